"""gssgd: communication-efficient data-parallel training with global sketching (gs-SGD).

Public surface: :class:`CountSketch`, :func:`make_aggregator` and :data:`AGGREGATORS`;
the DDP hooks live in :mod:`gssgd.ddp`.
"""

from gssgd.aggregators import AGGREGATORS, Aggregator, StepStats, make_aggregator
from gssgd.sketch import CountSketch

__all__ = ["AGGREGATORS", "Aggregator", "CountSketch", "StepStats", "make_aggregator"]
__version__ = "0.1.0"
