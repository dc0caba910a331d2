"""Local Top-k with error feedback (Stich et al. 2018; Aji & Heafield 2017).

Steps (per rank p, each step):
    1. Accumulate: ``a_p = e_p + u_p`` (``u_p = rho*u_p + g_p`` with local momentum).
    2. Compress: the k largest ``|a_p|`` (ties by lower index) and their values.
    3. Communicate: all-gather the (index, value) lists of every rank: each rank sends 2k
       numbers and receives 2k(P-1). The index list ends with the rank's non-finite flag,
       so when any rank's gradient is not finite every rank skips the step (its ``nonfinite``
       policy) before the values go.
    4. Decompress: sum the P lists in rank order; the update is the sum / P.
    5. Error feedback: ``e_p = a_p`` with the k sent coordinates zeroed (all were delivered).

Every rank sends a different index set, so the summed update holds up to P*k coordinates
and the received bytes grow with P.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from gssgd.aggregators.base import Aggregator, index_dtype
from gssgd.aggregators.feedback import SPARSE_RULES, ErrorFeedback
from gssgd.aggregators.options import CommonOptions
from gssgd.comm import Traffic, allgather
from gssgd.selection import topk_indices
from gssgd.validate import bad_value, check_number, is_int, is_number

__all__ = ["LocalTopk", "TopkOptions"]


def _check_momentum(value: float, masking: bool = True) -> None:
    if not isinstance(masking, bool):
        raise bad_value("momentum_masking", masking, "it must be True or False", "")
    if not is_number(value) or not 0 <= value < 1:  # type: ignore[operator]
        raise bad_value(
            "momentum",
            value,
            "it must be a number in [0, 1) (0 turns local momentum off)",
            "For example momentum=0.9.",
        )


@dataclass(frozen=True)
class TopkOptions(CommonOptions):
    """Options of every sparse method with error feedback (topk, gtopk, sketched, gs).

    The training-recipe tools of Deep Gradient Compression (Lin et al., ICLR 2018):

    Attributes:
        momentum: local momentum ("momentum correction": velocity kept per rank, zeroed
            where delivered unless ``momentum_masking=False``); 0 = off. Not with the
            optimizer's momentum.
        momentum_masking: DGC's masking (True): zero a delivered coordinate's velocity;
            False: momentum SGD exactly at density 1 (:func:`gssgd.ddp.compressed_sgd`).
        warmup_steps: density warm-up: the first ``warmup_steps`` aggregation steps send
            exponentially fewer coordinates, from ``warmup_density`` down to the target
            (:class:`~gssgd.aggregators.options.DensityWarmup`); 0 = off.
        warmup_density: the density of the first warm-up step, in (0, 1] (DGC: 0.25).
        local_clip: local gradient clipping: each rank scales its gradient to an l2 norm of
            at most ``local_clip / sqrt(P)`` before it enters the residual, so the sum over
            P ranks stays within about ``local_clip``; None = off.
        feedback: the error-feedback rule (``momentum`` is each rule's momentum), one
            module each in :mod:`gssgd.aggregators.feedback`:

            * ``"ef"`` (default): classic error feedback, with DGC's local momentum.
            * ``"ef21"``: EF21 and, with ``momentum``, EF21-SGDM: every rank returns the
              same dense estimate of the ranks' mean velocity. Without inner momentum,
              under momentum SGD or AdamW, it lags or diverges (the DDP hook warns).
            * ``"global"``: the momentum kept by the aggregator on the averaged update,
              alike on every rank (needs ``momentum`` > 0 and plain SGD).
            * ``"onebit"``: 1-bit Adam's compression stage; pair it with
              :class:`~gssgd.optim.FrozenVarianceAdamW` (``momentum`` = its beta1).
            * ``"fetchsgd"`` (the sketching methods only): FetchSGD's momentum and error in
              sketch space; no residual on the ranks, no exact round (gs needs
              ``exact=False``), no density warm-up; use plain SGD and ``rows`` > 1.
    """

    momentum: float = 0.0
    momentum_masking: bool = True
    warmup_steps: int = 0
    warmup_density: float = 0.25
    local_clip: float | None = None
    feedback: str = "ef"
    feedback_rules: ClassVar[dict[str, type[ErrorFeedback]]] = SPARSE_RULES

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_momentum(self.momentum, self.momentum_masking)
        if self.feedback not in self.feedbacks:
            sketching = "" if "fetchsgd" in self.feedbacks else (
                " ('fetchsgd' needs a sketching method: sketched or gs)")
            raise bad_value("feedback", self.feedback,
                            f"it must be one of {', '.join(self.feedbacks)} for this method"
                            + sketching,
                            "Use 'ef' (the default) or 'ef21' (with momentum=0.9: EF21-SGDM).")
        if self.feedback == "fetchsgd" and self.warmup_steps:
            raise bad_value("warmup_steps", self.warmup_steps,
                            "feedback='fetchsgd' keeps its error in tables of one shape, which "
                            "cannot recover a warm-up's larger k",
                            "Use warmup_steps=0 (--warmup-steps 0).")
        if self.feedback == "global" and self.momentum == 0:
            raise bad_value("momentum", self.momentum,
                            "feedback='global' is the aggregator's momentum, so it must be in "
                            "(0, 1)", "For example momentum=0.9 (--local-momentum 0.9).")
        if not is_int(self.warmup_steps) or self.warmup_steps < 0:
            raise bad_value("warmup_steps", self.warmup_steps, "it must be an integer >= 0",
                            "For example warmup_steps=100, or 0 for no density warm-up.")
        check_number("warmup_density", self.warmup_density, "in (0, 1]",
                     lambda v: 0 < v <= 1,
                     "For example warmup_density=0.25 (DGC's starting density).")
        if self.local_clip is not None:
            check_number("local_clip", self.local_clip, "> 0 or None", lambda v: v > 0,
                         "For example local_clip=1.0, or None for no clipping.")



class LocalTopk(Aggregator):
    """Each rank sends its own top-k; the update sums all of them."""

    name = "topk"
    flags_ride = True
    Options = TopkOptions
    options: TopkOptions

    @classmethod
    def message_traffic(
        cls, d: int, k: int, options: TopkOptions, world_size: int, *, step: int | None = None
    ) -> Traffic:
        """An all-gather of k indices and the rank's non-finite flag (one more index), then
        one of k values (the step's k: see
        :meth:`~gssgd.aggregators.base.Aggregator.traffic`)."""
        k = cls.k_at_step(d, k, options, step)
        index_bytes = index_dtype(d).itemsize
        return allgather((k + 1) * index_bytes, world_size) + allgather(k * 4, world_size)

    def _warmup_selection(self, total: torch.Tensor, k: int) -> None:
        """A warm-up step sent dense delivers every contribution: the sum of the ranks' own
        top-k lists, as the all-gather's step does."""
        return None

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        if self._sends_dense_now():  # a warm-up step that would cost more than dense
            return self._dense_warmup_step(grad)
        accumulated, bad = self._begin_riding(grad)
        with self._timed("compress"):
            idx = topk_indices(accumulated.abs(), self.step_k)
            vals = accumulated[idx]
            message = torch.cat([idx, idx.new_tensor([int(bad)])]).to(index_dtype(self.d))
        all_idx = self.comm.allgather_backend(message)  # the last entry: the rank's flag
        skipped = self._guard(grad, self._flags_in_lists(all_idx))
        if skipped is not None:
            return skipped
        all_vals = self.comm.allgather_backend(vals)
        with self._timed("decompress"):
            update = torch.zeros_like(accumulated)  # in the residual's dtype
            for rank_idx, rank_vals in zip(all_idx, all_vals, strict=True):  # rank order
                update.index_add_(0, rank_idx[:-1].to(torch.int64), rank_vals)
            update /= self.world_size
            self.feedback.keep(accumulated, idx)
        return self._finish(update)
