"""Exact resume through the training loop for every gssgd method, with and without local
momentum: N steps in one go, and N/2 steps then a resume to N in fresh processes, end with
bitwise the same parameters, optimizer state, random state and per-rank hook state
(residuals, momentum buffers, counters) in the final checkpoint.

Speed: every training run of one phase shares one launch of the workers (starting two
processes costs more than the runs themselves): the uninterrupted and the first-half runs of
every method in one, the resumed halves in another, so a resumed run never shares a process
with the run that wrote its checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gssgd.train.checkpoint import CHECKPOINT_DIR, checkpoint_name, resolve_checkpoint
from gssgd.train.launch import Worker, launch
from gssgd.train.loop import METHODS, TrainConfig, prepare, train_worker
from gssgd.train.metrics import read_metrics

#: The gssgd methods this file resumes, as the training loop names them when the module is
#: imported ("dense" is here while it names a method the loop accepts).
RESUMED = [m for m in ("dense", "topk", "gtopk", "sketched", "gs", "powersgd") if m in METHODS]
#: Small and fast: 2 workers on digits; no evaluation before the last step.
BASE: dict[str, Any] = dict(dataset="digits", workers=2, batch_size=16, eval_every=0,
                            progress=False, timeout=120.0)  # fmt: skip
#: Steps of the whole run. Compression starts at step 2 (the default start iteration), so
#: the resume at STEPS // 2 = 4 lands among compressed steps, with residuals to carry.
STEPS = 8
MOMENTUM = {
    "none": {},
    "local_momentum": {"local_momentum": 0.9},
    "per_bucket": {"per_bucket": True},
    # the optimizers users keep: momentum SGD and AdamW on EF21's estimate, and EF21-SGDM
    "momentum_sgd": {"momentum": 0.9, "feedback": "ef21"},
    "adamw": {"optimizer": "adamw", "weight_decay": 0.01, "feedback": "ef21"},
    "ef21m": {"local_momentum": 0.9, "feedback": "ef21"},
    # momentum kept by the aggregator (alike on every rank), and FetchSGD's in sketch space
    "global": {"local_momentum": 0.9, "feedback": "global"},
    # 1-bit Adam's recipe: dense AdamW for 3 steps, then the variance frozen and the
    # momentum compressed (the hook keeps the shared momentum)
    "frozen_adamw": {"optimizer": "adamw", "freeze_variance_after": 3},
    # the same with the variance kept moving: the resume must restore v as it moved
    "moving_adamw": {"optimizer": "adamw", "freeze_variance_after": 3, "adam_variance": "moving"},
    "fetchsgd_sketched": {"local_momentum": 0.9, "feedback": "fetchsgd", "rows": 3},
    "fetchsgd_gs": {"local_momentum": 0.9, "feedback": "fetchsgd", "rows": 3, "exact": False},
    # gs sketching every third step: the resume (aggregation step 2) lands on a step that
    # reuses the candidates kept in the checkpoint
    "reuse_gs": {"reuse": 3, "warmup_steps": 0},
    # local steps, H = 3: the resume (step 4) lands between outer steps (after 3, before 6)
    "local_steps": {"local_steps": 3},
}
#: variants for some methods only
ONLY_FOR = {"fetchsgd_sketched": ("sketched",), "fetchsgd_gs": ("gs",), "reuse_gs": ("gs",),
            "moving_adamw": ("gs",), "local_steps": ("dense", "gs")}  # the optimizer's own state: one method shows it
#: the variants whose state is FetchSGD's sketch tables (no residual, no vector momentum)
FETCHSGD = ("fetchsgd_sketched", "fetchsgd_gs")
#: the variants whose aggregators keep EF21's estimate
EF21 = ("momentum_sgd", "adamw", "ef21m")


def _cases() -> list:
    """(method, momentum variant) for every combination the training loop accepts."""
    cases = []
    for method in RESUMED:
        for variant, settings in MOMENTUM.items():
            if method not in ONLY_FOR.get(variant, (method,)):
                continue
            try:
                TrainConfig.build(method=method, steps=STEPS, **BASE, **settings)
            except ValueError as err:  # e.g. local momentum for a method without residuals,
                # or a feedback mode PowerSGD lacks (it has classic and 1-bit Adam's)
                if "does not apply" not in str(err) and "PowerSGD takes" not in str(err):
                    raise
                continue
            cases.append((method, variant))
    return cases


CASES = _cases()


def train_all(worker: Worker, cfgs: list[TrainConfig]) -> list[dict[str, Any] | None]:
    """Train every config in turn on this launch's workers (each run from scratch, or from
    its checkpoint, exactly as ``run_training`` would start it)."""
    return [train_worker(worker, cfg) for cfg in cfgs]


def _load(run: Path, step: int) -> dict[str, Any]:
    path = run / CHECKPOINT_DIR / checkpoint_name(step)
    return torch.load(path, weights_only=True)


def _differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Where two checkpoint parts differ (tensors bit for bit, with dtype and shape)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
        return [] if same else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where} keys {sorted(map(str, a))} vs {sorted(map(str, b))}"]
        return [d for k in a for d in _differences(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where} length {len(a)} vs {len(b)}"]
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in _differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} vs {b!r}"]


def _hook_buckets(ckpt: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's aggregator states (one per bucket; whole-model mode has one)."""
    return [
        sd
        for rank in ckpt["ranks"]
        for sd in rank["sync"].get("hook", {}).get("buckets", {}).values()
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Path]]:
    """For every case: an uninterrupted run ("full") and one stopped at STEPS // 2, then
    resumed to STEPS ("part")."""
    root = tmp_path_factory.mktemp("resume")
    dirs = {
        case: {"full": root / f"{case[0]}-{case[1]}-full", "part": root / f"{case[0]}-{case[1]}-part"}
        for case in CASES
    }
    first = []
    for (method, variant), d in dirs.items():
        settings = {"method": method, **BASE, **MOMENTUM[variant]}
        first.append(prepare(TrainConfig.build(steps=STEPS, out=str(d["full"]), **settings)))
        first.append(prepare(TrainConfig.build(steps=STEPS // 2, out=str(d["part"]), **settings)))
    launch(train_all, 2, (first,), timeout_s=BASE["timeout"])
    second = [
        prepare(
            TrainConfig.build(method=method, steps=STEPS, out=str(d["part"]), resume=str(d["part"]),
                        **BASE, **MOMENTUM[variant])  # fmt: skip
        )
        for (method, variant), d in dirs.items()
    ]
    launch(train_all, 2, (second,), timeout_s=BASE["timeout"])
    return dirs


def check_hook_totals(want: dict, got: dict) -> None:
    """Pop the hook's running totals from two sync states and compare them: the same
    iterations by kind, bytes and messages (its fresh aggregators check again that the ranks
    agree, a launch check whose bytes are no step's)."""
    hooks = (want.get("hook"), got.get("hook"))
    if hooks[0] is None:
        return
    want_totals, got_totals = (h.pop("totals") for h in hooks)
    assert got_totals == want_totals


def test_every_gssgd_method_of_the_loop_is_resumed() -> None:
    """The methods and the momentum variants this file covers (if the loop drops or renames
    one, this says so rather than the file silently testing less)."""
    assert {"topk", "gtopk", "sketched", "gs"} <= set(RESUMED), METHODS
    for method in ("topk", "gtopk", "sketched", "gs"):
        for variant in MOMENTUM:
            assert (method, variant) in CASES or method not in ONLY_FOR.get(variant, (method,))


@pytest.mark.parametrize(("method", "variant"), CASES, ids=[f"{m}-{v}" for m, v in CASES])
def test_resumed_run_ends_bitwise_equal_to_the_uninterrupted_one(
    runs: dict, method: str, variant: str
) -> None:
    full, part = runs[(method, variant)]["full"], runs[(method, variant)]["part"]
    want, got = _load(full, STEPS), _load(part, STEPS)
    assert resolve_checkpoint(part).name == checkpoint_name(STEPS)
    assert got["step"] == want["step"] == STEPS
    assert _differences(want["model"], got["model"], "model") == []
    assert _differences(want["optimizer"], got["optimizer"], "optimizer") == []
    assert len(got["ranks"]) == 2
    for r, (a, b) in enumerate(zip(want["ranks"], got["ranks"], strict=True)):
        check_hook_totals(a["sync"], b["sync"])
        # sync: the hook's residuals, momentum buffers and counters of this rank
        assert _differences(a["sync"], b["sync"], f"rank {r} sync") == []
        assert _differences(a["rng"], b["rng"], f"rank {r} rng") == []
    # The resumed half trained: its parameters moved from those it resumed from.
    assert _differences(_load(part, STEPS // 2)["model"], got["model"]) != []


@pytest.mark.parametrize(("method", "variant"), CASES, ids=[f"{m}-{v}" for m, v in CASES])
def test_the_resume_point_carries_state(runs: dict, method: str, variant: str) -> None:
    """The checkpoint resumed from holds what an exact resume must restore: every rank's
    aggregator after its compressed steps, with non-zero residuals (methods with error
    feedback) and, with local momentum, non-zero momentum buffers; so a resume that
    dropped either would show in the test above."""
    mid = _load(runs[(method, variant)]["part"], STEPS // 2)
    assert mid["step"] == STEPS // 2
    if variant == "local_steps":  # one outer step taken, one inner step since
        for rank in mid["ranks"]:
            local = rank["sync"]["local_steps"]
            assert (local["inner_steps"], local["outer_steps"]) == (4, 1)
            if method == "gs":  # dense keeps no residual
                assert torch.count_nonzero(local["aggregator"]["residual"]) > 0
            assert torch.count_nonzero(local["outer"]["state"][0]["momentum_buffer"]) > 0
        return
    buckets = _hook_buckets(mid)
    if not buckets:  # DDP's own all-reduce, no hook: parameters and optimizer are all
        assert method == "dense" and variant == "none"
        return
    assert len(buckets) == 2  # whole-model mode: one aggregator per rank
    for sd in buckets:
        assert sd["method"] == method
        assert 0 < sd["steps"] < STEPS // 2  # it compressed before (after the dense start)
        if variant in FETCHSGD:  # the error and velocity are tables (the server's, sketched)
            assert torch.count_nonzero(sd["residual"]) == 0 and "momentum" not in sd
            tables = sd["sketch_feedback"]
            if method == "gs" or sd is buckets[0]:
                assert torch.count_nonzero(tables["error"]) > 0
                assert torch.count_nonzero(tables["velocity"]) > 0
            continue
        if method != "dense":
            assert torch.count_nonzero(sd["residual"]) > 0
        if variant in ("local_momentum", "global", "frozen_adamw", "moving_adamw", *EF21):
            assert torch.count_nonzero(sd["momentum"]) > 0
        else:
            assert "momentum" not in sd
        if variant in EF21:
            assert torch.count_nonzero(sd["estimate"]) > 0
        else:
            assert "estimate" not in sd
        if variant == "reuse_gs":  # the candidates the resumed step reuses
            assert sd["kept_candidates"].numel() > 0


def test_metrics_hold_every_step_once(runs: dict) -> None:
    for (method, variant), d in runs.items():
        steps = [r["step"] for r in read_metrics(d["part"] / "metrics.jsonl")]
        assert steps == list(range(STEPS)), (method, variant)


BYTE_KEYS = ("bytes_sent", "bytes_sent_max", "bytes_received", "bytes_received_max",
             "bytes_sent_total")


def test_a_resumed_run_counts_the_bytes_of_the_uninterrupted_one(runs: dict) -> None:
    """Step by step, the resumed run's byte counts are the uninterrupted run's (its fresh
    aggregators' launch check counted 40 bytes more at the first resumed step)."""
    for (method, variant), d in runs.items():
        full = read_metrics(d["full"] / "metrics.jsonl")
        part = read_metrics(d["part"] / "metrics.jsonl")
        for a, b in zip(full, part, strict=True):
            assert {k: a[k] for k in BYTE_KEYS if k in a} == {
                k: b[k] for k in BYTE_KEYS if k in b}, (method, variant, a["step"])
