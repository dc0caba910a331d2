"""gssgd: communication-efficient data-parallel training with global sketching (gs-SGD).

Public surface: :class:`CountSketch`, :func:`make_aggregator`, :data:`AGGREGATORS`, the
method registry (:data:`METHODS`, :class:`Method`, :func:`register_method`) and
:class:`LocalSteps` (DiLoCo-style local steps with a compressed outer step); the DDP hooks
live in :mod:`gssgd.ddp`.

The names load on first use (PEP 562): ``import gssgd`` alone does not import torch, so the
command line answers ``gssgd --help`` and a mistyped command at once.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gssgd.aggregators import AGGREGATORS, Aggregator, StepStats, make_aggregator
    from gssgd.local_steps import LocalSteps
    from gssgd.methods import METHODS, Method, Variant, register_method
    from gssgd.sketch import CountSketch


#: Where each public name lives (imported on first use).
_HOMES = {
    "AGGREGATORS": "gssgd.aggregators", "Aggregator": "gssgd.aggregators",
    "StepStats": "gssgd.aggregators", "make_aggregator": "gssgd.aggregators",
    "LocalSteps": "gssgd.local_steps", "METHODS": "gssgd.methods",
    "Method": "gssgd.methods", "Variant": "gssgd.methods",
    "register_method": "gssgd.methods", "CountSketch": "gssgd.sketch",
}
__all__ = [  # the names of _HOMES
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


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    if name not in _HOMES:
        raise AttributeError(f"module 'gssgd' has no attribute {name!r}")
    importlib.import_module("gssgd.methods")  # registers the built-in methods' aggregators
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
