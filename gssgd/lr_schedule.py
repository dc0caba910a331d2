"""Learning-rate schedules: a linear warm-up, then constant or a half cosine to zero.

Language models are trained with a warm-up and a decaying learning rate, and a method
comparison at a constant rate favours whichever method the constant suits. One rule serves
``gssgd train`` (real and simulated workers), ``gssgd study`` specs and the one-call DDP
API, so a run's learning rate at step ``t`` is the same number everywhere:

    lr(t) = lr * factor(t)
    factor(t) = (t + 1) / W                                  for t < W (the warm-up)
              = 1                                            constant, t >= W
              = (1 + cos(pi * (t - W) / (T - W))) / 2        cosine, t >= W

with ``W`` the warm-up steps and ``T`` the run's steps (``t`` counts optimizer steps from
0). The factor depends on the step alone, so a resumed run's learning rate is the
uninterrupted run's, bit for bit, with nothing to checkpoint. Local steps (DiLoCo)
schedule their inner optimizer's steps; the outer step keeps its own rate.

Example::
    >>> schedule = LrSchedule("cosine", warmup_steps=2, total_steps=10)
    >>> [round(schedule.factor(t), 3) for t in (0, 1, 2, 6, 9)]
    [0.5, 1.0, 1.0, 0.5, 0.038]
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from gssgd.validate import check_int

__all__ = ["LR_SCHEDULES", "LrSchedule"]

#: The schedules after the warm-up (``--lr-schedule``).
LR_SCHEDULES: tuple[str, ...] = ("constant", "cosine")


@dataclass(frozen=True)
class LrSchedule:
    """A learning-rate schedule over a run of ``total_steps`` optimizer steps.

    Attributes:
        kind: ``"constant"`` or ``"cosine"`` (:data:`LR_SCHEDULES`).
        warmup_steps: steps of the linear warm-up, 0 for none (< ``total_steps``).
        total_steps: the run's optimizer steps (>= 1).

    Raises:
        ValueError: a value out of range (the message names it, its range and the fix).
    """

    kind: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 1

    def __post_init__(self) -> None:
        if self.kind not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule={self.kind!r} is invalid: it must be one of "
                             f"{', '.join(LR_SCHEDULES)}.")
        for name, low in (("total_steps", 1), ("warmup_steps", 0)):
            check_int(name, getattr(self, name), low)
        if self.warmup_steps and self.warmup_steps >= self.total_steps:
            raise ValueError(
                f"lr_warmup_steps={self.warmup_steps} is invalid: it must be below the run's "
                f"{self.total_steps} steps (a tenth of the run is usual: "
                f"{self.total_steps // 10}).")

    @property
    def is_constant(self) -> bool:
        """Whether every step takes the base learning rate (no warm-up, no decay)."""
        return self.kind == "constant" and not self.warmup_steps

    def factor(self, step: int) -> float:
        """The multiplier of the base learning rate at optimizer step ``step`` (from 0)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup_steps)
                       / max(1, self.total_steps - self.warmup_steps))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    def apply(self, optimizer: torch.optim.Optimizer, lr: float, step: int) -> None:
        """Set every parameter group's learning rate to ``lr * factor(step)`` (a loop that
        steps the optimizer itself calls this before each step)."""
        if self.is_constant:
            return
        value = lr * self.factor(step)
        for group in optimizer.param_groups:
            group["lr"] = value

    def scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        """The schedule as a ``torch`` scheduler over ``optimizer`` (step it after each
        ``optimizer.step()``; its ``state_dict`` resumes it)."""
        return torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(_factor, self))


def _factor(schedule: LrSchedule, step: int) -> float:
    """:meth:`LrSchedule.factor` as a picklable function of the step (LambdaLR's)."""
    return schedule.factor(step)
