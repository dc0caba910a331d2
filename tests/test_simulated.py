"""The simulated world (gssgd.simulated) against real gloo processes, and its own rules.

The same aggregator classes run on P = 3, 4 and 5 real processes (one spawn: P = 3 and 4
are subgroups of the P = 5 world) and on simulated worlds of the same sizes, with the same
per-rank gradients: the updates and residuals must be bitwise equal for every method,
those whose sums the package orders itself (local Top-k's all-gather, gTop-k's and gs's
recursive doubling, Sketched-SGD's star) and those summed by the backend's all-reduce
(dense, gs with allreduce="backend" and float16 tables, PowerSGD), which the simulated world sums in
gloo's order. The same spawn all-reduces random tensors, so the simulated all-reduce is
also checked bitwise against gloo's on its own, at lengths that are not multiples of P and
past gloo's segment size. The bytes every rank counts must be equal everywhere.
"""

from __future__ import annotations

from functools import cache, partial
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from gssgd import make_aggregator
from gssgd.aggregators.gs import GlobalSketchSGD
from gssgd.aggregators.sketched_sgd import SketchedSGD
from gssgd.aggregators.sketching import MANY_WORKERS, sketch_default_shape
from gssgd.simulated import SimulatedWorld, SimulationError, gloo_ring_chunk
from tests.aggregators.reference import default_sketch, reference_run
from tests.aggregators.scenarios import make_grad
from tests.dist_utils import raise_worker_errors, run_on_prefixes, run_workers

D, DENSITY, STEPS = 600, 0.02, 6
#: gs's many-workers shape at this d and k (what P >= 16 gets by default): 16·k columns,
#: m = 8 (capped), the pre-filter, float16 tables summed by the backend's ring.
_MANY = sketch_default_shape(D, round(DENSITY * D), world_size=MANY_WORKERS)
#: name -> (method, options). The density warm-up makes the first steps send more (and the
#: sketching methods use their warm-up sketch shapes), so those paths are compared too.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "dense": ("dense", {}),
    "topk": ("topk", {"warmup_steps": 3}),
    "gtopk": ("gtopk", {"momentum": 0.5}),
    "sketched": ("sketched", {"warmup_steps": 3}),
    "gs": ("gs", {"warmup_steps": 3}),
    "gs-backend": ("gs", {"allreduce": "backend"}),
    "gs-many-workers": ("gs", {
        "cols": _MANY.cols, "candidates": _MANY.candidates, "allreduce": _MANY.allreduce,
        "table_dtype": _MANY.table_dtype, "prefilter": _MANY.prefilter, "warmup_steps": 2}),
    # PowerSGD's three all-reduces are the backend's (a density is no knob of it)
    "powersgd": ("powersgd", {"shapes": ((20, 25), (10, 3, 3), (10,))}),
}
SIZES = (3, 4, 5)
#: Lengths of the backend all-reduce check, by dtype: fewer than P, not a multiple of P,
#: and past 2P MiB at every P here (gloo's chunks then hold more than two segments).
SUM_LENGTHS = {torch.float32: (1, 4, 13, 1001, 2_700_001),
               torch.float16: (1, 4, 13, 1001, 5_400_001)}


def _summand(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s tensor for the all-reduce check: magnitudes spread over a few
    powers of two, so that the order of the additions shows in the rounded sum."""
    g = torch.Generator().manual_seed(7919 * n + rank)
    spread = 2 if dtype == torch.float16 else 4
    x = torch.randn(n, generator=g, dtype=torch.float64)
    return (x * torch.exp2(torch.randint(-spread, spread + 1, (n,), generator=g))).to(dtype)


def _backend_sums(rank: int, group: Any = None) -> dict[tuple[torch.dtype, int], torch.Tensor]:
    """gloo's all-reduce of every ``_summand`` (rank 0 keeps the results: all ranks get the
    same bits, gloo's all-gather only copies)."""
    sums = {}
    for dtype, lengths in SUM_LENGTHS.items():
        for n in lengths:
            t = _summand(rank, n, dtype)
            dist.all_reduce(t, group=group)
            if rank == 0:
                sums[(dtype, n)] = t
    return sums


def _gradient(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(D, generator=g) * (1.0 + rank)


def _trajectories(rank: int, world_size: int, group: Any = None) -> dict[str, list[dict]]:
    """Every case's STEPS steps on this rank: update, residual and bytes of each step."""
    out: dict[str, list[dict]] = {}
    for name, (method, options) in CASES.items():
        agg = make_aggregator(method, D, density=DENSITY, group=group, **options)
        steps = []
        for step in range(STEPS):
            update = agg.step(_gradient(rank, step))
            steps.append({
                "update": update.clone(),
                "residual": None if agg.residual is None else agg.residual.clone(),
                "sent": agg.last_stats.bytes_sent,
                "received": agg.last_stats.bytes_received,
            })
        out[name] = steps
    return out


def _on_real_ranks(rank: int, world_size: int, group: Any = None) -> dict[str, Any]:
    return {"trajectories": _trajectories(rank, world_size, group),
            "sums": _backend_sums(rank, group)}


@cache
def _simulated(world_size: int) -> list[dict[str, list[dict]]]:
    world = SimulatedWorld(world_size)
    return world.run(lambda rank: _trajectories(rank.rank, world_size, rank))


@pytest.fixture(scope="module")
def real() -> dict[int, list[dict[str, Any]]]:
    """By P: every rank's trajectories and all-reduces on real gloo processes."""
    results = run_workers(max(SIZES), run_on_prefixes, _on_real_ranks, SIZES[:-1])
    raise_worker_errors(results)
    return {p: [results[r][p] for r in range(p)] for p in SIZES}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("world_size", SIZES)
def test_simulated_ranks_equal_real_processes(real: dict, world_size: int, name: str) -> None:
    simulated = _simulated(world_size)
    for rank in range(world_size):
        for step, (sim, got) in enumerate(zip(
            simulated[rank][name], real[world_size][rank]["trajectories"][name], strict=True
        )):
            where = f"{name}, P={world_size}, rank {rank}, step {step}"
            assert (sim["sent"], sim["received"]) == (got["sent"], got["received"]), where
            assert torch.equal(sim["update"], got["update"]), where
            if got["residual"] is None:  # dense keeps none
                assert sim["residual"] is None, where
            else:
                assert torch.equal(sim["residual"], got["residual"]), where
    # and every simulated rank got the same update, as real ranks do
    for rank in range(1, world_size):
        assert torch.equal(simulated[rank][name][-1]["update"], simulated[0][name][-1]["update"])


def _all_reduced(inputs: list[torch.Tensor], rank: Any) -> torch.Tensor:
    t = inputs[rank.rank].clone()
    rank.all_reduce(t)
    return t


@pytest.mark.parametrize("world_size", SIZES)
def test_simulated_all_reduce_sums_in_gloos_order(real: dict, world_size: int) -> None:
    """Bitwise gloo's sum, for float32 and float16, short and long tensors; the data is such
    that rank order 0..P-1 (the simulated world's sum before it followed gloo) is not."""
    world = SimulatedWorld(world_size)
    for (dtype, n), got in real[world_size][0]["sums"].items():
        inputs = [_summand(r, n, dtype) for r in range(world_size)]
        sims = world.run(partial(_all_reduced, inputs))
        for rank, sim in enumerate(sims):
            assert torch.equal(sim, got), f"P={world_size}, {dtype}, n={n}, rank {rank}"
        if n > 1000:
            in_rank_order = inputs[0].clone()
            for t in inputs[1:]:
                in_rank_order += t
            assert not torch.equal(in_rank_order, got), f"P={world_size}, {dtype}, n={n}"


@pytest.mark.parametrize(("numel", "element_size", "world_size", "chunk"), [
    (7, 4, 5, 2),  # 10 segments of one element, two per chunk: chunk 3 is short, 4 empty
    (100, 4, 16, 8),  # segments of 4 elements (16 bytes), not 100 / 16 rounded up
    (100, 2, 17, 6),
    (1001, 4, 17, 60),
    (2_621_441, 4, 5, 524_289),  # just past 2P MiB: 15 segments, not 10
    (6_000_001, 4, 5, 1_200_005),
    (6_000_001, 2, 5, 1_200_003),
    (6_000_001, 4, 3, 2_000_008),
])
def test_gloo_chunks_as_measured(numel: int, element_size: int, world_size: int,
                                 chunk: int) -> None:
    """Chunk lengths read off real gloo runs (P = 16 and 17 included: docs/benchmarks.md,
    "Simulated ring in gloo's order"), where each element's first summand was identified."""
    assert gloo_ring_chunk(numel, element_size, world_size) == chunk


def test_a_deadlock_is_named_at_once_and_the_world_stays_usable() -> None:
    world = SimulatedWorld(3)

    def waits_for_silence(rank: Any) -> None:
        if rank.rank == 0:
            rank.recv(torch.empty(2), src=1)  # rank 1 never sends

    with pytest.raises(SimulationError, match=r"rank 0 waits for a message from rank 1"):
        world.run(waits_for_silence)
    # a collective after the failure works: the world was reset
    sums = world.run(lambda rank: (t := torch.ones(2) * rank.rank, rank.all_reduce(t), t)[2])
    assert all(torch.equal(s, torch.full((2,), 3.0)) for s in sums)


def test_collectives_in_different_orders_are_a_deadlock_not_a_hang() -> None:
    world = SimulatedWorld(2)

    def mismatched(rank: Any) -> None:
        if rank.rank == 0:
            rank.all_reduce(torch.ones(1))
        else:
            rank.recv(torch.empty(1), src=0)

    with pytest.raises(SimulationError, match="different orders"):
        world.run(mismatched)


def test_a_rank_error_is_raised_with_its_rank() -> None:
    world = SimulatedWorld(4)

    def fails_on_two(rank: Any) -> None:
        if rank.rank == 2:
            raise ValueError("boom")
        rank.all_gather(torch.zeros(1))

    with pytest.raises(ValueError, match="boom") as err:
        world.run(fails_on_two)
    assert any("simulated rank 2 of 4" in note for note in err.value.__notes__)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_world_size_must_be_a_positive_integer(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"world_size=.* is invalid"):
        SimulatedWorld(bad)


def test_gathers_give_each_rank_its_own_tensors() -> None:
    world = SimulatedWorld(3)

    def gather_then_scribble(rank: Any) -> list[torch.Tensor]:
        got = rank.all_gather(torch.tensor([float(rank.rank)]))
        got[0].add_(100.0)  # must not change what other ranks hold
        return got

    out = world.run(gather_then_scribble)
    for got in out:
        assert [float(t) for t in got[1:]] == [1.0, 2.0]


@pytest.mark.parametrize("world_size", [16, 32])
def test_gs_many_workers_default_matches_the_independent_reference(world_size: int) -> None:
    """From 16 workers gs takes its many-workers shape (16·k columns, m = 8, a pre-filter
    of 8·k, float16 tables on the ring all-reduce). The same steps replayed by the
    independent reference of that documented shape choose the same coordinates."""
    aggs, k = _replays_the_reference("gs", world_size)
    opts = aggs[0].options
    assert (opts.cols, opts.candidates, opts.prefilter, opts.allreduce, opts.table_dtype) == (
        16 * k, 8, 8, "backend", torch.float16)
    steady = GlobalSketchSGD.traffic(4000, k, opts, world_size)
    assert aggs[0].last_stats.bytes_sent == steady.sent[0]
    assert max(a.last_stats.bytes_received for a in aggs) == max(steady.received)


def test_sketched_many_workers_default_matches_the_independent_reference() -> None:
    """From 16 workers Sketched-SGD takes the same sketch shape as gs (one rule sizes
    both): 16·k columns, m = 8, the pre-filter of 8·k and float16 tables, which its server
    widens and sums as float32. Replayed by the independent reference of that shape, the
    same coordinates; the steady bytes are its traffic formula's."""
    aggs, k = _replays_the_reference("sketched", 16)
    opts = aggs[0].options
    assert (opts.cols, opts.candidates, opts.prefilter, opts.table_dtype) == (
        16 * k, 8, 8, torch.float16)
    steady = SketchedSGD.traffic(4000, k, opts, 16)
    assert [a.last_stats.bytes_sent for a in aggs] == list(steady.sent)


def _replays_the_reference(method: str, world_size: int) -> tuple[list, int]:
    """Six steps of ``method`` at its default shape for ``world_size`` ranks (d = 4000,
    density 0.01) in a simulated world, checked against the independent reference of the
    documented default shape: the same coordinates, the same values to 1e-5. Returns the
    aggregators (after the last step) and k."""
    d, density, steps = 4000, 0.01, 6
    k = round(density * d)
    world = SimulatedWorld(world_size)
    aggs = [make_aggregator(method, d, density=density, group=world.rank(r))
            for r in range(world_size)]
    grads = [[make_grad(p, t, d) for p in range(world_size)] for t in range(steps)]
    got = [world.run(lambda rank, t=t: aggs[rank.rank].step(grads[t][rank.rank]))[0]
           for t in range(steps)]
    want, _ = reference_run(method, grads, k, default_sketch(d, k, world_size))
    for t in range(steps):
        assert set(torch.nonzero(got[t]).flatten().tolist()) == set(
            np.flatnonzero(want[t]).tolist()), f"{method}, step {t}"
        np.testing.assert_allclose(got[t].double().numpy(), want[t], rtol=1e-5, atol=1e-5)
    return aggs, k


def test_below_sixteen_workers_gs_keeps_the_small_p_width_and_candidates() -> None:
    """40·k columns and m = 32 (both capped here: d/4 and d/(8k)), float16 and the ring as
    at every P."""
    world = SimulatedWorld(8)
    opts = make_aggregator("gs", 4000, density=0.01, group=world.rank(0)).options
    assert (opts.cols, opts.candidates, opts.prefilter, opts.allreduce, opts.table_dtype) == (
        1000, 12, 8, "backend", torch.float16)


def test_gs_spaces_its_audits_by_its_own_bytes() -> None:
    """The MNIST CNN's d at density 0.001: with the dense audit, the small-P shape on 4
    workers (float16 tables on the ring) spaces audits about 380 steps apart, while the many-workers shape on 64 sends so
    little that a dense audit every 200 steps would add half its bytes, so later audits come
    over a thousand steps apart; the default pool audit costs so little that every shape
    audits at the 200-step floor."""
    d = 80_602
    for world_size, audit, low, high in ((4, "dense", 350, 420), (64, "dense", 1000, 1500),
                                         (4, "tops", 200, 200), (64, "tops", 200, 200)):
        agg = make_aggregator("gs", d, density=0.001, group=SimulatedWorld(world_size).rank(0),
                              audit=audit)
        assert low <= agg.guard.audit_every <= high, (world_size, audit, agg.guard.audit_every)
