"""Mixed precision through the hook: ``torch.autocast`` + ``torch.amp.GradScaler`` on CPU.

Real gloo processes (world sizes 2 and 3), every method, whole-model and per-bucket mode:

* an overflow injected on one rank at one step (a gradient hook multiplies one layer's
  gradient by Inf) under float16 and bfloat16 autocast: every rank's buckets come back
  all-NaN, the scaler skips the step on every rank (weights bitwise unchanged) and halves
  its scale, the residuals and momentum are bitwise those before the step, and training
  goes on (the weights move again, ranks stay identical);
* the residuals follow the scale: in float32 (where scaling by a power of two is exact) a
  run with an overflow at step s ends bitwise equal to a run that never had step s, its
  residuals exactly half of the other's (the scale it is in is half): nothing lost, nothing
  counted twice;
* float16 gradients keep float32 residuals and gs/Sketched-SGD float32 sketch tables
  (``table_dtype`` only on the wire), and update bitwise as the float32 gradient would.

The worker functions live here too (spawned processes import this module).
"""

from __future__ import annotations

import pickle
import traceback
import warnings

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gssgd
from gssgd.amp import LossScaleFollower, make_scaler, scaler_options
from gssgd.ddp import HookState, comm_hook
from tests.ddp.scenarios import CAP_MB, batch, make_model
from tests.dist_utils import raise_worker_errors, run_workers

SKETCH = {"rows": 3, "cols": 160, "candidates": 2}
#: method -> options (local momentum on the sparse ones, so the momentum is checked too)
OPTIONS: dict[str, dict] = {
    "dense": {},
    "topk": {"density": 0.02, "momentum": 0.5},
    "gtopk": {"density": 0.02, "momentum": 0.5},
    "sketched": {"density": 0.02, **SKETCH},
    "gs": {"density": 0.02, "momentum": 0.5, **SKETCH},
}
#: hook variants beside the methods: (method, whole_model only, extra HookState arguments)
STREAM = {"gs-stream": ("gs", {"overlap": "stream"})}
STEPS = 6
OVERFLOW_STEP = 3  # a compressed step (start_iter=1) with residuals to keep
INIT_SCALE = 2.0**10
LR = 0.05


#: (method, whole_model, autocast) of the overflow runs; (method, whole_model) of the
#: float32 runs that check the residuals follow the scale
CASES = [(m, w, a) for m in OPTIONS for w in (True, False) for a in ("fp16", "bf16")]
CASES += [("gs-stream", True, a) for a in ("fp16", "bf16")]
RESCALE = [(m, w) for m in OPTIONS for w in (True, False)] + [("gs-stream", True)]


# ----------------------------------------------------------------------------- workers
def _hook_tensors(state: HookState) -> dict[str, torch.Tensor]:
    """Every residual and momentum buffer of the hook, cloned."""
    out = {}
    for i, sd in state.state_dict()["buckets"].items():
        for key in ("residual", "momentum"):
            if key in sd:
                out[f"{i}/{key}"] = sd[key].clone()
    return out


def _params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def _train(rank: int, method: str, whole: bool, amp: torch.dtype | None,
           overflow_at: int | None, skip_step: int | None = None) -> dict:
    """STEPS steps of DDP + hook + GradScaler; ``overflow_at``: rank 1 % P's first-layer
    gradient is multiplied by Inf at that step; ``skip_step``: that step is left out."""
    world = dist.get_world_size()
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=CAP_MB)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE)
    method, extra = STREAM.get(method, (method, {}))
    opts = {**OPTIONS[method], **extra}
    state = HookState(method, density=opts.pop("density", None), start_iter=1,
                      whole_model=whole, model=model, scaler=scaler, **opts)
    ddp.register_comm_hook(state, comm_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    inject = {"on": False}
    first = next(iter(model.parameters()))
    first.register_hook(lambda g: g * float("inf") if inject["on"] else g)
    log = []
    for step in range(STEPS):
        if step == skip_step:
            continue
        inject["on"] = step == overflow_at and rank == 1 % world
        before, state_before = _params(model), _hook_tensors(state)
        scale_before = scaler.get_scale()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
            out = ddp(batch(rank, step))
        loss = out.float().square().mean()
        scaler.scale(loss).backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        scaler.step(optimizer)
        scaler.update()
        state_after = _hook_tensors(state)
        log.append({
            "step": step,
            "all_nan": bool(torch.isnan(grads).all()),
            "any_nonfinite": bool((~torch.isfinite(grads)).any()),
            "scale_before": scale_before,
            "scale_after": scaler.get_scale(),
            "moved": not torch.equal(before, _params(model)),
            "state_kept": set(state_before) == set(state_after) and all(
                torch.equal(state_before[k], state_after[k]) for k in state_before),
            "state_dtypes": sorted({str(t.dtype) for t in state_after.values()}),
            "skipped": bool(state.last_stats.skipped),
        })
    return {"log": log, "params": _params(model), "state": _hook_tensors(state),
            "saved_scale": state.state_dict().get("loss_scale")}


def _guarded(run, *args) -> dict:
    """``run(*args)``, or its error (a scenario's failure fails its own test only)."""
    try:
        return run(*args)
    except Exception:  # noqa: BLE001 - reported to the parent
        return {"error": traceback.format_exc()}


def overflow_runs(rank: int, world: int) -> dict:
    """Every method and mode, float16 and bfloat16 autocast, an overflow at OVERFLOW_STEP."""
    out = {}
    for method, whole, name in CASES:
        amp = {"fp16": torch.float16, "bf16": torch.bfloat16}[name]
        out[(method, whole, name)] = _guarded(_train, rank, method, whole, amp, OVERFLOW_STEP)
    return out


def rescale_runs(rank: int, world: int) -> dict:
    """Float32, every method and mode: an overflow at OVERFLOW_STEP vs no such step."""
    out = {}
    for method, whole in RESCALE:
        out[(method, whole)] = {
            "overflow": _guarded(_train, rank, method, whole, None, OVERFLOW_STEP),
            "never": _guarded(_train, rank, method, whole, None, None, OVERFLOW_STEP),
        }
    return out


def half_gradients(rank: int, world: int) -> dict:
    """Each method stepped with float16 gradients beside a twin stepped with the same
    gradients in float32: updates, residuals and sketch tables compared."""
    out = {}
    d = 3000
    for method, opts in {**OPTIONS, "gs16": {**OPTIONS["gs"], "table_dtype": torch.float16},
                         "bf16": OPTIONS["topk"]}.items():
        name = {"gs16": "gs", "bf16": "topk"}.get(method, method)
        dtype = torch.bfloat16 if method == "bf16" else torch.float16
        o = dict(opts)
        density = o.pop("density", None)
        low = gssgd.make_aggregator(name, d, density=density, **o)
        full = gssgd.make_aggregator(name, d, density=density, **o)
        same_update, same_state = True, True
        for step in range(3):
            gen = torch.Generator().manual_seed(100 * step + rank)
            g = (torch.randn(d, generator=gen) * 3).to(dtype)
            u_low, u_full = low.step(g), full.step(g.float())
            same_update &= u_low.dtype == dtype and torch.equal(u_low, u_full.to(dtype))
            if low.residual is not None:
                same_state &= torch.equal(low.residual, full.residual)
        out[method] = {
            "same_update": same_update,
            "same_state": same_state,
            "residual": str(low.residual.dtype) if low.residual is not None else None,
            "momentum": str(low.momentum_buffer.dtype) if low.momentum_buffer is not None else None,
            "table": str(low.sketch.table.dtype) if hasattr(low, "sketch") else None,
        }
    return out


#: (method, whole_model, extra HookState arguments) of the runs without ``scaler=``
NO_SCALER = {
    "topk-whole": ("topk", True, {}),
    "topk-bucket": ("topk", False, {}),
    "gs-stream": ("gs", True, {"overlap": "stream"}),
}
FIRST_OVERFLOW = 3  # every step from here on overflows on one rank
MAX_SKIPS = 3


def _without_scaler(rank: int, method: str, whole: bool, extra: dict) -> dict:
    """float16 autocast and a GradScaler the hook is not given (``nonfinite="skip"``, the
    default): one rank overflows at every step from FIRST_OVERFLOW on, until the hook's
    ``max_consecutive_skips`` stops the run. The warnings, the error and the scales."""
    world = dist.get_world_size()
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=CAP_MB)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE)
    opts = {**OPTIONS[method], **extra}
    state = HookState(method, density=opts.pop("density", None), start_iter=1,
                      whole_model=whole, model=model, max_consecutive_skips=MAX_SKIPS, **opts)
    ddp.register_comm_hook(state, comm_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    inject = {"on": False}
    next(iter(model.parameters())).register_hook(
        lambda g: g * float("inf") if inject["on"] else g)
    out: dict = {"stopped": None, "scales": [], "skipped": []}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for step in range(FIRST_OVERFLOW + MAX_SKIPS + 2):
            inject["on"] = step >= FIRST_OVERFLOW and rank == 1 % world
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = ddp(batch(rank, step)).float().square().mean()
            try:
                scaler.scale(loss).backward()
            except Exception as exc:  # noqa: BLE001 - the test reads it
                out["stopped"] = {"step": step, "type": type(exc).__name__, "text": str(exc)}
                break
            scaler.step(optimizer)
            scaler.update()
            out["scales"].append(scaler.get_scale())
            out["skipped"].append(bool(state.last_stats.skipped))
    out["warnings"] = [str(w.message) for w in seen if "gssgd" in str(w.message)]
    return out


def no_scaler_runs(rank: int, world: int) -> dict:
    return {name: _guarded(_without_scaler, rank, *run) for name, run in NO_SCALER.items()}


def all_scenarios(rank: int, world: int) -> dict:
    return {"overflow": overflow_runs(rank, world), "rescale": rescale_runs(rank, world),
            "half": half_gradients(rank, world)}


# ----------------------------------------------------------------------------- tests
@pytest.fixture(scope="module", params=[2, 3], ids=lambda p: f"P{p}")
def ranks(request: pytest.FixtureRequest) -> list[dict]:
    results = run_workers(request.param, all_scenarios)
    raise_worker_errors(results)
    return results


@pytest.mark.parametrize(("method", "whole", "amp"), CASES,
                         ids=[f"{m}-{'whole' if w else 'bucket'}-{a}" for m, w, a in CASES])
def test_an_overflow_on_one_rank_is_skipped_by_the_scaler_on_every_rank(
    ranks: list[dict], method: str, whole: bool, amp: str
) -> None:
    for r, res in enumerate(ranks):
        run = res["overflow"][(method, whole, amp)]
        assert "error" not in run, run.get("error")
        for entry in run["log"]:
            s = entry["step"]
            if s == OVERFLOW_STEP:
                # the same non-finite buckets everywhere, so the scaler finds the overflow
                assert entry["all_nan"], (r, entry)
                assert not entry["moved"], (r, entry)  # optimizer.step skipped
                assert entry["scale_after"] == entry["scale_before"] / 2, (r, entry)
                assert entry["state_kept"], (r, entry)  # residuals, momentum untouched
                assert entry["skipped"], (r, entry)  # reported in the hook's statistics
            else:
                assert not entry["any_nonfinite"], (r, entry)
                assert entry["moved"], (r, entry)  # training goes on
                assert entry["scale_after"] == entry["scale_before"], (r, entry)
            if method != "dense" and s >= 2:  # compressed (streaming gs: from step 2)
                assert entry["state_dtypes"] == ["torch.float32"], (r, entry)
        # every rank ends with the same weights
        assert torch.equal(run["params"], ranks[0]["overflow"][(method, whole, amp)]["params"])
        assert run["saved_scale"] == INIT_SCALE / 2


@pytest.mark.parametrize(("method", "whole"), RESCALE,
                         ids=[f"{m}-{'whole' if w else 'bucket'}" for m, w in RESCALE])
def test_a_skipped_overflow_loses_nothing_from_the_residuals(
    ranks: list[dict], method: str, whole: bool
) -> None:
    """Bitwise: the run whose step s overflowed equals the run that never had step s; its
    residuals and momentum are in units of half the scale, so exactly half."""
    for r, res in enumerate(ranks):
        runs = res["rescale"][(method, whole)]
        hit, never = runs["overflow"], runs["never"]
        assert "error" not in hit and "error" not in never, hit.get("error", never.get("error"))
        assert [e["step"] for e in never["log"]] == [s for s in range(STEPS) if s != OVERFLOW_STEP]
        assert torch.equal(hit["params"], never["params"]), r
        assert set(hit["state"]) == set(never["state"])
        if method != "dense":
            assert hit["state"], r  # residuals exist, and are non-zero
            assert any(torch.count_nonzero(t) > 0 for t in hit["state"].values())
        for key, tensor in hit["state"].items():
            assert torch.equal(tensor * 2, never["state"][key]), (r, key)
        assert hit["saved_scale"] * 2 == never["saved_scale"] == INIT_SCALE


@pytest.mark.parametrize("method", [*OPTIONS, "gs16", "bf16"])
def test_16_bit_gradients_keep_float32_state_and_tables(ranks: list[dict], method: str) -> None:
    for r, res in enumerate(ranks):
        got = res["half"][method]
        assert got["same_update"] and got["same_state"], (r, got)
        if method != "dense":
            assert got["residual"] == "torch.float32", (r, got)
        if method in ("topk", "gtopk", "gs", "bf16"):
            assert got["momentum"] == "torch.float32", (r, got)
        if method in ("sketched", "gs", "gs16"):
            assert got["table"] == "torch.float32", (r, got)  # gs16: float16 on the wire only


@pytest.fixture(scope="module")
def no_scaler() -> list[dict]:
    results = run_workers(2, no_scaler_runs)
    raise_worker_errors(results)
    return results


@pytest.mark.parametrize("run", list(NO_SCALER))
def test_a_scaler_run_without_scaler_is_told_where_it_skips(
    no_scaler: list[dict], run: str
) -> None:
    """Under a GradScaler the hook was not given, overflows become zero updates the scaler
    never sees: the first skipped step warns once, and the error that stops the run after
    max_consecutive_skips says how to give the hook the scaler."""
    for r, res in enumerate(no_scaler):
        got = res[run]
        assert "error" not in got, got["error"]
        # the trap itself: the steps were skipped and the scale never went down
        assert got["skipped"] == [False] * FIRST_OVERFLOW + [True] * (MAX_SKIPS - 1), (r, got)
        assert got["scales"] == [INIT_SCALE] * (FIRST_OVERFLOW + MAX_SKIPS - 1), (r, got)
        assert len(got["warnings"]) == 1, (r, got["warnings"])  # once, at the first skip
        text = got["warnings"][0]
        assert f"iteration {FIRST_OVERFLOW}: the hook skipped a non-finite gradient" in text
        assert "HookState(..., scaler=scaler) or state.use_scaler(scaler)" in text
        assert f"max_consecutive_skips={MAX_SKIPS}" in text
        stopped = got["stopped"]  # the error backward raised
        assert stopped is not None and stopped["step"] == FIRST_OVERFLOW + MAX_SKIPS - 1, got
        assert stopped["type"] == "FloatingPointError", stopped
        assert f"{MAX_SKIPS} consecutive steps were skipped" in stopped["text"], stopped
        assert "HookState(..., scaler=scaler) or state.use_scaler(scaler)" in stopped["text"]


def test_no_scaler_advice_with_a_scaler_or_another_policy() -> None:
    scaler = torch.amp.GradScaler("cpu")
    assert HookState("topk", density=0.01)._scaler_advice() is not None
    assert HookState("topk", density=0.01, scaler=scaler)._scaler_advice() is None
    assert HookState("topk", density=0.01, nonfinite="raise")._scaler_advice() is None
    assert HookState("topk", density=0.01, nonfinite="propagate")._scaler_advice() is None
    assert HookState("topk", density=0.01).use_scaler(scaler)._scaler_advice() is None


# ----------------------------------------------------------------------------- settings
def test_a_scaler_makes_propagate_the_default_and_refuses_skip() -> None:
    scaler = torch.amp.GradScaler("cpu")
    assert scaler_options({}, scaler)["nonfinite"] == "propagate"
    assert scaler_options({"nonfinite": "raise"}, scaler)["nonfinite"] == "raise"
    assert scaler_options({"k": 3}, None) == {"k": 3}
    with pytest.raises(ValueError, match="nonfinite='skip' is invalid with a scaler"):
        HookState("gs", density=0.01, scaler=scaler, nonfinite="skip")
    with pytest.raises(ValueError, match="scaler=dict is invalid: it must be a torch.amp.GradScaler"):
        HookState("gs", density=0.01, scaler={})
    state = HookState("topk", density=0.01, scaler=scaler)
    assert state.options["nonfinite"] == "propagate"
    with pytest.raises(ValueError, match="nonfinite='nan' is invalid: it must be 'skip', 'raise' or 'propagate'"):
        HookState("topk", density=0.01, nonfinite="nan")


def test_an_unpickled_state_takes_its_scaler_again() -> None:
    scaler = torch.amp.GradScaler("cpu")
    state = HookState("gs", density=0.01, scaler=scaler)
    state._loss_scale.scale = 512.0  # as after compressed steps under the scaler
    again = pickle.loads(pickle.dumps(state))
    assert again._loss_scale.scaler is None and again._loss_scale.scale == 512.0
    assert again.options["nonfinite"] == "propagate"  # the settings travel
    assert again.use_scaler(scaler)._loss_scale.scaler is scaler
    plain = HookState("topk", density=0.01).use_scaler(scaler)
    assert plain.options["nonfinite"] == "propagate"
    with pytest.raises(ValueError, match="nonfinite='skip' is invalid with a scaler"):
        HookState("topk", density=0.01, nonfinite="skip").use_scaler(scaler)


def test_the_follower_rescales_live_and_saved_state_by_the_scale_ratio() -> None:
    class Agg:
        def __init__(self) -> None:
            self.factors: list[float] = []

        def rescale(self, factor: float) -> None:
            self.factors.append(factor)

    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    scaler.scale(torch.tensor(1.0))  # the scaler makes its scale tensor on first use
    follower, agg = LossScaleFollower(scaler), Agg()
    saved = {"residual": torch.tensor([1.0, -3.0]), "steps": 2}
    follower.follow([agg], [saved])  # the first scale: nothing to convert
    assert follower.scale == 8.0 and agg.factors == []
    scaler.update(new_scale=2.0)
    follower.follow([agg], [saved])
    assert agg.factors == [0.25] and torch.equal(saved["residual"], torch.tensor([0.25, -0.75]))
    assert LossScaleFollower(torch.amp.GradScaler("cpu", enabled=False)).current() is None


def test_make_scaler_only_for_fp16() -> None:
    cpu = torch.device("cpu")
    assert isinstance(make_scaler("fp16", cpu), torch.amp.GradScaler)
    assert make_scaler("bf16", cpu) is None and make_scaler(None, cpu) is None
    with pytest.raises(ValueError, match="--amp='fp8' is invalid: it must be one of fp16, bf16"):
        make_scaler("fp8", cpu)
