"""Optional fused GPU kernels (Triton) for the Count Sketch and the top-k selection.

The pure-torch code in :mod:`gssgd.sketch` and :mod:`gssgd.selection` is the reference; these
kernels compute the same results without the d-sized work space the torch path needs
(hashes are computed inside the kernel from :func:`gssgd.sketch.count_sketch.sketch_hash_params`, never
stored). What each one does (details in ``docs/kernels.md``):

* :func:`sketch_accumulate`: ``table += sketch(vec)``, one atomic add per coordinate and row.
* :func:`query`: the median-of-rows estimates of the given coordinates (or of all ``d``).
* :func:`candidates`: the coordinates whose bucket reaches ``|value| >= tau`` in at least
  ``majority`` rows (with one row: the bucket threshold -> candidate coordinates recovery).
* :func:`at_least`: the ascending indices of ``values >= tau`` (the count/compact step of
  the sampled-threshold top-k selection).
* :func:`gather`: ``vec[indices]`` (the exact values at the candidates).

Where they run is decided in one place, :func:`use_kernels`, read by ``CountSketch`` and
the selection: CUDA tensors, when Triton can be imported. The environment variable
``GSSGD_KERNELS`` overrides it:

* ``auto`` (default): kernels for CUDA tensors when Triton is importable, torch elsewhere;
* ``off``: always the torch path (the reference);
* ``on``: kernels for every tensor Triton can run: CUDA tensors, and CPU tensors when
  ``TRITON_INTERPRET=1`` was set before this package was imported (Triton's interpreter,
  how the tests check the kernels on machines without a GPU).

Triton is an optional extra (``pip install 'gssgd[triton]'``): this module imports without
it, and the kernel functions import it only when first called.
"""

from __future__ import annotations

import importlib
import os
from functools import lru_cache
from typing import Any

import torch

__all__ = [
    "MODE_ENV",
    "MODES",
    "at_least",
    "available",
    "candidates",
    "gather",
    "interpreted",
    "mode",
    "query",
    "sketch_accumulate",
    "use_kernels",
]

#: The environment variable that chooses where the kernels run (see the module doc).
MODE_ENV = "GSSGD_KERNELS"
MODES: tuple[str, ...] = ("auto", "off", "on")

# Public kernel function -> the module that defines it (imported on first use).
_LAZY = {
    "sketch_accumulate": "gssgd.kernels.sketch_ops",
    "query": "gssgd.kernels.sketch_ops",
    "candidates": "gssgd.kernels.sketch_ops",
    "at_least": "gssgd.kernels.select_ops",
    "gather": "gssgd.kernels.select_ops",
}


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether Triton can be imported (checked once per process)."""
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


def interpreted() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def mode() -> str:
    """The current ``GSSGD_KERNELS`` setting, validated.

    Raises:
        ValueError: the variable holds something other than ``auto``, ``off`` or ``on``.
    """
    value = os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(
            f"{MODE_ENV}={value!r} is invalid: it must be one of {MODES} "
            f"(auto: kernels on CUDA when Triton is installed; off: the torch path)."
        )
    return value


def use_kernels(tensor: torch.Tensor) -> bool:
    """Whether operations on ``tensor`` run the Triton kernels (else the torch path).

    The one dispatch rule of the package: ``auto`` takes CUDA tensors when Triton is
    importable; ``off`` never; ``on`` every tensor Triton can run (see the module doc).

    Raises:
        RuntimeError: ``GSSGD_KERNELS=on`` but Triton is not installed, or ``tensor`` is on
            the CPU without ``TRITON_INTERPRET=1``.
    """
    setting = mode()
    if setting == "off":
        return False
    if setting == "auto":
        return tensor.device.type == "cuda" and available()
    if not available():
        raise RuntimeError(
            f"{MODE_ENV}=on but Triton is not installed: pip install 'gssgd[triton]', or "
            f"unset {MODE_ENV}."
        )
    if tensor.device.type != "cuda" and not interpreted():
        raise RuntimeError(
            f"{MODE_ENV}=on with a tensor on {tensor.device}: Triton runs CPU tensors only in "
            "its interpreter; set TRITON_INTERPRET=1 before importing gssgd, or move the "
            f"tensor to CUDA, or set {MODE_ENV}=auto."
        )
    return True


def __getattr__(name: str) -> Any:
    """The kernel functions, imported (with Triton) on first use."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
