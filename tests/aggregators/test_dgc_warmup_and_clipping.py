"""DGC's recipe tools in every sparse aggregator: density warm-up and local gradient clipping.

The schedule is checked value by value; on real gloo processes (P = 3, a non-power of two)
every sparse method sends the schedule's k at each step, every rank gets the same update,
no gradient mass is lost during the warm-up or under clipping (the mass invariant:
sum over ranks and steps of the gradient that entered = P * sum of updates + sum of
residuals), and every method's bytes sent and received, rank by rank and step by step,
equal its ``traffic`` formula for that step, warm-up steps included. A warm-up step whose
message would cost more than dense's all-reduce goes as that all-reduce: it never sends more
than dense (by the formulas, up to 1,024 workers), its update is the one the method's
message would carry or approximate (against a one-process reference), and a rank's
non-finite gradient on such a step leaves every rank's state as it was.
"""

from __future__ import annotations

import math
from functools import cache

import pytest
import torch

import gssgd
from gssgd.aggregators import build_options
from gssgd.aggregators.options import DensityWarmup
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
    ks, sent, received, first = [], [], [], None
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
        first = update.clone() if first is None else first
        ks.append(agg.last_stats.k)
        sent.append(agg.last_stats.bytes_sent)
        received.append(agg.last_stats.bytes_received)
    residual = agg.residual.double() if agg.residual is not None else None
    return {"entered": entered, "updates": updates, "residual": residual, "ks": ks,
            "sent": sent, "received": received, "last_update": update,
            "first_update": first}


def _warmup_options(method: str) -> dict:
    options = {"warmup_steps": 4, "warmup_density": 0.25, "rows": 3} if method in (
        "sketched", "gs") else {"warmup_steps": 4, "warmup_density": 0.25}
    if method == "gs":
        options["guard"] = "off"
    return options


def _dense_warmup_options(method: str) -> dict:
    """A warm-up from 90 % at P = 3: its first step's message would send more than dense's
    all-reduce, for every sparse method (checked by the test)."""
    return {**_warmup_options(method), "warmup_density": 0.9}


def _clip_options(method: str) -> dict:
    options = {"local_clip": 5.0}
    if method == "gs":
        options["guard"] = "off"
    return options


#: Every run of the gloo tests below, by (test, method): ``_run``'s arguments after P.
RUNS: dict[tuple[str, str], tuple[str, dict, int]] = {
    **{("warmup", m): (m, _warmup_options(m), 6) for m in SPARSE},
    **{("dense-warmup", m): (m, _dense_warmup_options(m), 6) for m in SPARSE},
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


@pytest.mark.parametrize(("run", "method"), [("warmup", "dense")] + [
    (run, m) for run in ("warmup", "dense-warmup") for m in SPARSE])
def test_traffic_formula_matches_the_measured_bytes_at_every_warmup_step(run: str, method: str
                                                                         ) -> None:
    """Rank by rank and step by step (4 warm-up steps, then 2 steady ones), the bytes sent and
    received equal the aggregator's ``traffic(..., step=t)``, the first step's too (the
    rank-agreement all-gather before it is a launch check, no step's traffic); the cost
    model's warm-up total is their sum."""
    world, d = 3, 2000
    results = _ranks(run, method)
    _, options, steps = RUNS[(run, method)]
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
    if run == "dense-warmup":  # step 0 went as dense's all-reduce, a later warm-up step not
        dense = cls.traffic(d, k, opts, world, step=0)
        assert cls.sends_dense_at(d, k, opts, world, 0)
        assert dense == build_options("dense", d, None)[0].traffic(d, d, build_options(
            "dense", d, None)[2], world)
        assert not cls.sends_dense_at(d, k, opts, world, 3)
        assert max(cls.message_traffic(d, k, opts, world, step=0).sent) > max(dense.sent)
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


def _reference_first_step(method: str, world: int, d: int, k: int) -> torch.Tensor:
    """One process's answer for step 0 of a warm-up sent dense (no residual yet, so a_p is
    the gradient): local Top-k averages the ranks' own top k; gTop-k takes the top k of
    that sum; the sketching methods the top k of the exact sum of the gradients."""
    grads = [torch.randn(d, generator=torch.Generator().manual_seed(100 + r)) * 3
             for r in range(world)]
    contributed = torch.zeros(d)
    for g in grads:
        own = torch.topk(g.abs(), k).indices
        contributed[own] += g[own]
    total = contributed if method in ("topk", "gtopk") else sum(grads)
    if method == "topk":
        return total / world
    chosen = torch.topk(total.abs(), k).indices
    update = torch.zeros(d)
    update[chosen] = total[chosen] / world
    return update


@pytest.mark.parametrize("method", SPARSE)
def test_a_warmup_step_sent_dense_updates_as_the_method_would_and_loses_no_mass(
        method: str) -> None:
    world, d = 3, 2000
    results = _ranks("dense-warmup", method)
    want = _reference_first_step(method, world, d, results[0]["ks"][0])
    for r in results:
        torch.testing.assert_close(r["first_update"], want, rtol=1e-5, atol=1e-6)
        assert torch.equal(r["last_update"], results[0]["last_update"])
    assert results[0]["ks"][0] == 1800  # 90 % of d, then down the exponential
    entered = sum(r["entered"] for r in results)
    kept = world * results[0]["updates"] + sum(r["residual"] for r in results)
    assert torch.allclose(entered, kept, atol=1e-4)


@pytest.mark.parametrize("method", SPARSE)
@pytest.mark.parametrize("world", [2, 3, 16, 64, 256, 1024])
def test_no_warmup_step_sends_more_than_a_dense_allreduce(method: str, world: int) -> None:
    """By the traffic formulas, for the character LSTM's d, 1M and a small d, from the
    default 25 %, 2 % and 100 %: every warm-up step's busiest rank sends at most what dense's
    all-reduce does, or the method's own steady step where that is more (the steps at 64
    workers that sent up to 16x dense before included)."""
    dense_cls, _, dense_opts = build_options("dense", 1, None)
    for d in (2000, 249_986, 1_000_000):
        dense = max(dense_cls.traffic(d, d, dense_opts, world).sent)
        for start in (0.02, 0.25, 1.0):
            options = {"warmup_steps": 100, "warmup_density": start}
            cls, k, opts = build_options(method, d, 0.001, **options)
            # a method whose own steady step costs more than dense (Sketched-SGD's server at
            # many workers and a small d) sends that at a warm-up step of the steady k
            bound = max(dense, max(cls.traffic(d, k, opts, world).sent))
            went_dense = 0
            for t in range(100):
                assert max(cls.traffic(d, k, opts, world, step=t).sent) <= bound, (d, start, t)
                went_dense += cls.sends_dense_at(d, k, opts, world, t)
            if method == "topk" and world == 64 and start == 0.25:
                # 64 ranks' k_t cost more than dense while k_t > d / 64: half of 25 % -> 0.1 %
                assert went_dense >= 45, (d, went_dense)


def _skip_in_a_dense_warmup(rank: int, world_size: int) -> dict:
    """Local Top-k with local momentum (its velocity changes in place as it compensates):
    step 0 and step 1 are warm-up steps sent dense; rank 1's step 1 gradient is NaN."""
    d = 2000
    agg = gssgd.make_aggregator("topk", d, density=0.01, momentum=0.9, warmup_steps=8,
                                warmup_density=0.9, nonfinite="skip")
    gen = torch.Generator().manual_seed(7 + rank)
    agg.step(torch.randn(d, generator=gen))
    before = agg.state_dict()
    bad = torch.randn(d, generator=gen)
    if rank == 1:
        bad[5] = float("nan")
    update = agg.step(bad)
    return {"rank": rank, "before": before, "after": agg.state_dict(), "update": update,
            "skipped": agg.last_stats.skipped, "sent": agg.last_stats.bytes_sent,
            "dense_at": [agg.sends_dense_at(d, agg.k, agg.options, world_size, t)
                         for t in (0, 1)]}


def test_a_nonfinite_rank_in_a_warmup_step_sent_dense_leaves_every_ranks_state() -> None:
    out = run_workers(3, _skip_in_a_dense_warmup)
    raise_worker_errors(out)
    dense_cls, _, dense_opts = build_options("dense", 2000, None)
    for r in out:
        assert r["dense_at"] == [True, True] and r["skipped"]
        assert not r["update"].any()
        assert r["sent"] == dense_cls.traffic(2000, 2000, dense_opts, 3).sent[r["rank"]]
        for key in ("residual", "momentum"):
            assert torch.equal(r["after"][key], r["before"][key]), key
        assert r["after"]["steps"] == r["before"]["steps"] + 1  # a skipped step counts
