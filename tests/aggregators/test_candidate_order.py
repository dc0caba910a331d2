"""The candidates of the exact round travel in a canonical order (sorted indices).

gs-SGD's exact round all-reduces each rank's values at the candidates and sends no indices:
the sums are only right if every rank lists the candidates in the same order. The sketch
promises the same *set* on every rank, not the same order (``heavy_hitters(...,
ordered=False)``; another device or kernel may list it otherwise). Here each rank's
``heavy_hitters`` hands the set back in its own shuffled order, as different hardware
might: the updates and residuals must still be bitwise those of the unshuffled run, on
every rank (P = 3). Sketched-SGD's server sorts them too, so its exact-value ties go to the
lower index whatever order the sketch listed them in.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import gssgd
from gssgd.sketch import CountSketch
from tests.dist_utils import raise_worker_errors, run_workers

D, K = 4000, 20
OPTIONS = {"rows": 3, "cols": 400, "candidates": 4}


def _grads(rank: int, step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(50 * step + rank)
    g = torch.randn(D, generator=gen)
    g[torch.randperm(D, generator=torch.Generator().manual_seed(step))[:60]] += 5.0
    return g


def _run(method: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    agg = gssgd.make_aggregator(method, D, k=K, **OPTIONS)
    updates = [agg.step(_grads(dist.get_rank(), step)) for step in range(4)]
    return updates, agg.residual.clone()


def shuffled_candidates(rank: int, world: int) -> dict:
    out = {}
    original = CountSketch.heavy_hitters
    for method in ("gs", "sketched"):
        plain = _run(method)

        def shuffled(self: CountSketch, k: int, ordered: bool = True):
            idx, est = original(self, k, ordered)
            perm = torch.randperm(idx.numel(), generator=torch.Generator().manual_seed(rank + 1))
            return idx[perm], est[perm]

        CountSketch.heavy_hitters = shuffled  # type: ignore[method-assign]
        try:
            mixed = _run(method)
        finally:
            CountSketch.heavy_hitters = original  # type: ignore[method-assign]
        out[method] = {"plain": plain, "mixed": mixed}
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    results = run_workers(3, shuffled_candidates)
    raise_worker_errors(results)
    return results


@pytest.mark.parametrize("method", ["gs", "sketched"])
def test_candidate_order_of_the_sketch_does_not_change_the_step(
    ranks: list[dict], method: str
) -> None:
    for r, res in enumerate(ranks):
        (plain_updates, plain_residual) = res[method]["plain"]
        (mixed_updates, mixed_residual) = res[method]["mixed"]
        for t, (a, b) in enumerate(zip(plain_updates, mixed_updates, strict=True)):
            assert torch.equal(a, b), (r, t)
            assert torch.equal(a, ranks[0][method]["mixed"][0][t]), (r, t)  # same on every rank
            assert torch.count_nonzero(a) == K
        assert torch.equal(plain_residual, mixed_residual), r
