"""The DDP feature matrix: every method through the hook with the DDP features users turn on.

``no_sync()`` gradient accumulation, ``find_unused_parameters=True`` (alone and with
``gradient_as_bucket_view=True``), ``static_graph=True``, ``gradient_as_bucket_view=True``
and a model whose buckets change size at DDP's rebuild and follow neither the parameter
order nor its reverse; each with every registered method (gssgd's per bucket and over the
whole model, DDP's all-reduce and fp16 hook), on three real gloo processes (a world size
that is not a power of two), against the same math done in one process
(:mod:`tests.ddp.feature_matrix_scenarios`). One spawn runs the whole matrix.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch

import gssgd
from tests.ddp import feature_matrix_scenarios as scen
from tests.dist_utils import raise_worker_errors, run_workers

WORLD_SIZE = 3
RUNS = [(case, run) for case in scen.CASES for run in scen.runs()]
#: Methods whose update carries exact values (PowerSGD: whose residuals keep exactly what
#: its update does not carry), so no gradient mass is lost (docs/design.md).
CONSERVING = ("dense", "topk", "gtopk", "sketched", "gs", "powersgd")


@cache
def results() -> list[dict]:
    out = run_workers(WORLD_SIZE, scen.run_matrix)
    raise_worker_errors(out)
    return out


def _run(rank: int, case: str, run: str) -> dict:
    res = results()[rank][f"{case}/{run}"]
    assert res["error"] is None, f"{case}/{run} on rank {rank}: {res['error']}"
    return res


def _method(run: str) -> str:
    return run if run in scen.BUILTINS else run.rsplit("-", 1)[0]


def test_the_matrix_covers_every_registered_method() -> None:
    """A newly registered method joins the matrix; only PyTorch's PowerSGD hook is left out
    (see BUILTINS)."""
    covered = {_method(run) for run in scen.runs()}
    assert covered == set(gssgd.METHODS) - {"torch-powersgd"}


@pytest.mark.parametrize(("case", "run"), RUNS)
def test_ddp_writes_the_reference_update(case: str, run: str) -> None:
    """gssgd's methods: bitwise the reference aggregators once compressing, the plain
    average before; DDP's all-reduce: the average; its fp16 hook: the average to fp16."""
    for rank in range(WORLD_SIZE):
        res = _run(rank, case, run)
        got, want = res["got"], res["want"]
        if run == "ddp-fp16":
            torch.testing.assert_close(got, want, rtol=1e-2, atol=2e-3)
            continue
        torch.testing.assert_close(got[: scen.START], want[: scen.START], rtol=1e-6, atol=1e-7)
        if run in scen.BUILTINS:
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
            continue
        for t in range(scen.START, scen.ITERS):
            assert torch.equal(got[t], want[t]), f"rank {rank} iteration {t}"


@pytest.mark.parametrize(("case", "run"), RUNS)
def test_every_rank_gets_bitwise_the_same_gradients(case: str, run: str) -> None:
    first = _run(0, case, run)["got"]
    for rank in range(1, WORLD_SIZE):
        assert torch.equal(_run(rank, case, run)["got"], first), f"rank {rank}"


@pytest.mark.parametrize(
    ("case", "run"), [(c, r) for c, r in RUNS if _method(r) in CONSERVING]
)
def test_no_gradient_mass_is_lost(case: str, run: str) -> None:
    """Sum over iterations and ranks of the local gradients = P x the summed gradients DDP
    wrote + the ranks' residuals, coordinate by coordinate (with unused parameters too)."""
    ranks = [_run(rank, case, run) for rank in range(WORLD_SIZE)]
    local = sum(r["local"].sum(0) for r in ranks)
    kept = WORLD_SIZE * ranks[0]["got"].sum(0) + sum(r["residual"] for r in ranks)
    torch.testing.assert_close(kept, local, rtol=1e-5, atol=1e-5)


def test_no_sync_reduces_once_per_accumulated_step() -> None:
    """The hook sees one iteration per optimizer step, not one per micro-batch."""
    for run in scen.runs():
        if run not in scen.BUILTINS:
            assert _run(0, "no_sync", run)["iter"] == scen.ITERS, run


def _rare_slice() -> slice:
    """The coordinates of Branchy's ``rare`` head in model order."""
    model = scen.Branchy()
    start = 0
    for name, p in model.named_parameters():
        if name.startswith("rare."):
            break
        start += p.numel()
    size = sum(p.numel() for n, p in model.named_parameters() if n.startswith("rare."))
    return slice(start, start + size)


@pytest.mark.parametrize("case", ["unused", "unused_view"])
def test_a_parameter_no_rank_used_gets_its_delivered_residual(case: str) -> None:
    """At iteration 3 no rank uses ``rare`` (DDP leaves its .grad alone), but per bucket
    top-k must send k of its own bucket's coordinates: the residual left from iteration 2.
    The hook hands that update to .grad itself; without it the mass would be lost."""
    rare = _rare_slice()
    res = _run(0, case, "topk-bucket")
    assert scen.ITERS > 3
    assert torch.count_nonzero(res["local"][3][rare]) == 0  # unused on this rank
    assert torch.count_nonzero(res["got"][3][rare]) > 0  # and yet updated from the residual


def test_the_reordered_model_has_buckets_in_neither_order_and_changing_sizes() -> None:
    """The scenario is meaningful: DDP's rebuilt layout is neither the parameter order nor
    its reverse, and the buckets' sizes change at the rebuild."""
    numels = [p.numel() for p in scen.Shuffled().parameters()]
    layouts = _run(0, "reordered", "topk-bucket")["layouts"]
    before, after = layouts[0], layouts[-1]
    order = [p for i in sorted(after) for p in after[i]]
    assert order not in (sorted(order), sorted(order, reverse=True)), after

    def sizes(layout: dict[int, list[int]]) -> list[int]:
        return [sum(numels[p] for p in layout[i]) for i in sorted(layout)]

    assert sizes(before) != sizes(after), (before, after)


def test_static_graph_rebuilds_later_and_per_bucket_mode_says_so() -> None:
    """static_graph=True: DDP rebuilds after iteration 1. Per-bucket compression from
    iteration 1, or a per-bucket state resumed there, is a clear error on every rank that
    names the fix; whole-model mode bound to the model runs."""
    for rank in range(WORLD_SIZE):
        res = results()[rank]["static_graph_limits"]
        msg = res["start_iter_1"]
        assert msg.startswith("ValueError: bucket 0 changed from "), msg
        assert "static_graph=True DDP rebuilds after iteration 1, so start_iter >= 2" in msg
        msg = res["resume_per_bucket"]
        assert msg.startswith("ValueError: bucket 0 holds"), msg
        assert "per-bucket state cannot resume there" in msg and "whole_model=True" in msg
        assert res["whole_model_start_iter_1"] == "no error"
