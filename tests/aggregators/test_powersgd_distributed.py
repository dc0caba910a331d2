"""PowerSGD on real gloo processes: P = 3 (not a power of two) and P = 2 (a subgroup of the
same spawn) against the independent float64 reference, its traffic formula against what
``last_stats`` counts, the non-finite guard and the rank-agreement check."""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

import pytest
import torch
import torch.distributed as dist

import gssgd
from gssgd.aggregators import build_options
from gssgd.aggregators.powersgd import PowerSGD
from gssgd.comm import ring_allreduce_bytes
from tests.aggregators.powersgd_reference import reference_powersgd
from tests.aggregators.test_powersgd import CONFIGS, SHAPES, STEPS, D, assert_near, gradient
from tests.dist_utils import raise_worker_errors, run_on_prefixes, run_workers

SIZES = (3, 2)


def _trajectories(rank: int, world_size: int, group: dist.ProcessGroup | None = None) -> dict:
    """Every config's STEPS steps on this rank: updates, final residual, statistics."""
    out: dict[str, Any] = {}
    for name, options in CONFIGS.items():
        agg = gssgd.make_aggregator("powersgd", D, group=group, shapes=SHAPES, **options)
        updates, stats = [], []
        for t in range(STEPS):
            updates.append(agg.step(gradient(rank, t)))
            stats.append(dataclasses.asdict(agg.last_stats))
        out[name] = {"updates": torch.stack(updates), "residual": agg.residual.clone(),
                     "stats": stats}
    return out


def _nonfinite(rank: int, world_size: int) -> dict:
    """The last rank's gradient is NaN at step 2: every rank skips it, state untouched."""
    agg = gssgd.make_aggregator("powersgd", D, shapes=SHAPES, rank=2)
    out: dict[str, Any] = {"updates": [], "q": [], "residual": [], "skipped": []}
    for t in range(4):
        g = gradient(rank, t)
        if rank == world_size - 1 and t == 2:
            g[5] = float("nan")
        out["updates"].append(agg.step(g))
        out["q"].append(agg.state_dict()["q"])
        out["residual"].append(agg.residual.clone())
        out["skipped"].append(agg.last_stats.skipped)
    return out


def _mismatch(rank: int, world_size: int) -> str:
    """Rank 1 asks for another rank r: every rank raises, naming the options."""
    agg = gssgd.make_aggregator("powersgd", D, shapes=SHAPES, rank=3 if rank == 1 else 2)
    try:
        agg.step(gradient(rank, 0))
    except ValueError as exc:
        return str(exc)
    return "no error"


def _all(rank: int, world_size: int) -> dict:
    out = run_on_prefixes(rank, world_size, _trajectories, SIZES[1:])
    out["nonfinite"] = _nonfinite(rank, world_size)
    out["mismatch"] = _mismatch(rank, world_size)
    return out


@cache
def results() -> list[dict]:
    out = run_workers(SIZES[0], _all)
    raise_worker_errors(out)
    return out


def _ranks(world_size: int, name: str) -> list[dict]:
    return [results()[r][world_size][name] for r in range(world_size)]


@pytest.mark.parametrize("world_size", SIZES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_gloo_processes_match_the_independent_reference(world_size: int, name: str) -> None:
    ranks = _ranks(world_size, name)
    grads = [[gradient(p, t) for p in range(world_size)] for t in range(STEPS)]
    want, residuals = reference_powersgd(grads, SHAPES, **CONFIGS[name])
    for t in range(STEPS):
        for r in range(1, world_size):
            assert torch.equal(ranks[r]["updates"][t], ranks[0]["updates"][t]), (t, r)
        assert_near(ranks[0]["updates"][t], want[t], f"step {t}")
    for r in range(world_size):
        assert_near(ranks[r]["residual"], residuals[r], f"rank {r}'s residual")


@pytest.mark.parametrize("world_size", SIZES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_traffic_formula_is_what_last_stats_counts(world_size: int, name: str) -> None:
    """Every step sends exactly the formula, the first too: the rank agreement's
    all-gather before it is a launch check, no step's traffic (a resumed run's fresh
    aggregator checks again and counts the same bytes)."""
    cls, k, opts = build_options("powersgd", D, shapes=SHAPES, **CONFIGS[name])
    want = cls.traffic(D, k, opts, world_size)
    for r, res in enumerate(_ranks(world_size, name)):
        for t, stats in enumerate(res["stats"]):
            assert stats["bytes_sent"] == want.sent[r], (r, t)
            assert stats["bytes_received"] == want.received[r], (r, t)
            assert stats["rounds"] == want.rounds, (r, t)
            assert stats["k"] == stats["d"] == D and not stats["skipped"]
    assert want.sent[0] < ring_allreduce_bytes(4 * D, world_size)  # less than dense sends


def test_a_nonfinite_gradient_on_one_rank_skips_the_step_on_every_rank() -> None:
    ranks = [results()[r]["nonfinite"] for r in range(SIZES[0])]
    for res in ranks:
        assert res["skipped"] == [False, False, True, False]
        assert torch.equal(res["updates"][2], torch.zeros(D))
        assert torch.equal(res["residual"][2], res["residual"][1])  # state untouched
        assert torch.equal(res["q"][2], res["q"][1])
        assert not torch.equal(res["q"][3], res["q"][2])  # and it goes on after
        assert torch.equal(res["updates"][3], ranks[0]["updates"][3])


def test_ranks_that_disagree_on_the_rank_all_raise_naming_the_options() -> None:
    for r in range(SIZES[0]):
        message = results()[r]["mismatch"]
        assert "ranks disagree on the aggregator configuration: options" in message, message
        assert "'rank': 3" in message if r == 1 else "'rank': 2" in message


def test_a_single_rank_runs_without_a_process_group_call() -> None:
    """P = 1 on the default group of one gloo process: the update is the rank-r
    approximation of its own gradient, and nothing is sent."""
    out = run_workers(1, _single)
    raise_worker_errors(out)
    update, sent = out[0]
    assert sent == 0
    assert torch.linalg.matrix_rank(update[260:740].view(30, 16)) == 2


def _single(rank: int, world_size: int) -> tuple[torch.Tensor, int]:
    agg = gssgd.make_aggregator("powersgd", D, shapes=SHAPES)
    update = agg.step(gradient(0, 0))
    assert isinstance(agg, PowerSGD)
    return update, agg.last_stats.bytes_sent
