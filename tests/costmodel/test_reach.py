"""The convergence half of ``gssgd advise``: the frontier study's steps to dense's accuracy
(gssgd.costmodel.reach) and how advise ranks by the time to that target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gssgd.cli.main import main
from gssgd.costmodel.advice import advise
from gssgd.costmodel.cluster import Link
from gssgd.costmodel.devices import get_device
from gssgd.costmodel.method_specs import method_spec
from gssgd.costmodel.reach import (
    FRONTIER_REACH,
    STUDY_D,
    STUDY_K,
    WEAK_REACH,
    frontier_row,
    powersgd_reach,
    reach,
    reach_table,
    weak_reach_table,
)

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
SUMMARY = RESULTS / "frontier" / "summary.json"
FAIR_SUMMARY = RESULTS / "fair-frontier-mnist" / "summary.json"


def test_the_table_is_the_committed_frontier_summary() -> None:
    """FRONTIER_REACH is a copy: rebuilt from docs/results/frontier/summary.json it must be
    equal (refresh it with reach_table after a new study)."""
    assert reach_table(json.loads(SUMMARY.read_text())) == FRONTIER_REACH


def test_the_weak_table_is_the_committed_fair_frontier_summary() -> None:
    """WEAK_REACH is a copy: rebuilt from the fair frontier's summary.json it must be equal
    (refresh it with weak_reach_table after a new study)."""
    assert weak_reach_table(json.loads(FAIR_SUMMARY.read_text())) == WEAK_REACH
    for p, rows in WEAK_REACH.items():
        assert rows["dense"] == (rows["dense"][0], 0.0, 1.0), p
        assert all(n in ("dense", "dense16") or "@" in n or n.startswith("powersgd-r")
                   for n in rows), p


def test_weak_rows_leave_out_variant_warmups_and_dense_off_its_best_lr() -> None:
    row = {"seeds": 3, "accuracy": 0.98, "steps_to_target_over_dense": 1.2}
    best = {**row, "steps_to_target_over_dense": 1.0}
    summary = {"by_P": {"16": {"dense-lr0.05": best, "dense-lr0.1": row, "gs-d0.001": row,
                               "gs-nowu-d0.003": row, "topk-wu0.02-d0.001": row,
                               "powersgd-r2": row, "gtopk-d0.01": {**row, "seeds": 2}}}}
    shape = frontier_row(method_spec("gs", STUDY_D, 0.001, world_size=16))
    assert weak_reach_table(summary) == {16: {
        "dense": (3, 0.0, 1.0), f"{shape}@0.001": (3, 0.0, 1.2), "powersgd-r2": (3, 0.0, 1.2)}}
    # PowerSGD at a learning rate of its own shares its rank's row: the sooner one counts
    summary["by_P"]["16"]["powersgd-lr0.1-r2"] = {**row, "steps_to_target_over_dense": 0.9}
    summary["by_P"]["16"]["powersgd-lr0.3-r2"] = {**row, "steps_to_target_over_dense": None}
    assert weak_reach_table(summary)[16]["powersgd-r2"] == (3, 0.0, 0.9)
    # too few seeds behind dense's best: no row at that P
    summary["by_P"]["16"]["dense-lr0.05"] = {**best, "seeds": 1}
    assert weak_reach_table(summary) == {}


def test_reach_prefers_the_weak_table_at_its_density_then_the_strong_one() -> None:
    strong = {16: {"topk": (3, 0.0, 1.3)}}
    weak = {16: {"topk@0.003": (3, -0.2, 1.1)}, 64: {"topk@0.001": (3, 0.1, 0.9)}}
    topk = method_spec("topk", 10**6, 0.001)
    at3 = reach(topk, 16, 0.003, table=strong, weak=weak)
    assert (at3.steps_ratio, at3.study, at3.workers) == (1.1, "weak scaling", 16)
    at1 = reach(topk, 16, 0.001, table=strong, weak=weak)  # the weak table's only P for it
    assert (at1.steps_ratio, at1.study, at1.workers) == (0.9, "weak scaling", 64)
    fallback = reach(topk, 16, 0.001, table=strong, weak={})
    assert (fallback.steps_ratio, fallback.study) == (1.3, "strong scaling")
    assert "strong scaling" in fallback.describe()
    assert reach(topk, 16, 0.01, table=strong, weak=weak) is None


def test_powersgd_reach_names_its_lowest_rank_that_reached() -> None:
    weak = {16: {"powersgd-r1": (3, -0.6, None), "powersgd-r2": (3, -0.4, 1.5),
                 "powersgd-r4": (3, 0.0, 0.9)},
            64: {"powersgd-r1": (3, -0.9, None)}}
    got = powersgd_reach(16, weak)
    assert (got.row, got.workers, got.steps_ratio) == ("powersgd-r2", 16, 1.5)
    assert powersgd_reach(64, weak) is None  # ran there, reached at no rank
    assert powersgd_reach(16, {16: {"dense": (3, 0.0, 1.0)}}) is None


def test_every_measured_p_has_dense_at_one_and_gtopk_short() -> None:
    for p, rows in FRONTIER_REACH.items():
        assert rows["dense"] == (rows["dense"][0], 0.0, 1.0), p
        # gTop-k never came within 0.5 point of dense on the MNIST CNN at density 0.001
        assert rows["gtopk"][2] is None and rows["gtopk"][1] < -0.5, p


@pytest.mark.parametrize(
    ("name", "workers", "streamed", "row"),
    [
        ("dense", 64, False, "dense"),
        ("dense16", 64, False, "dense16"),
        ("topk", 64, False, "topk"),
        ("gtopk", 4, False, "gtopk"),
        ("gs", 4, False, "gs-c40-m32-pf8"),  # small-P default: 40·k, m = 32, pre-filter 8·k
        ("gs", 64, False, "gs-c16-m8-h-pf8"),  # many workers: 16·k, m = 8, float16 tables
        ("gs-half", 4, False, "gs-c40-m32-h-pf8"),
        ("gs-backend", 4, True, "gs-c40-m32"),  # streamed: every coordinate sketched
        ("gs-estimate", 4, False, "gs-estimate"),
    ],
)
def test_frontier_row_names_a_shape_as_the_study_does(name, workers, streamed, row) -> None:
    spec = method_spec(name, STUDY_D, k=STUDY_K, world_size=workers)
    assert frontier_row(spec, streamed=streamed) == row


def test_reach_takes_the_nearest_measured_p_and_only_the_studied_density() -> None:
    table = {4: {"topk": (3, -0.2, 1.5)}, 64: {"topk": (3, 0.1, 1.0), "gtopk": (3, -2.0, None)}}
    topk = method_spec("topk", 10**6, 0.001)
    assert reach(topk, 8, 0.001, table=table, weak={}).workers == 4  # log2 distance 1, not 3
    assert reach(topk, 32, 0.001, table=table, weak={}).workers == 64
    far = reach(topk, 1024, 0.001, table=table, weak={})
    assert (far.workers, far.steps_ratio, far.reached) == (64, 1.0, True)
    short = reach(method_spec("gtopk", 10**6, 0.001), 16, 0.001, table=table, weak={})
    assert (short.workers, short.reached, short.gap_points) == (64, False, -2.0)
    assert reach(topk, 64, 0.01, table=table, weak={}) is None  # not the study's density
    sketched = method_spec("sketched", 10**6, 0.001)
    assert reach(sketched, 64, 0.001, table=table, weak={}) is None


def _advice(density: float = 0.001, workers: int = 64):
    return advise(params=25_600_000, workers=workers, link=Link(10**10, 20e-6),
                  device=get_device("h200"), density=density)


def test_advise_ranks_by_the_time_to_dense_and_puts_the_short_ones_last() -> None:
    a = _advice()
    groups = [c.rank_key(a.run_steps)[0] for c in a.candidates]
    assert groups == sorted(groups)
    reached = [c for c in a.candidates if c.reach is not None and c.reach.reached]
    seconds = [c.target_seconds(a.run_steps) for c in reached]
    assert seconds == sorted(seconds) and a.recommended is reached[0]
    gtopk = next(c for c in a.candidates if c.name == "gtopk")
    # gTop-k steps fastest here but was measured short of dense: not recommended
    assert a.fastest_step is gtopk and a.recommended is not gtopk
    assert a.candidates.index(gtopk) > a.candidates.index(reached[-1])


def test_advise_at_an_unmeasured_density_ranks_by_the_step() -> None:
    a = _advice(density=0.02)
    assert all(c.reach is None for c in a.candidates)
    steps = [c.step.total for c in a.candidates]
    assert steps == sorted(steps) and a.recommended is a.fastest_step


def test_the_report_says_why_the_fastest_step_is_not_recommended(capsys) -> None:
    assert main(["advise", "--params", "25.6M", "--workers", "64", "--link", "10gbit"]) == 0
    out = capsys.readouterr().out
    assert "not gtopk, the fastest step (measured short of dense's accuracy: not reached" in out
    assert "target s" in out and "dense's steps, P=64" in out
