"""Selection by chunk (gs's ``chunk`` option) against the independent reference of
tests/aggregators/reference.py; its bad settings. The distributed runs of a chunked gs are
``gs_chunk`` in tests/aggregators/test_distributed.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gssgd.aggregators import build_options
from gssgd.ddp import HookState
from gssgd.selection import grouped_topk_indices, shares
from tests.aggregators.reference import ref_chunked_topk, ref_shares


def lengths(d: int, chunk: int) -> list[int]:
    return [min(chunk, d - s) for s in range(0, d, chunk)]


@pytest.mark.parametrize(("sizes", "total"), [
    (lengths(3000, 700), 30), (lengths(3000, 700), 90), (lengths(10, 3), 4),
    (lengths(10, 3), 10), (lengths(247_636, 4096), 248), (lengths(5, 7), 2),
    (lengths(4096, 4096), 0), ([7, 0, 3, 5], 6), ([1, 1, 1], 2),
])  # fmt: skip
def test_shares_are_the_largest_remainder_ones(sizes: list[int], total: int) -> None:
    got = shares(total, torch.tensor(sizes))
    assert got.tolist() == ref_shares(total, sizes)
    assert int(got.sum()) == total
    assert all(0 <= q <= n for q, n in zip(got.tolist(), sizes, strict=True))


@pytest.mark.parametrize("seed", range(20))
def test_a_share_never_exceeds_its_group(seed: int) -> None:
    """So a step delivers exactly k: a chunk is never owed more than the candidates it holds
    (sharing k by chunk lengths could: largest remainders are not monotone in the total)."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(0, 50, (int(torch.randint(1, 40, (1,), generator=gen)),),
                          generator=gen)
    sizes[0] += 1
    for total in range(int(sizes.sum()) + 1):
        got = shares(total, sizes)
        assert int(got.sum()) == total and bool((got <= sizes).all())


@pytest.mark.parametrize("seed", range(5))
def test_each_chunk_keeps_its_largest_as_the_reference_does(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    d, chunk = 997, 64
    # few distinct values, so ties are everywhere; and some non-finite ones
    values = torch.randint(0, 6, (d,), generator=gen).float()
    values[torch.randint(0, d, (3,), generator=gen)] = float("nan")
    values[5] = float("inf")
    coords = torch.arange(d)
    sizes = torch.tensor(lengths(d, chunk))
    for total in (16, 100, d):
        got = grouped_topk_indices(values, coords // chunk, shares(total, sizes))
        ranked = np.where(np.isfinite(values.numpy()), values.numpy(), np.inf)
        want = ref_chunked_topk(ranked, coords.numpy(), chunk, total, d)
        assert got.tolist() == want.tolist(), total


@pytest.mark.parametrize("seed", range(12))
def test_any_subset_in_any_order_keeps_each_chunks_largest(seed: int) -> None:
    """Candidate pools (a subset of the coordinates), sorted or shuffled, with ties,
    NaN and ±Inf: the positions the reference picks, for totals from none to all."""
    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 2000, (1,), generator=gen))
    chunk = int(torch.randint(1, 300, (1,), generator=gen))
    d = 2 * n
    values = (torch.randint(0, 5, (n,), generator=gen).float() if seed % 2
              else torch.randn(n, generator=gen))
    values[torch.randint(0, n, (3,), generator=gen)] = float("nan")
    values[0] = float("-inf") if seed % 3 else float("inf")
    coords = torch.randperm(d, generator=gen)[:n]
    if seed % 4 < 2:
        coords = coords.sort().values
    sizes = torch.bincount(coords // chunk, minlength=-(-d // chunk))
    ranked = np.where(np.isfinite(values.numpy()), values.numpy(), np.inf)
    for total in (0, 1, n // 3, n):
        got = grouped_topk_indices(values, coords // chunk, shares(total, sizes))
        want = ref_chunked_topk(ranked, coords.numpy(), chunk, total, d)
        assert got.tolist() == want.tolist(), total


def test_a_quota_above_its_groups_size_keeps_the_whole_group() -> None:
    values = torch.tensor([5.0, 1.0, 3.0, 3.0, 2.0])
    groups = torch.tensor([1, 0, 1, 1, 2])
    got = grouped_topk_indices(values, groups, torch.tensor([4, 2, 0]))
    assert got.tolist() == [0, 1, 2]  # group 0's one, group 1's 5 and the first 3


def test_a_subset_of_coordinates_shares_by_what_each_chunk_holds() -> None:
    """The exact round's values sit at sorted candidate coordinates: chunk 1 holds three of
    the seven candidates, so it delivers two of the four; chunk 3 holds none."""
    coords = torch.tensor([3, 4, 12, 13, 14, 25, 26])
    values = torch.tensor([1.0, 2.0, 0.5, 3.0, 3.0, 7.0, 1.0])
    d, chunk = 40, 10
    groups = coords // chunk
    quotas = shares(4, torch.bincount(groups, minlength=4))
    assert quotas.tolist() == [1, 2, 1, 0]
    got = grouped_topk_indices(values, groups, quotas)
    assert got.tolist() == [1, 3, 4, 5]  # 4; 13 and 14 (tied); 25
    assert got.tolist() == ref_chunked_topk(values.numpy(), coords.numpy(), chunk, 4, d).tolist()


@pytest.mark.parametrize(("options", "message"), [
    ({"chunk": -1}, "chunk=-1 is invalid: it must be an integer >= 0"),
    ({"chunk": 2.5}, "chunk=2.5 is invalid"),
    ({"chunk": 64, "exact": False}, "selecting by chunk needs the exact round"),
    ({"chunk": 64}, r"chunk=64 is invalid: it cuts d=1000 into 16 chunks, more than the k=10 "
                    r"coordinates .* Use chunk >= ceil\(d / k\) = 100"),
])  # fmt: skip
def test_bad_chunk_settings_are_refused_with_the_fix(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_options("gs", 1000, 0.01, **options)


def test_as_many_chunks_as_k_is_accepted() -> None:
    _, k, opts = build_options("gs", 1000, 0.01, chunk=100)
    assert (k, opts.chunk) == (10, 100)


def test_chunk_cannot_stream() -> None:
    with pytest.raises(ValueError, match="chunk=64 cannot be used with overlap='stream'"):
        HookState("gs", density=0.01, whole_model=True, overlap="stream", chunk=64)


def _audit_recall(rank: int, world_size: int) -> list:
    """gs by chunk on a gradient whose heaviest coordinates all sit in chunk 0: the
    recall of every guard audit (None on the steps it does not audit)."""
    import gssgd

    d, chunk = 3000, 500
    agg = gssgd.make_aggregator("gs", d, density=0.01, chunk=chunk, rows=1, cols=1500,
                                candidates=4)
    gen = torch.Generator().manual_seed(rank)
    recalls = []
    for _ in range(agg.guard.first_audit + 1):
        g = 0.01 * torch.randn(d, generator=gen)
        g[:100] += 10.0  # chunk 0 alone would take the whole top k
        agg.step(g)
        recalls.append(agg.last_stats.audited_recall)
    return recalls


def test_the_guard_audits_against_the_top_k_chosen_by_chunk() -> None:
    """Measured against the global top k (all of it in chunk 0), a chunked selection would
    look collapsed (about 1/6 of that mass); against the chunked top k it is whole."""
    from tests.dist_utils import raise_worker_errors, run_workers

    (recalls,) = run_workers(1, _audit_recall)
    raise_worker_errors([recalls])
    audited = [r for r in recalls if r is not None]
    assert audited and audited[-1] == pytest.approx(1.0)
