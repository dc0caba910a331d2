"""EF21 (Richtarik, Sokolov, Fatkhullin 2021) and, with momentum, EF21-SGDM (Fatkhullin et
al. 2023): the ranks compress the change of their (momentum) gradients, and every rank
returns the same dense estimate of their mean.

Steps (per rank p, each step):
    1. Compensate: ``v_p = rho*v_p + g_p`` (``v_p = g_p`` without momentum) and compress
       ``a_p = e_p + (v_p - v_p_prev)``: what the shared estimate still lacks.
    2. (The method compresses and communicates ``a_p``; its averaged update is ``delta``.)
    3. Keep: ``e_p = a_p`` with the delivered coordinates zeroed (the velocity is never
       masked).
    4. Return ``G += delta``, the same on every rank: the optimizer steps on a smooth but
       lagging estimate instead of on sparse bursts.

The residuals then hold what the estimate lacks: ``sum_p e_p = sum_p v_p - P*G``.
"""

from __future__ import annotations

import torch

from gssgd.aggregators.feedback.ef import ErrorFeedback

__all__ = ["EF21Feedback"]


class EF21Feedback(ErrorFeedback):
    """EF21(-SGDM): residual, velocity ``v`` and the shared estimate ``G``.

    Args:
        momentum: ``rho`` in [0, 1); 0: plain EF21.
        masking: ignored (EF21 never masks its velocity).

    Attributes:
        estimate: ``G``, alike on every rank (None before the first step).
    """

    name = "ef21"
    streams = False  # no piece-by-piece compensation: streaming gs-SGD refuses it

    def __init__(self, momentum: float = 0.0, masking: bool = True) -> None:
        super().__init__(momentum, masking=False)
        self.estimate: torch.Tensor | None = None

    def compensate(self, grad: torch.Tensor) -> torch.Tensor:
        residual, velocity = self._residual_like(grad), self._velocity_like(grad)
        change = grad - (1 - self.momentum) * velocity  # v - v_prev, v = rho*v_prev + g
        velocity.add_(change)
        return residual + change

    def returned(self, update: torch.Tensor) -> torch.Tensor:
        if self.estimate is None:
            self.estimate = torch.zeros_like(update)
        self.estimate = self.estimate.to(update.device, update.dtype).add_(update)
        return self.estimate.clone()

    def tensors(self) -> dict[str, torch.Tensor | None]:
        return {**super().tensors(), "estimate": self.estimate}

    def load_state_dict(self, sd: dict) -> None:
        super().load_state_dict(sd)
        estimate = sd.get("estimate")
        self.estimate = None if estimate is None else estimate.clone()
