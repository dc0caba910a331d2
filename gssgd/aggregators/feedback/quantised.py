"""A quantiser's error feedback: keep what the message got wrong, ``e = a - C(a)``.

A sparsifier delivers some coordinates of ``a`` exactly, so its residual is ``a`` with them
zeroed (:class:`~gssgd.aggregators.feedback.ef.ErrorFeedback`). A quantiser (QSGD, signSGD,
a low-rank approximation such as PowerSGD's) sends an approximation ``C(a)`` of every
coordinate instead, so the residual is the difference (Karimireddy et al. 2019, "Error
Feedback Fixes SignSGD"; PowerSGD keeps the same ``e = a - P Q^T``).

Steps (per rank p, each step):
    1. Compensate: ``a_p = e_p + g_p`` (``e_p + u_p`` with local momentum, never masked:
       no coordinate is delivered exactly).
    2. (The method sends ``C(a_p)`` and averages.)
    3. Keep: ``e_p = a_p - C(a_p)``, where ``C(a_p)`` is this rank's decompressed message
       (for PowerSGD, whose factors are averaged before they are multiplied back, the
       update itself).
    4. Return the averaged update as it is.
"""

from __future__ import annotations

import torch

from gssgd.aggregators.feedback.ef import ErrorFeedback
from gssgd.aggregators.feedback.onebit import OneBitFeedback

__all__ = ["OneBitQuantisedFeedback", "QuantisedFeedback"]


class QuantisedFeedback(ErrorFeedback):
    """The residual ``a - C(a)`` of a compressor that approximates every coordinate."""

    def __init__(self, momentum: float = 0.0, masking: bool = True) -> None:
        super().__init__(momentum, masking=False)

    def keep(self, accumulated: torch.Tensor, delivered: torch.Tensor) -> None:
        """Step 3: ``e = a - C(a)``.

        Args:
            accumulated: this step's ``a_p``.
            delivered: ``C(a_p)``, the dense vector the message stands for (same shape).
        """
        self.residual = accumulated - delivered


class OneBitQuantisedFeedback(OneBitFeedback, QuantisedFeedback):
    """1-bit Adam's rule (compensate with the shared momentum, return it) with a quantiser's
    residual ``e = a - C(a)``: PowerSGD's ``feedback="onebit"``."""
