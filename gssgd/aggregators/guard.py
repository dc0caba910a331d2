"""Collapse detection for gs-SGD: audited recall of the global top-k mass.

A Count Sketch that is too small for the accumulated vector stops finding its heavy
coordinates: its candidates become no better than random ones, the update delivers almost
nothing, the residuals grow, and the delayed mass later arrives in bursts that diverge
under momentum. Every step gs-SGD reports the share of the accumulated mass it delivered
(``StepStats.delivered_fraction``, the exact values against the sketch's l2 estimate), but
that share has no absolute scale: it depends on how concentrated the gradient is.

So the guard *audits*: at a few steps (the first at ``first_audit``, then every
``audit_every``) the ranks fetch exact global values of their accumulated vectors (the
whole vector, or a pool of its largest coordinates: below; counted in the step's bytes),
and compute

    recall = ||delivered values||^2 / ||top-k of the exact global vector||^2,

the share of the mass that exact global top-k would have delivered. Below ``min_recall``
the sketch has collapsed. Every rank computes bitwise the same recall from all-reduced
values, so every rank takes the same decision without further messages.

The bar, ``min_recall = 0.1``, sits between the recalls of collapsed sketches (a few per
cent) and those of healthy ones under error feedback, which are far below 1 (it delivers the
rest later); the guard study holds the runs it was set from.

The exact global vector costs a dense all-reduce (``audit="dense"``). The default audit
(``audit="tops"``) fetches less: every rank all-gathers the indices of its own
:func:`audit_pool` largest coordinates, and the exact global sums at their union (sorted,
the same on every rank) are all-reduced; the best k of that pool stand in for exact global
top-k. A coordinate heavy in the sum is nearly always heavy on some rank, so the pool holds
most of the best mass; what it misses makes the recall look higher than it is, never lower
(no false alarm from the pool), and ``audit="both"`` logs the two recalls side by side to
measure the difference. The pool is :data:`AUDIT_POOL` times k over all ranks, at most
``d / 16``: about ``1.5 * pool / d`` of a dense all-reduce's bytes (under 10 %).

An audit costs bytes, so later audits are spaced by a byte budget
(:func:`audit_interval`): at most :data:`AUDIT_SHARE` of the method's own traffic, and never
more often than every 200 steps. The first audit, 20 steps after the start (or a resize),
catches the common collapse, a sketch too small from the start. A method whose message is
much smaller than the gradient (gs's many-workers shape) therefore audits every few thousand
steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gssgd.aggregators.base import index_dtype
from gssgd.comm import Traffic, allgather, ring_allreduce

__all__ = [
    "AUDITS", "AUDIT_POOL", "AUDIT_SHARE", "CollapseGuard", "SketchCollapseError",
    "audit_interval", "audit_pool", "audit_traffic",
]

#: What ``GSOptions.audit`` takes.
AUDITS: tuple[str, ...] = ("tops", "dense", "both")
#: The "tops" audit's pool over all ranks, in multiples of k (at most ``d / 16``).
AUDIT_POOL = 16

#: The most of a method's own traffic that later audits may add, on average.
AUDIT_SHARE = 0.05
#: Later audits never come more often than this (compressed steps).
MIN_AUDIT_EVERY = 200


def audit_pool(d: int, k: int, world_size: int) -> int:
    """How many of its largest coordinates each rank puts in a "tops" audit's pool:
    ``ceil(min(AUDIT_POOL * k, d / 16) / P)``, at least 1."""
    pool = min(AUDIT_POOL * k, max(k, d // 16))
    return max(1, min(d, -(-pool // world_size)))


def audit_traffic(kind: str, d: int, k: int, world_size: int) -> Traffic:
    """What one audit moves (the most: a "tops" pool's union may be smaller): a dense
    all-reduce of d float32 values, or the all-gather of every rank's pool indices and the
    all-reduce of the values at their union; "both" moves the two."""
    dense = ring_allreduce(d * 4, world_size)
    share = audit_pool(d, k, world_size)
    tops = allgather(share * index_dtype(d).itemsize, world_size) + ring_allreduce(
        min(d, share * world_size) * 4, world_size)
    return {"dense": dense, "tops": tops, "both": dense + tops}[kind]


def audit_interval(audit_bytes: int, step_bytes: int) -> int:
    """Steps between later audits: the fewest that keep an audit's ``audit_bytes`` (a dense
    all-reduce) within :data:`AUDIT_SHARE` of ``step_bytes`` per step, and at least
    :data:`MIN_AUDIT_EVERY`.

    Example: the MNIST CNN (d = 80,602) at density 0.001 on 64 workers: an audit moves
    635 kB per rank (a ring all-reduce of 322 kB), gs's many-workers step 10.4 kB, so later
    audits come every 1,225 steps.
    """
    if step_bytes <= 0:
        return MIN_AUDIT_EVERY
    return max(MIN_AUDIT_EVERY, math.ceil(audit_bytes / (AUDIT_SHARE * step_bytes)))


class SketchCollapseError(RuntimeError):
    """gs-SGD's sketch collapsed and the guard could not (or was told not to) repair it.

    Every rank raises it at the same step with the same message (the decision comes from
    all-reduced values), so a trainer can stop every worker together and report it once.
    """


@dataclass
class CollapseGuard:
    """When to audit, and what counts as a collapse.

    Attributes:
        min_recall: collapse when an audit finds a recall below this.
        first_audit: compressed steps before the first audit (after a start or a resize).
        audit_every: compressed steps between later audits.
        since_start: compressed steps since the start or the last resize.
        last_recall: the most recent audit's recall (None before the first).
    """

    min_recall: float = 0.1
    first_audit: int = 20
    audit_every: int = 200
    since_start: int = 0
    last_recall: float | None = None

    def due(self) -> bool:
        """Whether this step (the ``since_start``-th) is audited."""
        n = self.since_start
        return n == self.first_audit or (n > self.first_audit and n % self.audit_every == 0)

    def advance(self) -> None:
        self.since_start += 1

    def collapsed(self, recall: float) -> bool:
        """Record an audit's recall; True when the sketch has collapsed."""
        self.last_recall = recall
        return recall < self.min_recall

    def reset(self) -> None:
        """Start afresh after the sketch was resized."""
        self.since_start = 0

    def state_dict(self) -> dict[str, float | int | None]:
        return {"since_start": self.since_start, "last_recall": self.last_recall}

    def load_state_dict(self, sd: dict) -> None:
        self.since_start = int(sd.get("since_start", 0))
        self.last_recall = sd.get("last_recall")
