"""FetchSGD's momentum and error feedback in sketch space (Rothchild et al., ICML 2020).

A Count Sketch is linear, so momentum and error accumulation can run on the summed sketch
instead of on each worker's vector. Sketched-SGD's server and every gs-SGD rank hold the
same summed table ``S`` of the workers' gradients, and per step:

    1. Velocity: ``S_u = rho * S_u + S``.
    2. Error: ``S_e += S_u``.
    3. Recover: the k coordinates with the largest ``|estimate|`` in ``S_e`` (ties by lower
       index) and their estimates: the update before the division by P.
    4. Feedback: ``S_e = 0`` and ``S_u = 0`` in every bucket ``sketch(delta)`` touches
       (the delivered coordinates leave the error; momentum stopping).

Step 4 follows the authors' code (kiddyboots216/CommEfficient, ``fed_aggregator.py``),
not the paper's ``S_e -= sketch(delta)``: the code notes that subtracting "should work
but doesn't (model diverges)". Subtracting leaves every other coordinate hashed into a
touched bucket in ``S_e`` and takes off only the estimate, which carries the collisions'
noise; that noise then builds up step after step. Zeroing drops the colliding
coordinates' error in those buckets instead (``tests/aggregators/feedback/test_fetchsgd.py``
shows the difference on a noisy quadratic).

The workers keep no residual; what the sketch does not deliver stays in ``S_e``. The
learning rate is applied by the optimizer after this (plain SGD): with a constant learning
rate that is FetchSGD's update, since the paper's ``S_e += lr * S_u`` only scales the
error by a constant.
"""

from __future__ import annotations

from typing import Any

import torch

from gssgd.aggregators.feedback.ef import ErrorFeedback
from gssgd.sketch import CountSketch

__all__ = ["FetchSGDFeedback", "SketchFeedback"]


class SketchFeedback:
    """The velocity ``S_u`` and error ``S_e`` tables of FetchSGD, and its recovery step.

    Args:
        momentum: ``rho`` in [0, 1).
    """

    def __init__(self, momentum: float) -> None:
        self.momentum = momentum
        self.velocity: torch.Tensor | None = None
        self.error: torch.Tensor | None = None

    def recover(self, summed: CountSketch, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Steps 1-4 on ``summed``, the sketch of the sum of the workers' gradients.

        Args:
            summed: the summed sketch (its table is read, not changed).
            k: coordinates to deliver.

        Returns:
            ``(indices, values)``: the k delivered coordinates (ordered by ``|value|``)
            and the error sketch's estimates of them (sums over the workers).

        Raises:
            ValueError: ``summed`` has another table shape than the stored state (a
                sketch must keep its shape for the whole run).
        """
        table = summed.table
        if self.velocity is None or self.error is None:
            self.velocity, self.error = torch.zeros_like(table), torch.zeros_like(table)
        if self.velocity.shape != table.shape:
            raise ValueError(
                f"FetchSGD's sketch state has shape {tuple(self.velocity.shape)} but this "
                f"step's sketch {tuple(table.shape)}; keep rows and cols fixed for the run."
            )
        self.velocity = self.velocity.to(table.device, table.dtype)
        self.error = self.error.to(table.device, table.dtype)
        self.velocity.mul_(self.momentum).add_(table)
        self.error.add_(self.velocity)
        error = summed.with_table(self.error)
        indices, values = error.heavy_hitters(k)
        delta = torch.zeros(summed.d, dtype=table.dtype, device=table.device)
        delta[indices] = values
        delivered = summed.with_table(torch.zeros_like(table))
        delivered.accumulate(delta)
        touched = delivered.table != 0
        self.error[touched] = 0
        self.velocity[touched] = 0
        return indices, values

    def rescale(self, factor: float) -> None:
        """Multiply both tables by ``factor`` (a loss-scale change under AMP)."""
        for table in (self.velocity, self.error):
            if table is not None:
                table.mul_(factor)

    def state_dict(self) -> dict[str, Any]:
        """Copies of the two tables (None before the first step)."""
        return {
            "velocity": None if self.velocity is None else self.velocity.clone(),
            "error": None if self.error is None else self.error.clone(),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        velocity, error = sd.get("velocity"), sd.get("error")
        self.velocity = None if velocity is None else velocity.clone()
        self.error = None if error is None else error.clone()


class FetchSGDFeedback(ErrorFeedback):
    """FetchSGD as a rule: the ranks compress their plain gradients and keep nothing; the
    sketching method recovers through :attr:`tables` (steps 1-4 above) on whichever rank
    holds the summed sketch (every gs-SGD rank; Sketched-SGD's server).

    Args:
        momentum: ``rho`` in [0, 1), the sketch velocity's decay.
        masking: ignored.

    Attributes:
        tables: the :class:`SketchFeedback` velocity and error tables.
    """

    name = "fetchsgd"
    streams = False  # no piece-by-piece compensation: streaming gs-SGD refuses it
    owns_momentum = True

    def __init__(self, momentum: float = 0.0, masking: bool = True) -> None:
        super().__init__(0.0, masking=False)
        self.tables = SketchFeedback(momentum)

    def compensate(self, grad: torch.Tensor) -> torch.Tensor:
        return grad.clone()  # the sketch is built from it; the error lives in sketch space

    def keep(self, accumulated: torch.Tensor, delivered: torch.Tensor) -> None:
        """Nothing: the ranks keep no residual (the error sketch keeps what was not sent)."""

    def rescale(self, factor: float) -> None:
        self.tables.rescale(factor)

    def state_dict(self) -> dict[str, Any]:
        return {"residual": None, "sketch_feedback": self.tables.state_dict()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.tables.load_state_dict(sd.get("sketch_feedback", {}))
