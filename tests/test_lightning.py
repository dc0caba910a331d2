"""examples/lightning_gssgd.py on CPU: Lightning's DDPStrategy, two gloo processes.

Lightning registers ``DDPStrategy(ddp_comm_hook=...)`` only on CUDA; on CPU the example's
callback registers the same hook on the DDP module Lightning made. One ``torchrun`` launch
of 6 optimizer steps of 2 accumulated micro-batches: the hook must have compressed every
step once (whole-model gs), and both ranks must hold the same parameters.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning")

from examples.lightning_gssgd import Classifier  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STEPS, WORLD = 6, 2


@pytest.fixture(scope="module")
def finals(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("lightning")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={WORLD}", str(ROOT / "examples" / "lightning_gssgd.py"),
           "--steps", str(STEPS), "--accumulate", "2", "--devices", str(WORLD),
           "--out", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [torch.load(out / f"final_rank{r}.pt", weights_only=True) for r in range(WORLD)]


def test_the_hook_ran_once_per_optimizer_step_on_cpu(finals: list[dict]) -> None:
    """Without the callback Lightning would not register it on CPU: iter would stay 0."""
    for final in finals:
        assert final["steps"] == STEPS
        assert final["hook"]["iter"] == STEPS


def test_the_last_step_was_compressed(finals: list[dict]) -> None:
    d = sum(p.numel() for p in Classifier(0.1).parameters())
    dense_ring = 2 * (WORLD - 1) * 4 * d // WORLD  # what DDP's all-reduce would send
    for final in finals:
        assert 0 < final["bytes_sent"] < dense_ring / 2
        assert torch.count_nonzero(final["hook"]["buckets"][0]["residual"]) > 0


def test_every_rank_holds_the_same_trained_parameters(finals: list[dict]) -> None:
    initial = list(Classifier(0.1).parameters())
    for a, b in zip(finals[0]["params"], finals[1]["params"], strict=True):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, p.detach()) for a, p in zip(finals[0]["params"], initial,
                                                               strict=True))
