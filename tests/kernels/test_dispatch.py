"""Where the kernels run: :func:`gssgd.kernels.use_kernels` and ``GSSGD_KERNELS``; the
library without Triton."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gssgd import kernels

ROOT = Path(__file__).resolve().parents[2]


def test_auto_keeps_cpu_tensors_on_the_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kernels.MODE_ENV, raising=False)
    assert kernels.mode() == "auto"
    assert not kernels.use_kernels(torch.zeros(3))


def test_off_forces_the_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernels.MODE_ENV, "off")
    assert not kernels.use_kernels(torch.zeros(3))


def test_on_runs_cpu_tensors_only_in_the_interpreter(
    monkeypatch: pytest.MonkeyPatch, device: torch.device
) -> None:
    monkeypatch.setenv(kernels.MODE_ENV, "on")
    if device.type == "cpu":
        assert kernels.use_kernels(torch.zeros(3))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        kernels.use_kernels(torch.zeros(3))


def test_on_without_triton_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernels.MODE_ENV, "on")
    monkeypatch.setattr(kernels, "available", lambda: False)
    with pytest.raises(RuntimeError, match=r"pip install 'gssgd\[triton\]'"):
        kernels.use_kernels(torch.zeros(3))


def test_invalid_mode_names_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernels.MODE_ENV, "fast")
    with pytest.raises(ValueError, match=r"GSSGD_KERNELS='fast' is invalid.*'auto', 'off', 'on'"):
        kernels.use_kernels(torch.zeros(3))


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = kernels.nope


def test_library_works_without_triton(tmp_path: Path) -> None:
    """An import hook makes ``triton`` unimportable: gssgd imports, sketches and selects on
    the torch path, and ``GSSGD_KERNELS=on`` explains what is missing."""
    script = textwrap.dedent(
        """
        import importlib.abc, os, sys
        class NoTriton(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "triton" or name.startswith("triton."):
                    raise ImportError("triton blocked for this test")
        sys.meta_path.insert(0, NoTriton())
        import torch, gssgd
        from gssgd import kernels
        assert not kernels.available()
        sk = gssgd.CountSketch(5000, rows=5, cols=4096, seed=0)
        x = torch.zeros(5000); x[[3, 4000]] = torch.tensor([9.0, -7.0])
        sk.accumulate(x); sk.accumulate(x)  # twice: the second adds onto a non-zero table
        assert sk.query(torch.tensor([3, 4000])).tolist() == [18.0, -14.0]
        assert sk.heavy_hitters(2)[0].tolist() == [3, 4000]
        os.environ["GSSGD_KERNELS"] = "on"
        try:
            sk.query()
        except RuntimeError as err:
            assert "Triton is not installed" in str(err), err
        else:
            raise AssertionError("GSSGD_KERNELS=on without Triton did not complain")
        print("ok")
        """
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
