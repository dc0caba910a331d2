"""``tools/gpu_check.sh`` without a GPU, and the CUDA backend switch it uses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gssgd.train.launch import CUDA_BACKEND_ENV, cuda_backend, resolve_device_kind

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the check runs")
def test_gpu_check_stops_before_the_first_cuda_step(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("GPU_CHECK_DRY_RUN", None)
    out = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu_check.sh"), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "no CUDA device visible" in out.stderr
    assert (tmp_path / "environment.json").exists()
    assert not (tmp_path / "kernel_tests.txt").exists()  # stopped before part 1


def test_cuda_backend_defaults_to_nccl_and_checks_its_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CUDA_BACKEND_ENV, raising=False)
    assert cuda_backend() == "nccl"
    monkeypatch.setenv(CUDA_BACKEND_ENV, "gloo")
    assert cuda_backend() == "gloo"
    monkeypatch.setenv(CUDA_BACKEND_ENV, "mpi")
    with pytest.raises(ValueError, match="GSSGD_CUDA_BACKEND='mpi' is invalid: use nccl"):
        cuda_backend()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_device_cuda_without_cuda_is_refused_whatever_the_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CUDA_BACKEND_ENV, "gloo")
    with pytest.raises(ValueError, match="no CUDA device; use --device cpu"):
        resolve_device_kind("cuda", 4)


def test_gloo_lets_several_workers_share_one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv(CUDA_BACKEND_ENV, "nccl")
    with pytest.raises(ValueError, match="NCCL needs one GPU per worker"):
        resolve_device_kind("cuda", 4)
    monkeypatch.setenv(CUDA_BACKEND_ENV, "gloo")
    assert resolve_device_kind("cuda", 4) == "cuda"
