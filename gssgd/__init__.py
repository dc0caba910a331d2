"""gssgd: communication-efficient data-parallel training with global sketching (gs-SGD).

Public surface: :class:`CountSketch`, :func:`make_aggregator`, :data:`AGGREGATORS`, the
method registry (:data:`METHODS`, :class:`Method`, :func:`register_method`) and
:class:`LocalSteps` (DiLoCo-style local steps with a compressed outer step); the DDP hooks
live in :mod:`gssgd.ddp`.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from gssgd.aggregators import AGGREGATORS, Aggregator, StepStats, make_aggregator
from gssgd.local_steps import LocalSteps
from gssgd.methods import METHODS, Method, Variant, register_method
from gssgd.sketch import CountSketch

__all__ = [
    "AGGREGATORS",
    "METHODS",
    "Aggregator",
    "CountSketch",
    "LocalSteps",
    "Method",
    "StepStats",
    "Variant",
    "make_aggregator",
    "register_method",
]
try:  # the one version is pyproject.toml's, as installed
    __version__ = _version("gssgd")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
