"""Worker functions for tests/ddp/test_overlap_buckets.py (importable by spawned gloo
processes): the same training with ``overlap="none"`` and ``overlap="buckets"``, on a
model of many DDP buckets whose backward sleeps a random time per rank and layer."""

# No ``from __future__ import annotations``: DDP checks a hook's annotations as objects.
import random
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gssgd.ddp import HookState, comm_hook

#: label -> (method, hook options): every method that averages per bucket
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "dense": ("dense", {}),
    "dense16": ("dense", {"dtype": torch.float16}),
    "topk": ("topk", {"density": 0.05}),
    "gtopk": ("gtopk", {"density": 0.05}),
    "sketched": ("sketched", {"density": 0.05, "rows": 3, "cols": 120, "candidates": 2}),
    "gs": ("gs", {"density": 0.05, "rows": 3, "cols": 120, "candidates": 2}),
    "powersgd": ("powersgd", {"rank": 1}),
}
STEPS = 20
START_ITER = 2  # the dense warm-up's iterations
LAYERS = 10
CAP_MB = 0.005  # 10 layers of 40 x 40 (6.4 KB each): one bucket per layer, or so


class _Dawdle(torch.autograd.Function):
    """Identity whose backward sleeps 0-3 ms, drawn from the rank's own generator, so the
    buckets become ready at different times on different ranks."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rng: random.Random) -> torch.Tensor:
        ctx.rng = rng
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.rng.random() * 0.003)
        return grad, None


class Deep(nn.Module):
    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(40, 40) for _ in range(LAYERS))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
        self.rng = rng

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = _Dawdle.apply(torch.tanh(layer(x)), self.rng)
        return x


def train(rank: int, world: int, label: str, overlap: str) -> dict[str, Any]:
    """STEPS steps of SGD through the hook; the final weights and the buckets DDP used."""
    model = Deep(random.Random(1000 * rank + len(overlap)))
    ddp = DDP(model, bucket_cap_mb=CAP_MB)
    method, options = METHODS[label]
    state = HookState(method, whole_model=False, start_iter=START_ITER, overlap=overlap,
                      **options)
    returned_pending = [0]

    def hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        compressing = state.iter >= state.start_iter  # the warm-up's all-reduce is async anyway
        fut = comm_hook(state, bucket)
        returned_pending[0] += compressing and not fut.done()  # backward went on without it
        return fut

    ddp.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    blocked_within_phases = []  # the hook's calls' wall time against its phases' seconds
    for _ in range(STEPS):
        x = torch.randn(8, 40, generator=gen)
        loss = (ddp(x) - x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        s = state.last_stats
        phases = s.seconds_compress + s.seconds_communicate + s.seconds_decompress
        if state.last_iteration == "compressed":  # (the warm-up's all-reduce is async anyway)
            blocked_within_phases.append((s.seconds_blocked, phases))
    buckets = len(ddp.reducer._get_zeros_like_grad_buckets())
    out = {"weights": [p.detach().clone() for p in model.parameters()], "buckets": buckets,
           "bytes": state.totals.bytes_sent, "returned_pending": returned_pending[0],
           "blocked": blocked_within_phases}
    del ddp
    return out


def both(rank: int, world: int, label: str) -> dict[str, Any]:
    """The synchronous and the overlapped run of ``label``'s method on this rank."""
    return {overlap: train(rank, world, label, overlap) for overlap in ("none", "buckets")}


def nan_in_a_middle_bucket(rank: int, world: int, label: str) -> dict[str, Any]:
    """``nonfinite="raise"`` with the overlap: from step 3 rank 1's gradient of a middle
    layer is NaN. What each rank's backward raised, at which step, and whether the steps
    before it trained (every bucket's collective was still issued: no rank hangs)."""
    model = Deep(random.Random(rank))
    ddp = DDP(model, bucket_cap_mb=CAP_MB)
    method, options = METHODS[label]
    state = HookState(method, whole_model=False, start_iter=2, overlap="buckets",
                      nonfinite="raise", **options)
    ddp.register_comm_hook(state, comm_hook)
    step = [0]
    poisoned = model.layers[LAYERS // 2].weight
    poisoned.register_hook(lambda g: g * float("nan") if rank == 1 and step[0] >= 3 else g)
    gen = torch.Generator().manual_seed(rank)
    raised = None
    for step[0] in range(5):
        x = torch.randn(8, 40, generator=gen)
        try:
            (ddp(x) - x).square().mean().backward()
        except Exception as exc:  # what the backward raised, with its type
            raised = (type(exc).__name__, str(exc), step[0])
            break
    out = {"raised": raised, "iterations": state.iter}
    del ddp
    return out
