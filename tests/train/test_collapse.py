"""The collapse guard in a real training run: a case that diverges without it.

digits, MLP (d = 17,226), 2 gloo workers, density 0.01 (k = 172), SGD lr 0.1 with momentum
0.9 after aggregation. With a far too small sketch (3 x 172, m = 2) gs-SGD's candidates are
little better than random ones: the residuals pile up, their delayed bursts make the test
loss climb step after step and the accuracy fall, and without the guard the run still
"completes". Local Top-k and gs-SGD with the default sketch train fine on the same setup.
With the guard (its default, "grow") the run doubles the sketch twice, then stops every
worker at the same step with a message that says what to change, keeping the newest
checkpoint, before the model has diverged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gssgd.train.checkpoint import CHECKPOINT_DIR, list_checkpoints
from gssgd.train.loop import STATUS_COLLAPSED, STATUS_COMPLETED, TrainConfig, run_training
from gssgd.train.metrics import read_metrics

SETUP: dict[str, Any] = dict(dataset="digits", model="mlp", workers=2, density=0.01, lr=0.1,
                             momentum=0.9, steps=150, eval_every=50, progress=False,
                             timeout=60.0)
TOO_SMALL: dict[str, Any] = dict(method="gs", rows=3, cols=172, candidates=2)


def _test_curve(out: Path) -> list[tuple[float, float]]:
    """(test loss, test accuracy) at each evaluation."""
    return [(r["test_loss"], r["test_accuracy"])
            for r in read_metrics(out / "metrics.jsonl") if "test_loss" in r]


def _train(out: Path, **settings: Any) -> dict[str, Any]:
    summary = run_training(TrainConfig(out=str(out), **{**SETUP, **settings}))
    assert summary is not None
    return summary


@pytest.fixture(scope="module")
def unguarded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("collapse") / "off"
    return out, _train(out, guard="off", **TOO_SMALL)


def test_without_the_guard_the_too_small_sketch_diverges_silently(unguarded) -> None:
    out, summary = unguarded
    assert summary["status"] == STATUS_COMPLETED  # nothing stopped it...
    losses = [loss for loss, _ in _test_curve(out)]
    accuracies = [acc for _, acc in _test_curve(out)]
    # ...yet the test loss climbs at every evaluation and the accuracy falls.
    assert losses == sorted(losses) and losses[-1] > 3 * losses[0], losses
    assert accuracies == sorted(accuracies, reverse=True) and accuracies[-1] < 0.6, accuracies


def test_local_topk_and_the_default_sketch_train_on_the_same_setup(tmp_path: Path) -> None:
    topk = _train(tmp_path / "topk", method="topk")
    gs = _train(tmp_path / "gs", method="gs")
    assert topk["final_test_accuracy"] > 0.9, topk
    assert gs["final_test_accuracy"] > 0.9, gs


def test_the_guard_stops_the_run_before_it_diverges_and_says_what_to_change(
    unguarded, tmp_path: Path
) -> None:
    _, off = unguarded
    out = tmp_path / "grow"
    summary = _train(out, checkpoint_every=10, **TOO_SMALL)  # guard left at its default

    assert summary["status"] == STATUS_COLLAPSED
    message = summary["message"]
    assert "collapsed" in message and "Raise cols or candidates" in message, message
    assert "grew 2 times" in message, message  # it first tried growing, twice
    stopped = summary["steps"]
    assert 40 < stopped < 100, summary
    # The stop came before the damage: the loss of the last steps is far below where the
    # unguarded run went, and the newest checkpoint (not a diverged one) is kept.
    assert summary["final_train_loss"] < off["final_train_loss"] / 2, (summary, off)
    kept = list_checkpoints(out / CHECKPOINT_DIR)
    assert kept and kept[-1].name in message
    assert len(read_metrics(out / "metrics.jsonl")) == stopped
