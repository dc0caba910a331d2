"""gs never silently costlier than its rivals: below the crossover worker count a sketch
plus its exact round sends more than local Top-k's all-gather of k, and gs says so when it
is built, naming the cheaper method (real gloo processes for the warning; the formulas for
the crossover)."""

from __future__ import annotations

import io
import logging

import pytest

import gssgd
from gssgd.aggregators import build_options
from gssgd.aggregators.topk import LocalTopk
from tests.dist_utils import run_workers


@pytest.mark.parametrize(("workers", "density", "cheaper"), [
    (2, 0.01, {"topk"}), (4, 0.001, {"topk"}), (8, 0.01, {"topk"}), (32, 0.001, set()),
])
def test_the_rivals_cheaper_than_gs_come_from_their_own_traffic_formulas(
        workers: int, density: float, cheaper: set[str]) -> None:
    d = 1_000_000
    cls, k, options = build_options("gs", d, density, world_size=workers)
    rivals = cls.cheaper_rivals(d, k, options, workers)
    assert set(rivals) == cheaper
    if rivals:
        assert rivals["topk"] == max(LocalTopk.traffic(d, k, LocalTopk.Options(), workers).sent)
        assert rivals["topk"] < max(cls.traffic(d, k, options, workers).sent)


def _build_gs(rank: int, world_size: int) -> str:
    """Build gs on this rank and return what its logger said."""
    said = io.StringIO()
    logging.getLogger("gssgd.aggregators.gs").addHandler(logging.StreamHandler(said))
    gssgd.make_aggregator("gs", 200_000, density=0.01)
    return said.getvalue()


def test_gs_at_two_workers_says_local_topk_sends_less_once() -> None:
    said = run_workers(2, _build_gs)
    assert "gs-SGD at 2 workers sends" in said[0] and "method 'topk' sends" in said[0]
    assert "Use method='topk'" in said[0]
    assert said[1] == ""  # rank 0 alone says it
