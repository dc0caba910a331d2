"""The training loop's own collectives: every rank's loss agreed on, the step's bytes
gathered, and how a failed collective is told from other errors."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from gssgd.train.launch import Worker
from gssgd.train.metrics import StepBytes

__all__ = ["agree_on_loss", "collective_failure", "gather_bytes"]


def agree_on_loss(
    loss: torch.Tensor, correct: int, count: int, worker: Worker
) -> tuple[float, float, float, float]:
    """Sum (loss * count, correct, count, non-finite ranks) over the ranks: every rank
    learns whether any loss is non-finite, so all stop together."""
    value = float(loss.detach())
    seen = torch.tensor([value * count, correct, count, not math.isfinite(value)],
                        dtype=torch.float64, device=worker.device)
    dist.all_reduce(seen)
    loss_sum, correct_sum, count_sum, nonfinite = seen.tolist()
    return loss_sum, correct_sum, count_sum, nonfinite


def gather_bytes(stats: dict[str, Any], worker: Worker) -> StepBytes:
    """This step's bytes sent and received over the ranks (mean and busiest)."""
    mine = torch.tensor(
        [stats["bytes_sent"], stats["bytes_received"]], dtype=torch.float64, device=worker.device
    )
    everyone = [torch.empty_like(mine) for _ in range(worker.world_size)]
    dist.all_gather(everyone, mine)
    return StepBytes.of([tuple(t.tolist()) for t in everyone])


def collective_failure(err: BaseException) -> bool:
    """Whether an error came from a collective (gloo/NCCL timeouts, closed connections)."""
    if isinstance(err, dist.DistBackendError):
        return True
    text = str(err).lower()
    return any(w in text for w in ("timed out", "timeout", "connection", "gloo", "nccl", "peer"))
