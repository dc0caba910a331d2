"""What a hook's iterations cost: one iteration's sum (:class:`IterationStats`, published
as :attr:`HookState.last_stats <gssgd.ddp.HookState>`) and the running totals since the run
began (:class:`RunningTotals`, :attr:`HookState.totals`, part of ``state_dict()``), so a
training loop can report the bytes a run has sent without summing them itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, fields
from typing import Any

from gssgd.aggregators import StepStats

__all__ = ["IterationStats", "RunningTotals"]


class IterationStats:
    """Sums the StepStats of one iteration's aggregator steps and dense all-reduces (the
    delivered fraction weighted by bucket size, the audited recall the lowest)."""

    def __init__(self) -> None:
        self.total = StepStats()
        self._fraction_sum = 0.0
        self._fraction_weight = 0

    def add(self, stats: StepStats) -> None:
        t = self.total
        for f in dataclasses.fields(StepStats):
            if f.name not in ("skipped", "delivered_fraction", "audited_recall"):
                setattr(t, f.name, getattr(t, f.name) + getattr(stats, f.name))
        t.skipped = t.skipped or stats.skipped
        if stats.audited_recall is not None:  # the worst audited bucket
            seen = t.audited_recall
            t.audited_recall = stats.audited_recall if seen is None else min(
                seen, stats.audited_recall)
        if stats.delivered_fraction is not None:
            self._fraction_sum += stats.delivered_fraction * stats.d
            self._fraction_weight += stats.d
            t.delivered_fraction = self._fraction_sum / self._fraction_weight


@dataclass
class RunningTotals:
    """Sums over a hook's iterations (this rank's).

    Attributes:
        iterations: DDP iterations the hook has ended.
        dense_iterations: of those, the warm-up's plain all-reduces.
        compressed_iterations: of those, the ones the method compressed.
        skipped_iterations: of those, compressed ones every vector of which was skipped for
            a non-finite gradient.
        bytes_sent, bytes_received: payload bytes this rank put on and took off the wire
            (the same accounting as :class:`~gssgd.StepStats`).
        messages: point-to-point messages this rank sent.

    Only counts: a resumed run's totals go on from the saved ones (plus what its fresh
    aggregators' rank-agreement check sends again), while seconds are in ``last_stats``.
    """

    iterations: int = 0
    dense_iterations: int = 0
    compressed_iterations: int = 0
    skipped_iterations: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    messages: int = 0

    def add(self, stats: StepStats, kind: str) -> None:
        """Count one ended iteration of ``kind`` ("dense", "compressed" or "skipped")
        whose summed statistics are ``stats``."""
        self.iterations += 1
        if kind == "dense":
            self.dense_iterations += 1
        else:
            self.compressed_iterations += 1
            self.skipped_iterations += kind == "skipped"
        for name in ("bytes_sent", "bytes_received", "messages"):
            setattr(self, name, getattr(self, name) + getattr(stats, name))

    def state_dict(self) -> dict[str, Any]:
        """The totals as plain numbers (what ``HookState.state_dict()["totals"]`` holds)."""
        return asdict(self)

    @classmethod
    def from_state_dict(cls, sd: dict[str, Any] | None) -> RunningTotals:
        """Totals from :meth:`state_dict` output (None or missing fields: zeros; a state
        saved before totals existed)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (sd or {}).items() if k in known})
