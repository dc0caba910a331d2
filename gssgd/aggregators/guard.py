"""Collapse detection for gs-SGD: audited recall of the global top-k mass.

A Count Sketch that is too small for the accumulated vector stops finding its heavy
coordinates: its candidates become no better than random ones, the update delivers almost
nothing, the residuals grow, and the delayed mass later arrives in bursts that diverge
under momentum. Every step gs-SGD reports the share of the accumulated mass it delivered
(``StepStats.delivered_fraction``, the exact values against the sketch's l2 estimate), but
that share has no absolute scale: it depends on how concentrated the gradient is.

So the guard *audits*: at a few steps (the first at ``first_audit``, then every
``audit_every``) every rank all-reduces its whole accumulated vector once (counted in the
step's bytes), and computes exactly

    recall = ||delivered values||^2 / ||top-k of the exact global vector||^2,

the share of the mass that exact global top-k would have delivered. Below ``min_recall``
the sketch has collapsed. Every rank computes bitwise the same recall from all-reduced
values, so every rank takes the same decision without further messages.

The bar, ``min_recall = 0.1``, sits between the recalls of collapsed sketches (a few per
cent) and those of healthy ones under error feedback, which are far below 1 (it delivers the
rest later); the guard study holds the runs it was set from.

An audit costs a dense all-reduce, so later audits are spaced by a byte budget
(:func:`audit_interval`): at most :data:`AUDIT_SHARE` of the method's own traffic, and never
more often than every 200 steps. The first audit, 20 steps after the start (or a resize),
catches the common collapse, a sketch too small from the start. A method whose message is
much smaller than the gradient (gs's many-workers shape) therefore audits every few thousand
steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["AUDIT_SHARE", "CollapseGuard", "SketchCollapseError", "audit_interval"]

#: The most of a method's own traffic that later audits may add, on average.
AUDIT_SHARE = 0.05
#: Later audits never come more often than this (compressed steps).
MIN_AUDIT_EVERY = 200


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
