"""The collapse guard: a too-small sketch is detected by audits and grown, or stops."""

from __future__ import annotations

from functools import cache

import pytest

from gssgd.comm import ring_allreduce_bytes
from tests.aggregators.guard_scenarios import D, run_guard
from tests.dist_utils import raise_worker_errors, run_each, run_workers

#: The P = 2 runs, by name: ``run_guard``'s (cols, guard, steps). One spawn runs them all
#: (starting processes costs more than the runs); each raises or stops on every rank alike.
TWO_RANK_RUNS: dict[str, tuple[int, str, int]] = {
    "healthy": (2000, "grow", 45),
    "raise": (8, "raise", 30),
    "give_up": (8, "grow", 80),
}


@cache
def _two_rank_results() -> list[dict]:
    out = run_workers(2, run_each, run_guard, TWO_RANK_RUNS)
    raise_worker_errors(out)
    return out


def _two_ranks(name: str) -> list[dict]:
    out = [rank[name] for rank in _two_rank_results()]
    raise_worker_errors(out)
    return out


def test_healthy_sketch_is_left_alone() -> None:
    ranks = _two_ranks("healthy")
    for res in ranks:
        assert res["cols"] == 2000
        assert res["recalls"][-1] is not None and res["recalls"][-1] > 0.5


@pytest.mark.parametrize("audit", ["tops", "dense"])
def test_collapsed_sketch_grows_on_every_rank_until_it_recovers(audit: str) -> None:
    ranks = run_workers(3, run_guard, 128, "grow", 90, audit)
    raise_worker_errors(ranks)
    assert len({res["cols"] for res in ranks}) == 1  # every rank took the same decisions
    res = ranks[0]
    assert res["cols"] in (256, 512) and res["state_cols"] == res["cols"]  # grown once or twice
    assert res["num_candidates"] == 100 * res["cols"] // 128  # m*k = 2*50 doubled alike
    first_audit = res["recalls"][20]
    assert first_audit is not None and first_audit < 0.1
    # the step statistics report each audit's recall on the audited step, None elsewhere
    audited = {t: r for t, r in enumerate(res["audited"]) if r is not None}
    assert audited[20] == first_audit and 20 < min(set(audited) - {20}) < 60
    assert all(res["recalls"][t] == r for t, r in audited.items())
    # after growing, the sketch finds the heavy mass again: above the bar, 5x the first audit
    assert res["recalls"][-1] > max(0.1, 5 * first_audit)
    dense_audit = ring_allreduce_bytes(D * 4, 3)
    if audit == "dense":  # the whole vector all-reduced once: about dense's bytes
        assert res["bytes"][20] > 3 * D and res["bytes"][20] > dense_audit
    else:  # the pool of the ranks' largest coordinates: a few per cent of that
        assert res["bytes"][20] - res["bytes"][19] < 0.1 * dense_audit


def test_the_pool_audit_never_raises_a_false_alarm() -> None:
    """``audit="both"``: the pool's best mass is at most the exact best, so its recall is
    at least the dense audit's, healthy or collapsed (and the dense one decides)."""
    ranks = run_workers(2, run_each, run_guard, {
        "healthy": (2000, "grow", 45, "both"), "collapsed": (128, "grow", 90, "both")})
    raise_worker_errors(ranks)
    for name in ("healthy", "collapsed"):
        audits = ranks[0][name]["audit_recalls"]
        assert audits and all(a["tops"] >= a["dense"] - 1e-9 for a in audits), audits
    first = ranks[0]["collapsed"]["audit_recalls"][0]
    assert first["dense"] < 0.1 and first["tops"] < 0.1  # both see the collapse


def test_guard_raise_stops_every_rank_with_advice() -> None:
    ranks = _two_ranks("raise")
    assert len(ranks) == 2
    for res in ranks:
        assert "collapsed at aggregation step 20" in res["error"]
        assert "Raise cols or candidates" in res["error"]


def test_grow_gives_up_after_two_doublings_with_advice() -> None:
    ranks = _two_ranks("give_up")
    assert len(ranks) == 2
    for res in ranks:
        assert "collapsed at aggregation step 60" in res["error"], res
        assert "already grew 2 times" in res["error"]
        assert res["cols"] == 32 and res["num_candidates"] == 400


def test_later_audits_stay_within_five_percent_of_the_step_bytes() -> None:
    """An audit is a dense all-reduce: spaced by a byte budget, never closer than 200 steps.
    gs's many-workers step is small, so its later audits come thousands of steps apart."""
    from gssgd.aggregators.gs import AUDIT_SHARE, audit_interval
    from gssgd.comm import ring_allreduce_bytes

    audit = ring_allreduce_bytes(80_602 * 4, 64)  # the MNIST CNN on 64 workers
    every = audit_interval(audit, 10_458)  # gs's many-workers step there
    assert every == 1214 and audit / every <= AUDIT_SHARE * 10_458
    assert audit / (every - 1) > AUDIT_SHARE * 10_458  # the fewest steps that keep the budget
    assert audit_interval(audit, 10**9) == 200 and audit_interval(audit, 0) == 200
