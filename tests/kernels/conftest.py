"""Run the kernels in Triton's CPU interpreter, or on CUDA when asked.

``TRITON_INTERPRET=1`` must be set before any kernel is defined (``triton.jit`` decides at
decoration time), so it is set here, when pytest loads this directory, before the test
modules import :mod:`gssgd.kernels`' kernel modules. ``GSSGD_KERNEL_TEST_DEVICE=cuda``
(``tools/gpu_check.sh``) compiles the kernels for the GPU instead and runs the same tests
on CUDA tensors.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

DEVICE = os.environ.get("GSSGD_KERNEL_TEST_DEVICE", "cpu")
if DEVICE not in ("cpu", "cuda"):
    raise ValueError(f"GSSGD_KERNEL_TEST_DEVICE={DEVICE!r} must be 'cpu' or 'cuda'")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

HAVE_TRITON = importlib.util.find_spec("triton") is not None
NO_TRITON = "Triton is not installed (pip install -e '.[dev]' installs it)"


@pytest.fixture
def device() -> torch.device:
    """Where the kernels run: the CPU under the interpreter, or CUDA."""
    if not HAVE_TRITON:
        pytest.skip(NO_TRITON)
    if DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.skip("GSSGD_KERNEL_TEST_DEVICE=cuda but no CUDA device is visible")
    from gssgd.kernels import sketch_ops

    interpreted = type(sketch_ops._sketch_kernel).__name__ == "InterpretedFunction"
    if DEVICE == "cpu" and not interpreted:
        pytest.fail(
            "gssgd.kernels' kernels were compiled before tests/kernels/conftest.py set "
            "TRITON_INTERPRET=1 (something imported them earlier in this process); run "
            "tests/kernels on its own, or export TRITON_INTERPRET=1 first."
        )
    return torch.device(DEVICE)


@pytest.fixture
def kernels_on(monkeypatch: pytest.MonkeyPatch, device: torch.device) -> torch.device:
    """``GSSGD_KERNELS=on`` for the test: CountSketch and the selection take the kernels."""
    monkeypatch.setenv("GSSGD_KERNELS", "on")
    return device

