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
    frontier_row,
    reach,
    reach_table,
)

SUMMARY = Path(__file__).resolve().parents[2] / "docs" / "results" / "frontier" / "summary.json"


def test_the_table_is_the_committed_frontier_summary() -> None:
    """FRONTIER_REACH is a copy: rebuilt from docs/results/frontier/summary.json it must be
    equal (refresh it with reach_table after a new study)."""
    assert reach_table(json.loads(SUMMARY.read_text())) == FRONTIER_REACH


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
    assert reach(topk, 8, 0.001, table=table).workers == 4  # log2 distance 1 against 3
    assert reach(topk, 32, 0.001, table=table).workers == 64
    far = reach(topk, 1024, 0.001, table=table)
    assert (far.workers, far.steps_ratio, far.reached) == (64, 1.0, True)
    short = reach(method_spec("gtopk", 10**6, 0.001), 16, 0.001, table=table)
    assert (short.workers, short.reached, short.gap_points) == (64, False, -2.0)
    assert reach(topk, 64, 0.01, table=table) is None  # not the study's density
    assert reach(method_spec("sketched", 10**6, 0.001), 64, 0.001, table=table) is None


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
    a = _advice(density=0.01)
    assert all(c.reach is None for c in a.candidates)
    steps = [c.step.total for c in a.candidates]
    assert steps == sorted(steps) and a.recommended is a.fastest_step


def test_the_report_says_why_the_fastest_step_is_not_recommended(capsys) -> None:
    assert main(["advise", "--params", "25.6M", "--workers", "64", "--link", "10gbit"]) == 0
    out = capsys.readouterr().out
    assert "not gtopk, the fastest step (measured short of dense's accuracy: not reached" in out
    assert "target s" in out and "dense's steps, P=64" in out
