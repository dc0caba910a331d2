"""``gssgd train --simulate``: a simulated world's run against real processes, at large P,
and the settings it refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from gssgd.aggregators import build_options
from gssgd.cli.main import main
from gssgd.train import loop
from gssgd.train.checkpoint import CHECKPOINT_DIR, checkpoint_name, load_checkpoint
from gssgd.train.data import load_dataset
from gssgd.train.loop import TrainConfig, prepare, run_training
from gssgd.train.metrics import read_metrics
from gssgd.train.models import build_model

DIGITS: dict[str, Any] = dict(dataset="digits", batch_size=16, eval_every=4, progress=False,
                              timeout=60.0, density=0.01)


@pytest.mark.parametrize(
    ("method", "bucket_cap_mb"),
    [
        ("gtopk", None),  # DDP's default caps: one bucket, rebuilt in gradient-ready order
        ("gs", None),
        ("dense", 0.004),  # 4 KiB caps: three buckets from step 1, each all-reduced apart
        ("powersgd", None),  # its all-reduces are the backend's, in gloo's order
    ],
)
def test_a_simulated_run_is_the_real_run_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, bucket_cap_mb: float | None
) -> None:
    """The same settings on 3 real gloo workers and 3 simulated ones: every step's bytes
    and loss, the test accuracy and the final model are equal, bit for bit. The dense
    warm-up (steps 0 and 1) all-reduces DDP's buckets, which DDP lays out anew after step 0
    (gssgd.train.ddp_buckets mirrors it). With the simulated bucket kept in model order,
    each of these runs drifted from the real one in the last bits by step 7."""
    _assert_simulated_is_real(tmp_path, monkeypatch, method, 3, bucket_cap_mb=bucket_cap_mb,
                              **({"powersgd_rank": 1} if method == "powersgd" else {}))


@pytest.mark.parametrize(("method", "workers"), [("dense", 3), ("gs", 4), ("topk", 5)])
def test_local_steps_simulated_are_the_real_run_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, workers: int
) -> None:
    """``--local-steps 3``: each simulated rank trains its own replica and every third
    step takes the outer step on its simulated rank; losses, bytes (none on inner steps),
    evaluations between outer steps and the final model equal real processes', bit for bit."""
    _assert_simulated_is_real(tmp_path, monkeypatch, method, workers, local_steps=3)


def _assert_simulated_is_real(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str,
                              workers: int, **settings: Any) -> None:
    built, build = [], loop.build_model

    def keep(*args: Any, **kwargs: Any) -> torch.nn.Module:  # the simulated run's model
        built.append(build(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(loop, "build_model", keep)
    runs = {}
    for sim in (False, True):
        out = tmp_path / f"{method}-{sim}"
        cfg = TrainConfig.build(method=method, workers=workers, steps=8, simulate=sim, out=str(out),
                          **{**DIGITS, "density": None if method in ("dense", "powersgd") else 0.01,
                             **settings})
        summary = run_training(cfg)
        assert summary is not None and summary["status"] == "completed"
        assert summary.get("simulated", False) is sim
        runs[sim] = read_metrics(out / "metrics.jsonl")
    keys = ("loss", "train_accuracy", "bytes_sent", "bytes_sent_max", "bytes_received",
            "bytes_received_max", "k", "test_loss", "test_accuracy")
    assert [{k: r.get(k) for k in keys} for r in runs[True]] == [
        {k: r.get(k) for k in keys} for r in runs[False]]
    if settings.get("local_steps"):  # bytes on outer steps only
        every = settings["local_steps"]
        assert [r["bytes_sent"] > 0 for r in runs[True]] == [
            (r["step"] + 1) % every == 0 for r in runs[True]]
    real = load_checkpoint(tmp_path / f"{method}-False" / CHECKPOINT_DIR / checkpoint_name(8))
    simulated = built[-1].state_dict()
    assert real["model"].keys() == simulated.keys()
    for name, weights in real["model"].items():
        assert torch.equal(simulated[name], weights), name


def test_256_simulated_workers_train_the_mnist_cnn_with_exact_bytes(tmp_path: Path) -> None:
    """P = 256 on the MNIST CNN (global batch 256: one sample per worker): gs, in its
    many-workers shape (ring all-reduce, float16 tables), sends what the traffic formula
    says, on every rank alike."""
    cfg = TrainConfig.build(method="gs", dataset="mnist", workers=256, global_batch=256, steps=3,
                      start_iter=1, warmup_steps=0, density=0.001, simulate=True,
                      eval_every=0, progress=False, out=str(tmp_path / "p256"))
    summary = run_training(cfg)
    assert summary is not None and summary["status"] == "completed"
    assert summary["world_size"] == 256 and summary["config"]["batch_size"] == 1
    cls, k, opts = build_options("gs", summary["d"], 0.001, world_size=256)
    expected = cls.traffic(summary["d"], k, opts, 256)
    last = read_metrics(tmp_path / "p256" / "metrics.jsonl")[-1]
    assert last["bytes_sent_max"] == max(expected.sent)
    assert last["bytes_received_max"] == max(expected.received)
    assert last["bytes_sent"] == pytest.approx(sum(expected.sent) / 256)


def test_simulated_powersgd_sends_its_formula_for_the_models_own_layers(tmp_path: Path) -> None:
    """``gssgd train --method powersgd --simulate`` on 16 workers: every rank's bytes of a
    compressed step are PowerSGD's traffic formula for the model's parameter shapes (the
    hook passes them), not for the bare vector's default layout."""
    cfg = TrainConfig.build(method="powersgd", workers=16, steps=3, start_iter=1, simulate=True,
                      powersgd_rank=2, out=str(tmp_path / "p16"),
                      **{**DIGITS, "density": None, "eval_every": 0})
    summary = run_training(cfg)
    assert summary is not None and summary["status"] == "completed"
    model = build_model(summary["config"]["model"], load_dataset("digits"))
    shapes = [tuple(p.shape) for p in model.parameters()]
    cls, k, opts = build_options("powersgd", summary["d"], rank=2, shapes=shapes)
    expected = cls.traffic(summary["d"], k, opts, 16)
    bare = cls.traffic(summary["d"], k, build_options("powersgd", summary["d"], rank=2)[2], 16)
    assert max(expected.sent) != max(bare.sent)  # the layers matter
    last = read_metrics(tmp_path / "p16" / "metrics.jsonl")[-1]
    assert last["bytes_sent_max"] == max(expected.sent)
    assert last["bytes_received_max"] == max(expected.received)


def test_the_global_batch_is_split_over_the_workers(tmp_path: Path) -> None:
    cfg = prepare(TrainConfig.build(method="topk", workers=8, global_batch=64, simulate=True,
                              out=str(tmp_path / "a"), **DIGITS))
    assert cfg.batch_size == 8
    with pytest.raises(ValueError, match=r"--global-batch 60 does not split evenly over "
                       r"--workers 8: it must be a multiple of the workers, e.g. 56 or 64"):
        prepare(TrainConfig.build(method="topk", workers=8, global_batch=60, out=str(tmp_path / "b"),
                            **DIGITS))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"per_bucket": True}, r"--per-bucket cannot be combined with --simulate"),
        ({"amp": "bf16"}, r"--amp cannot be combined with --simulate"),
        ({"method": "torch-powersgd", "density": None}, r"aggregator methods only"),
    ],
)
def test_simulate_refuses_what_it_cannot_simulate(settings: dict, message: str) -> None:
    base = {**DIGITS, "method": "gs", "workers": 4, "simulate": True, **settings}
    with pytest.raises(ValueError, match=message):
        TrainConfig.build(**base)


def test_compare_simulates_many_workers_and_dense_alone_needs_no_density(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``gssgd compare --simulate`` at P = 16, and compare's default density goes only to
    the methods that take it (``--methods dense`` alone used to fail on it)."""
    quick = ["--dataset", "digits", "--steps", "3", "--eval-every", "3", "--no-progress"]
    # no density warm-up: its first steps would go as dense's ring all-reduce at P = 16
    code = main(["compare", "--methods", "dense,topk,gs", "--simulate", "--workers", "16",
                 "--global-batch", "64", "--warmup-steps", "0", *quick,
                 "--out", str(tmp_path / "p16")])
    assert code == 0
    results = json.loads((tmp_path / "p16" / "results.json").read_text())
    assert [r["status"] for r in results.values()] == ["completed"] * 3
    topk = results["topk"]  # a ring all-gather: each rank sends on what it receives
    assert topk["bytes_received_max_per_step"] == topk["bytes_sent_per_step"] > 0
    assert main(["compare", "--methods", "dense", *quick, "--workers", "2",
                 "--out", str(tmp_path / "dense")]) == 0


def test_the_guard_catches_a_collapse_in_the_many_workers_shape(tmp_path: Path) -> None:
    """16 simulated workers take gs's many-workers shape (pre-filter, float16 tables, ring
    all-reduce); a far too small table in it (52 columns, m = 1 at k = 172) is found by the
    guard's audit, which stops every rank together (guard="raise") instead of training on."""
    cfg = TrainConfig.build(method="gs", dataset="digits", model="mlp", workers=16, global_batch=64,
                      density=0.01, cols=52, candidates=1, guard="raise", lr=0.2, momentum=0.0,
                      warmup_steps=0, steps=60, eval_every=0, progress=False, simulate=True,
                      out=str(tmp_path / "collapse"))
    summary = run_training(cfg)
    assert summary is not None and summary["status"] == "stopped: sketch collapsed"
    assert "collapsed at aggregation step 20" in summary["message"]
    assert "cols=52" in summary["message"]
