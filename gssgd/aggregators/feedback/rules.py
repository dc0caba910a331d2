"""The error-feedback rules by the name the ``feedback`` option gives them.

A method's options say which of these it implements (``feedback_rules``); the rule objects
themselves live one per module in this package.
"""

from __future__ import annotations

from gssgd.aggregators.feedback.ef import ErrorFeedback
from gssgd.aggregators.feedback.ef21 import EF21Feedback
from gssgd.aggregators.feedback.fetchsgd import FetchSGDFeedback
from gssgd.aggregators.feedback.global_ import GlobalMomentumFeedback
from gssgd.aggregators.feedback.onebit import OneBitFeedback

__all__ = ["FEEDBACKS", "OWN_MOMENTUM_FEEDBACKS", "RULES", "SKETCH_RULES", "SPARSE_RULES"]

#: Every rule a built-in method takes, by its ``feedback`` name.
RULES: dict[str, type[ErrorFeedback]] = {
    rule.name: rule
    for rule in (ErrorFeedback, EF21Feedback, GlobalMomentumFeedback, OneBitFeedback,
                 FetchSGDFeedback)
}
#: The rules of a method that delivers coordinates of each rank's vector (topk, gtopk).
SPARSE_RULES = {name: RULES[name] for name in ("ef", "ef21", "global", "onebit")}
#: The sparse rules and FetchSGD's, which needs a sketch (sketched, gs).
SKETCH_RULES = {**SPARSE_RULES, "fetchsgd": FetchSGDFeedback}
#: What ``feedback`` accepts across the built-in methods.
FEEDBACKS: tuple[str, ...] = tuple(RULES)
#: The rules that keep the momentum themselves (the optimizer must not add its own).
OWN_MOMENTUM_FEEDBACKS: tuple[str, ...] = tuple(n for n, r in RULES.items() if r.owns_momentum)
