"""A quantiser of your own, with error feedback, in one file: QSGD (Alistarh et al., NeurIPS
2017) registered with gssgd as ``"qsgd"``, with a new option, ``levels``.

What a new method needs, and nothing else: an options dataclass (its own fields are new
settings, validated here), an ``Aggregator`` subclass whose ``step`` shows compression,
communication and error feedback in order, a ``message_traffic`` formula for the cost model, and one
``register_method`` call. The error-feedback rule comes from gssgd: a quantiser approximates
every coordinate instead of delivering some exactly, so its residual is the difference
``e = a - Q(a)`` (:class:`~gssgd.aggregators.feedback.QuantisedFeedback`, Karimireddy et
al. 2019), chosen by the options' ``feedback_rules``.

Use it::

    import examples.qsgd                               # registers "qsgd"
    agg = gssgd.make_aggregator("qsgd", d, levels=16)

    gssgd train --plugin examples.qsgd --method qsgd --opt levels=16 --dataset digits

and in DDP: ``ddp_model.register_comm_hook(HookState("qsgd", levels=16, model=ddp_model),
comm_hook)`` (``from gssgd.ddp import HookState, comm_hook``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from gssgd import Aggregator, Method, register_method
from gssgd.aggregators.feedback import ErrorFeedback, QuantisedFeedback
from gssgd.aggregators.options import CommonOptions
from gssgd.comm import Traffic, allgather

#: QSGD's levels travel as signed 8-bit integers, so at most 127 of them.
MAX_LEVELS = 127


@dataclass(frozen=True)
class QSGDOptions(CommonOptions):
    """Options of QSGD, validated once (a ValueError names the value, the range, the fix).

    Attributes:
        levels: s, the quantisation levels of ``|a_i| / ||a||`` in [0, 1] (QSGD's s); more
            levels, less noise. 1: ternary, signSGD-like with a norm.
        seed: seeds each rank's rounding generator (rank r draws from ``seed + r``).
    """

    levels: int = 16
    seed: int = 0
    feedback_rules: ClassVar[dict[str, type[ErrorFeedback]]] = {"ef": QuantisedFeedback}

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.levels, bool) or not isinstance(self.levels, int) or not (
                1 <= self.levels <= MAX_LEVELS):
            raise ValueError(f"levels={self.levels!r} is invalid: it must be an integer in "
                             f"[1, {MAX_LEVELS}] (levels travel as int8). For example levels=16.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r} is invalid: it must be an integer >= 0. "
                             "For example seed=0.")


def quantise(vector: torch.Tensor, levels: int, generator: torch.Generator
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """QSGD's stochastic quantiser: ``(norm, codes)`` with ``Q(v) = norm * codes / levels``.

    Each ``|v_i| / ||v||`` in [0, 1] is rounded to one of its two neighbouring levels
    ``l / s`` at random, up with probability equal to the remainder, so ``Q(v)`` is unbiased.

    Args:
        vector: 1-D float tensor.
        levels: s >= 1.
        generator: a CPU generator (the draws are the same on every device).

    Returns:
        The l2 norm (a 1-element float32 tensor) and the signed levels as int8.
    """
    norm = torch.linalg.vector_norm(vector).reshape(1).to(torch.float32)
    if float(norm) == 0:
        return norm, torch.zeros_like(vector, dtype=torch.int8)
    scaled = vector.abs() / norm.to(vector.dtype) * levels
    lower = scaled.floor()
    draws = torch.rand(vector.numel(), generator=generator, dtype=vector.dtype).to(vector.device)
    magnitude = lower + (draws < scaled - lower).to(vector.dtype)
    return norm, (magnitude * vector.sign()).to(torch.int8)


def dequantise(norm: torch.Tensor, codes: torch.Tensor, levels: int, dtype: torch.dtype
               ) -> torch.Tensor:
    """``Q(v) = norm * codes / levels`` in ``dtype``."""
    return codes.to(dtype) * (norm.to(dtype) / levels)


class QSGD(Aggregator):
    """QSGD with error feedback: every rank sends ``||a||`` and ``a``'s signed levels.

    Steps (per rank p, each step):
        1. Accumulate: ``a_p = e_p + g_p`` (the error-feedback rule).
        2. Compress: ``Q(a_p)``: the norm and d int8 levels (:func:`quantise`).
        3. Communicate: all-gather every rank's levels (d bytes) and norm (4 bytes).
        4. Decompress: the mean of the P dequantised vectors, summed in rank order.
        5. Error feedback: ``e_p = a_p - Q(a_p)``.
    """

    name = "qsgd"
    Options = QSGDOptions
    options: QSGDOptions
    sends_all = True  # every coordinate travels (quantised); no k or density

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.generator = torch.Generator().manual_seed(self.options.seed + self.rank)

    @classmethod
    def message_traffic(
        cls, d: int, k: int, options: QSGDOptions, world_size: int, *, step: int | None = None
    ) -> Traffic:
        """The non-finite flag, then all-gathers of d int8 levels and of one float32 norm."""
        return cls.control_traffic(world_size) + allgather(d, world_size) + allgather(
            4, world_size)

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        skipped = self._begin(grad)  # rank agreement, non-finite guard
        if skipped is not None:
            return skipped
        levels = self.options.levels
        with self._timed("compress"):
            accumulated = self._error_compensated(grad)
            norm, codes = quantise(accumulated, levels, self.generator)
        all_codes = self.comm.allgather_backend(codes)
        all_norms = self.comm.allgather_backend(norm)
        with self._timed("decompress"):
            update = torch.zeros_like(accumulated)
            for rank_norm, rank_codes in zip(all_norms, all_codes, strict=True):  # rank order
                update += dequantise(rank_norm, rank_codes, levels, update.dtype)
            update /= self.world_size
            self.feedback.keep(accumulated, dequantise(norm, codes, levels, accumulated.dtype))
        return self._finish(update)

    def state_dict(self) -> dict[str, object]:
        """Adds the rounding generator's state, so a resumed run draws the same numbers."""
        return {**super().state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, sd: dict[str, object]) -> None:
        super().load_state_dict(sd)  # type: ignore[arg-type]
        if "generator" in sd:
            self.generator.set_state(sd["generator"])  # type: ignore[arg-type]


METHOD = register_method(Method("qsgd", "QSGD with error feedback (an example)", QSGD,
                                cost_like="dense"), replace=True)
