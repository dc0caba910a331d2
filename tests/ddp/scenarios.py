"""Worker functions for tests/ddp/test_hook.py (importable by spawned gloo processes).

Each scenario trains a small MLP wrapped in DDP with gssgd's hook, next to an identical
plain copy whose local gradients go through reference aggregators built with
``gssgd.make_aggregator``, and returns both so the parent process can compare them.
"""

from __future__ import annotations

import dataclasses
import io
import pickle

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gssgd
from gssgd.ddp import HookState, comm_hook
from tests.dist_utils import error_report

#: DDP bucket cap (MB): small enough that the MLP's 4010 parameters (16 KB) need several
#: buckets after DDP's rebuild (with torch 2.13: 3 buckets of 1234, 1960 and 816 elements, in
#: reverse model order; 1 bucket before the rebuild). The tests read the layouts DDP hands
#: the hook (``bucket.parameters()``) instead of assuming one torch version's bucketing.
CAP_MB = 0.004
#: Another cap, for another layout (torch 2.13: 2 buckets of 3194 and 816 elements).
OTHER_CAP_MB = 0.006
START = 2  # start_iter of every scenario
ITERS = 6  # iterations per scenario: START dense ones, then compressed ones
LR = 0.05
SKETCH = {"rows": 3, "cols": 160, "candidates": 2}

#: method -> HookState options (density 0.02: k = 25 .. 80 per vector)
METHODS: dict[str, dict] = {
    "dense": {},
    "topk": {"density": 0.02},
    "gtopk": {"density": 0.02},
    "sketched": {"density": 0.02, **SKETCH},
    "gs": {"density": 0.02, **SKETCH},
}
MODES = {"bucket": False, "whole": True}


def make_model() -> nn.Module:
    """The same MLP (4010 parameters, 8 tensors) on every rank and every call."""
    gen = torch.Generator().manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 48), nn.Tanh(), nn.Linear(48, 40), nn.Tanh(),
        nn.Linear(40, 24), nn.Tanh(), nn.Linear(24, 10),
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


def batch(rank: int, step: int) -> torch.Tensor:
    """Different inputs per (rank, step)."""
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(1000 * step + rank))


def local_grads(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Backward of the loss on a plain (non-DDP) model; the gradients in model order."""
    model.zero_grad()
    model(x).square().mean().backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def flat_grads(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def sgd(model: nn.Module, *others: nn.Module) -> None:
    """One SGD step on ``model`` with its gradients; ``others`` copy the new parameters."""
    with torch.no_grad():
        for p in model.parameters():
            p -= LR * p.grad
        for other in others:
            for q, p in zip(other.parameters(), model.parameters(), strict=True):
                q.copy_(p)


def recording(layouts: dict[int, list[int]], model: nn.Module):
    """``comm_hook`` that also records each bucket's parameter positions (in bucket order)."""
    ids = {id(p): i for i, p in enumerate(model.parameters())}

    def hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        layouts[bucket.index()] = [ids[id(p)] for p in bucket.parameters()]
        return comm_hook(state, bucket)

    hook.__annotations__ = {}  # DDP checks annotation objects; these are strings here
    return hook


def mean_over_ranks(vec: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(vec) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, vec)
    return torch.stack(parts).mean(0)


class Reference:
    """gssgd aggregators fed with the plain model's local gradients, per bucket or whole."""

    def __init__(self, method: str, whole: bool, opts: dict) -> None:
        self.method, self.whole, self.opts = method, whole, dict(opts)
        self.aggs: dict[int, gssgd.Aggregator] = {}

    def agg(self, index: int, d: int, shapes: list | None = None) -> gssgd.Aggregator:
        """The vector ``index``'s aggregator; a method that compresses by tensor shape
        (PowerSGD) is given the ``shapes`` of the vector's gradients, as the hook does."""
        if index not in self.aggs:
            opts = dict(self.opts)
            if gssgd.AGGREGATORS[self.method].takes_shapes and shapes is not None:
                opts["shapes"] = [tuple(s) for s in shapes]
            self.aggs[index] = gssgd.make_aggregator(
                self.method, d, density=opts.pop("density", None), **opts)
        return self.aggs[index]

    def update(self, grads: list[torch.Tensor], layouts: dict[int, list[int]]) -> torch.Tensor:
        """The update in model order, from the local gradients in model order."""
        flat = [g.reshape(-1) for g in grads]
        if self.whole:
            whole = torch.cat(flat)
            return self.agg(0, whole.numel(), [g.shape for g in grads]).step(whole)
        out = [torch.empty(0)] * len(flat)
        for index in sorted(layouts):
            positions = layouts[index]
            piece = torch.cat([flat[i] for i in positions])
            update = self.agg(index, piece.numel(), [grads[i].shape for i in positions]
                              ).step(piece)
            for i, part in zip(positions, update.split([flat[i].numel() for i in positions]),
                               strict=True):
                out[i] = part
        return torch.cat(out)


def train_against_reference(rank: int, method: str, whole: bool, opts: dict,
                            ddp_kwargs: dict | None = None) -> dict:
    """ITERS iterations of DDP + hook and of the plain model + reference aggregators."""
    model, plain = make_model(), make_model()
    ddp = DDP(model, bucket_cap_mb=CAP_MB, **(ddp_kwargs or {}))
    state = HookState(method, start_iter=START, whole_model=whole, model=model, **opts)
    layouts: dict[int, list[int]] = {}
    ddp.register_comm_hook(state, recording(layouts, model))
    ref = Reference(method, whole, opts)
    out: dict = {"got": [], "want": [], "stats": [], "iter": [], "layouts": []}
    for t in range(ITERS):
        layouts.clear()
        x = batch(rank, t)
        ddp.zero_grad()
        ddp(x).square().mean().backward()
        grads = local_grads(plain, x)
        if t < START:
            want = mean_over_ranks(torch.cat([g.reshape(-1) for g in grads]))
        else:
            want = ref.update(grads, layouts)
        out["got"].append(flat_grads(model))
        out["want"].append(want)
        out["stats"].append(dataclasses.asdict(state.last_stats))
        out["iter"].append(state.iter)
        out["layouts"].append(dict(layouts))
        sgd(model, plain)
    sd = state.state_dict()
    out["state_dict"] = sd
    out["reference_residuals"] = {
        i: a.state_dict().get("residual") for i, a in ref.aggs.items()}
    return {k: torch.stack(v) if k in ("got", "want") else v for k, v in out.items()}


def run_all(rank: int, world_size: int) -> dict:
    """Every method in per-bucket and whole-model mode, plus a gradient-as-bucket-view run."""
    torch.manual_seed(1234)  # DDP's construction must not depend on the global RNG
    out = {}
    for method, opts in METHODS.items():
        for mode, whole in MODES.items():
            out[f"{method}-{mode}"] = train_against_reference(rank, method, whole, opts)
    out["gs-whole-view"] = train_against_reference(
        rank, "gs", True, METHODS["gs"], {"gradient_as_bucket_view": True})
    out["gs-momentum-bucket"] = train_against_reference(
        rank, "gs", False, {**METHODS["gs"], "momentum": 0.9})
    return out


def run_all_resume_and_errors(rank: int, world_size: int) -> dict:
    """``run_all``, then ``resume`` and ``errors`` (under ``"scenario/resume"`` and
    ``"scenario/errors"``) on the same processes: starting processes again costs seconds.
    Each builds its own DDP models and hook states; a scenario that raised is reported like
    a failed worker of ``run_workers``, to the tests of that scenario."""
    out = run_all(rank, world_size)
    for name, scenario in (("resume", resume), ("errors", errors)):
        try:
            out[f"scenario/{name}"] = scenario(rank, world_size)
        except Exception as exc:  # noqa: BLE001 - reported to the tests of the scenario
            out[f"scenario/{name}"] = error_report(exc)
    return out


# ----------------------------------------------------------------------- resume
def _train(ddp: DDP, model: nn.Module, rank: int, steps: range) -> list[torch.Tensor]:
    grads = []
    for t in steps:
        ddp.zero_grad()
        ddp(batch(rank, t)).square().mean().backward()
        grads.append(flat_grads(model))
        sgd(model)
    return grads


def _model_with(params: list[torch.Tensor] | None) -> nn.Module:
    model = make_model()
    if params is not None:
        with torch.no_grad():
            for p, saved in zip(model.parameters(), params, strict=True):
                p.copy_(saved)
    return model


def _fresh(cap: float = CAP_MB, params: list[torch.Tensor] | None = None):
    model = _model_with(params)
    return model, DDP(model, bucket_cap_mb=cap)


def resume(rank: int, world_size: int) -> dict:
    """Checkpoint round trips: state_dict through torch.save, and pickle."""
    out: dict = {}
    # 1. Whole-model gs in model order: 3 iterations, save, resume in a fresh DDP (whose
    #    first iteration has a single bucket) for 3 more: bitwise the uninterrupted run.
    opts = METHODS["gs"]
    model, ddp = _fresh()
    state = HookState("gs", start_iter=START, whole_model=True, model=model, **opts)
    ddp.register_comm_hook(state, comm_hook)
    out["uninterrupted"] = _train(ddp, model, rank, range(6))

    model, ddp = _fresh()
    state = HookState("gs", start_iter=START, whole_model=True, model=model, **opts)
    ddp.register_comm_hook(state, comm_hook)
    first = _train(ddp, model, rank, range(3))
    buf = io.BytesIO()
    torch.save({"hook": state.state_dict(), "params": [p.detach().clone()
                                                        for p in model.parameters()]}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    model, ddp = _fresh(params=ckpt["params"])
    resumed = HookState("gs", start_iter=START, whole_model=True, model=model, **opts)
    resumed.load_state_dict(ckpt["hook"])
    ddp.register_comm_hook(resumed, comm_hook)
    out["resumed"] = first + _train(ddp, model, rank, range(3, 6))
    out["resumed_iter"] = resumed.iter
    out["saved_sd"] = ckpt["hook"]
    out["saved_iter"] = ckpt["hook"]["iter"]

    # 2. Per-bucket topk through pickle: the copy keeps the residuals; resumed in a fresh
    #    DDP it runs one dense iteration (pre-rebuild layout), then compresses on from the
    #    saved residuals, matching reference aggregators loaded with the same states.
    model, ddp = _fresh()
    state = HookState("topk", start_iter=START, density=0.02)
    layouts: dict[int, list[int]] = {}
    ddp.register_comm_hook(state, recording(layouts, model))
    _train(ddp, model, rank, range(4))
    before = state.state_dict()
    copy = pickle.loads(pickle.dumps(state))
    out["pickle_before"] = before
    out["pickle_layouts"] = dict(layouts)  # the rebuilt layout the states were saved for
    out["pickle_after"] = copy.state_dict()
    out["pickle_group_dropped"] = copy.group is None and not copy._aggregators
    params = [p.detach().clone() for p in model.parameters()]

    model, ddp = _fresh(params=params)
    plain = _model_with(params)
    ddp.register_comm_hook(copy, recording(layouts, model))
    ref = Reference("topk", False, {"density": 0.02})
    got, want = [], []
    for t in range(4, 7):
        layouts.clear()
        x = batch(rank, t)
        ddp.zero_grad()
        ddp(x).square().mean().backward()
        grads = local_grads(plain, x)
        if t == 4:  # the resumed state's first iteration in this process: dense
            want.append(mean_over_ranks(torch.cat([g.reshape(-1) for g in grads])))
            for index, sd in before["buckets"].items():
                ref.agg(index, sd["d"]).load_state_dict(sd)
            out["residual_after_dense"] = copy.state_dict()
        else:
            want.append(ref.update(grads, layouts))
        got.append(flat_grads(model))
        sgd(model, plain)
    out["pickle_got"], out["pickle_want"] = torch.stack(got), torch.stack(want)
    return out


# ----------------------------------------------------------------------- errors
def _error_of(fn) -> str:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the message is what the test checks
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def rebuilt_layout(rank: int, cap: float) -> dict[int, list[int]]:
    """The parameter positions of each bucket (in bucket order) after DDP's rebuild, as
    DDP hands them to a hook: three iterations of a plain all-reduce."""
    model, ddp = _fresh(cap)
    layouts: dict[int, list[int]] = {}
    ddp.register_comm_hook(HookState("dense", start_iter=100), recording(layouts, model))
    _train(ddp, model, rank, range(3))
    return dict(layouts)


def errors(rank: int, world_size: int) -> dict:
    """Errors that only show once DDP hands over its buckets.

    The bucket sizes come from the layouts DDP builds here (``out["layouts"]`` and
    ``out["other_layouts"]``), so the scenarios hold whatever torch's bucketing is.
    """
    out: dict = {"layouts": rebuilt_layout(rank, CAP_MB)}
    out["other_layouts"] = rebuilt_layout(rank, OTHER_CAP_MB)
    numels = [p.numel() for p in make_model().parameters()]
    # k one more than the smallest bucket: smaller than the model, larger than that bucket
    k = min(sum(numels[i] for i in pos) for pos in out["layouts"].values()) + 1
    out["k"] = k

    def k_too_large() -> None:
        model, ddp = _fresh()
        ddp.register_comm_hook(HookState("gs", start_iter=1, k=k, **SKETCH), comm_hook)
        _train(ddp, model, rank, range(3))  # the smallest bucket is smaller than k

    out["k_too_large"] = _error_of(k_too_large)

    # A per-bucket state saved with CAP_MB's buckets, loaded where DDP makes OTHER_CAP_MB's.
    model, ddp = _fresh()
    state = HookState("topk", start_iter=1, density=0.02)
    ddp.register_comm_hook(state, comm_hook)
    _train(ddp, model, rank, range(3))
    saved = state.state_dict()

    def other_layout() -> None:
        model, ddp = _fresh(cap=OTHER_CAP_MB)
        resumed = HookState("topk", start_iter=1, density=0.02)
        resumed.load_state_dict(saved)
        ddp.register_comm_hook(resumed, comm_hook)
        _train(ddp, model, rank, range(3))

    out["other_layout"] = _error_of(other_layout)

    # A whole-model state saved in model order, resumed without binding the model.
    model, ddp = _fresh()
    state = HookState("gtopk", start_iter=1, whole_model=True, model=model, density=0.02)
    ddp.register_comm_hook(state, comm_hook)
    _train(ddp, model, rank, range(3))
    saved_whole = pickle.loads(pickle.dumps(state))

    def unbound() -> None:
        model, ddp = _fresh()
        ddp.register_comm_hook(saved_whole, comm_hook)
        _train(ddp, model, rank, range(3))

    out["unbound"] = _error_of(unbound)
    return out
