"""Density warm-up: DGC's exponential schedule from a high density down to the target.

Deep Gradient Compression (Lin, Han, Mao, Wang, Dally; ICLR 2018) starts training at a high
density (25 %) and lowers it exponentially over the first epochs, so the early, fast-changing
gradients are not starved while the residuals build up. Here, for aggregation step
``t < steps``::

    k0  = max(k, round(start_density * d))            # the starting count
    k_t = round(k0 * (k / k0) ** (t / steps))         # exponential from k0 down to k

and ``k_t = k`` from step ``steps`` on: each step sends what the exponential says, so the
warm-up's bytes follow it (a sketching method's warm-up sketch grows with ``k_t / k`` too:
:meth:`~gssgd.aggregators.sketching.SketchedOptions.warmup_shape`). Every rank computes the
same k from the same integers and floats.

Bytes sent during the warm-up are counted like any others (they are simply larger), and a
step whose message would cost more than dense's all-reduce goes as that all-reduce
(:meth:`~gssgd.aggregators.base.Aggregator.sends_dense_at`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DensityWarmup"]


@dataclass(frozen=True)
class DensityWarmup:
    """The k of each aggregation step under DGC's exponential density warm-up.

    Attributes:
        d: vector length.
        k: the target count (after the warm-up).
        steps: warm-up length in aggregation steps (0: no warm-up).
        start_density: the density of step 0, in (0, 1].

    Example:
        >>> w = DensityWarmup(d=100_000, k=100, steps=4, start_density=0.25)
        >>> [w.k_at(t) for t in range(6)]
        [25000, 6287, 1581, 398, 100, 100]
    """

    d: int
    k: int
    steps: int
    start_density: float

    @property
    def start_k(self) -> int:
        """``k0``: the count of step 0 (never below the target)."""
        return max(self.k, min(self.d, round(self.start_density * self.d)))

    def k_at(self, step: int) -> int:
        """The count of aggregation step ``step`` (0-based)."""
        if step >= self.steps or self.start_k == self.k:
            return self.k
        k0 = self.start_k
        return max(self.k, min(k0, round(k0 * (self.k / k0) ** (step / self.steps))))

    def distinct_k(self) -> list[int]:
        """Every count the schedule uses, largest first."""
        return sorted({self.k_at(t) for t in range(self.steps + 1)}, reverse=True)
