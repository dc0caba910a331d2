"""DGC's recipe tools in every sparse aggregator: density warm-up and local gradient clipping.

The schedule is checked value by value; on real gloo processes (P = 3, a non-power of two)
every sparse method sends the schedule's k at each step, every rank gets the same update,
no gradient mass is lost during the warm-up or under clipping (the mass invariant:
sum over ranks and steps of the gradient that entered = P * sum of updates + sum of
residuals), and every method's bytes sent and received, rank by rank and step by step,
equal its ``traffic`` formula for that step, warm-up steps included.
"""

from __future__ import annotations

import math
from functools import cache

import pytest
import torch

import gssgd
from gssgd.aggregators import build_options
from gssgd.aggregators.schedule import DensityWarmup
from gssgd.costmodel.method_specs import method_spec, traffic, warmup_traffic
from tests.dist_utils import raise_worker_errors, run_each, run_workers

SPARSE = ["topk", "gtopk", "sketched", "gs"]


def test_warmup_sends_what_the_exponential_says() -> None:
    w = DensityWarmup(d=100_000, k=100, steps=4, start_density=0.25)
    # 25000 * (100 / 25000) ** (t / 4), rounded: no rounding up to k * 2^j any more
    assert [w.k_at(t) for t in range(7)] == [25000, 6287, 1581, 398, 100, 100, 100]
    assert w.distinct_k() == [25000, 6287, 1581, 398, 100]
    long = DensityWarmup(d=80_602, k=81, steps=100, start_density=0.25)
    ks = [long.k_at(t) for t in range(101)]
    assert ks == sorted(ks, reverse=True) and ks[0] == 20150 and ks[-1] == 81
    exponential = [20150 * (81 / 20150) ** (t / 100) for t in range(100)]
    assert all(abs(k - e) <= 0.5 for k, e in zip(ks, exponential, strict=False))
    # the total the warm-up sends is the exponential's, not up to twice it
    assert abs(sum(ks[:100]) - sum(exponential)) < 0.01 * sum(exponential)
    assert DensityWarmup(1000, 500, 10, 0.25).k_at(0) == 500  # never below the target
    assert DensityWarmup(1000, 10, 0, 0.25).k_at(0) == 10  # steps=0: off


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"warmup_steps": -1}, r"warmup_steps=-1 is invalid: it must be an integer >= 0"),
        ({"warmup_density": 0.0}, r"warmup_density=0.0 is invalid: .* \(0, 1\]"),
        ({"local_clip": -2.0}, r"local_clip=-2.0 is invalid: it must be a number > 0"),
        ({"local_clip": float("nan")}, "local_clip=nan is invalid"),
    ],
)
def test_bad_recipe_options_say_the_range_and_the_fix(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        gssgd.make_aggregator("gs", 1000, **options)


def _run(rank: int, world_size: int, method: str, options: dict, steps: int) -> dict:
    d = 2000
    density = {} if method == "dense" else {"density": 0.01}
    agg = gssgd.make_aggregator(method, d, **density, **options)
    gen = torch.Generator().manual_seed(100 + rank)
    entered = torch.zeros(d, dtype=torch.float64)
    updates = torch.zeros(d, dtype=torch.float64)
    ks, sent, received = [], [], []
    for _ in range(steps):
        g = torch.randn(d, generator=gen) * 3
        clip = options.get("local_clip")
        if clip is not None:  # what clipping lets in: g scaled to norm <= clip / sqrt(P)
            limit = clip / math.sqrt(world_size)
            g_in = g * min(1.0, limit / float(g.norm()))
        else:
            g_in = g
        entered += g_in.double()
        update = agg.step(g)
        updates += update.double()
        ks.append(agg.last_stats.k)
        sent.append(agg.last_stats.bytes_sent)
        received.append(agg.last_stats.bytes_received)
    residual = agg.residual.double() if agg.residual is not None else None
    return {"entered": entered, "updates": updates, "residual": residual, "ks": ks,
            "sent": sent, "received": received, "last_update": update}


def _warmup_options(method: str) -> dict:
    options = {"warmup_steps": 4, "warmup_density": 0.25, "rows": 3} if method in (
        "sketched", "gs") else {"warmup_steps": 4, "warmup_density": 0.25}
    if method == "gs":
        options["guard"] = "off"
    return options


def _clip_options(method: str) -> dict:
    options = {"local_clip": 5.0}
    if method == "gs":
        options["guard"] = "off"
    return options


#: Every run of the gloo tests below, by (test, method): ``_run``'s arguments after P.
RUNS: dict[tuple[str, str], tuple[str, dict, int]] = {
    **{("warmup", m): (m, _warmup_options(m), 6) for m in SPARSE},
    **{("clip", m): (m, _clip_options(m), 4) for m in ("topk", "gs")},
    ("warmup", "dense"): ("dense", {}, 6),  # no warm-up: the same traffic at every step
}



@cache
def _results() -> list[dict]:
    """Per rank, every run of RUNS: one spawn of P = 3 processes for all of them (starting
    the processes costs more than the runs)."""
    out = run_workers(3, run_each, _run, RUNS)
    raise_worker_errors(out)
    return out


def _ranks(test: str, method: str) -> list[dict]:
    out = [rank[(test, method)] for rank in _results()]
    raise_worker_errors(out)
    return out


@pytest.mark.parametrize("method", SPARSE)
def test_warmup_sends_the_schedule_and_loses_no_mass(method: str) -> None:
    world = 3
    results = _ranks("warmup", method)
    assert len(results) == world
    want = [DensityWarmup(2000, 20, 4, 0.25).k_at(t) for t in range(6)]
    assert want == [500, 224, 100, 45, 20, 20]  # 500 * (20 / 500) ** (t / 4), rounded
    for r in results:
        assert r["ks"] == want
        assert torch.equal(r["last_update"], results[0]["last_update"])  # same on every rank
        assert r["sent"][1] > r["sent"][4]  # a warm-up step sends more than a steady one
    entered = sum(r["entered"] for r in results)
    kept = world * results[0]["updates"] + sum(r["residual"] for r in results)
    assert torch.allclose(entered, kept, atol=1e-4)


@pytest.mark.parametrize("method", ["dense", *SPARSE])
def test_traffic_formula_matches_the_measured_bytes_at_every_warmup_step(method: str) -> None:
    """Rank by rank and step by step (4 warm-up steps, then 2 steady ones), the bytes sent and
    received equal the aggregator's ``traffic(..., step=t)``, the first step's too (the
    rank-agreement all-gather before it is a launch check, no step's traffic); the cost
    model's warm-up total is their sum."""
    world, d = 3, 2000
    results = _ranks("warmup", method)
    _, options, steps = RUNS[("warmup", method)]
    density = None if method == "dense" else 0.01
    cls, k, opts = build_options(method, d, density, **options)
    for t in range(steps):
        want = cls.traffic(d, k, opts, world, step=t)
        assert [r["sent"][t] for r in results] == list(want.sent), (method, t)
        assert [r["received"][t] for r in results] == list(want.received), (method, t)
    steady = cls.traffic(d, k, opts, world)
    assert [r["sent"][-1] for r in results] == list(steady.sent)
    spec = method_spec(method, d, density, **{n: v for n, v in options.items() if n != "guard"})
    assert traffic(spec, world) == steady
    warm, n = warmup_traffic(spec, world), spec.warmup_steps
    if method == "dense":  # no warm-up
        assert n == 0 and warm.sent == warm.received == (0,) * world
        return
    assert n == 4 and max(warm.sent) > n * max(steady.sent)
    for r, rank in enumerate(results):
        assert warm.sent[r] == sum(rank["sent"][:n]), (method, r)
        assert warm.received[r] == sum(rank["received"][:n]), (method, r)


@pytest.mark.parametrize("method", ["topk", "gs"])
def test_local_clipping_bounds_what_enters_and_loses_no_mass(method: str) -> None:
    world = 3
    results = _ranks("clip", method)
    assert len(results) == world
    entered = sum(r["entered"] for r in results)
    kept = world * results[0]["updates"] + sum(r["residual"] for r in results)
    assert torch.allclose(entered, kept, atol=1e-4)  # the clipped gradients, all delivered or kept
    # what each rank kept or sent is its clipped gradients: 4 steps of norm <= 5/sqrt(3)
    # (unclipped, each step's gradient has a norm near 3 * sqrt(2000) = 134)
    for r in results:
        assert float(r["entered"].norm()) <= 4 * 5.0 / math.sqrt(3) + 1e-6
