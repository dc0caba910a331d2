"""Soak: a 300-step run under ``torchrun --max-restarts 3`` whose workers are killed three
times (a random rank at a random step each time, SIGKILL) ends bitwise equal to the same
run left alone: parameters, optimizer, every rank's residuals, momentum and random state.

Marked ``soak`` and left out of the default run (``addopts`` in pyproject.toml); it takes
minutes. Run it with::

    .venv/bin/python -m pytest -m soak tests/train/test_soak.py
    GSSGD_SOAK_SEED=7 .venv/bin/python -m pytest -m soak tests/train/test_soak.py  # other kills

How the kills happen: this module is also a ``--plugin`` of the killed run. Imported on a
worker with ``GSSGD_SOAK_KILLS=RANK:STEP,RANK:STEP,RANK:STEP`` set, it wraps the training
loop's fault injection so that on torchrun attempt ``i`` (``TORCHELASTIC_RESTART_COUNT``)
rank ``RANK_i`` SIGKILLs itself at the start of step ``STEP_i``. torchrun then restarts every
worker, which continue from the newest checkpoint in ``--out`` (every 25 steps).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from gssgd.train.checkpoint import resolve_checkpoint

KILLS_ENV = "GSSGD_SOAK_KILLS"
SEED_ENV = "GSSGD_SOAK_SEED"
STEPS, CHECKPOINT_EVERY, WORKERS, KILLS = 300, 25, 3, 3
REPO = Path(__file__).resolve().parents[2]
ARGS = ["--dataset", "digits", "--model", "mlp", "--method", "gs", "--density", "0.01",
        "--local-momentum", "0.9", "--steps", str(STEPS), "--checkpoint-every",
        str(CHECKPOINT_EVERY), "--eval-every", "0", "--no-progress", "--plugin", __name__]


def kill_plan(seed: int) -> list[tuple[int, int]]:
    """Three (rank, step) kills, one in each third of the run, away from its ends, so that
    each falls after the checkpoint the previous restart resumed from."""
    rng = random.Random(seed)
    third = STEPS // KILLS
    return [(rng.randrange(WORKERS), i * third + rng.randrange(10, third - 10))
            for i in range(KILLS)]


def _install_kills() -> None:
    """On a worker of the killed run: SIGKILL this rank at its step of this attempt."""
    plan = [tuple(int(v) for v in kill.split(":")) for kill in os.environ[KILLS_ENV].split(",")]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt >= len(plan):
        return
    rank, step = plan[attempt]
    from gssgd.train import loop

    inject = loop._inject_faults

    def inject_and_kill(cfg: Any, this_rank: int, this_step: int) -> None:
        if (this_rank, this_step) == (rank, step):
            print(f"soak: attempt {attempt}: SIGKILL rank {rank} at step {step}",
                  file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        inject(cfg, this_rank, this_step)

    loop._inject_faults = inject_and_kill


if os.environ.get(KILLS_ENV):  # imported as the killed run's --plugin
    _install_kills()


def _torchrun(out: Path, kills: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(KILLS_ENV, None)
    if kills:
        env[KILLS_ENV] = kills
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(WORKERS), "--max-restarts", str(KILLS), "-m", "gssgd.cli.main", "train", *ARGS,
           "--out", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=REPO, env=env)


def _differences(a: Any, b: Any, where: str = "") -> list[str]:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))
        return [] if same else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where} keys differ"]
        return [d for k in a for d in _differences(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in _differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} vs {b!r}"]


@pytest.mark.soak
@pytest.mark.timeout(7200)  # minutes: two 300-step runs, one restarted three times
def test_three_killed_workers_end_bitwise_equal_to_the_run_left_alone(tmp_path: Path) -> None:
    seed = int(os.environ.get(SEED_ENV, "0"))
    plan = kill_plan(seed)
    kills = ",".join(f"{r}:{s}" for r, s in plan)
    start = time.perf_counter()
    alone = _torchrun(tmp_path / "alone", None)
    seconds_alone = time.perf_counter() - start
    assert alone.returncode == 0, alone.stderr[-3000:]
    killed = _torchrun(tmp_path / "killed", kills)
    seconds_killed = time.perf_counter() - start - seconds_alone
    log = killed.stdout + killed.stderr
    assert killed.returncode == 0, log[-3000:]
    print(f"soak seed {seed}, kills {kills}: alone {seconds_alone:.0f} s, "
          f"killed {seconds_killed:.0f} s", file=sys.stderr)

    # every kill happened, and each restart resumed from the checkpoint before it
    for attempt, (rank, step) in enumerate(plan):
        assert f"soak: attempt {attempt}: SIGKILL rank {rank} at step {step}" in log
        resumed = step // CHECKPOINT_EVERY * CHECKPOINT_EVERY
        assert f"steps {resumed}..{STEPS}" in log, (attempt, resumed)

    want = torch.load(resolve_checkpoint(tmp_path / "alone"), weights_only=True)
    got = torch.load(resolve_checkpoint(tmp_path / "killed"), weights_only=True)
    assert want["step"] == got["step"] == STEPS
    assert _differences(want["model"], got["model"], "model") == []
    assert _differences(want["optimizer"], got["optimizer"], "optimizer") == []
    assert len(got["ranks"]) == WORKERS
    for r, (a, b) in enumerate(zip(want["ranks"], got["ranks"], strict=True)):
        assert _differences(a["sync"], b["sync"], f"rank {r} sync") == []  # residuals, momentum
        assert _differences(a["rng"], b["rng"], f"rank {r} rng") == []
        for sd in b["sync"]["hook"]["buckets"].values():
            assert torch.count_nonzero(sd["residual"]) > 0 and torch.count_nonzero(sd["momentum"]) > 0
