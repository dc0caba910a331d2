"""gTop-k's merge of two (index, value) lists: the d-long buffer path equals the sorting
path bit for bit, both ways round, and the survival mask equals ``torch.isin``."""

from __future__ import annotations

import pytest
import torch

from gssgd.aggregators.gtopk import DENSE_MERGE_FRACTION, merge_topk, present_in

D = 5_000


def _list(k: int, seed: int, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(D, generator=g)[:k].to(dtype)
    vals = torch.randn(k, generator=g)
    vals[: k // 4] = 0.5  # ties in |value|: the selection's lower-index rule decides
    return [idx, vals]


@pytest.mark.parametrize("k", [10, 300, 2_000, D])  # below and above the dense path's bar
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_the_dense_merge_is_the_sorting_merge_bitwise(k: int, dtype: torch.dtype) -> None:
    a, b = _list(k, 1, dtype), _list(k, 2, dtype)
    want = merge_topk(a, b, k)
    assert (2 * k >= DENSE_MERGE_FRACTION * D) == (k >= 300)
    for got in (merge_topk(a, b, k, D), merge_topk(b, a, k, D), merge_topk(b, a, k)):
        assert torch.equal(got[0], want[0]) and got[0].dtype == dtype
        assert torch.equal(got[1], want[1])
    union = torch.unique(torch.cat([a[0], b[0]]))
    assert want[0].numel() == min(k, union.numel())


def test_present_in_is_isin() -> None:
    a, b = _list(700, 3, torch.int32), _list(900, 4, torch.int32)
    mask = present_in(b[0], D)
    assert torch.equal(mask[a[0].to(torch.int64)], torch.isin(a[0], b[0]))
    both = present_in(a[0], D, b[0])
    assert int(both.sum()) == torch.unique(torch.cat([a[0], b[0]])).numel()
