"""The simulated world (gssgd.simulated) against real gloo processes, and its own rules.

The same aggregator classes run on P = 3, 4 and 5 real processes (one spawn: P = 3 and 4
are subgroups of the P = 5 world) and on simulated worlds of the same sizes, with the same
per-rank gradients: where the package fixes the order of the sums (local Top-k's
all-gather, gTop-k's and gs's recursive doubling, Sketched-SGD's star) the updates and
residuals must be bitwise equal; where the backend's all-reduce picks the order (dense, gs
with allreduce="backend", PowerSGD) the same coordinates must be chosen and the values agree
to rounding. The bytes every rank counts must be equal everywhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from gssgd import make_aggregator
from gssgd.aggregators.gs import GlobalSketchSGD
from gssgd.simulated import SimulatedWorld, SimulationError
from tests.aggregators.reference import default_sketch, reference_run
from tests.aggregators.scenarios import make_grad
from tests.dist_utils import raise_worker_errors, run_on_prefixes, run_workers

D, DENSITY, STEPS = 600, 0.02, 6
#: name -> (method, options). The density warm-up makes the first steps send more (and the
#: sketching methods use their warm-up sketch shapes), so those paths are compared too.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "dense": ("dense", {}),
    "topk": ("topk", {"warmup_steps": 3}),
    "gtopk": ("gtopk", {"momentum": 0.5}),
    "sketched": ("sketched", {"warmup_steps": 3}),
    "gs": ("gs", {"warmup_steps": 3}),
    "gs-backend": ("gs", {"allreduce": "backend"}),
    # PowerSGD's three all-reduces are the backend's (a density is no knob of it)
    "powersgd": ("powersgd", {"shapes": ((20, 25), (10, 3, 3), (10,))}),
}
#: Cases whose sums the package orders itself: bitwise equal to real processes.
BITWISE = ("topk", "gtopk", "sketched", "gs")
#: Cases whose backend sums feed a power iteration: each step's orthogonalisation and the
#: warm start carry the rounding of gloo's order on, so they agree to a small share of the
#: update's scale (measured up to 3e-6 of it in 6 steps), not element by element.
LOW_RANK = ("powersgd",)
SIZES = (3, 4, 5)


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


def _simulated(world_size: int) -> list[dict[str, list[dict]]]:
    world = SimulatedWorld(world_size)
    return world.run(lambda rank: _trajectories(rank.rank, world_size, rank))


@pytest.fixture(scope="module")
def real() -> dict[int, list[dict[str, list[dict]]]]:
    """By P: every rank's trajectories on real gloo processes."""
    results = run_workers(max(SIZES), run_on_prefixes, _trajectories, SIZES[:-1])
    raise_worker_errors(results)
    return {p: [results[r][p] for r in range(p)] for p in SIZES}


@pytest.mark.parametrize("world_size", SIZES)
def test_simulated_ranks_equal_real_processes(real: dict, world_size: int) -> None:
    simulated = _simulated(world_size)
    for name in CASES:
        for rank in range(world_size):
            for step, (sim, got) in enumerate(
                zip(simulated[rank][name], real[world_size][rank][name], strict=True)
            ):
                where = f"{name}, P={world_size}, rank {rank}, step {step}"
                assert (sim["sent"], sim["received"]) == (got["sent"], got["received"]), where
                if name in BITWISE:
                    assert torch.equal(sim["update"], got["update"]), where
                    assert torch.equal(sim["residual"], got["residual"]), where
                elif name in LOW_RANK:  # the backend's order, carried by the power iteration
                    for key in ("update", "residual"):
                        gap = float((sim[key] - got[key]).abs().max())
                        assert gap <= 5e-5 * float(got[key].abs().max()), (where, key, gap)
                else:  # the backend's order of the sum: the same coordinates, to rounding
                    assert torch.equal(sim["update"] != 0, got["update"] != 0), where
                    torch.testing.assert_close(sim["update"], got["update"], rtol=1e-5, atol=1e-6)
        # and every simulated rank got the same update, as real ranks do
        for rank in range(1, world_size):
            assert torch.equal(simulated[rank][name][-1]["update"], simulated[0][name][-1]["update"])


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
    d, density, steps = 4000, 0.01, 6
    k = round(density * d)
    world = SimulatedWorld(world_size)
    aggs = [make_aggregator("gs", d, density=density, group=world.rank(r))
            for r in range(world_size)]
    opts = aggs[0].options
    assert (opts.cols, opts.candidates, opts.prefilter, opts.allreduce, opts.table_dtype) == (
        16 * k, 8, 8, "backend", torch.float16)
    grads = [[make_grad(p, t, d) for p in range(world_size)] for t in range(steps)]
    got = []
    for t in range(steps):
        got.append(world.run(lambda rank, t=t: aggs[rank.rank].step(grads[t][rank.rank]))[0])
    want, _ = reference_run("gs", grads, k, default_sketch(d, k, world_size))
    for t in range(steps):
        assert set(torch.nonzero(got[t]).flatten().tolist()) == set(
            np.flatnonzero(want[t]).tolist()), f"step {t}"
        np.testing.assert_allclose(got[t].double().numpy(), want[t], rtol=1e-5, atol=1e-5)
    steady = GlobalSketchSGD.traffic(d, k, opts, world_size)
    assert aggs[0].last_stats.bytes_sent == steady.sent[0]
    assert max(a.last_stats.bytes_received for a in aggs) == max(steady.received)


def test_below_sixteen_workers_gs_keeps_the_small_p_default() -> None:
    world = SimulatedWorld(8)
    opts = make_aggregator("gs", 4000, density=0.01, group=world.rank(0)).options
    assert (opts.cols, opts.candidates, opts.prefilter, opts.allreduce, opts.table_dtype) == (
        1000, 12, 8, "recursive_doubling", torch.float32)


def test_gs_spaces_its_audits_by_its_own_bytes() -> None:
    """The MNIST CNN's d at density 0.001: the small-P shape on 4 workers keeps audits about
    200 steps apart; the many-workers shape on 64 sends so little that a dense audit every
    200 steps would add half its bytes, so later audits come over a thousand steps apart."""
    d = 80_602
    for world_size, low, high in ((4, 200, 260), (64, 1000, 1500)):
        agg = make_aggregator("gs", d, density=0.001, group=SimulatedWorld(world_size).rank(0))
        assert low <= agg.guard.audit_every <= high, (world_size, agg.guard.audit_every)
