"""Elastic restart without loss: torchrun --max-restarts, one worker killed mid-run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from gssgd.train.checkpoint import resolve_checkpoint

ARGS = [
    "--dataset",
    "digits",
    "--method",
    "gs",
    "--steps",
    "20",
    "--checkpoint-every",
    "8",
    "--no-progress",
]


def torchrun(out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "-m",
        "gssgd.cli.main",
        "train",
        *ARGS,
        "--out",
        str(out),
        *extra,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=out.parent)


def final_state(out: Path) -> dict:
    return torch.load(resolve_checkpoint(out), weights_only=True)


def test_killed_worker_restarts_from_the_checkpoint_and_ends_bitwise_equal(
    tmp_path, torchrun_gs_run
) -> None:
    """The uninterrupted run is the session's torchrun launch (tests/conftest.py)."""
    plain_out, plain = torchrun_gs_run
    assert plain.returncode == 0, plain.stderr[-3000:]
    faulty = torchrun(tmp_path / "faulty", "--fail-at", "1:11")
    assert faulty.returncode == 0, faulty.stderr[-3000:]
    assert "steps 8..20" in faulty.stdout + faulty.stderr  # resumed from the step-8 checkpoint
    want, got = final_state(plain_out), final_state(tmp_path / "faulty")
    assert want["step"] == got["step"] == 20
    for name, tensor in want["model"].items():
        assert torch.equal(tensor, got["model"][name]), name
    for a, b in zip(want["ranks"], got["ranks"], strict=True):  # every rank's residual too
        assert torch.equal(
            a["sync"]["hook"]["buckets"][0]["residual"], b["sync"]["hook"]["buckets"][0]["residual"]
        )
