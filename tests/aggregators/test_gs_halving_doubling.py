"""gs-SGD with its tables and exact values summed by recursive halving and doubling
(``allreduce="halving_doubling"``): the same updates as the backend's ring where every sum
is exact (integer gradients, float32 tables), at P = 3, 5 and 6 (not powers of two) in the
simulated world and at P = 3 and 4 on gloo, with the traffic its formula gives."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import gssgd
from gssgd.aggregators.gs import GlobalSketchSGD
from gssgd.simulated import SimulatedWorld
from tests.dist_utils import raise_worker_errors, run_workers

D, K, STEPS = 3_000, 30, 3
OPTIONS = {"k": K, "table_dtype": torch.float32, "guard": "off"}


def gradient(rank: int, step: int) -> torch.Tensor:
    """Small integers (every sum exact in float32, in any order), heavy where shared."""
    gen = torch.Generator().manual_seed(100 * step + rank)
    g = torch.randint(-3, 4, (D,), generator=gen).float()
    g[(torch.arange(40) * 17 + step) % D] += 50
    return g


def _steps(agg: Any, rank: int) -> list[torch.Tensor]:
    return [agg.step(gradient(rank, t)) for t in range(STEPS)]


def _simulated(world_size: int, allreduce: str) -> list[list[torch.Tensor]]:
    world = SimulatedWorld(world_size)
    aggs = [gssgd.make_aggregator("gs", D, allreduce=allreduce, group=world.rank(r), **OPTIONS)
            for r in range(world_size)]
    return world.run(lambda rank: _steps(aggs[rank.rank], rank.rank))


@pytest.mark.parametrize("world_size", [3, 5, 6])
def test_halving_doubling_gives_the_rings_updates_where_sums_are_exact(world_size: int) -> None:
    got, want = _simulated(world_size, "halving_doubling"), _simulated(world_size, "backend")
    for r in range(world_size):
        for t in range(STEPS):
            assert torch.equal(got[r][t], want[r][t]), (r, t)
            assert torch.equal(got[r][t], got[0][t])  # every rank alike
    assert any(bool(u.ne(0).any()) for u in got[0])


def _gloo_rank(rank: int, world_size: int) -> dict[str, Any]:
    agg = gssgd.make_aggregator("gs", D, allreduce="halving_doubling", **OPTIONS)
    return {"updates": _steps(agg, rank), "stats": agg.last_stats, "options": agg.options}


@pytest.mark.parametrize("world_size", [3, 4])
def test_halving_doubling_on_gloo_matches_and_counts_its_formula(world_size: int) -> None:
    results = run_workers(world_size, _gloo_rank)
    raise_worker_errors(results)
    want = _simulated(world_size, "backend")
    options = results[0]["options"]
    traffic = GlobalSketchSGD.traffic(D, K, options, world_size)
    for r, res in enumerate(results):
        for t in range(STEPS):
            assert torch.equal(res["updates"][t], want[r][t]), (r, t)
        stats = res["stats"]
        assert (stats.bytes_sent, stats.bytes_received) == (traffic.sent[r], traffic.received[r])
        assert stats.rounds == traffic.rounds
