"""A compressor of your own, registered with gssgd: random-k with error feedback.

Every rank picks the same k random coordinates each step (the choice comes from a
generator seeded by ``seed`` and the step, so no indices travel), all-reduces its
error-compensated gradient at those coordinates (k numbers) and keeps the rest in its
residual. It is a weak compressor (random coordinates carry little of the gradient's mass)
and exists to show what a new method needs: an options dataclass, an ``Aggregator``
subclass whose ``step`` shows compression, communication and error feedback in order, a
``message_traffic`` formula for the cost model, and one ``register_method`` call.

Use it (docs/extending.md walks through every line)::

    import examples.randomk                     # registers "randomk"
    agg = gssgd.make_aggregator("randomk", d, density=0.01)

    gssgd train --plugin examples.randomk --method randomk --dataset digits --workers 2
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gssgd import Aggregator, Method, register_method
from gssgd.aggregators.options import CommonOptions
from gssgd.comm import Traffic, ring_allreduce


@dataclass(frozen=True)
class RandomKOptions(CommonOptions):
    """Options of random-k, validated once (a ValueError names the value and the fix).

    Attributes:
        seed: the shared seed of the coordinate choice (every rank must use the same).
    """

    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r} is invalid: it must be an integer >= 0. "
                             "For example seed=0.")


class RandomK(Aggregator):
    """Random-k sparsification with error feedback (Stich et al. 2018).

    Steps (per rank, each step):
        1. Accumulate: ``a = e + g``.
        2. Compress: the same k coordinates on every rank, drawn from (seed, step).
        3. Communicate: all-reduce ``a`` at those coordinates (k numbers, no indices).
        4. Update: the sums / P at those coordinates. Error feedback: zero them in ``a``.
    """

    name = "randomk"
    Options = RandomKOptions
    options: RandomKOptions

    @classmethod
    def message_traffic(
        cls, d: int, k: int, options: RandomKOptions, world_size: int, *, step: int | None = None
    ) -> Traffic:
        """The non-finite flag, then a ring all-reduce of k float32 values (at every step)."""
        return cls.control_traffic(world_size) + ring_allreduce(4 * k, world_size)

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        skipped = self._begin(grad)  # rank agreement, non-finite guard
        if skipped is not None:
            return skipped
        with self._timed("compress"):
            accumulated = self._error_compensated(grad)
            chooser = torch.Generator().manual_seed(self.options.seed * 1_000_003 + self.steps)
            idx = torch.randperm(self.d, generator=chooser)[: self.k].to(grad.device)
            values = accumulated[idx]
        summed = self.comm.allreduce_backend(values)
        with self._timed("decompress"):
            update = torch.zeros_like(grad)
            update[idx] = summed / self.world_size
            self.feedback.keep(accumulated, idx)
        return self._finish(update)


METHOD = register_method(Method("randomk", "random-k with error feedback (an example)", RandomK,
                                cost_like="topk"), replace=True)
