"""Global momentum: classic error feedback on the gradient, and momentum kept by the
aggregator on the averaged update, alike on every rank.

Steps (per rank p, each step):
    1. Compensate: ``a_p = e_p + g_p`` (no local momentum).
    2. (The method compresses and communicates ``a_p``; its averaged update is ``delta``.)
    3. Keep: ``e_p = a_p`` with the delivered coordinates zeroed.
    4. Return the velocity: ``M[delta != 0] = 0`` (masking: where a fresh delivery, which
       carries its accumulated gradients, arrives, the coordinate's earlier velocity stops,
       as DGC masks its local velocity), then ``M = rho*M + delta``.

The coordinates a step carries are its update's nonzeros, so the rule suits methods whose
update is sparse; a dense update would mask every coordinate (no momentum). It needs
``rho > 0`` and plain SGD (the momentum is here, not in the optimizer).
"""

from __future__ import annotations

import torch

from gssgd.aggregators.feedback.ef import ErrorFeedback

__all__ = ["GlobalMomentumFeedback"]


class GlobalMomentumFeedback(ErrorFeedback):
    """Per-rank residual; the velocity ``M`` of the averaged update (alike on every rank).

    Args:
        momentum: ``rho`` in (0, 1), the velocity's decay.
        masking: ignored (the mask is the update's support, step 4).
    """

    name = "global"
    streams = False  # no piece-by-piece compensation: streaming gs-SGD refuses it
    owns_momentum = True

    def __init__(self, momentum: float = 0.0, masking: bool = True) -> None:
        super().__init__(momentum, masking=False)

    def compensate(self, grad: torch.Tensor) -> torch.Tensor:
        return self._residual_like(grad) + grad

    def returned(self, update: torch.Tensor) -> torch.Tensor:
        if self.velocity is None:
            self.velocity = torch.zeros_like(update)
        velocity = self.velocity.to(update.device, update.dtype)
        velocity[update != 0] = 0
        self.velocity = velocity.mul_(self.momentum).add_(update)
        return velocity.clone()
