"""AdamW with a compressing hook on real gloo processes: :func:`gssgd.ddp.compressed_adamw`
and the checks that keep 1-bit Adam's recipe from diverging silently.

* A hand-built pair whose values do not match (the README's one-line hook under
  ``FrozenVarianceAdamW``; ``feedback="onebit"`` with the default ``start_iter``; a dense
  hook) stops at the first step on every rank with an error that names both values and
  the one call; a matching pair is paired instead.
* An overflow a GradScaler skips during the dense warm-up does not shift the switch: the
  first compressed momentum is stepped on as a momentum, after the dense steps actually
  taken (whole-model, per-bucket and streaming gs, float16 autocast).
* A non-finite step the hook skips (no scaler) moves neither the parameters nor the
  moments, the moving variance included.
* compressed_adamw's run, uninterrupted and resumed from a checkpoint in new processes,
  equals an independent float64 reference of 1-bit Adam with local Top-k (3 ranks).

The worker functions live here too (spawned processes import this module).
"""

from __future__ import annotations

import tempfile
import traceback
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from gssgd.ddp import HookState, comm_hook, compressed_adamw
from gssgd.optim import FrozenVarianceAdamW
from tests.aggregators.reference import ref_topk
from tests.ddp.scenarios import CAP_MB, batch, make_model
from tests.dist_utils import raise_worker_errors, run_workers

SKETCH = {"rows": 3, "cols": 160, "candidates": 2}


def _guarded(run, *args) -> dict:
    """``run(*args)``, or its error (a scenario's failure fails its own test only)."""
    try:
        return run(*args)
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        return {"error": repr(exc), "type": type(exc).__name__, "trace": traceback.format_exc()}


def _loss(ddp: torch.nn.Module, rank: int, step: int) -> torch.Tensor:
    return ddp(batch(rank, step)).square().mean()


# ----------------------------------------------------------------------------- mismatches
#: name -> (FrozenVarianceAdamW's freeze_step, HookState's method and options)
PAIRINGS = {
    # the README's one-line hook (classic error feedback, start_iter 2) under the optimizer
    "ef_hook": (30, "gs", {"density": 0.02, **SKETCH}),
    # 1-bit Adam's feedback and momentum, but the hook's default start_iter
    "default_start": (30, "gs", {"density": 0.02, "feedback": "onebit", "momentum": 0.9,
                                 **SKETCH}),
    "dense_hook": (2, "dense", {"start_iter": 2}),
    "matched": (2, "topk", {"density": 0.02, "start_iter": 2, "feedback": "onebit",
                            "momentum": 0.9}),
}


def _pairing(rank: int, name: str) -> dict:
    freeze, method, opts = PAIRINGS[name]
    opts = dict(opts)
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=CAP_MB)
    state = HookState(method, density=opts.pop("density", None),
                      start_iter=opts.pop("start_iter", 2), **opts)
    ddp.register_comm_hook(state, comm_hook)
    optimizer = FrozenVarianceAdamW(model.parameters(), lr=1e-3, freeze_step=freeze)
    for step in range(4):
        optimizer.zero_grad()
        _loss(ddp, rank, step).backward()
        try:
            optimizer.step()
        except ValueError as exc:
            return {"step": step, "error": str(exc)}
    return {"step": None, "paired": optimizer.hook is state}


def _short_run(rank: int) -> dict:
    """compressed_adamw told the run is no longer than its dense warm-up."""
    ddp = DDP(make_model(), bucket_cap_mb=CAP_MB)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compressed_adamw(ddp, "topk", density=0.02, freeze_step=30, total_steps=20)
    return {"warnings": [str(w.message) for w in seen]}


def pairing_runs(rank: int, world: int) -> dict:
    out = {name: _guarded(_pairing, rank, name) for name in PAIRINGS}
    out["short"] = _guarded(_short_run, rank)
    return out


@pytest.fixture(scope="module")
def pairings() -> list[dict]:
    out = run_workers(2, pairing_runs)
    raise_worker_errors(out)
    return out


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("ef_hook", ["start_iter=2 is not freeze_step=30", "feedback='ef' is not 'onebit'",
                     "momentum=0.0 is not beta1=0.9"]),
        ("default_start", ["start_iter=2 is not freeze_step=30"]),
        ("dense_hook", ["method 'dense' never compresses"]),
    ],
)
def test_a_mismatched_pair_stops_at_the_first_step_on_every_rank(
    pairings: list[dict], name: str, says: list[str]
) -> None:
    for rank in pairings:
        got = rank[name]
        assert got["step"] == 0, got
        for text in [*says, "gssgd.ddp.compressed_adamw(", "torch.optim.AdamW"]:
            assert text in got["error"], (text, got["error"])


def test_a_matched_hand_built_pair_is_paired(pairings: list[dict]) -> None:
    for rank in pairings:
        assert rank["matched"] == {"step": None, "paired": True}


def test_a_run_no_longer_than_the_warm_up_warns(pairings: list[dict]) -> None:
    for rank in pairings:
        said = [w for w in rank["short"]["warnings"] if "total_steps=20" in w]
        assert len(said) == 1 and "the whole run is dense AdamW" in said[0]
        assert "a tenth of it: 2" in said[0]


class _NotDDP(torch.nn.Linear):
    """Looks like a DDP model to the argument checks (they run before anything is built)."""

    def register_comm_hook(self, state: object, hook: object) -> None:
        raise AssertionError("never reached")


@pytest.mark.parametrize(
    ("model", "method", "options", "match"),
    [
        (torch.nn.Linear(2, 2), "gs", {}, r"model=Linear is invalid: it must be the "
         r"DistributedDataParallel model"),
        (_NotDDP(2, 2), "gs", {"feedback": "ef", "start_iter": 5},
         r"feedback='ef', start_iter=5: compressed_adamw sets start_iter=freeze_step"),
    ],
)
def test_compressed_adamw_refuses_what_would_break_the_recipe(
    model: torch.nn.Module, method: str, options: dict, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        compressed_adamw(model, method, **options)


def _dense_pair(rank: int, world: int) -> dict:
    """Five AdamW steps through compressed_adamw(..., "dense") and through plain DDP with
    torch.optim.AdamW, from the same model."""
    out: dict = {}
    for name in ("one_call", "by_hand"):
        ddp = DDP(make_model(), bucket_cap_mb=CAP_MB)
        if name == "one_call":
            run = compressed_adamw(ddp, "dense", lr=1e-2, weight_decay=0.01)
            optimizer = run.optimizer
            out["types"] = (type(run.optimizer).__name__, run.hook.method)
        else:
            optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2, weight_decay=0.01)
        for step in range(5):
            optimizer.zero_grad()
            _loss(ddp, rank, step).backward()
            optimizer.step()
        out[name] = [p.detach().clone() for p in ddp.parameters()]
    return out


def test_compressed_adamw_with_dense_is_plain_adamw_through_the_same_call() -> None:
    """A loop over methods with a baseline needs no special case: "dense" is AdamW on the
    dense average, bit for bit DDP's own with torch.optim.AdamW."""
    out = run_workers(2, _dense_pair)
    raise_worker_errors(out)
    for rank in out:
        assert rank["types"] == ("AdamW", "dense")
        assert all(torch.equal(a, b) for a, b in zip(rank["one_call"], rank["by_hand"],
                                                     strict=True))


# ----------------------------------------------------------------------------- overflow
START = 3  # the first compressed iteration
OVERFLOW = 1  # a dense warm-up iteration the scaler skips
#: mode -> compressed_adamw's arguments
MODES = {
    "whole": {"whole_model": True},
    "per_bucket": {"whole_model": False},
    "stream": {"whole_model": True, "overlap": "stream"},
}


def _overflow(rank: int, mode: str) -> dict:
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=CAP_MB)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    run = compressed_adamw(ddp, "gs", lr=1e-3, density=0.02, freeze_step=START,
                           scaler=scaler, **MODES[mode], **SKETCH)
    inject = {"on": False}
    first = next(iter(model.parameters()))
    first.register_hook(lambda g: g * float("inf") if inject["on"] else g)
    out: dict = {"kinds": [], "taken_as_momentum": None}
    for step in range(START + 3):
        inject["on"] = step == OVERFLOW and rank == 1
        run.optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = ddp(batch(rank, step)).float().square().mean()
        scaler.scale(loss).backward()
        scaler.step(run.optimizer)
        scaler.update()
        out["kinds"].append(run.hook.last_iteration)
        if run.hook.last_iteration == "compressed" and out["taken_as_momentum"] is None:
            out["taken_as_momentum"] = all(  # m stepped on as it arrived, not AdamW-averaged
                torch.equal(run.optimizer.state[p]["exp_avg"], p.grad)
                for p in model.parameters())
    out["frozen_at"] = sorted({run.optimizer.state[p]["frozen_at"] for p in model.parameters()})
    return out


def overflow_runs(rank: int, world: int) -> dict:
    return {mode: _guarded(_overflow, rank, mode) for mode in MODES}


@pytest.mark.parametrize("mode", list(MODES))
def test_an_overflow_in_the_warm_up_does_not_shift_the_switch(mode: str, overflows) -> None:
    for rank in overflows:
        got = rank[mode]
        assert "error" not in got, got.get("trace")
        assert got["kinds"] == ["dense"] * START + ["compressed"] * 3
        assert got["frozen_at"] == [START - 1]  # the dense steps the optimizer took
        assert got["taken_as_momentum"] is True


@pytest.fixture(scope="module")
def overflows() -> list[dict]:
    out = run_workers(2, overflow_runs)
    raise_worker_errors(out)
    return out


# ----------------------------------------------------------------------------- skipped step
def skipped_run(rank: int, world: int) -> dict:
    """No scaler (``nonfinite="skip"``), the moving variance; rank 1 sends NaN at step 3."""
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=CAP_MB)
    run = compressed_adamw(ddp, "topk", lr=1e-3, density=0.05, freeze_step=2,
                           variance="moving")
    inject = {"on": False}
    first = next(iter(model.parameters()))
    first.register_hook(lambda g: g * float("nan") if inject["on"] else g)
    kept = None
    for step in range(5):
        inject["on"] = step == 3 and rank == 1
        before = [(p.detach().clone(), run.optimizer.state[p]["exp_avg"].clone(),
                   run.optimizer.state[p]["exp_avg_sq"].clone())
                  for p in model.parameters()] if step == 3 else None
        run.optimizer.zero_grad()
        _loss(ddp, rank, step).backward()
        run.optimizer.step()
        if before is not None:
            kept = run.hook.last_iteration == "skipped" and all(
                torch.equal(w, p.detach()) and torch.equal(m, run.optimizer.state[p]["exp_avg"])
                and torch.equal(v, run.optimizer.state[p]["exp_avg_sq"])
                for (w, m, v), p in zip(before, model.parameters(), strict=True))
    return {"kept": kept, "last": run.hook.last_iteration}


def test_a_skipped_step_moves_neither_weights_nor_moments() -> None:
    out = run_workers(2, skipped_run)
    raise_worker_errors(out)
    for rank in out:
        assert rank == {"kept": True, "last": "compressed"}


# ----------------------------------------------------------------------------- reference
WORLD = 3
STEPS, SAVE_AT, FREEZE = 8, 5, 3
LR, BETAS, EPS, WD, DENSITY = 0.01, (0.9, 0.99), 1e-8, 0.1, 0.1


def _run(rank: int, world: int, ckpt: str, phase: str) -> dict:
    """compressed_adamw with local Top-k: ``full`` (every step), ``first`` (up to SAVE_AT,
    then every rank saves), or ``rest`` (new processes: load, then the remaining steps)."""
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=CAP_MB)
    run = compressed_adamw(ddp, "topk", lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                           density=DENSITY, freeze_step=FREEZE)
    steps = {"full": range(STEPS), "first": range(SAVE_AT), "rest": range(SAVE_AT, STEPS)}
    if phase == "rest":
        saved = torch.load(Path(ckpt) / f"rank{rank}.pt", weights_only=True)
        model.load_state_dict(saved["model"])
        run.load_state_dict(saved["run"])
    for step in steps[phase]:
        run.optimizer.zero_grad()
        _loss(ddp, rank, step).backward()
        run.optimizer.step()
    if phase == "first":
        torch.save({"model": model.state_dict(), "run": run.state_dict()},
                   Path(ckpt) / f"rank{rank}.pt")
    return {"params": [p.detach().clone() for p in model.parameters()]}


def reference_params() -> list[np.ndarray]:
    """1-bit Adam with local Top-k, written out in float64 from the papers' equations.

    Dense steps t < FREEZE: AdamW on the mean gradient (bias-corrected m and v, decoupled
    decay). Then, with v frozen after FREEZE steps and the shared momentum M (0 at the
    switch): rank p compresses a_p = e_p + b1*M + (1-b1)*g_p to its k largest |a_p|, keeps
    the rest as e_p, M = sum of the sent values / P, and the step is
    x = x*(1 - lr*wd) - lr*M / (sqrt(v / (1 - b2^FREEZE)) + eps).
    """
    model = make_model().double()
    params = list(model.parameters())
    shapes = [p.shape for p in params]
    x = np.concatenate([p.detach().numpy().ravel() for p in params])
    d = x.size
    k = max(1, round(DENSITY * d))
    b1, b2 = BETAS
    m, v, shared = np.zeros(d), np.zeros(d), np.zeros(d)
    residual = [np.zeros(d) for _ in range(WORLD)]

    def gradient(rank: int, step: int) -> np.ndarray:
        offset = 0
        with torch.no_grad():
            for p, shape in zip(params, shapes, strict=True):
                n = int(np.prod(shape))
                p.copy_(torch.from_numpy(x[offset:offset + n].reshape(shape)))
                offset += n
        model.zero_grad()
        model(batch(rank, step).double()).square().mean().backward()
        return np.concatenate([p.grad.numpy().ravel() for p in params])

    for t in range(STEPS):
        grads = [gradient(r, t) for r in range(WORLD)]
        if t < FREEZE:
            g = sum(grads) / WORLD
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            step = (m / (1 - b1 ** (t + 1))) / (np.sqrt(v / (1 - b2 ** (t + 1))) + EPS)
        else:
            sent = np.zeros(d)
            for r in range(WORLD):
                a = residual[r] + b1 * shared + (1 - b1) * grads[r]
                top = ref_topk(np.abs(a), k)
                sent[top] += a[top]
                a[top] = 0
                residual[r] = a
            shared = sent / WORLD
            step = shared / (np.sqrt(v / (1 - b2**FREEZE)) + EPS)
        x = x * (1 - LR * WD) - LR * step
    out, offset = [], 0
    for shape in shapes:
        n = int(np.prod(shape))
        out.append(x[offset:offset + n].reshape(shape))
        offset += n
    return out


def test_compressed_adamw_and_its_resume_equal_an_independent_reference() -> None:
    want = reference_params()
    with tempfile.TemporaryDirectory() as ckpt:
        full = run_workers(WORLD, _run, ckpt, "full")
        first = run_workers(WORLD, _run, ckpt, "first")
        rest = run_workers(WORLD, _run, ckpt, "rest")
    for out in (full, first, rest):
        raise_worker_errors(out)
    for rank in range(WORLD):
        for got, resumed, ref in zip(full[rank]["params"], rest[rank]["params"], want,
                                     strict=True):
            assert torch.equal(got, resumed)  # the resume is bitwise
            np.testing.assert_allclose(got.double().numpy(), ref, rtol=1e-4, atol=1e-6)
