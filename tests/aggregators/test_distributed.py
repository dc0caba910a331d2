"""Every aggregator on real gloo processes against the single-process reference."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
import torch

from gssgd.bench.cost_model import MethodSpec, traffic
from tests.aggregators.reference import reference_run
from tests.aggregators.scenarios import (
    CONFIGS,
    ROUNDED,
    SKETCH,
    STEPS,
    D,
    for_every_method,
    make_grad,
    run_all,
)
from tests.dist_utils import raise_worker_errors, run_workers

WORLD_SIZES = [1, 2, 3, 4, 8]
CONSERVING = ["topk", "gtopk", "sketched", "gs", "gs_backend", "gs_half"]


@cache
def results(world_size: int) -> list[dict]:
    out = run_workers(world_size, run_all)
    raise_worker_errors(out)
    return out


@cache
def reference(world_size: int, name: str):
    method, opts, d = CONFIGS[name]
    grads = [[make_grad(p, t, d) for p in range(world_size)] for t in range(STEPS)]
    k = max(1, round(opts.get("density", 0.01) * d))
    return reference_run(method, grads, k, opts)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_update_is_bitwise_identical_on_every_rank(world_size: int, name: str) -> None:
    ranks = results(world_size)
    for r in range(1, world_size):
        assert torch.equal(ranks[r][name]["updates"], ranks[0][name]["updates"]), f"rank {r}"


@pytest.mark.parametrize("name", [n for n in CONFIGS if n != "gs_half"])
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_update_matches_single_process_reference(world_size: int, name: str) -> None:
    got = results(world_size)[0][name]["updates"].double().numpy()
    want, _ = reference(world_size, name)
    tol = 2e-3 if name == "dense16" else 1e-5
    for t in range(STEPS):
        if name != "dense16":
            assert set(np.flatnonzero(got[t])) == set(np.flatnonzero(want[t])), f"step {t}"
        np.testing.assert_allclose(got[t], want[t], rtol=tol, atol=tol, err_msg=f"step {t}")


@pytest.mark.parametrize("name", [n for n in CONFIGS if n not in ROUNDED and n != "dense"])
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_residual_matches_reference(world_size: int, name: str) -> None:
    _, want = reference(world_size, name)
    for r, res in enumerate(results(world_size)):
        np.testing.assert_allclose(
            res[name]["residual"].double().numpy(),
            want[r],
            rtol=1e-4,
            atol=1e-4,
            err_msg=f"rank {r}",
        )


@pytest.mark.parametrize("name", CONSERVING)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_no_gradient_mass_is_lost(world_size: int, name: str) -> None:
    """sum_t,p g = P * sum_t update + sum_p e_p, over 50 steps."""
    ranks = results(world_size)
    grads = sum(r[name]["grad_sum"] for r in ranks)
    delivered = world_size * ranks[0][name]["updates"].double().sum(0)
    residuals = sum(r[name]["residual"].double() for r in ranks)
    assert grads.abs().max() > 1  # the invariant is not trivially zero
    torch.testing.assert_close(delivered + residuals, grads, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("world_size", [3, 4])
def test_half_tables_halve_the_sketch_bytes_and_pick_what_float32_picks(world_size: int) -> None:
    """16-bit tables round only the choice of candidates; on this data, not even that."""
    ranks = results(world_size)
    k = round(0.01 * D)
    for table_bytes, name in ((4, "gs"), (2, "gs_half")):
        spec = MethodSpec("gs", "gs", D, k, table_bytes=table_bytes, **SKETCH)
        sent = traffic(spec, world_size).sent
        assert [r[name]["stats"][-1]["bytes_sent"] for r in ranks] == list(sent), name
    half = ranks[0]["gs_half"]
    want, _ = reference(world_size, "gs")
    for t in range(5):  # before residuals could tell the runs apart
        got = half["updates"][t].double().numpy()
        assert set(np.flatnonzero(got)) == set(np.flatnonzero(want[t])), f"step {t}"
        np.testing.assert_allclose(got, want[t], rtol=1e-5, atol=1e-5, err_msg=f"step {t}")


def test_estimate_mode_loses_mass_by_design() -> None:
    ranks = results(4)
    grads = sum(r["gs_estimate"]["grad_sum"] for r in ranks)
    delivered = 4 * ranks[0]["gs_estimate"]["updates"].double().sum(0)
    residuals = sum(r["gs_estimate"]["residual"].double() for r in ranks)
    assert (delivered + residuals - grads).abs().max() > 1e-2


FLAG = 4  # the non-finite flag: one int32 all-gathered every step


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_gs_bytes_grow_with_log2_p(world_size: int) -> None:
    k = 30
    table = SKETCH["rows"] * SKETCH["cols"] * 4
    exact = SKETCH["candidates"] * k * 4
    rounds = int(math.log2(world_size))
    for res in results(world_size):
        stats = res["gs"]["stats"][-1]
        assert stats["bytes_sent"] == rounds * (table + exact) + FLAG
        assert stats["rounds"] == 2 * rounds + (world_size - 1)


@pytest.mark.parametrize("world_size", [3, 4])
def test_gs_bytes_do_not_grow_with_d(world_size: int) -> None:
    for res in results(world_size):
        small = res["gs_k_small_d"]["stats"][-1]
        large = res["gs_k_large_d"]["stats"][-1]
        assert small["d"] * 10 == large["d"]
        assert small["bytes_sent"] == large["bytes_sent"]
        assert small["bytes_received"] == large["bytes_received"]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_topk_receives_2k_from_each_other_rank(world_size: int) -> None:
    k = 30
    for res in results(world_size):
        stats = res["topk"]["stats"][-1]
        assert stats["bytes_received"] == (world_size - 1) * (2 * k * 4 + FLAG)
        assert stats["bytes_sent"] == (2 * k * 4 + FLAG if world_size > 1 else 0)


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_sketched_server_receives_p_minus_1_sketches(world_size: int) -> None:
    k, table = 30, SKETCH["rows"] * SKETCH["cols"] * 4
    exact = SKETCH["candidates"] * k * 4
    server = results(world_size)[0]["sketched"]["stats"][-1]
    assert server["bytes_received"] == (world_size - 1) * (table + exact + FLAG)
    worker = results(world_size)[1]["sketched"]["stats"][-1]
    assert worker["bytes_sent"] == table + exact + FLAG
    assert worker["bytes_received"] == exact + 2 * k * 4 + (world_size - 1) * FLAG


@pytest.mark.parametrize("world_size", [2, 4])
def test_dense_counts_the_ring_figure(world_size: int) -> None:
    stats = results(world_size)[0]["dense"]["stats"][-1]
    assert stats["bytes_sent"] == (2 * (world_size - 1) * D * 4) // world_size + FLAG
    stats16 = results(world_size)[0]["dense16"]["stats"][-1]
    assert stats16["bytes_sent"] == (2 * (world_size - 1) * D * 2) // world_size + FLAG


def test_gs_sends_under_a_tenth_of_dense_at_low_density() -> None:
    """At d = 30,000 and k = 30 (density 0.001) gs sends < 1/10 of dense's ring figure."""
    stats = results(4)[0]["gs_k_large_d"]["stats"][-1]
    dense_ring = (2 * 3 * stats["d"] * 4) // 4
    assert stats["bytes_sent"] < dense_ring / 10


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_that_disagree_all_raise(world_size: int) -> None:
    for per_method in run_workers(world_size, for_every_method, "mismatched_density"):
        for method, msg in per_method.items():
            assert "ranks disagree" in msg, (method, msg)
            assert ("dtype" if method == "dense" else "'k'") in msg or "k (" in msg


def test_nonfinite_gradient_skips_the_step_on_every_rank() -> None:
    ranks = run_workers(3, for_every_method, "nonfinite_step")
    raise_worker_errors(ranks)
    for per_method in ranks:
        for res in per_method.values():
            assert res["skipped"] == [False, True, True, False]
            for t in (1, 2):
                assert torch.count_nonzero(res["updates"][t]) == 0
                if res["residuals"][0] is not None:
                    assert torch.equal(res["residuals"][t], res["residuals"][0])
            assert torch.isfinite(res["updates"][3]).all()
            assert torch.count_nonzero(res["updates"][3]) > 0


def test_persistent_nonfinite_stops_every_rank_after_max_skips() -> None:
    for per_method in run_workers(2, for_every_method, "persistent_nonfinite", "skip"):
        for method, msg in per_method.items():
            assert msg.startswith("step 4: step 4: non-finite gradient"), (method, msg)
            assert "3 consecutive steps were skipped" in msg
            assert "rank(s) [0]" in msg


def test_nonfinite_raise_stops_every_rank_at_once() -> None:
    for per_method in run_workers(3, for_every_method, "persistent_nonfinite", "raise"):
        for method, msg in per_method.items():
            assert msg.startswith("step 2: step 2: non-finite gradient"), (method, msg)
            assert "nonfinite='raise'" in msg
