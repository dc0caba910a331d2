"""Recursive-doubling schedules and accounted collectives on real gloo processes."""

from __future__ import annotations

from functools import cache

import pytest
import torch
import torch.distributed as dist

from gssgd.comm import (
    Communicator,
    allgather,
    gloo_ring_segments,
    halving_doubling,
    recursive_doubling,
    recursive_doubling_plan,
    ring_allreduce,
    ring_allreduce_bytes,
)
from tests.dist_utils import raise_worker_errors, run_on_prefixes, run_workers


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 6, 7, 8, 12])
def test_plan_pairs_every_rank_once_per_round(world_size: int) -> None:
    plans = [recursive_doubling_plan(r, world_size) for r in range(world_size)]
    power = plans[0].power
    assert power & (power - 1) == 0 and power <= world_size < 2 * power
    for r, p in enumerate(plans):
        if r >= power:
            assert p.fold_into == r - power and not p.partners
            assert plans[r - power].folded_from == r
        else:
            for q in p.partners:
                assert plans[q].partners[p.partners.index(q)] == r  # partners are mutual


def _collectives(rank: int, world_size: int, group: dist.ProcessGroup | None = None) -> dict:
    comm = Communicator(group)
    x = torch.full((6,), float(rank + 1))
    out = {"rd": comm.allreduce_recursive_doubling(x)}
    out["rd_stats"] = comm.take_stats()
    # halving and doubling: distinct integers per rank and element (sums exact in any
    # order), 23 elements (chunks of unequal size at every P)
    y = torch.arange(23, dtype=torch.float32) * 10 + rank
    out["hd"] = comm.allreduce_halving_doubling(y)
    out["hd_stats"] = comm.take_stats()
    out["backend"] = comm.allreduce_backend(x.clone())
    out["backend_stats"] = comm.take_stats()
    out["allgather"] = comm.allgather_backend(x[:2])
    out["allgather_stats"] = comm.take_stats()
    gathered = comm.gather_to_root([x[:2]])
    out["gathered"] = None if gathered is None else [g[0] for g in gathered]
    out["star"] = comm.broadcast_from_root([x[:3] * (rank == 0)])[0]
    out["star_stats"] = comm.take_stats()
    return out


WORLD_SIZES = [1, 2, 3, 4, 5]



@cache
def _results() -> list[dict[int, dict]]:
    ranks = run_workers(max(WORLD_SIZES), run_on_prefixes, _collectives, WORLD_SIZES)
    raise_worker_errors(ranks)
    return ranks


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_collectives_sum_and_count(world_size: int) -> None:
    """P = 5 on the whole world, P = 1 to 4 on subgroups of it (group-local ranks)."""
    ranks = [per_size[world_size] for per_size in _results()[:world_size]]
    assert len(ranks) == world_size
    total = world_size * (world_size + 1) / 2
    power = 1 << (world_size.bit_length() - 1)
    for r, res in enumerate(ranks):
        assert torch.equal(res["rd"], torch.full((6,), total))
        assert torch.equal(res["backend"], torch.full((6,), total))
        assert torch.equal(res["star"], torch.ones(3))
        want = torch.arange(23, dtype=torch.float32) * 10 * world_size + sum(range(world_size))
        assert torch.equal(res["hd"], want)
        hd, h = halving_doubling(23 * 4, world_size), res["hd_stats"]
        assert (h.bytes_sent, h.bytes_received, h.rounds) == (hd.sent[r], hd.received[r], hd.rounds)
        assert (h.messages, h.messages_received) == (hd.messages[r], hd.messages_received[r])
        assert hd.rounds == 2 * (power.bit_length() - 1) + (2 if world_size != power else 0)
        s = res["rd_stats"]
        rounds = power.bit_length() - 1
        if r >= power:  # folded: sends once, receives the result once
            assert (s.bytes_sent, s.bytes_received) == (24, 24)
        else:
            extra = 1 if r + power < world_size else 0
            assert s.bytes_sent == 24 * (rounds + extra)
            assert s.bytes_received == 24 * (rounds + extra)
        assert s.rounds == rounds + (2 if world_size != power else 0)
        rd = recursive_doubling(24, world_size)
        assert (s.messages, s.messages_received) == (rd.messages[r], rd.messages_received[r])
        ring, b = ring_allreduce(24, world_size), res["backend_stats"]
        assert (b.bytes_sent, b.bytes_received) == (ring.sent[r], ring.received[r])
        assert (b.messages, b.messages_received) == (ring.messages[r], ring.messages_received[r])
        g = res["allgather_stats"]  # a ring all-gather: each rank forwards the others' blocks
        assert g.bytes_sent == g.bytes_received == (world_size - 1) * 8
        assert g.messages == g.messages_received == 2 * (world_size - 1)
        assert [float(t[0]) for t in res["allgather"]] == [q + 1.0 for q in range(world_size)]
    if world_size > 1:
        root = ranks[0]
        assert [float(g[0]) for g in root["gathered"]] == [float(r + 1) for r in range(world_size)]
        assert root["star_stats"].bytes_received == (world_size - 1) * 8
        assert root["star_stats"].bytes_sent == (world_size - 1) * 12


@pytest.mark.parametrize("world_size", [2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize(("nbytes", "itemsize"), [(4, 4), (24, 4), (80, 4), (2592, 2),
                                                  (322_408, 4), (5 << 20, 4), (3 << 21, 2)])
def test_ring_allreduce_is_the_ring_figure_on_average(
    world_size: int, nbytes: int, itemsize: int
) -> None:
    """Each rank sends 2n less two blocks of gloo's segments: 2(P-1)/P * n over the ranks,
    each rank within two of its largest blocks, and what it sends its predecessor receives."""
    p, ring = world_size, ring_allreduce(nbytes, world_size, itemsize)
    segments = gloo_ring_segments(nbytes, p, itemsize)
    assert sum(segments) == nbytes and len(segments) % p == 0 and len(segments) >= 2 * p
    assert sum(ring.sent) == sum(ring.received) == 2 * (p - 1) * nbytes
    block = max(segments) * len(segments) // p
    assert all(abs(s - ring_allreduce_bytes(nbytes, p)) <= 2 * block for s in ring.sent)
    assert ring.received == ring.sent[1:] + ring.sent[:1]
    assert ring.rounds == 2 * (p - 1) and ring.critical_bytes == max(ring.sent)
    assert max(ring.messages) <= 2 * (len(segments) - len(segments) // p)


def test_allgather_forwards_the_other_ranks_blocks() -> None:
    """gloo's ring all-gather: P - 1 steps of two half-blocks, each rank sending its own
    block and forwarding P - 2 others'; one rank alone moves nothing."""
    t = allgather(4, 16)
    assert t.sent == t.received == (60,) * 16
    assert t.messages == t.messages_received == (30,) * 16
    assert (t.rounds, t.critical_bytes, t.critical_headers) == (15, 60, 90)
    assert allgather(4, 1) == allgather(0, 1)


@pytest.mark.parametrize("world_size", [2, 4, 8, 16])
def test_halving_doubling_sends_about_the_rings_bytes(world_size: int) -> None:
    """Each rank sends ``2 n (P-1)/P`` bytes (to a chunk's rounding) in ``2 log2 P`` rounds,
    where recursive doubling sends ``n log2 P``."""
    n = 4 * 1_000_003
    hd = halving_doubling(n, world_size)
    ideal = 2 * (world_size - 1) * n / world_size
    assert all(abs(s - ideal) <= 4 * world_size for s in hd.sent)
    assert hd.rounds == 2 * (world_size.bit_length() - 1)
    assert max(hd.sent) < recursive_doubling(n, world_size).sent[0] or world_size <= 4
