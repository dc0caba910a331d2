"""gTop-k as its authors' code runs it (``exchange="tree"``): a binomial tree to rank 0 with
merges at every receiver, a broadcast back, and the authors' residual rule, checked against
a single-process reference of that pattern written here from gtopkssgd's
``gtopk_sparse_allreduce`` (pairs 0 <- 1, 2 <- 3, ...; then 0 <- 2, ...; any P), on real
gloo processes and in the simulated world, at P = 3 (not a power of two), 4 and 5."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import gssgd
from gssgd.aggregators.base import index_dtype
from gssgd.comm import tree_plan, tree_reduce_broadcast
from gssgd.simulated import SimulatedWorld
from tests.dist_utils import raise_worker_errors, run_workers

D, K, STEPS = 2_000, 20, 4


def gradient(rank: int, step: int) -> torch.Tensor:
    """Rank- and step-dependent gradients whose heavy coordinates overlap in part."""
    gen = torch.Generator().manual_seed(1_000 * step + rank)
    g = torch.randn(D, generator=gen)
    g[(torch.arange(30) * 7 + step) % D] += 4.0  # shared heavy coordinates
    g[(torch.arange(10) * 13 + 101 * rank) % D] += 6.0  # each rank's own
    return g


def _topk(values: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of the k largest |values|, ties to the lower position."""
    order = sorted(range(values.numel()), key=lambda i: (-abs(float(values[i])), i))
    return torch.tensor(order[:k], dtype=torch.int64)


def _merge(a: dict[int, float], b: dict[int, float], k: int) -> dict[int, float]:
    """Sum equal indices in float32, keep the k largest |sums| (ties to the lower index)."""
    summed = dict(a)
    for i, v in b.items():
        summed[i] = float(np.float32(summed[i]) + np.float32(v)) if i in summed else v
    keep = sorted(summed, key=lambda i: (-abs(summed[i]), i))[:k]
    return {i: summed[i] for i in keep}


def reference(world_size: int, steps: int = STEPS) -> list[list[torch.Tensor]]:
    """Every rank's update at every step, by the authors' pattern: each rank's top-k of its
    error-compensated gradient goes up the tree (rank r sends to r - 2^i in the round i of
    its lowest set bit, a receiver merges), rank 0's list is the update / P, and each rank
    zeroes the residual at its own indices that are in the final list."""
    residual = [torch.zeros(D) for _ in range(world_size)]
    out: list[list[torch.Tensor]] = [[] for _ in range(world_size)]
    for t in range(steps):
        acc = [residual[r] + gradient(r, t) for r in range(world_size)]
        own = [_topk(acc[r], K) for r in range(world_size)]
        lists = [{int(i): float(acc[r][i]) for i in own[r]} for r in range(world_size)]
        step = 1
        while step < world_size:
            for r in range(0, world_size, 2 * step):
                if r + step < world_size:
                    lists[r] = _merge(lists[r], lists[r + step], K)
            step *= 2
        final = lists[0]
        update = torch.zeros(D)
        for i, v in final.items():
            update[i] = torch.tensor(v, dtype=torch.float32) / world_size
        for r in range(world_size):
            out[r].append(update)
            delivered = torch.tensor([int(i) for i in own[r] if int(i) in final], dtype=torch.int64)
            residual[r] = acc[r].clone()
            residual[r][delivered] = 0
    return out


def _run(agg: Any, rank: int) -> list[torch.Tensor]:
    return [agg.step(gradient(rank, t)) for t in range(STEPS)]


def _gloo_rank(rank: int, world_size: int) -> dict[str, Any]:
    agg = gssgd.make_aggregator("gtopk", D, k=K, exchange="tree")
    updates = _run(agg, rank)
    return {"updates": updates, "stats": agg.last_stats}


def test_the_tree_plan_is_the_authors_pairs_and_any_p_reaches_rank_0() -> None:
    assert [tree_plan(r, 8).parent for r in range(8)] == [None, 0, 0, 2, 0, 4, 4, 6]
    assert tree_plan(0, 8).children == (1, 2, 4)
    for p in range(1, 12):
        for r in range(1, p):  # every rank's path ends at rank 0, within ceil(log2 P) hops
            hops, node = 0, r
            while node != 0:
                parent = tree_plan(node, p).parent
                assert parent is not None and node in tree_plan(parent, p).children
                node, hops = parent, hops + 1
            assert hops <= (p - 1).bit_length()


@pytest.mark.parametrize("world_size", [3, 4, 5])
def test_the_tree_matches_the_authors_pattern_in_the_simulated_world(world_size: int) -> None:
    world = SimulatedWorld(world_size)
    aggs = [gssgd.make_aggregator("gtopk", D, k=K, exchange="tree", group=world.rank(r))
            for r in range(world_size)]
    got = world.run(lambda rank: _run(aggs[rank.rank], rank.rank))
    want = reference(world_size)
    for r in range(world_size):
        for t in range(STEPS):
            assert torch.equal(got[r][t], want[r][t]), (r, t)
    # the tree differs from the symmetric exchange somewhere (else this test proves little)
    sym = SimulatedWorld(world_size)
    aggs = [gssgd.make_aggregator("gtopk", D, k=K, group=sym.rank(r)) for r in range(world_size)]
    symmetric = sym.run(lambda rank: _run(aggs[rank.rank], rank.rank))
    assert any(not torch.equal(symmetric[0][t], want[0][t]) for t in range(STEPS))


@pytest.mark.parametrize("world_size", [3, 4])
def test_the_tree_on_gloo_matches_the_reference_and_counts_its_formula(world_size: int) -> None:
    results = run_workers(world_size, _gloo_rank)
    raise_worker_errors(results)
    want = reference(world_size)
    # the indices, one int32 of the ranks' non-finite flags as bits, the float32 values
    pair = (K + 1) * index_dtype(D).itemsize + K * 4
    formula = tree_reduce_broadcast(pair, world_size, tensors=2)
    for r, res in enumerate(results):
        for t in range(STEPS):
            assert torch.equal(res["updates"][t], want[r][t]), (r, t)
        stats = res["stats"]
        assert stats.bytes_sent == formula.sent[r]
        assert stats.bytes_received == formula.received[r]
    assert results[0]["stats"].rounds == 2 * (world_size - 1).bit_length()  # no flag exchange
