"""Selection by chunk (gs's ``chunk`` option) against the independent reference of
tests/aggregators/reference.py; its bad settings. The distributed runs of a chunked gs are
``gs_chunk`` in tests/aggregators/test_distributed.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gssgd.aggregators import build_options
from gssgd.aggregators.chunked import chunk_quotas, grouped_topk_indices
from gssgd.ddp import HookState
from tests.aggregators.reference import ref_chunk_quotas, ref_chunked_topk


@pytest.mark.parametrize(("d", "chunk", "total"), [
    (3000, 700, 30), (3000, 700, 90), (10, 3, 4), (10, 3, 10), (247_636, 4096, 248),
    (5, 7, 2), (4096, 4096, 0), (1001, 10, 1),
])  # fmt: skip
def test_quotas_are_the_largest_remainder_shares(d: int, chunk: int, total: int) -> None:
    quotas = chunk_quotas(d, chunk, total)
    assert quotas.tolist() == ref_chunk_quotas(d, chunk, total)
    lengths = [min(chunk, d - s) for s in range(0, d, chunk)]
    assert int(quotas.sum()) == total
    assert all(0 <= q <= n for q, n in zip(quotas.tolist(), lengths, strict=True))


@pytest.mark.parametrize("seed", range(5))
def test_each_chunk_keeps_its_largest_as_the_reference_does(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    d, chunk = 997, 64
    # few distinct values, so ties are everywhere; and some non-finite ones
    values = torch.randint(0, 6, (d,), generator=gen).float()
    values[torch.randint(0, d, (3,), generator=gen)] = float("nan")
    values[5] = float("inf")
    coords = torch.arange(d)
    for total in (1, 15, 100, d):
        got = grouped_topk_indices(values, coords // chunk, chunk_quotas(d, chunk, total))
        ranked = np.where(np.isfinite(values.numpy()), values.numpy(), np.inf)
        want = ref_chunked_topk(ranked, coords.numpy(), chunk, total, d)
        assert got.tolist() == want.tolist(), total


def test_a_subset_of_coordinates_is_grouped_by_its_coordinates() -> None:
    """The exact round's values sit at sorted candidate coordinates, not at 0..n-1."""
    coords = torch.tensor([3, 4, 9, 12, 13, 14, 25])
    values = torch.tensor([1.0, 2.0, 5.0, 0.5, 3.0, 3.0, 7.0])
    d, chunk = 30, 10
    got = grouped_topk_indices(values, coords // chunk, chunk_quotas(d, chunk, 3))
    assert got.tolist() == [2, 4, 6]  # chunk 0: 9 (5.0); chunk 1: 13 before 14; chunk 2: 25
    assert got.tolist() == ref_chunked_topk(values.numpy(), coords.numpy(), chunk, 3, d).tolist()


@pytest.mark.parametrize(("options", "message"), [
    ({"chunk": -1}, "chunk=-1 is invalid: it must be an integer >= 0"),
    ({"chunk": 2.5}, "chunk=2.5 is invalid"),
    ({"chunk": 64, "exact": False}, "selecting by chunk needs the exact round"),
])  # fmt: skip
def test_bad_chunk_settings_are_refused_with_the_fix(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_options("gs", 1000, 0.01, **options)


def test_chunk_cannot_stream() -> None:
    with pytest.raises(ValueError, match="chunk=64 cannot be used with overlap='stream'"):
        HookState("gs", density=0.01, whole_model=True, overlap="stream", chunk=64)
