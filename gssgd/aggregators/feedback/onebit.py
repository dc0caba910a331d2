"""1-bit Adam's compression stage (Tang et al. 2021) with any method's compressor.

Steps (per rank p, each step; ``m`` is the last step's update, alike on every rank):
    1. Compensate: ``a_p = e_p + rho*m + (1 - rho)*g_p``: this rank's share of the next
       exponential moving average of the gradients.
    2. (The method compresses and communicates ``a_p``; its averaged update is ``delta``.)
    3. Keep: ``e_p = a_p`` with the delivered coordinates zeroed (a subclass that mixes in
       :class:`~gssgd.aggregators.feedback.quantised.QuantisedFeedback` keeps
       ``a_p - delta`` instead).
    4. Return ``delta`` and keep it as ``m``: a compressed moving average of the gradients.

Pair it with :class:`~gssgd.optim.FrozenVarianceAdamW` (``rho`` = its beta1), which steps on
``m`` with the variance frozen after a dense warm-up (:func:`gssgd.ddp.compressed_adamw`).
"""

from __future__ import annotations

import torch

from gssgd.aggregators.feedback.ef import ErrorFeedback

__all__ = ["OneBitFeedback"]


class OneBitFeedback(ErrorFeedback):
    """Per-rank residual; the shared momentum ``m`` (kept as :attr:`velocity`).

    Args:
        momentum: ``rho`` in [0, 1), the optimizer's beta1.
        masking: ignored (``m`` is the last update, never masked).
    """

    name = "onebit"
    owns_momentum = True

    def __init__(self, momentum: float = 0.0, masking: bool = True) -> None:
        super().__init__(momentum, masking=False)

    def compensate(self, grad: torch.Tensor) -> torch.Tensor:
        own = self._residual_like(grad) + (1 - self.momentum) * grad
        if self.velocity is None:
            return own
        return own.add_(self.velocity.to(grad.device, grad.dtype), alpha=self.momentum)

    def returned(self, update: torch.Tensor) -> torch.Tensor:
        self.velocity = update.clone()  # the shared momentum m
        return update

    @property
    def keeps_step_velocity(self) -> bool:
        return False  # m is the last update: read during the step, replaced by returned()

    def compensate_part(self, grad: torch.Tensor, part: slice, out: torch.Tensor,
                        velocity: torch.Tensor | None = None) -> None:
        own = grad * (1 - self.momentum)
        if self.velocity is not None:
            own.add_(self.velocity[part].to(own.device, own.dtype), alpha=self.momentum)
        torch.add(self._residual_like(out)[part], own, out=out[part])
