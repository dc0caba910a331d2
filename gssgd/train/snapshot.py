"""Checkpoints of a training run across its ranks: every rank's RNG and hook state gathered
to rank 0, which writes them beside the model and the optimizer
(:func:`save_run_checkpoint`), and the RNG helpers a resumed rank restores with.

The file format, atomic writes and resolving a checkpoint live in :mod:`gssgd.train.checkpoint`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gssgd.ddp.paired import to_cpu
from gssgd.train import checkpoint
from gssgd.train.config import TrainConfig
from gssgd.train.launch import Worker
from gssgd.train.metrics import RunTotals
from gssgd.train.sync import GradientSync

__all__ = ["rng_state", "save_run_checkpoint", "set_rng_state"]


def save_run_checkpoint(
    out: Path,
    step: int,
    cfg: TrainConfig,
    fingerprint: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sync: GradientSync,
    totals: RunTotals,
    worker: Worker,
) -> None:
    """Gather every rank's RNG and hook state to rank 0, which writes the checkpoint.

    A collective: every rank learns whether rank 0's write succeeded and raises if not.
    """
    mine = {"rng": rng_state(worker.device), "sync": to_cpu(sync.state_dict())}
    everyone: list[Any] | None = [None] * worker.world_size if worker.rank == 0 else None
    dist.gather_object(mine, everyone, dst=0)
    ok, error = torch.ones(1, device=worker.device), None
    if worker.rank == 0:
        try:
            checkpoint.save_checkpoint(
                out,
                step,
                {
                    "fingerprint": fingerprint,
                    "config": dataclasses.asdict(cfg),
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "ranks": everyone,
                    "totals": totals.state_dict(),
                },
            )
        except OSError as err:
            ok.zero_()
            error = err
    dist.broadcast(ok, src=0)
    if error is not None:
        raise OSError(f"writing the checkpoint of step {step} to {out} failed: {error}") from error
    if not bool(ok.item()):
        raise RuntimeError(f"rank 0 could not write the checkpoint of step {step} (see its error)")


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """This process's RNG states (CPU, and the device's on CUDA)."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    """Restore :func:`rng_state` output."""
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
