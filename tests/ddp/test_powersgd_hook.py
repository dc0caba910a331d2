"""gssgd's PowerSGD through the DDP hook (HookState("powersgd", ...)) on real gloo
processes, P = 2 and 3: per bucket and over the whole model against the reference
aggregator (bitwise, with the parameters' shapes the hook passes), its bytes against the
traffic formula of each vector's shapes, and against PyTorch's own ``powerSGD_hook`` on
the same model.

Against PyTorch: both run per DDP bucket on one bucket (a bucket cap above the model), so
they see the same tensors in the same order. PyTorch seeds its first Q from a NumPy
``RandomState(random_seed)``: its first ``randint(1_000_000_000)`` seeds ``torch``'s
generator, which draws each Q in turn; gssgd draws them in the same order from its own
generator seeded with ``seed``, so giving gssgd that number as ``seed`` starts both from the
same Q. From there the two must give bitwise the same gradients, iteration by iteration,
and keep bitwise the same residuals.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from gssgd.aggregators import build_options
from gssgd.ddp import HookState, comm_hook
from tests.ddp import scenarios as scen
from tests.dist_utils import raise_worker_errors, run_workers

WORLD_SIZES = [2, 3]
#: mode -> whole_model of the runs against the reference aggregators
RUNS = {"bucket": False, "whole": True}
OPTIONS = {"rank": 2}
#: matrix ranks compared with PyTorch's hook: Gram-Schmidt (1, 2) and QR (4)
TORCH_RANKS = (1, 2, 4)
#: PyTorch's first seed for its Q draws with random_seed=0 (see the module docstring)
TORCH_FIRST_SEED = int(np.random.RandomState(0).randint(1_000_000_000))


def against_torch(rank: int, world_size: int, r: int) -> dict:
    """ITERS iterations of the same model under PyTorch's hook and under gssgd's, one
    bucket each: both models' gradients and residuals."""
    ours, theirs = scen.make_model(), scen.make_model()
    ddp_ours = DDP(ours, bucket_cap_mb=100)
    ddp_theirs = DDP(theirs, bucket_cap_mb=100)
    state = HookState("powersgd", start_iter=scen.START, rank=r, seed=TORCH_FIRST_SEED)
    ddp_ours.register_comm_hook(state, comm_hook)
    torch_state = torch_hook.PowerSGDState(
        None, matrix_approximation_rank=r, start_powerSGD_iter=scen.START, random_seed=0)
    ddp_theirs.register_comm_hook(torch_state, torch_hook.powerSGD_hook)
    out: dict = {"ours": [], "theirs": []}
    for t in range(scen.ITERS):
        x = scen.batch(rank, t)
        for ddp in (ddp_ours, ddp_theirs):
            ddp.zero_grad()
            ddp(x).square().mean().backward()
        out["ours"].append(scen.flat_grads(ours))
        out["theirs"].append(scen.flat_grads(theirs))
        scen.sgd(ours)
        scen.sgd(theirs)
    out["residual_ours"] = state.state_dict()["buckets"][0]["residual"]
    out["residual_theirs"] = torch_state.error_dict[0].clone()
    out["buckets"] = len(state.state_dict()["layouts"])
    return {k: torch.stack(v) if isinstance(v, list) else v for k, v in out.items()}


def run_all(rank: int, world_size: int) -> dict:
    torch.manual_seed(1234)  # DDP's construction must not depend on the global RNG
    out: dict = {f"powersgd-{mode}": scen.train_against_reference(rank, "powersgd", whole,
                                                                  OPTIONS)
                 for mode, whole in RUNS.items()}
    for r in TORCH_RANKS:
        out[f"torch-{r}"] = against_torch(rank, world_size, r)
    return out


@cache
def results(world_size: int) -> list[dict]:
    out = run_workers(world_size, run_all)
    raise_worker_errors(out)
    return out


@cache
def shapes() -> list[tuple[int, ...]]:
    return [tuple(p.shape) for p in scen.make_model().parameters()]


@pytest.mark.parametrize("mode", list(RUNS))
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_the_hook_is_the_reference_aggregator_bitwise(world_size: int, mode: str) -> None:
    """Per bucket (several buckets: each its own aggregator with its parameters' shapes)
    and over the whole model (model order): bitwise the reference aggregators, the same
    on every rank; before start_iter the plain average."""
    ranks = [res[f"powersgd-{mode}"] for res in results(world_size)]
    for r, res in enumerate(ranks):
        torch.testing.assert_close(res["got"][: scen.START], res["want"][: scen.START],
                                   rtol=1e-6, atol=1e-7)
        for t in range(scen.START, scen.ITERS):
            assert torch.equal(res["got"][t], res["want"][t]), f"rank {r} iteration {t}"
            assert torch.equal(res["got"][t], ranks[0]["got"][t]), f"rank {r} iteration {t}"
    if mode == "bucket":
        assert len(ranks[0]["layouts"][-1]) >= 2, "the scenario should have several buckets"
    got = ranks[0]["got"][-1]
    assert torch.count_nonzero(got) > 0.9 * got.numel()  # a dense, low-rank update
    first = shapes()[0]  # Linear(16, 48)'s weight, compressed at rank 2
    assert torch.linalg.matrix_rank(got[: math.prod(first)].view(first)) <= 2


@pytest.mark.parametrize("mode", list(RUNS))
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_last_stats_are_the_traffic_formula_of_each_vectors_shapes(world_size: int,
                                                                  mode: str) -> None:
    """What the hook's last_stats count for a compressed iteration is the sum over its
    vectors (buckets, or the whole model) of PowerSGD's formula for their shapes, the first
    compressed iteration too (the aggregators' rank agreement is no iteration's traffic)."""
    res = results(world_size)[0][f"powersgd-{mode}"]
    every = shapes()
    for t in range(scen.START, scen.ITERS):
        vectors = [every] if mode == "whole" else [
            [every[i] for i in pos] for _, pos in sorted(res["layouts"][t].items())]
        want = 0
        for vec in vectors:
            d = sum(math.prod(s) for s in vec)
            cls, k, opts = build_options("powersgd", d, shapes=vec, **OPTIONS)
            want += cls.traffic(d, k, opts, world_size).sent[0]
        assert res["stats"][t]["bytes_sent"] == want, t


@pytest.mark.parametrize("r", TORCH_RANKS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_pytorchs_powersgd_hook_gives_bitwise_the_same_gradients(world_size: int, r: int
                                                                 ) -> None:
    for rank, res in enumerate(results(world_size)):
        run = res[f"torch-{r}"]
        assert run["buckets"] == 1
        for t in range(scen.ITERS):
            assert torch.equal(run["ours"][t], run["theirs"][t]), f"rank {rank} iteration {t}"
        assert torch.equal(run["residual_ours"], run["residual_theirs"]), f"rank {rank}"
        assert torch.count_nonzero(run["residual_ours"]) > 0  # error feedback is at work
        first = shapes()[0]  # and the gradients are compressed: rank r at most
        assert torch.linalg.matrix_rank(run["ours"][-1][: math.prod(first)].view(first)) <= r


def test_the_seed_that_matches_pytorch_is_pinned() -> None:
    """If NumPy's RandomState stream ever changed, the comparison above would fail for
    that reason alone; this says so plainly."""
    assert TORCH_FIRST_SEED == 209_652_396
