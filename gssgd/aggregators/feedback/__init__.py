"""Error feedback as small strategies, one rule per module.

A rule owns a rank's feedback state and answers three questions an aggregator's ``step``
asks in order: what to compress (``compensate``), what to keep (``keep``) and what to
return (``returned``). Methods choose theirs by their options' ``feedback`` name
(:data:`~gssgd.aggregators.feedback.rules.RULES`); a new rule is one more module.
"""

from gssgd.aggregators.feedback.ef import ErrorFeedback
from gssgd.aggregators.feedback.ef21 import EF21Feedback
from gssgd.aggregators.feedback.fetchsgd import FetchSGDFeedback, SketchFeedback
from gssgd.aggregators.feedback.global_ import GlobalMomentumFeedback
from gssgd.aggregators.feedback.onebit import OneBitFeedback
from gssgd.aggregators.feedback.quantised import OneBitQuantisedFeedback, QuantisedFeedback
from gssgd.aggregators.feedback.rules import (
    FEEDBACKS,
    OWN_MOMENTUM_FEEDBACKS,
    RULES,
    SKETCH_RULES,
    SPARSE_RULES,
)

__all__ = [
    "EF21Feedback", "ErrorFeedback", "FEEDBACKS", "FetchSGDFeedback", "GlobalMomentumFeedback",
    "OWN_MOMENTUM_FEEDBACKS", "OneBitFeedback", "OneBitQuantisedFeedback", "QuantisedFeedback",
    "RULES", "SKETCH_RULES", "SPARSE_RULES", "SketchFeedback",
]
