"""PowerSGD (gssgd.aggregators.powersgd) in one process: options and their errors, the
low-rank plan, the orthogonalisation against PyTorch's, and simulated worlds against the
independent reference (tests/aggregators/powersgd_reference.py). Real gloo processes:
test_powersgd_distributed.py."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd

import gssgd
from gssgd.aggregators import build_options
from gssgd.aggregators.powersgd import PowerSGD, default_shapes, orthogonalize_, plan_lowrank
from gssgd.comm import ring_allreduce, ring_allreduce_bytes
from gssgd.ddp import HookState
from gssgd.simulated import SimulatedWorld
from tests.aggregators.powersgd_reference import reference_powersgd

#: A conv kernel, a bias, two matrices of one shape apart (PyTorch groups them), a small
#: matrix that would not shrink, a scalar, a wide matrix that compresses at rank 1 only,
#: and a 3-D tensor that compresses up to rank 3.
SHAPES: list[tuple[int, ...]] = [(20, 3, 2, 2), (20,), (30, 16), (6, 6), (30, 16), (5,),
                                 (3, 40), (), (12, 5, 4)]
D = sum(math.prod(s) for s in SHAPES)
#: config name -> options (every one with SHAPES)
CONFIGS: dict[str, dict[str, Any]] = {
    "rank1": {"rank": 1},
    "rank2": {"rank": 2},
    "rank4": {"rank": 4},  # r > 2: torch.linalg.qr, as PyTorch's hook
    "cold": {"rank": 2, "warm_start": False},  # a fresh draw every step
    "momentum": {"rank": 2, "momentum": 0.9},
    "seeded": {"rank": 2, "seed": 12345},
    # 1-bit Adam's compressed momentum (compressed_adamw's recipe)
    "onebit": {"rank": 2, "feedback": "onebit", "momentum": 0.9},
}
STEPS = 5


def gradient(rank: int, step: int) -> torch.Tensor:
    """A different gradient per (rank, step): a part shared by the ranks whose matrices
    have a decaying spectrum (singular values 8, 4, 2, ...: gradients are nearly low-rank,
    and well-separated singular values keep the rank-r subspace from turning on rounding),
    plus noise of each rank's own."""
    own = torch.Generator().manual_seed(7919 * rank + 104_729 * step + 1)
    shared = torch.Generator().manual_seed(31 * step)
    parts = []
    for shape in SHAPES:
        numel = math.prod(shape)
        if len(shape) < 2:
            parts.append(torch.randn(numel, generator=shared))
            continue
        n, m = shape[0], numel // shape[0]
        u, _ = torch.linalg.qr(torch.randn(n, n, generator=shared))
        v, _ = torch.linalg.qr(torch.randn(m, m, generator=shared))
        k = min(n, m)
        s = 8.0 * 0.5 ** torch.arange(k, dtype=torch.float32)
        parts.append(((u[:, :k] * s) @ v[:, :k].T).reshape(-1))
    return torch.cat(parts) + 0.1 * torch.randn(D, generator=own)


def simulated_run(world_size: int, options: dict[str, Any], steps: int = STEPS,
                  ) -> list[dict[str, Any]]:
    """Every rank's updates, residual and statistics over ``steps`` steps of a simulated
    world (the same aggregator class and collectives as real processes)."""
    world = SimulatedWorld(world_size)
    aggs = [gssgd.make_aggregator("powersgd", D, group=world.rank(r), shapes=SHAPES, **options)
            for r in range(world_size)]
    out: list[dict[str, Any]] = [{"updates": [], "stats": []} for _ in range(world_size)]
    for t in range(steps):
        ups = world.run(lambda rank, t=t: aggs[rank.rank].step(gradient(rank.rank, t)))
        for r in range(world_size):
            out[r]["updates"].append(ups[r])
            out[r]["stats"].append(aggs[r].last_stats)
    for r in range(world_size):
        out[r]["residual"] = aggs[r].residual
    return out


def assert_near(got: torch.Tensor, want: torch.Tensor, where: str, rel: float = 5e-5) -> None:
    """Equal to float32 rounding: no element further from the float64 reference than
    ``rel`` times the reference's largest element. The float32 run drifts from the exact
    math as the power iteration carries its rounding (and gloo's order of the sums) from
    step to step: measured 1e-7 of the scale at the first step, up to 4e-6 by the fifth in
    a simulated world and 1.1e-5 once on gloo at P = 3, rank 1. A wrong rule (another
    error feedback, a missing division by the world size, another random draw, a cold
    start) is off by 1e-1 and more, and a Q scaled by 1.0001 already fails."""
    gap, scale = float((got.double() - want).abs().max()), float(want.abs().max())
    assert gap <= rel * scale, f"{where}: off by {gap:.3g}, {gap / scale:.3g} of the scale"


# ---------------------------------------------------------------------------- options
@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"rank": 0}, r"rank=0 is invalid: it must be an integer >= 1 .* Start with rank=1"),
        ({"rank": 2.5}, r"rank=2.5 is invalid: it must be an integer >= 1"),
        ({"rank": True}, r"rank=True is invalid"),
        ({"warm_start": "yes"}, r"warm_start='yes' is invalid: it must be True or False"),
        ({"min_compression_rate": 0.5}, r"min_compression_rate=0.5 is invalid: it must be a "
         r"number >= 1 \(below 1, factors larger than the matrix would be sent\)"),
        ({"min_compression_rate": float("inf")}, r"min_compression_rate=inf is invalid"),
        ({"epsilon": -1e-8}, r"epsilon=-1e-08 is invalid: it must be a number >= 0"),
        ({"seed": -1}, r"seed=-1 is invalid: it must be an integer in \[0, 2\*\*64\)"),
        ({"momentum": 1.0}, r"momentum=1.0 is invalid: it must be a number in \[0, 1\)"),
        ({"shapes": [(10, 10)]}, r"shapes=\(\(10, 10\),\) is invalid: their sizes add up to 100, "
         r"not to the vector's d=1622"),
        ({"shapes": [(10, -1)]}, r"\(10, -1\) is not a shape of integers >= 0"),
        ({"shapes": "10x10"}, r"shapes='10x10' is invalid: it must be a non-empty sequence"),
        ({"k": 10}, r"method 'powersgd' sends every coordinate and takes no k"),
        ({"cols": 10}, r"unknown option\(s\) \['cols'\] for method 'powersgd'"),
        ({"nonfinite": "ignore"}, r"nonfinite='ignore' is invalid"),
    ],
)
def test_bad_options_are_refused_with_the_value_the_range_and_the_fix(
    options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        build_options("powersgd", D, **options)


def test_the_hook_passes_the_shapes_itself() -> None:
    with pytest.raises(ValueError, match=r"shapes=.* cannot be given to the hook: it passes "
                       r"each vector's parameter shapes to 'powersgd' itself"):
        HookState("powersgd", shapes=[(2, 2)])
    with pytest.raises(ValueError, match=r"rank=0 is invalid"):
        HookState("powersgd", rank=0)


def test_density_is_no_knob_and_shapes_default_to_one_near_square_matrix() -> None:
    """Like dense, PowerSGD takes no k (its rank sets the message; a density is ignored),
    and a bare vector is read as isqrt(d) rows with a dense tail."""
    _, k, opts = build_options("powersgd", 80_602, density=0.5)
    assert k == 80_602 and opts.rank == 2 and opts.warm_start and opts.seed == 0
    assert opts.shapes == default_shapes(80_602) == ((283, 284), (230,))
    assert default_shapes(100) == ((10, 10),) and default_shapes(1) == ((1, 1),)


# ---------------------------------------------------------------------------- the plan
def test_the_plan_follows_pytorchs_rule_and_order() -> None:
    plan = plan_lowrank(SHAPES, rank=2, min_compression_rate=2)
    # compressed: the conv (20 x 12), both (30, 16) together, then the (12, 5, 4); the
    # (6, 6) would not halve, the (3, 40) needs rank 1
    assert [(f.offset, f.n, f.m, f.r) for f in plan.factors] == [
        (0, 20, 12, 2), (260, 30, 16, 2), (776, 30, 16, 2), (1382, 12, 20, 2)]
    assert [f.p_offset for f in plan.factors] == [0, 40, 100, 160]
    assert plan.dense == ((240, 20), (740, 36), (1256, 5), (1261, 120), (1381, 1))
    assert (plan.dense_numel, plan.p_numel, plan.q_numel) == (182, 184, 128)
    rank1 = plan_lowrank(SHAPES, rank=1, min_compression_rate=2)
    assert (3, 40) in [(f.n, f.m) for f in rank1.factors]
    assert plan_lowrank(SHAPES, rank=1, min_compression_rate=100).factors == ()


def test_traffic_is_three_ring_all_reduces_the_first_with_the_flags() -> None:
    _, k, opts = build_options("powersgd", D, rank=2, shapes=SHAPES)
    for world in (1, 2, 3, 16):
        t = PowerSGD.traffic(D, k, opts, world)
        # the dense part carries the P non-finite flags; then every P, every Q
        sizes = (182 + world, 184, 128)
        rings = [ring_allreduce(4 * n, world) for n in sizes]
        assert t.sent == tuple(sum(r.sent[q] for r in rings) for q in range(world))
        # on average over the ranks each ring sends the ideal floor(2(P-1)/P * n)
        ideal = sum(ring_allreduce_bytes(4 * n, world) for n in sizes)
        assert abs(sum(t.sent) / world - ideal) < 3
        assert t.rounds == 3 * 2 * (world - 1)  # no flag exchange


# ---------------------------------------------------------------------------- orthogonalise
@pytest.mark.parametrize("r", [1, 2, 3, 5])
def test_orthogonalisation_is_pytorchs(r: int) -> None:
    """Bitwise PyTorch's ``_orthogonalize`` (Gram-Schmidt up to rank 2, QR above)."""
    x = torch.randn(1, 40, r, generator=torch.Generator().manual_seed(r))
    mine, theirs = x.clone(), x.clone()
    orthogonalize_(mine)
    torch_powersgd._orthogonalize(theirs)
    assert torch.equal(mine, theirs)
    torch.testing.assert_close(mine[0].T @ mine[0], torch.eye(r), rtol=0, atol=1e-5)


def test_an_all_zero_column_stays_zero_where_pytorch_gives_nan() -> None:
    x = torch.randn(1, 10, 2)
    x[..., 0] = 0
    orthogonalize_(x)
    assert torch.isfinite(x).all() and torch.equal(x[..., 0], torch.zeros(1, 10))
    theirs = torch.zeros(1, 10, 2)
    torch_powersgd._orthogonalize(theirs)
    assert torch.isnan(theirs).all()  # why gssgd does not copy this one line


# ---------------------------------------------------------------------------- the math
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_simulated_world_matches_the_independent_reference(world_size: int, name: str) -> None:
    options = CONFIGS[name]
    got = simulated_run(world_size, options)
    grads = [[gradient(p, t) for p in range(world_size)] for t in range(STEPS)]
    want, residuals = reference_powersgd(grads, SHAPES, **options)
    for t in range(STEPS):
        for r in range(world_size):
            assert torch.equal(got[r]["updates"][t], got[0]["updates"][t]), (t, r)
        assert_near(got[0]["updates"][t], want[t], f"step {t}")
    for r in range(world_size):
        assert_near(got[r]["residual"], residuals[r], f"rank {r}'s residual")


def test_no_gradient_mass_is_lost() -> None:
    """sum_t,p g = W * sum_t update + sum_p e_p: what the update does not carry stays in
    the residuals (PyTorch's rule e_p = a_p - update)."""
    world = 3
    got = simulated_run(world, CONFIGS["rank1"])
    grads = sum(gradient(p, t).double() for p in range(world) for t in range(STEPS))
    delivered = world * sum(u.double() for u in got[0]["updates"])
    kept = sum(got[r]["residual"].double() for r in range(world))
    assert kept.abs().max() > 1  # the residuals hold a lot: the invariant is not trivial
    torch.testing.assert_close(delivered + kept, grads, rtol=1e-5, atol=1e-4)


def test_the_update_is_low_rank_where_it_compresses_and_exact_where_it_does_not() -> None:
    world = 2
    got = simulated_run(world, {"rank": 1}, steps=1)
    update = got[0]["updates"][0]
    mean = (gradient(0, 0) + gradient(1, 0)) / 2
    assert torch.linalg.matrix_rank(update[260:740].view(30, 16)) == 1
    torch.testing.assert_close(update[240:260], mean[240:260])  # the bias: the exact mean
    assert not torch.allclose(update[260:740], mean[260:740], atol=1e-2)


def test_a_matrix_that_was_all_zero_on_every_rank_compresses_again_later() -> None:
    """A layer no rank has used yet (its gradient and residual all zero): its P and new Q
    come out zero, where PyTorch's hook gives NaN (epsilon 0) or a zero Q whose power
    iteration never leaves zero (epsilon > 0). gssgd keeps the zero step finite and the
    last Q for the warm start, so once the layer has gradients it is updated again."""
    shapes, world = [(30, 16), (20,)], 2
    d = 500
    sim = SimulatedWorld(world)
    aggs = [gssgd.make_aggregator("powersgd", d, group=sim.rank(r), shapes=shapes)
            for r in range(world)]
    grads = [torch.randn(d, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    unused = [g.clone() for g in grads]
    for g in unused:
        g[:480] = 0  # the matrix: no gradient on any rank at the first step
    first = sim.run(lambda rank: aggs[rank.rank].step(unused[rank.rank]))[0]
    assert torch.isfinite(first).all() and torch.count_nonzero(first[:480]) == 0
    second = sim.run(lambda rank: aggs[rank.rank].step(grads[rank.rank]))[0]
    assert torch.linalg.matrix_rank(second[:480].view(30, 16)) == 2
