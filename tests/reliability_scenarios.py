"""Worker functions for tests/test_reliability.py (importable by spawned gloo processes)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gssgd.ddp import HookState, comm_hook


class OddModel(nn.Module):
    """A frozen layer, a 0-dim parameter, and (optionally) a float64 layer."""

    def __init__(self, mixed: bool) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.frozen = nn.Linear(6, 6)
        self.frozen.requires_grad_(False)
        self.scale = nn.Parameter(torch.tensor(1.5))  # a 0-dim parameter
        self.body = nn.Linear(6, 4)
        self.head = nn.Linear(4, 3).double() if mixed else nn.Linear(4, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.body(self.frozen(x) * self.scale))
        return self.head(h.to(self.head.weight.dtype))


def train_odd_model(rank: int, world_size: int, method: str, mixed: bool) -> dict:
    """A few DDP steps with the gs hook on a model with odd parameters; returns the params
    and any error message."""
    model = OddModel(mixed)
    ddp = DDP(model)
    state = HookState(method, density=0.2, start_iter=1, whole_model=True, model=model)
    ddp.register_comm_hook(state, comm_hook)
    try:
        for step in range(4):
            x = torch.randn(5, 6, generator=torch.Generator().manual_seed(10 * step + rank))
            ddp.zero_grad()
            ddp(x).pow(2).mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p -= 0.1 * p.grad
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "frozen_unchanged": torch.equal(model.frozen.weight, OddModel(mixed).frozen.weight),
        "iter": state.iter,
    }


def train_odd_models(rank: int, world_size: int, method: str, variants: tuple[bool, ...]) -> dict:
    """``train_odd_model`` for every ``mixed`` of ``variants`` in turn (one spawn), by it."""
    return {mixed: train_odd_model(rank, world_size, method, mixed) for mixed in variants}
