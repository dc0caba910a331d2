"""Every aggregator on real gloo processes against the single-process reference."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
import torch

from gssgd.aggregators import build_options
from gssgd.comm import recursive_doubling
from gssgd.costmodel import MethodSpec, traffic
from tests.aggregators.reference import default_sketch, reference_run
from tests.aggregators.scenarios import (
    CONFIGS,
    DEFAULT_SHAPE,
    FAULTS,
    NONFINITE_METHODS,
    PREFIX_CONFIGS,
    PREFIX_SIZES,
    ROUNDED,
    SKETCH,
    STEPS,
    D,
    make_grad,
    run_all,
    run_all_and_faults,
    run_all_and_prefixes,
)
from tests.dist_utils import raise_worker_errors, run_workers

WORLD_SIZES = [1, 2, 3, 4, 8]
CONSERVING = ["topk", "gtopk", "sketched", "gs", "gs_backend", "gs_half", "gs_reuse", "gs_chunk",
              "sketched_default", "gs_default", "gs_default_sparse"]  # fmt: skip


def _marks(world_size: int) -> list:
    """P = 8 (and 5, 6, 7, its subgroups) needs the longest spawn of the suite: slow."""
    return [pytest.mark.slow] if world_size >= 5 else []


def sizes(*world_sizes: int) -> list:
    return [pytest.param(p, marks=_marks(p), id=str(p)) for p in world_sizes]


def cases(names) -> list:
    """(world_size, name) for every world size of WORLD_SIZES, plus the prefix-subgroup
    world sizes 5, 6, 7 for the names they run; ids ``P-name`` as before."""
    pairs = [(p, n) for p in WORLD_SIZES for n in names]
    pairs += [(p, n) for p in PREFIX_SIZES for n in names if n in PREFIX_CONFIGS]
    return [pytest.param(p, n, marks=_marks(p), id=f"{p}-{n}") for p, n in pairs]


@cache
def results(world_size: int) -> list[dict]:
    """Per rank, ``{config name: result}``. P = 5, 6, 7 are subgroups of the P = 8 run."""
    if world_size in PREFIX_SIZES:
        return [rank["prefix"][world_size] for rank in results(8)[:world_size]]
    if world_size == 8:
        fn = run_all_and_prefixes
    else:
        fn = run_all_and_faults if world_size in FAULTS else run_all
    out = run_workers(world_size, fn)
    raise_worker_errors(out)
    return out


def fault(world_size: int, *scenario: str) -> list[dict]:
    """Per rank, ``{method: result}`` of a fault scenario of FAULTS (run after the configs,
    in the spawn of ``results(world_size)``)."""
    return [rank["faults"][scenario] for rank in results(world_size)]


def k_of(name: str) -> int:
    _, opts, d = CONFIGS[name]
    return max(1, round(opts.get("density", 0.01) * d))


def reference_opts(name: str) -> dict:
    """The config's options; without a sketch shape, the documented default one, and
    the sketching methods' default pre-filter unless the config sets one."""
    method, opts, d = CONFIGS[name]
    if method not in ("sketched", "gs"):
        return opts
    defaults = default_sketch(d, k_of(name))
    if "rows" in opts:
        defaults = {key: v for key, v in defaults.items() if key == "prefilter"}
    return {**defaults, **opts}


@cache
def reference(world_size: int, name: str, dtype=np.float64):
    method, _, d = CONFIGS[name]
    grads = [[make_grad(p, t, d) for p in range(world_size)] for t in range(STEPS)]
    return reference_run(method, grads, k_of(name), reference_opts(name), dtype=dtype)


@pytest.mark.parametrize(("world_size", "name"), cases(CONFIGS))
def test_update_is_bitwise_identical_on_every_rank(world_size: int, name: str) -> None:
    ranks = results(world_size)
    for r in range(1, world_size):
        assert torch.equal(ranks[r][name]["updates"], ranks[0][name]["updates"]), f"rank {r}"


@pytest.mark.parametrize(("world_size", "name"), cases([n for n in CONFIGS if n != "gs_half"]))
def test_update_matches_single_process_reference(world_size: int, name: str) -> None:
    got = results(world_size)[0][name]["updates"].double().numpy()
    want, _ = reference(world_size, name)
    tol = 2e-3 if name == "dense16" else 1e-5
    assert len(got) == len(want) == STEPS
    for t in range(len(want)):
        if name != "dense16":
            assert set(np.flatnonzero(got[t])) == set(np.flatnonzero(want[t])), f"step {t}"
        np.testing.assert_allclose(got[t], want[t], rtol=tol, atol=tol, err_msg=f"step {t}")


@pytest.mark.parametrize(
    ("world_size", "name"), cases([n for n in CONFIGS if n not in ROUNDED and n != "dense"])
)
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


@pytest.mark.parametrize(("world_size", "name"), cases(CONSERVING))
def test_no_gradient_mass_is_lost(world_size: int, name: str) -> None:
    """sum_t,p g = P * sum_t update + sum_p e_p, over STEPS steps."""
    ranks = results(world_size)
    grads = sum(r[name]["grad_sum"] for r in ranks)
    delivered = world_size * ranks[0][name]["updates"].double().sum(0)
    residuals = sum(r[name]["residual"].double() for r in ranks)
    assert grads.abs().max() > 1  # the invariant is not trivially zero
    torch.testing.assert_close(delivered + residuals, grads, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(("world_size", "name"), cases([n for n in CONFIGS if "ef21" in n]))
def test_ef21_estimate_and_residuals_hold_all_the_momentum(world_size: int, name: str) -> None:
    """EF21: ``P * G_T + sum_p e_p = sum_p v_p``, ``v_p = rho*v_p + g_p`` over the run: what
    the shared estimate has not taken up is in the residuals, no more, no less."""
    _, opts, d = CONFIGS[name]
    rho = opts.get("momentum", 0.0)
    v = torch.zeros(d, dtype=torch.float64)
    for p in range(world_size):
        vp = torch.zeros(d, dtype=torch.float64)
        for t in range(STEPS):
            vp = rho * vp + make_grad(p, t, d).double()
        v += vp
    ranks = results(world_size)
    estimate = world_size * ranks[0][name]["updates"][-1].double()
    residuals = sum(r[name]["residual"].double() for r in ranks)
    assert v.abs().max() > 1  # the invariant is not trivially zero
    torch.testing.assert_close(estimate + residuals, v, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("world_size", [3, 4])
def test_half_tables_halve_the_sketch_bytes_and_pick_what_float32_picks(world_size: int) -> None:
    """16-bit tables round only the choice of candidates; on this data, not even that."""
    ranks = results(world_size)
    k = round(0.01 * D)
    for table_bytes, name in ((4, "gs"), (2, "gs_half")):
        spec = MethodSpec("gs", "gs", D, k, table_bytes=table_bytes,
                          **{n: SKETCH[n] for n in ("rows", "cols", "candidates")})
        sent = traffic(spec, world_size).sent
        assert [r[name]["stats"][-1]["bytes_sent"] for r in ranks] == list(sent), name
    half = ranks[0]["gs_half"]
    want, _ = reference(world_size, "gs")
    for t in range(5):  # before residuals could tell the runs apart
        got = half["updates"][t].double().numpy()
        assert set(np.flatnonzero(got)) == set(np.flatnonzero(want[t])), f"step {t}"
        np.testing.assert_allclose(got, want[t], rtol=1e-5, atol=1e-5, err_msg=f"step {t}")


@pytest.mark.parametrize(("world_size", "name"), cases(["gtopk", "gtopk_momentum"]))
def test_gtopk_is_bitwise_the_float32_reference(world_size: int, name: str) -> None:
    """gTop-k's sums are pairwise float32 additions in the recursive-doubling order, so a
    float32 replay of the algorithm gives the same bits: updates and every rank's residual.
    At P = 3, 5, 6, 7 one, one, two and three ranks fold in and must get the final list and
    their own surviving contributions back."""
    want, residuals = reference(world_size, name, np.float32)
    ranks = results(world_size)
    got = ranks[0][name]["updates"].numpy()
    assert len(got) == len(want) == STEPS
    for t in range(len(want)):
        assert np.array_equal(got[t], want[t]), f"step {t}"
    for r, res in enumerate(ranks):
        assert np.array_equal(res[name]["residual"].numpy(), residuals[r]), f"rank {r}"


@pytest.mark.parametrize(("world_size", "name"), cases(DEFAULT_SHAPE))
def test_default_configs_run_the_shipped_default_sketch(world_size: int, name: str) -> None:
    """One row, 40k columns (capped at d/4), m = 32 candidates (capped at d/(8k)), and the
    guard never grew it (so the reference's fixed shape is the one that ran)."""
    _, _, d = CONFIGS[name]
    k = k_of(name)
    want = default_sketch(d, k)
    for res in results(world_size):
        shape = res[name]["shape"]
        assert shape["rows"] == 1
        assert (shape["cols"], shape["candidates"]) == (want["cols"], want["candidates"])
        assert shape["num_candidates"] == min(want["candidates"] * k, d)


def test_default_sketch_shapes_cover_both_caps() -> None:
    """The default configs test the capped and the uncapped default alike."""
    capped, free = default_sketch(D, k_of("gs_default")), default_sketch(10 * D, 30)
    assert (capped["cols"], capped["candidates"]) == (D // 4, D // (8 * 30))
    assert (free["cols"], free["candidates"]) == (40 * 30, 32)
    assert k_of("gs_default_sparse") == 30


def test_estimate_mode_loses_mass_by_design() -> None:
    ranks = results(4)
    grads = sum(r["gs_estimate"]["grad_sum"] for r in ranks)
    delivered = 4 * ranks[0]["gs_estimate"]["updates"].double().sum(0)
    residuals = sum(r["gs_estimate"]["residual"].double() for r in ranks)
    assert (delivered + residuals - grads).abs().max() > 1e-2


@pytest.mark.parametrize("world_size", sizes(2, 4, 8))
def test_gs_bytes_grow_with_log2_p(world_size: int) -> None:
    k = 30
    table = SKETCH["rows"] * SKETCH["cols"] * 4
    exact = SKETCH["candidates"] * k * 4
    rounds = int(math.log2(world_size))
    for res in results(world_size):
        stats = res["gs"]["stats"][-1]
        # the P non-finite flags (float32 here) ride after the table: no flag exchange
        assert stats["bytes_sent"] == rounds * (table + 4 * world_size + exact)
        assert stats["rounds"] == 2 * rounds


@pytest.mark.parametrize("world_size", sizes(3, 4))
def test_gs_reuse_sends_the_table_every_third_step_only(world_size: int) -> None:
    """Step by step, the bytes equal ``traffic(step=t)`` (the first step adds the agreement
    check): a sketching step every third, the exact round alone between them."""
    cls, k, opts = build_options("gs", D, 0.01, **{n: v for n, v in CONFIGS["gs_reuse"][1].items()
                                                   if n != "density"})
    sent = [s["bytes_sent"] for s in results(world_size)[0]["gs_reuse"]["stats"]]
    # the flags ride with the exact round when it is the step's only message
    exact_only = recursive_doubling((SKETCH["candidates"] * k + world_size) * 4,
                                    world_size).sent[0]
    for t in range(1, STEPS):
        assert sent[t] == cls.traffic(D, k, opts, world_size, step=t).sent[0], t
        assert (sent[t] == exact_only) == (t % 3 != 0), t
    assert sent[3] > sent[4]


@pytest.mark.parametrize("world_size", [3, 4])
def test_gs_bytes_do_not_grow_with_d(world_size: int) -> None:
    for res in results(world_size):
        small = res["gs_k_small_d"]["stats"][-1]
        large = res["gs_k_large_d"]["stats"][-1]
        assert small["d"] * 10 == large["d"]
        assert small["bytes_sent"] == large["bytes_sent"]
        assert small["bytes_received"] == large["bytes_received"]


@pytest.mark.parametrize("world_size", sizes(*WORLD_SIZES))
def test_topk_sends_and_receives_2k_for_each_other_rank(world_size: int) -> None:
    k = 30
    for res in results(world_size):
        stats = res["topk"]["stats"][-1]
        assert stats["bytes_received"] == (world_size - 1) * (2 * k * 4 + 4)
        assert stats["bytes_sent"] == stats["bytes_received"]  # the ring forwards the others'


@pytest.mark.parametrize("world_size", sizes(2, 3, 4, 8))
def test_sketched_server_receives_p_minus_1_sketches(world_size: int) -> None:
    k, table = 30, SKETCH["rows"] * SKETCH["cols"] * 4
    exact = SKETCH["candidates"] * k * 4
    # each sketch ends with its rank's non-finite flag (a float32 here); the candidates come
    # back with every rank's as bits (one int32 up to 31 ranks)
    server = results(world_size)[0]["sketched"]["stats"][-1]
    assert server["bytes_received"] == (world_size - 1) * (table + 4 + exact)
    worker = results(world_size)[1]["sketched"]["stats"][-1]
    assert worker["bytes_sent"] == table + 4 + exact
    assert worker["bytes_received"] == exact + 4 + 2 * k * 4
    assert worker["rounds"] == server["rounds"] == 4  # four star phases, no flag exchange


@pytest.mark.parametrize("world_size", [2, 4])
def test_dense_counts_the_ring_figure(world_size: int) -> None:
    """The ring all-reduce of the gradient and, riding at its end, the P non-finite flags
    (no separate flag exchange: one collective a step)."""
    n = D + world_size  # gloo's segments move a rank's share by a few elements
    for name, size in (("dense", 4), ("dense16", 2)):
        stats = results(world_size)[0][name]["stats"][-1]
        assert abs(stats["bytes_sent"] - (2 * (world_size - 1) * n * size) // world_size) \
            <= 2 * world_size * size
        assert stats["rounds"] == 2 * (world_size - 1)


def test_gs_sends_under_a_tenth_of_dense_at_low_density() -> None:
    """At d = 30,000 and k = 30 (density 0.001) gs sends < 1/10 of dense's ring figure."""
    stats = results(4)[0]["gs_k_large_d"]["stats"][-1]
    dense_ring = (2 * 3 * stats["d"] * 4) // 4
    assert stats["bytes_sent"] < dense_ring / 10


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_that_disagree_all_raise(world_size: int) -> None:
    ranks = fault(world_size, "mismatched_density")
    raise_worker_errors(ranks)
    assert len(ranks) == world_size
    for per_method in ranks:
        for method, msg in per_method.items():
            assert "ranks disagree" in msg, (method, msg)
            assert ("dtype" if method == "dense" else "'k'") in msg or "k (" in msg


def test_nonfinite_gradient_skips_the_step_on_every_rank() -> None:
    """The flags ride in each method's first message; the skip leaves every rank's state,
    and so the next step, bitwise as a skip before any message would."""
    ranks = fault(3, "nonfinite_step")
    raise_worker_errors(ranks)
    for per_method in ranks:
        assert per_method.keys() == NONFINITE_METHODS.keys()
        for label, res in per_method.items():
            assert res["skipped"] == [False, True, True, False], label
            assert res["same_as_twin"] == [True] * 4, label
            for t in (1, 2):
                assert torch.count_nonzero(res["updates"][t]) == 0
            assert torch.isfinite(res["updates"][3]).all()
            assert torch.count_nonzero(res["updates"][3]) > 0


def test_persistent_nonfinite_stops_every_rank_after_max_skips() -> None:
    ranks = fault(2, "persistent_nonfinite", "skip")
    raise_worker_errors(ranks)
    for per_method in ranks:
        for method, msg in per_method.items():
            assert msg.startswith("step 4: step 4: non-finite gradient"), (method, msg)
            assert "3 consecutive steps were skipped" in msg
            assert "rank(s) [0]" in msg


def test_nonfinite_raise_stops_every_rank_at_once() -> None:
    ranks = fault(3, "persistent_nonfinite", "raise")
    raise_worker_errors(ranks)
    for per_method in ranks:
        for method, msg in per_method.items():
            assert msg.startswith("step 2: step 2: non-finite gradient"), (method, msg)
            assert "nonfinite='raise'" in msg
