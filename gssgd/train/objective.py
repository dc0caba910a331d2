"""What one rank computes at a step: its batch, its loss, its optimizer, and its share of an
evaluation.

Shared by the training loop of real processes (:mod:`gssgd.train.loop`) and the simulated
world's loop (:mod:`gssgd.train.simulate`), so both train the same thing: rank ``r`` of
``P`` draws the batch :func:`train_batch` gives it and averages the same loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gssgd.train.config import TrainConfig
from gssgd.train.data import ImageData, TextData, batch_indices, lm_batch

__all__ = ["TEXT_EVAL_WINDOWS", "batch_loss", "evaluation_sums", "train_batch"]

#: Test windows of a text evaluation (drawn once from the test split, shared by ranks).
TEXT_EVAL_WINDOWS = 512


def train_batch(
    data: ImageData | TextData,
    cfg: TrainConfig,
    step: int,
    rank: int,
    world_size: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch at ``step``: a pure function of (seed, step, rank, world size)."""
    if isinstance(data, TextData):
        x, y = lm_batch(data.train, step, rank, world_size, cfg.batch_size, cfg.seq_len, cfg.seed)
    else:
        idx = batch_indices(step, rank, world_size, cfg.batch_size, len(data.y_train), cfg.seed)
        x, y = data.x_train[idx], data.y_train[idx]
    return x.to(device), y.to(device)


def batch_loss(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """Mean cross-entropy, correct predictions and count (text: per character)."""
    logits = logits.reshape(-1, logits.shape[-1])
    targets = targets.reshape(-1)
    loss = F.cross_entropy(logits, targets)
    correct = int((logits.detach().argmax(dim=1) == targets).sum())
    return loss, correct, targets.numel()


@torch.no_grad()
def evaluation_sums(
    model: nn.Module,
    data: ImageData | TextData,
    cfg: TrainConfig,
    rank: int,
    world_size: int,
    device: torch.device,
) -> torch.Tensor:
    """Rank ``rank``'s share of the test: (loss * count, correct, count) as float64.

    Images: the whole test split, rank ``r`` scoring samples ``r, r+P, ...``. Text:
    :data:`TEXT_EVAL_WINDOWS` windows drawn once from the test split. Summed over the ranks
    (``world_size=1``: all of it) they give the test loss and accuracy.
    """
    model.eval()
    if isinstance(data, TextData):
        x, y = lm_batch(data.test, 0, 0, 1, TEXT_EVAL_WINDOWS, cfg.seq_len, cfg.seed)
    else:
        x, y = data.x_test, data.y_test
    x, y = x[rank::world_size], y[rank::world_size]
    sums = torch.zeros(3, dtype=torch.float64)
    chunk = 64 if isinstance(data, TextData) else 1000
    for i in range(0, len(y), chunk):
        logits = model(x[i : i + chunk].to(device))
        targets = y[i : i + chunk].to(device)
        loss, correct, count = batch_loss(logits, targets)
        sums += torch.tensor([float(loss) * count, correct, count], dtype=torch.float64)
    model.train()
    return sums.to(device)
