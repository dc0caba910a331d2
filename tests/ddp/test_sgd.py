"""Momentum SGD with a compressing hook on real gloo processes: :func:`gssgd.ddp.compressed_sgd`.

* Where the momentum goes: inside the hook for the sparse methods (DGC's momentum
  correction, plain SGD outside, weight decay scaled by 1 / (1 - momentum)), in the
  optimizer for dense and PowerSGD.
* compressed_sgd with local Top-k on 3 ranks (not a power of two) equals an independent
  float64 reference of momentum correction with masking, written from the equations;
  with PowerSGD it equals momentum SGD stepping on the hook's update.
* A resumed run (new processes, each rank its own file) equals the uninterrupted one.
* A hand-built pair (the optimizer's momentum on a sparse method's error-fed update)
  warns at any density, naming compressed_sgd; bad arguments are refused by name.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from gssgd.ddp import HookState, comm_hook, compressed_sgd, momentum_placement
from gssgd.recipes import one_call_horizon, recipe_advice
from tests.aggregators.reference import ref_topk
from tests.ddp.scenarios import CAP_MB, batch, make_model
from tests.dist_utils import raise_worker_errors, run_workers

WORLD = 3
STEPS, SAVE_AT, START = 7, 4, 2
LR, MOMENTUM, WD, DENSITY = 0.05, 0.9, 0.01, 0.1


def _loss(ddp: torch.nn.Module, rank: int, step: int) -> torch.Tensor:
    return ddp(batch(rank, step)).square().mean()


def _run(rank: int, world: int, method: str, ckpt: str, phase: str) -> dict:
    """compressed_sgd: ``full`` (every step), ``first`` (up to SAVE_AT, then every rank
    saves its file), or ``rest`` (new processes: load, then the remaining steps)."""
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=CAP_MB)
    level = {"rank": 2} if method == "powersgd" else {"density": DENSITY}
    run = compressed_sgd(ddp, method, lr=LR, momentum=MOMENTUM, weight_decay=WD,
                         start_iter=START, **level)
    steps = {"full": range(STEPS), "first": range(SAVE_AT), "rest": range(SAVE_AT, STEPS)}
    if phase == "rest":
        saved = torch.load(Path(ckpt) / f"{method}{rank}.pt", weights_only=True)
        model.load_state_dict(saved["model"])
        run.load_state_dict(saved["run"])
    updates = []
    for step in steps[phase]:
        run.optimizer.zero_grad()
        _loss(ddp, rank, step).backward()
        updates.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
        run.optimizer.step()
    if phase == "first":
        torch.save({"model": model.state_dict(), "run": run.state_dict()},
                   Path(ckpt) / f"{method}{rank}.pt")
    group = run.optimizer.param_groups[0]
    return {"params": [p.detach().clone() for p in model.parameters()],
            "updates": updates, "placement": run.placement,
            "hook_momentum": run.hook.options.get("momentum", 0.0),
            "masking": run.hook.options.get("momentum_masking"),
            "optimizer": (group["momentum"], group["weight_decay"])}


def _phases(rank: int, world: int, ckpt: str, phase: str) -> dict:
    return {m: _run(rank, world, m, ckpt, phase) for m in ("topk", "powersgd")}


def _flat(model: torch.nn.Module) -> np.ndarray:
    return np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])


def _gradient(model: torch.nn.Module, x: np.ndarray, rank: int, step: int) -> np.ndarray:
    """The float64 gradient of rank ``rank``'s loss at step ``step`` at the point ``x``."""
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(x[offset:offset + p.numel()].reshape(p.shape)))
            offset += p.numel()
    model.zero_grad()
    model(batch(rank, step).double()).square().mean().backward()
    return np.concatenate([p.grad.numpy().ravel() for p in model.parameters()])


def reference_topk_params() -> np.ndarray:
    """Momentum SGD through local Top-k with DGC's momentum correction, in float64.

    Steps t < START: the mean gradient, plain SGD (the hook's dense warm-up; the
    optimizer has no momentum). Then each rank p: u_p = m*u_p + g_p, a_p = e_p + u_p,
    send its k largest |a_p| (ties to the lower index), zero a_p there (u_p runs on: no
    masking), keep e_p = a_p; the update is the sum of the sent values / P. Every step:
    x = x - lr * (update + wd / (1 - m) * x).
    """
    model = make_model().double()
    x = _flat(model)
    d = x.size
    k = max(1, round(DENSITY * d))
    residual = [np.zeros(d) for _ in range(WORLD)]
    velocity = [np.zeros(d) for _ in range(WORLD)]
    for t in range(STEPS):
        grads = [_gradient(model, x, r, t) for r in range(WORLD)]
        if t < START:
            update = sum(grads) / WORLD
        else:
            sent = np.zeros(d)
            for r in range(WORLD):
                velocity[r] = MOMENTUM * velocity[r] + grads[r]
                a = residual[r] + velocity[r]
                top = ref_topk(np.abs(a), k)
                sent[top] += a[top]
                a[top] = 0
                residual[r] = a
            update = sent / WORLD
        x = x - LR * (update + WD / (1 - MOMENTUM) * x)
    return x


@pytest.fixture(scope="module")
def runs() -> dict:
    with tempfile.TemporaryDirectory() as ckpt:
        out = {phase: run_workers(WORLD, _phases, ckpt, phase)
               for phase in ("full", "first", "rest")}
    for res in out.values():
        raise_worker_errors(res)
    return out


def test_momentum_goes_into_the_hook_for_sparse_methods_and_the_optimizer_otherwise(
        runs: dict) -> None:
    topk, powersgd = runs["full"][0]["topk"], runs["full"][0]["powersgd"]
    assert topk["placement"] == "hook" and topk["hook_momentum"] == MOMENTUM
    assert topk["masking"] is False
    assert topk["optimizer"] == (0.0, pytest.approx(WD / (1 - MOMENTUM)))
    assert powersgd["placement"] == "optimizer" and powersgd["hook_momentum"] == 0.0
    assert powersgd["optimizer"] == (MOMENTUM, WD)
    assert [momentum_placement(m) for m in ("dense", "topk", "gtopk", "sketched", "gs",
                                            "powersgd")] == [
        "optimizer", "hook", "hook", "hook", "hook", "optimizer"]


def test_compressed_sgd_with_topk_equals_the_independent_reference(runs: dict) -> None:
    want = reference_topk_params()
    for rank in range(WORLD):
        got = np.concatenate([p.double().numpy().ravel()
                              for p in runs["full"][rank]["topk"]["params"]])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_compressed_sgd_with_powersgd_is_momentum_sgd_on_the_hooks_update(runs: dict) -> None:
    """PowerSGD's update (checked against its own reference elsewhere) stepped on by
    torch's momentum SGD formula: x = x - lr * b, b = m*b + (update + wd*x)."""
    res = runs["full"][0]["powersgd"]
    x = _flat(make_model())
    velocity = np.zeros_like(x)
    for update in res["updates"]:
        velocity = MOMENTUM * velocity + update.double().numpy() + WD * x
        x = x - LR * velocity
    got = np.concatenate([p.double().numpy().ravel() for p in res["params"]])
    np.testing.assert_allclose(got, x, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["topk", "powersgd"])
def test_a_resumed_run_equals_the_uninterrupted_one(runs: dict, method: str) -> None:
    for rank in range(WORLD):
        for got, resumed in zip(runs["full"][rank][method]["params"],
                                runs["rest"][rank][method]["params"], strict=True):
            assert torch.equal(got, resumed)


# --------------------------------------------------------------------- hand-built pairs
@pytest.mark.parametrize("density", [0.1, 0.01, 0.001])
@pytest.mark.parametrize("method", ["topk", "gtopk", "sketched", "gs"])
def test_momentum_sgd_on_a_sparse_hook_warns_at_any_density_naming_compressed_sgd(
        method: str, density: float) -> None:
    params = [torch.nn.Parameter(torch.zeros(3))]
    advice = recipe_advice(torch.optim.SGD(params, lr=0.1, momentum=0.9), method, {}, density)
    assert advice is not None and "gssgd.ddp.compressed_sgd(ddp_model" in advice
    assert recipe_advice(torch.optim.SGD(params, lr=0.1), method, {}, density) is None


def test_momentum_sgd_on_powersgd_or_dense_gets_no_warning() -> None:
    params = [torch.nn.Parameter(torch.zeros(3))]
    for method in ("powersgd", "dense"):
        assert recipe_advice(torch.optim.SGD(params, lr=0.1, momentum=0.9), method, {},
                             None) is None


def test_plain_adamw_on_a_compressing_hook_points_to_compressed_adamw() -> None:
    params = [torch.nn.Parameter(torch.zeros(3))]
    advice = recipe_advice(torch.optim.AdamW(params), "gs", {}, 0.01)
    assert advice is not None and "gssgd.ddp.compressed_adamw(ddp_model, 'gs'" in advice


# --------------------------------------------------------------------- refusals
class _NotDDP(torch.nn.Module):
    pass


class _FakeDDP(torch.nn.Module):
    def register_comm_hook(self, state: object, hook: object) -> None:  # pragma: no cover
        raise AssertionError("a refused call must not register")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"lr": 0.0}, r"lr=0\.0 is invalid: it must be a number > 0"),
    ({"lr": 0.1, "momentum": 1.0}, r"momentum=1\.0 is invalid: it must be a number in \[0, 1\)"),
    ({"lr": 0.1, "weight_decay": -1}, r"weight_decay=-1 is invalid"),
    ({"lr": 0.1, "nesterov": True, "density": 0.01},
     r"nesterov=True cannot be used with 'gs': its momentum is kept inside the hook"),
    ({"lr": 0.1, "feedback": "onebit"}, r"feedback='onebit' is 1-bit Adam's recipe.*compressed_adamw"),
    ({"lr": 0.1, "momentum_": 0}, r"unknown option\(s\) \['momentum_'\] for method 'gs'"),
    ({"lr": 0.1, "total_steps": 0}, r"total_steps=0 is invalid: it must be an integer >= 1"),
    ({"lr": 0.1, "total_steps": 2.5}, r"total_steps=2\.5 is invalid"),
])
def test_bad_arguments_are_refused_by_name(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        compressed_sgd(_FakeDDP(), "gs", **kwargs)


def test_a_model_that_is_not_ddp_is_refused() -> None:
    with pytest.raises(ValueError, match="it must be the DistributedDataParallel model"):
        compressed_sgd(_NotDDP(), "gs", lr=0.1)


def test_a_hand_built_pair_in_ddp_warns_once() -> None:
    out = run_workers(2, _hand_built)
    raise_worker_errors(out)
    for messages in out:
        assert sum("compressed_sgd" in m for m in messages) == 1, messages


def _hand_built(rank: int, world: int) -> list[str]:
    """The README's hook line under the user's momentum SGD, density 0.01."""
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=CAP_MB)
    ddp.register_comm_hook(HookState("gs", density=0.01, model=ddp), comm_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            optimizer.zero_grad()
            _loss(ddp, rank, step).backward()
            optimizer.step()
    return [str(w.message) for w in caught]


def _dense_limit(rank: int, world: int) -> list[torch.Tensor]:
    """compressed_sgd with every coordinate sent (topk at density 1)."""
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=CAP_MB)
    run = compressed_sgd(ddp, "topk", lr=LR, momentum=MOMENTUM, weight_decay=WD, density=1.0,
                         start_iter=START)
    for step in range(STEPS):
        run.optimizer.zero_grad()
        _loss(ddp, rank, step).backward()
        run.optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def test_with_every_coordinate_sent_compressed_sgd_is_momentum_sgd() -> None:
    """The hook's momentum without masking: at density 1 nothing stays in the residual and
    the velocity is momentum SGD's (with DGC's masking it would be plain SGD, a tenth of
    the step). Reference in float64: the START dense warm-up steps are plain SGD, then
    u = m*u + mean g, x = x - lr*(u + wd/(1 - m)*x)."""
    out = run_workers(2, _dense_limit)
    raise_worker_errors(out)
    model = make_model().double()
    x = _flat(model)
    velocity = np.zeros_like(x)
    for t in range(STEPS):
        g = sum(_gradient(model, x, r, t) for r in range(2)) / 2
        if t >= START:
            velocity = MOMENTUM * velocity + g
            g = velocity
        x = x - LR * (g + WD / (1 - MOMENTUM) * x)
    for params in out:
        got = np.concatenate([p.double().numpy().ravel() for p in params])
        np.testing.assert_allclose(got, x, rtol=1e-5, atol=1e-6)


def _adamw_powersgd(rank: int, world: int) -> dict:
    """compressed_adamw with PowerSGD (refused before: 'it never compresses')."""
    from gssgd.ddp import compressed_adamw

    model = make_model()
    ddp = DDP(model, bucket_cap_mb=CAP_MB)
    run = compressed_adamw(ddp, "powersgd", lr=1e-2, freeze_step=2, rank=1)
    losses = []
    for step in range(8):
        run.optimizer.zero_grad()
        loss = _loss(ddp, rank, step)
        loss.backward()
        run.optimizer.step()
        losses.append(loss.item())
    return {"params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
            "kind": run.hook.last_iteration, "options": run.hook.options, "losses": losses}


def test_compressed_adamw_takes_powersgd() -> None:
    out = run_workers(2, _adamw_powersgd)
    raise_worker_errors(out)
    assert torch.equal(out[0]["params"], out[1]["params"])  # the same update on every rank
    for res in out:
        assert res["kind"] == "compressed"
        assert res["options"] == {"rank": 1, "feedback": "onebit", "momentum": 0.9}
        assert res["losses"][-1] < res["losses"][0]


def _default_density(rank: int, world: int) -> dict:
    """What the one calls log for a sparse method with and without a density."""
    import io
    import logging

    from gssgd.ddp import compressed_adamw

    said = io.StringIO()
    logging.getLogger("gssgd").addHandler(logging.StreamHandler(said))
    out = {}
    for name, call, kwargs in (("sgd_default", compressed_sgd, {"lr": 0.1}),
                               ("sgd_given", compressed_sgd, {"lr": 0.1, "density": 0.05}),
                               ("adamw_default", compressed_adamw, {})):
        said.truncate(0), said.seek(0)
        call(DDP(make_model()), "topk", **kwargs)
        out[name] = said.getvalue()
    return out


def test_a_sparse_method_without_a_density_says_it_sends_the_default() -> None:
    """compressed_sgd(m, "topk", lr=0.1) silently meant density 0.01."""
    out = run_workers(1, _default_density)
    raise_worker_errors(out)
    said = out[0]
    assert "compressed_sgd: no density given for 'topk': it sends the default 0.01" in \
        said["sgd_default"]
    assert "no density given" not in said["sgd_given"]
    assert "compressed_adamw: no density given for 'topk'" in said["adamw_default"]


# --------------------------------------------------------------------- the horizon
def _horizon_warnings(rank: int, world: int) -> dict[str, Any]:
    """The warnings compressed_sgd gives at construction, per call, and the skip limits
    the run's length sets."""
    calls = {
        "topk, unknown length": ("topk", {"density": 0.01}),
        "topk, 200 steps": ("topk", {"density": 0.01, "total_steps": 200}),
        "topk, 600 steps": ("topk", {"density": 0.01, "total_steps": 600}),
        "gs, 100 steps at density 0.1": ("gs", {"density": 0.1, "total_steps": 100}),
        "topk, k of d, 50 steps": ("topk", {"k": 5, "total_steps": 50}),
        "powersgd, unknown length": ("powersgd", {"rank": 1}),
        "powersgd, 600 steps": ("powersgd", {"rank": 1, "total_steps": 600}),
        "dense, 10 steps": ("dense", {"total_steps": 10}),
        "topk on a plain CNN, 600 steps": ("topk", {"density": 0.01, "total_steps": 600}),
        "topk on a batch-norm CNN, 600 steps": ("topk", {"density": 0.01, "total_steps": 600}),
        "powersgd on a plain CNN, 600 steps": ("powersgd", {"rank": 1, "total_steps": 600}),
    }
    out = {}
    for name, (method, kwargs) in calls.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compressed_sgd(DDP(_cnn(norm="batch-norm" in name) if "CNN" in name
                               else make_model()), method, lr=0.05, **kwargs)
        out[name] = [str(w.message) for w in caught if "one-call study" in str(w.message)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for steps in (60, 5000):  # the skip limit: a tenth of the run, at most 100
            run = compressed_sgd(DDP(make_model()), "topk", lr=0.05, total_steps=steps)
            out[f"skips at {steps}"] = run.hook.options["max_consecutive_skips"]
        run = compressed_sgd(DDP(make_model()), "topk", lr=0.05, total_steps=60,
                             max_consecutive_skips=3)
        out["skips given"] = run.hook.options["max_consecutive_skips"]
    return out


def _cnn(norm: bool) -> torch.nn.Module:
    layers = [torch.nn.Conv2d(3, 4, 3)] + ([torch.nn.BatchNorm2d(4)] if norm else [])
    return torch.nn.Sequential(*layers, torch.nn.ReLU(), torch.nn.Flatten())


def test_a_sparse_run_shorter_than_its_horizon_is_warned_at_construction() -> None:
    """The one-call study: at dense's lr a sparse method came within 2x dense's loss only
    over ONE_CALL_HORIZON / density steps (PowerSGD within 1.5x over LOW_RANK_HORIZON), and
    on a CNN without normalisation not even then; a shorter (or unknown) run, and a sparse
    method on such a CNN, are told so, naming the steps it needs and the fixes."""
    out = run_workers(1, _horizon_warnings)
    raise_worker_errors(out)
    said = out[0]
    needed = one_call_horizon("topk", 0.01)
    assert needed == 600
    assert len(said["topk, unknown length"]) == 1
    assert "total_steps not given" in said["topk, unknown length"][0]
    assert f"{needed} steps" in said["topk, 200 steps"][0]
    assert "total_steps=200" in said["topk, 200 steps"][0]
    assert "PowerSGD" in said["topk, 200 steps"][0]
    assert said["topk, 600 steps"] == []
    assert said["gs, 100 steps at density 0.1"] == []  # 6 / 0.1 = 60 steps
    n = sum(p.numel() for p in make_model().parameters())
    assert (f"{one_call_horizon('topk', 5 / n)} steps" in said["topk, k of d, 50 steps"][0])
    assert "within 1.5x" in said["powersgd, unknown length"][0]  # PowerSGD's own horizon
    assert "density" not in said["powersgd, unknown length"][0]
    assert said["powersgd, 600 steps"] == [] and said["dense, 10 steps"] == []
    plain = said["topk on a plain CNN, 600 steps"]
    assert len(plain) == 1 and "no normalisation layers" in plain[0]
    assert said["topk on a batch-norm CNN, 600 steps"] == []
    assert said["powersgd on a plain CNN, 600 steps"] == []
    assert (said["skips at 60"], said["skips at 5000"], said["skips given"]) == (6, 100, 3)


# --------------------------------------------------------------------- the lr schedule
def _scheduled(rank: int, world: int) -> dict[str, Any]:
    """compressed_sgd and compressed_adamw with warm-up + cosine: the lr at each step, and
    a run restored from the state_dict of step 4."""
    from gssgd.ddp import compressed_adamw

    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, call in (("sgd", compressed_sgd), ("adamw", compressed_adamw)):
            ddp = DDP(make_model())
            run = call(ddp, "topk", lr=0.05, density=0.1, total_steps=10,
                       lr_schedule="cosine", lr_warmup_steps=2)
            lrs = []
            for step in range(10):
                lrs.append(run.optimizer.param_groups[0]["lr"])
                run.optimizer.zero_grad()
                _loss(ddp, rank, step).backward()
                run.optimizer.step()
                run.scheduler.step()
                if step == 3:
                    saved = run.state_dict()
            again = call(DDP(make_model()), "topk", lr=0.05, density=0.1, total_steps=10,
                         lr_schedule="cosine", lr_warmup_steps=2)
            again.load_state_dict(saved)
            out[name] = (lrs, again.optimizer.param_groups[0]["lr"])
        out["constant"] = compressed_sgd(DDP(make_model()), "topk", lr=0.05, density=0.1,
                                         total_steps=10).scheduler
        try:
            compressed_sgd(DDP(make_model()), "topk", lr=0.05, lr_schedule="cosine")
        except ValueError as err:
            out["no length"] = str(err)
    return out


def test_the_one_call_takes_the_trainers_lr_schedule() -> None:
    """The one call's scheduler gives the trainer's numbers (LrSchedule), and restores
    mid-run from the run's state_dict."""
    from gssgd.lr_schedule import LrSchedule

    out = run_workers(1, _scheduled)
    raise_worker_errors(out)
    said = out[0]
    schedule = LrSchedule("cosine", 2, 10)
    for name in ("sgd", "adamw"):
        lrs, restored = said[name]
        assert lrs == [0.05 * schedule.factor(t) for t in range(10)], name
        assert restored == lrs[4], name
    assert said["constant"] is None
    assert "need total_steps=" in said["no length"]
