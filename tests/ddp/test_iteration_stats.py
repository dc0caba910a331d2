"""IterationStats: one DDP iteration's statistics from its buckets' aggregator steps."""

from __future__ import annotations

from gssgd.aggregators.base import StepStats
from gssgd.ddp.hook import IterationStats


def test_bytes_add_up_the_fraction_is_weighted_and_the_audit_is_the_worst_bucket() -> None:
    it = IterationStats()
    it.add(StepStats(bytes_sent=10, d=100, delivered_fraction=0.5))
    it.add(StepStats(bytes_sent=5, d=300, delivered_fraction=0.1, audited_recall=0.4))
    it.add(StepStats(bytes_sent=1, d=0, audited_recall=0.0))  # a recall of exactly 0 is kept
    it.add(StepStats(bytes_sent=2, d=0, audited_recall=0.3))
    total = it.total
    assert total.bytes_sent == 18 and total.d == 400
    assert abs(total.delivered_fraction - (0.5 * 100 + 0.1 * 300) / 400) < 1e-12
    assert total.audited_recall == 0.0


def test_an_iteration_without_an_audit_reports_none() -> None:
    it = IterationStats()
    it.add(StepStats(bytes_sent=3, d=10))
    assert it.total.audited_recall is None
