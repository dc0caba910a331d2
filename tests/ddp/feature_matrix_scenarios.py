"""Worker functions for tests/ddp/test_feature_matrix.py: the DDP feature matrix.

Each *case* is one DDP feature users switch on in their own scripts (``no_sync()``
gradient accumulation, ``find_unused_parameters=True``, ``static_graph=True``,
``gradient_as_bucket_view=True``, a model whose bucket layout is neither the parameter
order nor its reverse). Each case runs with every registered method
(:data:`gssgd.METHODS`): the gssgd aggregators through :func:`gssgd.ddp.comm_hook`, per
bucket and over the whole model, and DDP's built-ins (its own all-reduce, its fp16 hook,
PowerSGD). Beside the DDP model, an identical plain model does the same forward and
backward passes; its local gradients go through reference aggregators
(:class:`tests.ddp.scenarios.Reference`, ``gssgd.make_aggregator`` on the layouts DDP hands
the hook), so the parent can compare what DDP wrote into ``param.grad`` with the same math
done in one process.

One spawn per world size runs the whole matrix (tiny models, few steps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import gssgd
from gssgd.ddp import HookState, comm_hook
from tests.ddp.scenarios import METHODS as OPTIONS
from tests.ddp.scenarios import START, Reference, mean_over_ranks, recording

ITERS = 4  # iterations per run: START dense ones, then compressed ones
MICRO = 3  # micro-batches per iteration in the no_sync case (the first MICRO - 1 unsynced)
LR = 0.05
#: DDP's built-in methods (no gssgd aggregator), trained through DDP's own hooks. PyTorch's
#: PowerSGD (torch-powersgd; gssgd's own powersgd is in the matrix) is left out: PyTorch's hook
#: issues collectives from its future callbacks, and on gloo with several buckets it hung or
#: aborted (signal 6) as registered here; the trainer runs it bucket by bucket on gloo
#: (gssgd.train.sync.bucket_by_bucket, tested in tests/train/test_loop.py).
BUILTINS = tuple(
    name for name, m in gssgd.METHODS.items() if m.aggregator is None and name != "torch-powersgd"
)
#: gssgd's aggregators, each per bucket and over the whole model.
HOOKED = tuple(name for name, m in gssgd.METHODS.items() if m.aggregator is not None)
MODES = {"bucket": False, "whole": True}


def _init(model: nn.Module) -> nn.Module:
    """The same weights on every rank and every call."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


class Mlp(nn.Module):
    """Four layers in model order (2 858 parameters): DDP's rebuilt buckets run in reverse."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 48), nn.Tanh(), nn.Linear(48, 32), nn.Tanh(),
                                 nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 10))

    def forward(self, x: torch.Tensor, rank: int, t: int) -> torch.Tensor:
        return self.net(x)


class Branchy(nn.Module):
    """A trunk and three heads. ``rare`` is used on every rank only when ``t % 3 == 2``
    (unused on every rank otherwise: DDP leaves its ``.grad`` alone); ``some`` is used only
    by rank 0 on odd steps (unused on the other ranks: DDP reduces zeros for them)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(16, 32)
        self.main = nn.Linear(32, 10)
        self.rare = nn.Linear(32, 10)
        self.some = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor, rank: int, t: int) -> torch.Tensor:
        h = torch.tanh(self.trunk(x))
        y = self.main(h)
        if t % 3 == 2:
            y = y + self.rare(h)
        if t % 2 == 0 or rank == 0:
            y = y + self.some(h)
        return y


class Shuffled(nn.Module):
    """Layers registered in another order than the forward pass uses them (head first,
    the wide embedding second), so DDP's rebuilt buckets follow neither the parameter
    order nor its reverse, and their sizes change at the rebuild."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(24, 10)
        self.embed = nn.Linear(16, 64)
        self.mid = nn.Linear(64, 24)

    def forward(self, x: torch.Tensor, rank: int, t: int) -> torch.Tensor:
        return self.head(torch.tanh(self.mid(torch.tanh(self.embed(x)))))


@dataclass(frozen=True)
class Case:
    """One DDP feature: the model, DDP's keyword arguments and micro-batches per step."""

    model: Callable[[], nn.Module]
    ddp: dict[str, Any] = field(default_factory=dict)
    micro: int = 1
    cap_mb: float = 0.003  # several buckets for every model here


CASES: dict[str, Case] = {
    "no_sync": Case(Mlp, micro=MICRO),
    "unused": Case(Branchy, {"find_unused_parameters": True}, cap_mb=0.00125),
    "unused_view": Case(
        Branchy, {"find_unused_parameters": True, "gradient_as_bucket_view": True}, cap_mb=0.00125
    ),
    "static_graph": Case(Mlp, {"static_graph": True}),
    "bucket_view": Case(Mlp, {"gradient_as_bucket_view": True}),
    "reordered": Case(Shuffled, cap_mb=0.002),
}


def runs() -> list[str]:
    """Every run's name in a case: ``method-mode`` for gssgd's methods, the built-ins' names."""
    return [f"{m}-{mode}" for m in HOOKED for mode in MODES] + list(BUILTINS)


def batch(rank: int, t: int, micro: int) -> torch.Tensor:
    """Different inputs per (rank, step, micro-batch)."""
    seed = 10_000 * t + 100 * micro + rank
    return torch.randn(6, 16, generator=torch.Generator().manual_seed(seed))


def _loss(model: nn.Module, x: torch.Tensor, rank: int, t: int) -> torch.Tensor:
    return model(x, rank, t).square().mean()


def _flat(model: nn.Module) -> torch.Tensor:
    """The gradients in model order; a parameter without ``.grad`` counts as zeros."""
    return torch.cat([
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
        for p in model.parameters()
    ])


def _sgd(ddp_model: nn.Module, plain: nn.Module) -> None:
    """SGD on the DDP model's gradients (parameters without one stay); ``plain`` copies."""
    with torch.no_grad():
        for p, q in zip(ddp_model.parameters(), plain.parameters(), strict=True):
            if p.grad is not None:
                p -= LR * p.grad
            q.copy_(p)


def _register(ddp: DDP, model: nn.Module, method: str, whole: bool,
              layouts: dict[int, list[int]]) -> HookState | None:
    if method == "ddp-fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif method != "ddp-allreduce":
        hook = HookState(method, start_iter=START, whole_model=whole, model=model,
                         **OPTIONS.get(method, {}))
        ddp.register_comm_hook(hook, recording(layouts, model))
        return hook
    return None


def _residuals(state: HookState, model: nn.Module) -> torch.Tensor:
    """This rank's residuals in model order (zeros where a method keeps none)."""
    numels = [p.numel() for p in model.parameters()]
    starts = [sum(numels[:i]) for i in range(len(numels))]
    out = torch.zeros(sum(numels))
    sd = state.state_dict()
    for index, bucket in sd["buckets"].items():
        residual = bucket.get("residual")
        if residual is None:
            continue
        offset = 0
        for pos, n in sd["layouts"][index]:
            out[starts[pos]:starts[pos] + n] = residual[offset:offset + n]
            offset += n
    return out


def run_case(rank: int, case: Case, method: str, whole: bool) -> dict[str, Any]:
    """ITERS iterations of DDP with ``method`` on ``case``, next to the plain reference.

    Returns:
        ``got``/``want`` (ITERS x d, model order): the DDP model's gradients after each
        backward and the reference's; ``local``: this rank's local gradient of each
        iteration (summed over micro-batches); ``residual``: the hook's residuals at the
        end (model order); ``layouts``: the buckets DDP handed the hook, per iteration.
    """
    model, plain = _init(case.model()), _init(case.model())
    ddp = DDP(model, bucket_cap_mb=case.cap_mb, **case.ddp)
    layouts: dict[int, list[int]] = {}
    state = _register(ddp, model, method, whole, layouts)
    ref = Reference(method, whole, OPTIONS.get(method, {})) if state is not None else None
    out: dict[str, Any] = {"got": [], "want": [], "local": [], "layouts": [], "error": None}
    for t in range(ITERS):
        layouts.clear()
        ddp.zero_grad(set_to_none=True)
        plain.zero_grad(set_to_none=True)
        for micro in range(case.micro):
            x = batch(rank, t, micro)
            if micro < case.micro - 1:
                with ddp.no_sync():
                    _loss(ddp, x, rank, t).backward()
            else:
                _loss(ddp, x, rank, t).backward()
            _loss(plain, x, rank, t).backward()
        local = [
            (q.grad if q.grad is not None else torch.zeros_like(q)) for q in plain.parameters()
        ]
        flat_local = torch.cat([g.reshape(-1) for g in local])
        if ref is None or t < START:
            want = mean_over_ranks(flat_local)
        else:
            want = ref.update(local, layouts)
        out["got"].append(_flat(model))
        out["want"].append(want)
        out["local"].append(flat_local)
        out["layouts"].append(dict(layouts))
        _sgd(model, plain)
    out["residual"] = _residuals(state, model) if state is not None else None
    out["iter"] = state.iter if state is not None else None
    return {k: torch.stack(v) if k in ("got", "want", "local") else v for k, v in out.items()}


def run_matrix(rank: int, world_size: int, cases: list[str] | None = None) -> dict[str, Any]:
    """Every case with every method; a run that raises records its error instead."""
    torch.manual_seed(1234)  # DDP's construction must not depend on the global RNG
    out: dict[str, Any] = {}
    for name in cases or list(CASES):
        for run in runs():
            method, _, mode = run.partition("-") if run not in BUILTINS else (run, "", "")
            try:
                out[f"{name}/{run}"] = run_case(rank, CASES[name], method, mode == "whole")
            except Exception as exc:  # noqa: BLE001 - the test reports which run failed
                out[f"{name}/{run}"] = {"error": f"{type(exc).__name__}: {exc}"}
    if cases is None:
        out["static_graph_limits"] = static_graph_limits(rank)
    return out


# ----------------------------------------------------------------------- static_graph limits
def _train_static(rank: int, state: HookState, params: list[torch.Tensor] | None,
                  steps: range, bind: bool = False) -> list[torch.Tensor]:
    """A few iterations of Mlp under static_graph=True with ``state``'s hook (bound to the
    model when ``bind``)."""
    model = _init(Mlp())
    if bind:
        state.bind(model)
    if params is not None:
        with torch.no_grad():
            for p, saved in zip(model.parameters(), params, strict=True):
                p.copy_(saved)
    ddp = DDP(model, bucket_cap_mb=CASES["static_graph"].cap_mb, static_graph=True)
    ddp.register_comm_hook(state, comm_hook)
    for t in steps:
        ddp.zero_grad(set_to_none=True)
        _loss(ddp, batch(rank, t, 0), rank, t).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
    return [p.detach().clone() for p in model.parameters()]


def _error_of(fn: Callable[[], object]) -> str:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the message is what the test checks
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def static_graph_limits(rank: int) -> dict[str, str]:
    """With static_graph=True DDP rebuilds its buckets after iteration 1, not 0: per-bucket
    compression from iteration 1, and a per-bucket state resumed in a new DDP (whose second
    iteration still has the first layout), stop with a clear error on every rank; whole-model
    mode in model order compresses from iteration 1 without one."""
    opts = OPTIONS["topk"]
    out = {
        "start_iter_1": _error_of(lambda: _train_static(
            rank, HookState("topk", start_iter=1, **opts), None, range(3))),
    }
    state = HookState("topk", start_iter=START, **opts)
    params = _train_static(rank, state, None, range(4))
    saved = state.state_dict()

    def resume() -> None:
        resumed = HookState("topk", start_iter=START, **opts)
        resumed.load_state_dict(saved)
        _train_static(rank, resumed, params, range(4, 7))

    out["resume_per_bucket"] = _error_of(resume)
    out["whole_model_start_iter_1"] = _error_of(lambda: _train_static(
        rank, HookState("topk", start_iter=1, whole_model=True, **opts), None, range(3),
        bind=True))
    return out
