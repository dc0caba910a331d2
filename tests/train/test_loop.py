"""Tests for gssgd.train.loop: real spawned gloo runs on digits, resume, stops, settings."""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from gssgd.comm import ring_allreduce_bytes
from gssgd.optim import FrozenVarianceAdamW
from gssgd.recipes import ADAMW_FREEZE_STEPS
from gssgd.train.checkpoint import CHECKPOINT_DIR, CheckpointError, resolve_checkpoint
from gssgd.train.config import make_optimizer
from gssgd.train.launch import WorkerFailed, launch
from gssgd.train.loop import (
    STATUS_COMPLETED,
    STATUS_NONFINITE,
    TrainConfig,
    prepare,
    run_training,
)
from gssgd.train.method_settings import settings_for
from gssgd.train.metrics import read_metrics
from gssgd.train.sync import builtin_hook_bytes
from tests.train.test_resume_methods import train_all

# Small and fast: 2 workers on digits (d = 11,482 for the CNN).
DIGITS: dict[str, Any] = dict(dataset="digits", workers=2, batch_size=16, eval_every=5,
                              progress=False, timeout=60.0)
STEPS = 20


def _model(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(resolve_checkpoint(run), weights_only=True)["model"]


@pytest.fixture(scope="module")
def first_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any]]]:
    """The runs that need no launch of their own, by name: (--out, rank 0's summary). One
    launch of the workers trains them in turn, each from scratch as ``run_training`` would
    start it (starting the workers costs about as much as a run):

    * ``gs``: an uninterrupted gs run of STEPS steps, checkpointing every 8;
    * ``nonfinite``: a ddp-allreduce run whose loss stops being finite (lr 1e6)."""
    root = tmp_path_factory.mktemp("first")
    settings = {
        "gs": dict(method="gs", steps=STEPS, checkpoint_every=8),
        "nonfinite": dict(method="ddp-allreduce", steps=30, lr=1e6),
    }
    cfgs = [
        prepare(TrainConfig.build(out=str(root / name), **s, **DIGITS)) for name, s in settings.items()
    ]
    summaries = launch(train_all, 2, (cfgs,), timeout_s=DIGITS["timeout"])
    assert len(summaries) == len(settings) and all(s is not None for s in summaries)
    return {name: (root / name, s) for name, s in zip(settings, summaries, strict=True)}


@pytest.fixture(scope="module")
def gs_run(first_runs) -> tuple[Path, dict[str, Any]]:
    """An uninterrupted gs run of STEPS steps, checkpointing every 8."""
    return first_runs["gs"]


# ---------------------------------------------------------------------------- a whole run


def test_spawned_run_writes_metrics_summary_and_checkpoints(gs_run) -> None:
    out, summary = gs_run
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(STEPS))
    for key in ("loss", "bytes_sent", "bytes_received", "seconds_compute", "seconds_compress",
                "seconds_communicate", "seconds_step", "delivered_fraction"):
        assert key in records[-1], key
    evaluated = [r["step"] for r in records if "test_accuracy" in r]
    assert evaluated == [4, 9, 14, 19]

    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["status"] == summary["status"] == STATUS_COMPLETED
    assert on_disk["steps"] == STEPS and on_disk["world_size"] == 2
    assert 0 < on_disk["final_test_accuracy"] <= 1
    d = on_disk["d"]
    assert 0 < on_disk["bytes_sent_per_step"] < 4 * d  # less than one dense float32 payload

    names = sorted(p.name for p in (out / CHECKPOINT_DIR).glob("step-*.pt"))
    assert names == ["step-00000016.pt", "step-00000020.pt"]  # every 8 and the last; 2 kept
    ckpt = torch.load(resolve_checkpoint(out), weights_only=True)
    assert ckpt["step"] == STEPS
    assert ckpt["fingerprint"] == {"method": "gs", "model": "cnn", "dataset": "digits",
                                   "world_size": 2, "d": d}
    residuals = [r["sync"]["hook"]["buckets"][0]["residual"] for r in ckpt["ranks"]]
    assert [tuple(r.shape) for r in residuals] == [(d,), (d,)]
    assert not torch.equal(residuals[0], residuals[1])  # every rank's own residual is kept


def test_killed_and_resumed_run_ends_bitwise_equal_to_the_uninterrupted_one(
    gs_run, tmp_path: Path
) -> None:
    uninterrupted, _ = gs_run
    out = tmp_path / "run"
    cfg = TrainConfig.build(method="gs", steps=STEPS, checkpoint_every=8, out=str(out), **DIGITS)
    with pytest.raises(WorkerFailed, match=f"--resume {out}"):
        run_training(TrainConfig.build(**{**cfg.__dict__, "fail_at": (1, 11)}))
    assert resolve_checkpoint(out).name == "step-00000008.pt"

    summary = run_training(TrainConfig.build(**{**cfg.__dict__, "resume": str(out)}))
    assert summary is not None and summary["status"] == STATUS_COMPLETED
    want, got = _model(uninterrupted), _model(out)
    assert all(torch.equal(want[k], got[k]) for k in want)
    want_ranks = torch.load(resolve_checkpoint(uninterrupted), weights_only=True)["ranks"]
    got_ranks = torch.load(resolve_checkpoint(out), weights_only=True)["ranks"]
    for a, b in zip(want_ranks, got_ranks, strict=True):
        assert torch.equal(a["sync"]["hook"]["buckets"][0]["residual"],
                           b["sync"]["hook"]["buckets"][0]["residual"])
    # metrics.jsonl holds each step once: the killed run's steps 8..10 were replaced.
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(STEPS))


@pytest.mark.parametrize("method", ["torch-powersgd", "powersgd"])
def test_powersgd_resume_is_bitwise_too(tmp_path: Path, method: str) -> None:
    """PowerSGD keeps memories (PyTorch's hook per bucket; gssgd's the warm-start Q and the
    residual): the resumed run must continue from them.

    One worker is enough to pin the bucket layout and PowerSGD's state (and is quick).
    """
    steps = 8
    full, part = tmp_path / "full", tmp_path / "part"
    base = dict(method=method, steps=steps, **{**DIGITS, "workers": 1, "eval_every": 0})
    # The whole run and the first half share one launch; the resume gets a fresh one.
    first = [prepare(TrainConfig.build(out=str(full), **base)),
             prepare(TrainConfig.build(out=str(part), **{**base, "steps": steps // 2}))]  # fmt: skip
    launch(train_all, 1, (first,), timeout_s=DIGITS["timeout"])
    assert resolve_checkpoint(part).name == "step-00000004.pt"
    run_training(TrainConfig.build(out=str(part), resume=str(part), **base))
    want, got = _model(full), _model(part)
    assert all(torch.equal(want[k], got[k]) for k in want)
    saved = torch.load(resolve_checkpoint(part), weights_only=True)["ranks"][0]["sync"]
    if method == "torch-powersgd":
        assert saved["powersgd"]["iter"] == steps and saved["powersgd"]["error"]  # memories
    else:
        whole = saved["hook"]["buckets"][0]
        assert whole["q"].numel() > 0 and whole["steps"] == steps - 2  # after start_iter 2


def test_pytorchs_powersgd_hook_completes_on_gloo_with_many_buckets(tmp_path: Path) -> None:
    """PyTorch's PowerSGD hook issues its P and Q all-reduces from future callbacks, which
    gloo runs on its own threads: with several buckets the ranks issued collectives in
    different orders and gloo aborted ("Received data size doesn't match") or hung. On gloo
    the run finishes each bucket inside its hook; 3 workers and 10 KB buckets must train."""
    out = tmp_path / "run"
    cfg = TrainConfig.build(method="torch-powersgd", steps=8, start_iter=2, bucket_cap_mb=0.01,
                            out=str(out), **{**DIGITS, "workers": 3, "eval_every": 0})
    summary = run_training(cfg)
    assert summary is not None and summary["status"] == STATUS_COMPLETED
    ranks = torch.load(resolve_checkpoint(out), weights_only=True)["ranks"]
    assert len(ranks) == 3
    # a memory per bucket holding a compressed matrix: 3 of the CNN's buckets at 10 KB
    assert all(len(r["sync"]["powersgd"]["error"]) == 3 for r in ranks)


# ---------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"method": "topk"}, "method is 'gs' there but 'topk' here"),
        ({"workers": 3}, r"world_size is 2 there but 3 here \(--workers\)"),
        ({"model": "mlp"}, "model is 'cnn' there but 'mlp' here"),
    ],
)
def test_resuming_another_run_is_refused_naming_what_differs(
    gs_run, tmp_path: Path, change: dict[str, Any], match: str
) -> None:
    out, _ = gs_run
    cfg = TrainConfig.build(**{**DIGITS, "steps": 40, "resume": str(out), "out": str(tmp_path),
                         "method": "gs", **change})
    with pytest.raises(ValueError, match=match):
        prepare(cfg)


def test_corrupt_checkpoint_is_a_clear_error_naming_the_file(gs_run, tmp_path: Path) -> None:
    out, _ = gs_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    latest = resolve_checkpoint(copy)
    latest.write_bytes(latest.read_bytes()[:1000])
    cfg = TrainConfig.build(method="gs", steps=40, resume=str(copy), **DIGITS)
    with pytest.raises(CheckpointError, match="corrupt or truncated") as info:
        prepare(cfg)
    assert str(latest) in str(info.value) and "step-00000016.pt" in str(info.value)


def test_resuming_a_finished_run_says_to_raise_steps(gs_run) -> None:
    out, _ = gs_run
    with pytest.raises(ValueError, match="nothing to train.*--steps 40"):
        prepare(TrainConfig.build(method="gs", steps=STEPS, resume=str(out), **DIGITS))


def test_a_fresh_run_does_not_write_over_an_earlier_one(gs_run, tmp_path: Path) -> None:
    out, _ = gs_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    with pytest.raises(ValueError, match="already holds a run.*--resume.*--overwrite"):
        prepare(TrainConfig.build(method="gs", steps=5, out=str(copy), **DIGITS))
    prepare(TrainConfig.build(method="gs", steps=5, out=str(copy), overwrite=True, **DIGITS))
    assert not (copy / "metrics.jsonl").exists()
    assert not list((copy / CHECKPOINT_DIR).glob("step-*.pt"))


def test_non_finite_loss_stops_every_worker_cleanly(first_runs) -> None:
    out, summary = first_runs["nonfinite"]
    assert summary is not None
    assert summary["status"] == STATUS_NONFINITE
    assert "not finite" in summary["message"] and "--lr" in summary["message"]
    assert summary["steps"] < 30
    assert len(read_metrics(out / "metrics.jsonl")) == summary["steps"]


# ---------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"steps": 0}, r"--steps=0 is invalid: it must be an integer >= 1"),
        ({"lr": -1.0}, r"--lr=-1.0 is invalid: it must be a number > 0"),
        ({"momentum": 1.0}, r"--momentum=1.0 is invalid: it must be a number in \[0, 1\)"),
        ({"method": "adam"}, r"--method='adam' is invalid: it must be one of dense, topk"),
        ({"method": "dense16"}, r"--method='dense16' is invalid.*ddp-fp16.*--plugin"),
        ({"method": "topk", "rows": 5}, "--rows does not apply to --method topk; it applies to "
         "sketched, gs"),
        ({"method": "dense", "density": 0.1}, "--density does not apply to --method dense"),
        ({"method": "ddp-allreduce", "rows": 3}, "--rows does not apply to --method ddp-allreduce"),
        ({"method": "gs", "rows": 4}, r"--rows=4 is invalid: it must be an odd.* \(--method gs\)"),
        ({"density": 0.1, "k": 5}, "give only one"),
        ({"density": 2.0}, r"--density=2.0 is invalid: it must be a number in \(0, 1\]"),
        ({"method": "dense", "payload_dtype": "int8"}, "--payload-dtype='int8' is invalid"),
        ({"method": "gs", "local_momentum": 1.5}, r"--local-momentum=1.5 is invalid: .*\[0, 1\)"),
        ({"method": "topk", "warmup_density": 0.0}, r"--warmup-density=0.0 is invalid"),
        ({"plugins": ("no_such_module_xyz",)}, "--plugin 'no_such_module_xyz' cannot be imported"),
        ({"method": "torch-powersgd", "start_iter": 1}, r"--start-iter=1 is invalid: .* >= 2"),
        ({"method": "powersgd", "powersgd_rank": 0}, r"--powersgd-rank=0 is invalid: .* >= 1"),
        ({"method": "powersgd", "density": 0.1}, "--density does not apply to --method powersgd"),
        ({"method": "ddp-powersgd"}, "PyTorch's own PowerSGD hook is torch-powersgd"),
        ({"fail_at": (1,)}, "RANK:STEP"),
        ({"bucket_cap_mb": 0}, r"--bucket-cap-mb=0 is invalid: it must be a number in \(0, 1024\]"),
        ({"method": "gs", "table_dtype": "int8"}, "--table-dtype='int8' is invalid"),
        ({"method": "topk", "table_dtype": "float16"}, "--table-dtype does not apply to --method topk"),
        ({"optimizer": "adam"}, r"--optimizer='adam' is invalid: it must be one of sgd, adamw"),
        ({"optimizer": "adamw", "momentum": 0.9}, "--momentum=0.9 is invalid: .* AdamW"),
        ({"optimizer": "adamw", "betas": (0.9, 1.0)}, r"--betas=\(0.9, 1.0\) is invalid"),
        ({"method": "topk", "feedback": "ef22"}, "--feedback='ef22' is invalid: .* ef, ef21"),
        ({"method": "gtopk", "feedback": "fetchsgd"}, "--feedback='fetchsgd' is invalid: .* "
         "ef, ef21, global, onebit for this method"),
        ({"method": "dense", "feedback": "ef21"}, "--feedback does not apply to --method dense"),
        ({"freeze_variance_after": 100}, "--freeze-variance-after=100 is invalid: it freezes "
         "AdamW's variance. Add --optimizer adamw"),
        ({"optimizer": "adamw", "freeze_variance_after": 100, "start_iter": 5},
         "--start-iter=5 is invalid: --freeze-variance-after 100 sets it to 100"),
        ({"optimizer": "adamw", "freeze_variance_after": 9, "feedback": "ef21"},
         "--feedback='ef21' is invalid: --freeze-variance-after 9 sets it to 'onebit'"),
        ({"method": "dense", "optimizer": "adamw", "freeze_variance_after": 9},
         "--freeze-variance-after does not apply to --method dense"),
        ({"optimizer": "adamw", "freeze_variance_after": 100, "steps": 100},
         "--freeze-variance-after=100 is invalid: it must be below --steps 100 .* Use a "
         "tenth of the run, --freeze-variance-after 10"),
        ({"optimizer": "adamw", "freeze_variance_after": -1},
         "--freeze-variance-after=-1 is invalid: it must be an integer >= 0"),
        ({"optimizer": "adamw", "adam_variance": "slow"},
         "--adam-variance='slow' is invalid: it must be one of frozen, moving"),
        ({"adam_variance": "moving"}, "--adam-variance='moving' is invalid: it applies to "
         "1-bit Adam's recipe only"),
        ({"optimizer": "adamw", "freeze_variance_after": 0, "adam_variance": "moving"},
         "--adam-variance='moving' is invalid: it applies to 1-bit Adam's recipe only"),
        ({"method": "dense", "optimizer": "adamw", "adam_variance": "moving"},
         "--adam-variance does not apply to --method dense"),
    ],
)
def test_bad_settings_name_the_flag_the_range_and_the_fix(
    settings: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        TrainConfig.build(**settings)


@pytest.mark.parametrize(
    ("settings", "lr", "momentum", "local"),
    [
        ({"method": "gs"}, 0.2, 0.0, None),  # images: plain SGD with error feedback
        ({"method": "dense"}, 0.05, 0.9, None),
        # a language model: sparse methods move the momentum into the aggregator (DGC)
        ({"method": "gs", "dataset": "shakespeare"}, 1.6, 0.0, 0.9),
        ({"method": "dense", "dataset": "shakespeare"}, 0.8, 0.9, None),
        ({"method": "topk", "dataset": "text:x.txt", "model": "gpt"}, 1.6, 0.0, 0.9),
        ({"method": "gtopk", "dataset": "shakespeare", "momentum": 0.0}, 1.6, 0.0, 0.9),
        # the user's own momentum setup is kept, and the optimizer's stays off where the
        # aggregator keeps one
        ({"method": "topk", "dataset": "shakespeare", "momentum": 0.9}, 1.6, 0.9, None),
        ({"method": "topk", "dataset": "shakespeare", "local_momentum": 0.0}, 1.6, 0.9, 0.0),
        ({"method": "gs", "dataset": "shakespeare", "feedback": "global",
          "local_momentum": 0.9}, 1.6, 0.0, 0.9),
        ({"method": "gs", "dataset": "shakespeare", "feedback": "ef21"}, 1.6, 0.9, None),
        ({"method": "topk", "optimizer": "adamw"}, 0.001, 0.0, 0.9),  # 1-bit Adam's beta1
        # AdamW's lr: the character LSTM's best, 0.01; elsewhere 0.001
        ({"method": "dense", "dataset": "shakespeare", "optimizer": "adamw"}, 0.01, 0.0, None),
        ({"method": "gs", "dataset": "text:x.txt", "model": "lm", "optimizer": "adamw"}, 0.01,
         0.0, 0.9),
        ({"method": "dense", "dataset": "shakespeare", "model": "gpt", "optimizer": "adamw"},
         0.001, 0.0, None),
        ({"method": "topk", "dataset": "shakespeare", "lr": 0.3, "momentum": 0.5}, 0.3, 0.5,
         None),
    ],
)
def test_the_default_recipe_follows_the_model_family_and_the_optimizer(
    settings: dict[str, Any], lr: float, momentum: float, local: float | None
) -> None:
    cfg = TrainConfig.build(**settings)
    for checked in (cfg, dataclasses.replace(cfg)):  # checked again on the workers
        assert (checked.lr, checked.momentum, checked.option("momentum")) == (lr, momentum,
                                                                          local)


def test_freezing_the_variance_sets_1bit_adams_recipe() -> None:
    """N dense AdamW steps, then the momentum (beta1) compressed: the hook's start, its
    feedback and its momentum follow from the one flag, and the optimizer freezes at N."""
    cfg = TrainConfig.build(method="gs", dataset="shakespeare", optimizer="adamw",
                      betas=(0.8, 0.99), freeze_variance_after=50)
    assert (cfg.start_iter, cfg.option("feedback"), cfg.option("momentum")) == (50, "onebit", 0.8)
    assert cfg.aggregator_options()["feedback"] == "onebit"
    opt = make_optimizer(torch.nn.Linear(2, 2), cfg)
    assert isinstance(opt, FrozenVarianceAdamW) and opt.defaults["freeze_step"] == 50
    compare = settings_for("dense", {"freeze_variance_after": 50, "optimizer": "adamw"})
    assert compare == {"optimizer": "adamw"}  # compare's dense trains with plain AdamW


@pytest.mark.parametrize(
    ("settings", "freeze"),
    [
        ({"method": "topk", "optimizer": "adamw"}, ADAMW_FREEZE_STEPS),  # the default
        ({"method": "topk", "optimizer": "adamw", "freeze_variance_after": 0}, 0),  # off
        ({"method": "topk", "optimizer": "adamw", "feedback": "ef"}, None),  # chosen
        ({"method": "gs", "optimizer": "adamw", "start_iter": 5}, None),
        # streaming gs carries 1-bit Adam's momentum too
        ({"method": "gs", "optimizer": "adamw", "overlap": "stream"}, ADAMW_FREEZE_STEPS),
        ({"method": "dense", "optimizer": "adamw"}, None),
        ({"method": "gs"}, None),  # SGD
    ],
)
def test_a_sparse_method_under_adamw_freezes_the_variance_by_default(
    settings: dict[str, Any], freeze: int | None
) -> None:
    cfg = TrainConfig.build(**settings)
    for checked in (cfg, dataclasses.replace(cfg)):  # a config is checked again on workers
        assert checked.freeze_variance_after == freeze
        assert (checked.option("feedback") == "onebit") == bool(freeze)
        assert isinstance(make_optimizer(torch.nn.Linear(2, 2), checked),
                          FrozenVarianceAdamW) == bool(freeze)


@pytest.mark.parametrize(("steps", "freeze"), [(100, 10), (150, 15), (9, 0)])
def test_a_run_shorter_than_the_default_warm_up_lowers_it_and_says_so(
    steps: int, freeze: int
) -> None:
    """``--steps 100`` under AdamW: the default 150 dense steps would leave the whole run
    dense; a tenth of the run is used instead (none below 10 steps), with a warning."""
    with pytest.warns(UserWarning, match=rf"--steps {steps} is not longer than AdamW's "
                      rf"default dense warm-up of {ADAMW_FREEZE_STEPS} steps.*"
                      rf"--freeze-variance-after {freeze}"):
        cfg = TrainConfig.build(method="gs", optimizer="adamw", steps=steps)
    assert cfg.freeze_variance_after == freeze and (cfg.start_iter == freeze or not freeze)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        again = dataclasses.replace(cfg)  # checked again on the workers: kept, no new warning
    assert again.freeze_variance_after == freeze
    assert not [w for w in seen if "dense warm-up" in str(w.message)]


@pytest.mark.parametrize(
    ("settings", "variance"),
    [
        ({}, "frozen"),  # 1-bit Adam's, at every density
        ({"density": 0.001}, "frozen"),
        ({"k": 10}, "frozen"),
        ({"density": 0.001, "adam_variance": "moving"}, "moving"),  # given: kept
        ({"density": 0.01, "adam_variance": "moving"}, "moving"),
    ],
)
def test_1bit_adams_variance_is_frozen_unless_given(
    settings: dict[str, Any], variance: str
) -> None:
    cfg = TrainConfig.build(method="gs", optimizer="adamw", **settings)
    for checked in (cfg, dataclasses.replace(cfg)):  # a config is checked again on workers
        assert checked.adam_variance == variance
        opt = make_optimizer(torch.nn.Linear(2, 2), checked)
        assert isinstance(opt, FrozenVarianceAdamW) and opt.defaults["variance"] == variance
    off = TrainConfig.build(method="gs", optimizer="adamw", freeze_variance_after=0, **{
        key: value for key, value in settings.items() if key != "adam_variance"})
    assert off.adam_variance is None  # no 1-bit Adam's recipe: no variance to choose


def test_density_too_small_for_k_is_caught_before_any_worker_starts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="k"):
        prepare(TrainConfig.build(method="topk", k=10**9, out=str(tmp_path), **DIGITS))


def test_settings_for_drops_what_a_method_does_not_take() -> None:
    settings = {"rows": 7, "density": 0.1, "exact": False, "lr": 0.1, "powersgd_rank": 4}
    assert settings_for("ddp-allreduce", settings) == {"lr": 0.1}
    assert settings_for("dense", settings) == {"lr": 0.1}
    assert settings_for("topk", settings) == {"density": 0.1, "lr": 0.1}
    assert settings_for("gs", settings) == {"rows": 7, "density": 0.1, "exact": False, "lr": 0.1}
    assert settings_for("powersgd", settings) == {"lr": 0.1, "powersgd_rank": 4}
    assert settings_for("torch-powersgd", settings) == {"lr": 0.1, "powersgd_rank": 4}


# ---------------------------------------------------------------------------- byte accounting


def test_builtin_hooks_are_counted_with_the_ring_figure() -> None:
    shapes = [torch.Size([50, 100]), torch.Size([50])]  # a Linear(100, 50)
    d = 50 * 100 + 50
    assert builtin_hook_bytes("ddp-allreduce", shapes, 4, compressed=False) == (2 * 3 * 4 * d) // 4
    assert builtin_hook_bytes("ddp-fp16", shapes, 4, compressed=False) == (2 * 3 * 2 * d) // 4
    # PowerSGD before its start iteration: the dense all-reduce.
    assert builtin_hook_bytes("torch-powersgd", shapes, 4, compressed=False) == (2 * 3 * 4 * d) // 4
    # After: the bias uncompressed, the weight as P (50 x 2) and Q (100 x 2), three all-reduces.
    want = sum(ring_allreduce_bytes(4 * n, 4) for n in (50, 50 * 2, 100 * 2))
    assert builtin_hook_bytes("torch-powersgd", shapes, 4, compressed=True, powersgd_rank=2) == want
    with pytest.raises(ValueError, match="no built-in DDP hook"):
        builtin_hook_bytes("gs", shapes, 4, compressed=True)


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"local_steps": 0}, r"--local-steps=0 is invalid: it must be an integer >= 1"),
        ({"outer_lr": 0.5}, r"--outer-lr=0.5 is invalid: it sets the outer step.*--local-steps"),
        ({"local_steps": 3, "outer_lr": 0}, r"--outer-lr=0 is invalid: it must be a number > 0"),
        ({"local_steps": 3, "outer_momentum": 1.0}, r"--outer-momentum=1.0 is invalid.*\[0, 1\)"),
        ({"outer_error_decay": 0.9}, r"--outer-error-decay=0.9 is invalid: it sets the outer"),
        ({"local_steps": 3, "outer_error_decay": 0}, r"--outer-error-decay=0 is invalid.*\(0, 1\]"),
        ({"local_steps": 3, "method": "dense", "outer_error_decay": 0.9},
         r"--outer-error-decay does not apply to --method dense; it applies to topk"),
        ({"local_steps": 3, "method": "ddp-allreduce"}, r"--method='ddp-allreduce' is invalid"),
        ({"local_steps": 3, "per_bucket": True, "amp": "fp16"},
         r"--per-bucket, --amp cannot be combined with --local-steps"),
        ({"local_steps": 3, "optimizer": "adamw", "freeze_variance_after": 5},
         r"--freeze-variance-after cannot be combined with --local-steps"),
    ],
)
def test_bad_local_step_settings_are_clear_errors(settings: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TrainConfig.build(**{**DIGITS, "method": "gs", **settings})


def test_local_steps_take_denses_inner_recipe_and_no_warm_up() -> None:
    """The inner optimizer trains alone, as dense does (momentum SGD at dense's lr, not the
    sparse methods' plain SGD at 0.2); the outer step has DiLoCo's defaults, and the density
    warm-up (counted in aggregation steps) is off."""
    cfg = TrainConfig.build(**{**DIGITS, "method": "gs", "local_steps": 10})
    dense = TrainConfig.build(**{**DIGITS, "method": "dense"})
    assert (cfg.lr, cfg.momentum) == (dense.lr, dense.momentum)
    assert (cfg.outer_lr, cfg.outer_momentum, cfg.option("warmup_steps")) == (0.7, 0.9, None)
    assert cfg.outer_error_decay is None  # classic error feedback unless told
    adamw = TrainConfig.build(**{**DIGITS, "method": "gs", "local_steps": 10, "optimizer": "adamw"})
    assert not adamw.freeze_variance_after  # plain AdamW inside, no 1-bit Adam schedule


# ---------------------------------------------------------------------------- NaN gradients
NAN_MODEL = '''
import torch
from torch import nn


class NanFrom(nn.Module):
    """An MLP whose loss stays finite while its gradients turn NaN from the 20th training
    forward on (a model that broke the backward, not the forward)."""

    def __init__(self, data):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, data.num_classes))
        self.calls = 0

    def forward(self, x):
        out = self.net(x)
        if self.training:
            self.calls += 1
            if self.calls > 20 and out.requires_grad:
                out.register_hook(lambda g: g * float("nan"))
        return out


def model(data):
    return NanFrom(data)
'''


@pytest.mark.parametrize("simulate", [False, True])
def test_gradients_that_stay_non_finite_end_the_run_loudly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, simulate: bool) -> None:
    """A 60-step run whose gradients are NaN from step 20 on stops after a tenth of the run
    (6) of skipped steps in a row: non-zero exit, a message naming the limit and the kept
    checkpoint, which is the last one before the NaNs (the skipped steps moved nothing)."""
    from gssgd.cli.main import main

    (tmp_path / "nan_model.py").write_text(NAN_MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    code = main(["train", "--method", "gs", "--density", "0.1", "--dataset",
                 "examples.user_model:blobs", "--model", "nan_model:model", "--steps", "60",
                 "--checkpoint-every", "10", "--eval-every", "10", "--batch-size", "16",
                 "--workers", "2", "--no-progress", "--timeout", "60", "--out", str(out)]
                + (["--simulate"] if simulate else []))
    summary = json.loads((out / "summary.json").read_text())
    assert code == 1, summary
    assert summary["status"] == STATUS_NONFINITE
    assert "max_consecutive_skips=6" in summary["message"], summary["message"]
    assert summary["steps"] < 30
    if not simulate:  # the simulated world keeps no checkpoints
        assert "step-00000020.pt" in summary["message"] and "is kept" in summary["message"]
        assert resolve_checkpoint(out).name == "step-00000020.pt"


@pytest.mark.parametrize("simulate", [False, True])
def test_a_model_with_frozen_parameters_records_and_resumes_its_trained_size(
        tmp_path: Path, simulate: bool) -> None:
    """``d`` is what trains (the second layer of tests.train.frozen_model): the config and
    summary say so on real and simulated workers, and a real run resumes from its own
    checkpoint (the fingerprint prepare checks is the one the loop wrote)."""
    out = tmp_path / "run"
    settings = {**DIGITS, "method": "topk", "density": 0.1, "out": str(out),
                "model": "tests.train.frozen_model:frozen_mlp", "simulate": simulate}
    first = run_training(TrainConfig.build(**{**settings, "steps": 3}))
    assert first is not None and first["status"] == STATUS_COMPLETED
    trained = 32 * 10 + 10  # the second layer: 32 inputs x 10 classes, and its biases
    assert first["d"] == json.loads((out / "config.json").read_text())["d"] == trained
    if not simulate:
        resumed = run_training(TrainConfig.build(**{**settings, "steps": 5, "resume": str(out)}))
        assert resumed is not None and resumed["status"] == STATUS_COMPLETED
        assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(5))
