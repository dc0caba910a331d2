"""``gssgd train --tensorboard DIR``: the step scalars of ``metrics.jsonl`` as TensorBoard
events (read back with TensorBoard's own reader), and a clear exit 2 when the optional
``tensorboard`` package is missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gssgd.cli.main import main
from gssgd.train.loop import TrainConfig, run_training
from gssgd.train.metrics import read_metrics
from gssgd.train.tensorboard import TAGS

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="the tensorboard package (gssgd[dev]) reads the event file back",
)


@pytest.mark.parametrize("simulate", [False, True])
def test_the_event_file_holds_the_metrics_scalars(tmp_path: Path, simulate: bool) -> None:
    """Real workers and a simulated world alike: the one training loop writes the events."""
    out, tb = tmp_path / "run", tmp_path / "tb"
    summary = run_training(TrainConfig(method="topk", dataset="digits", workers=2, steps=3,
                                       batch_size=16, eval_every=0, progress=False, lr=0.1,
                                       out=str(out), tensorboard=str(tb), simulate=simulate))
    assert summary is not None and summary["status"] == "completed"
    events = event_accumulator.EventAccumulator(str(tb))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    records = read_metrics(out / "metrics.jsonl")
    for field in ("loss", "train_accuracy", "bytes_sent", "bytes_received", "seconds_step"):
        scalars = events.Scalars(TAGS[field])
        assert [s.step for s in scalars] == [0, 1, 2], field
        for s, r in zip(scalars, records, strict=True):
            assert s.value == pytest.approx(r[field], rel=1e-6), field  # float32 in the file
    test_acc = events.Scalars(TAGS["test_accuracy"])  # evaluated after the last step only
    assert [s.step for s in test_acc] == [2]
    assert test_acc[0].value == pytest.approx(records[-1]["test_accuracy"], rel=1e-6)
    assert [s.value for s in events.Scalars("train/lr")] == pytest.approx([0.1] * 3)
    assert "amp/loss_scale" not in tags  # no --amp fp16, no scaler


def test_a_missing_tensorboard_exits_2_with_the_pip_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    status = main(["train", "--dataset", "digits", "--workers", "2", "--steps", "2",
                   "--out", str(tmp_path / "run"), "--tensorboard", str(tmp_path / "tb")])
    err = capsys.readouterr().err
    assert status == 2
    assert "--tensorboard needs the tensorboard package" in err
    assert "pip install tensorboard" in err
    assert not (tmp_path / "run").exists()  # nothing started
