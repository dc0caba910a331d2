"""Futures for DDP communication hooks: one completed later, or one already done."""

from __future__ import annotations

import torch

__all__ = ["completed_future", "new_future"]


def new_future(device: torch.device) -> torch.futures.Future[torch.Tensor]:
    """A future that may hold tensors on ``device`` (CUDA futures must name their device):
    what a DDP communication hook returns for a bucket it completes later."""
    return torch.futures.Future(devices=[device] if device.type != "cpu" else None)


def completed_future(tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """A future that already holds ``tensor``."""
    fut = new_future(tensor.device)
    fut.set_result(tensor)
    return fut
