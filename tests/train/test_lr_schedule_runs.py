"""``--lr-schedule`` and ``--lr-warmup-steps`` in whole runs: the simulated world is the
real one bitwise under a schedule (local steps too), a killed run resumes bitwise, and the
schedule changes the run (it is applied, not only recorded)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gssgd.train.checkpoint import CHECKPOINT_DIR, checkpoint_name, load_checkpoint
from gssgd.train.loop import TrainConfig, run_training
from gssgd.train.metrics import read_metrics
from tests.train.test_simulate import DIGITS, _assert_simulated_is_real

COSINE = {"lr_schedule": "cosine", "lr_warmup_steps": 3}


@pytest.mark.parametrize(("method", "extra"), [("gs", {}), ("dense", {"local_steps": 3})])
def test_a_scheduled_run_is_the_same_simulated_and_real(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, extra: dict) -> None:
    _assert_simulated_is_real(tmp_path, monkeypatch, method, 3, **COSINE, **extra)


def _run(out: Path, **settings: object) -> list[dict]:
    cfg = TrainConfig.build(method="gs", workers=2, steps=8, out=str(out), checkpoint_every=4,
                            **{**DIGITS, **COSINE, **settings})
    summary = run_training(cfg)
    assert summary is not None and summary["status"] == "completed"
    return read_metrics(out / "metrics.jsonl")


def test_a_scheduled_run_resumed_from_its_checkpoint_ends_bitwise_the_same(
        tmp_path: Path) -> None:
    """The factor depends on the step alone: resuming at step 4 (mid-decay) of the same
    8-step run gives the uninterrupted run's losses and final weights."""
    full = _run(tmp_path / "full")
    resumed = _run(tmp_path / "resumed",
                   resume=str(tmp_path / "full" / CHECKPOINT_DIR / checkpoint_name(4)))
    assert [r["loss"] for r in resumed] == [r["loss"] for r in full[4:]]
    final = [load_checkpoint(tmp_path / run / CHECKPOINT_DIR / checkpoint_name(8))["model"]
             for run in ("full", "resumed")]
    for name, weights in final[0].items():
        assert torch.equal(final[1][name], weights), name


def test_the_schedule_changes_the_run(tmp_path: Path) -> None:
    """Warm-up + cosine and a constant rate start from the same weights and batches: the
    first step's loss is the same, the later ones are not."""
    scheduled = _run(tmp_path / "cosine")
    constant = _run(tmp_path / "constant", lr_schedule="constant", lr_warmup_steps=0)
    assert scheduled[0]["loss"] == constant[0]["loss"]
    assert [r["loss"] for r in scheduled[2:]] != [r["loss"] for r in constant[2:]]
