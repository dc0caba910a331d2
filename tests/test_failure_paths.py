"""Failure paths users reached in their own setups (docs/reliability.md, rows 33 and 34).

* A summed sketch table holding NaN or Inf (a float16 table overflowing on the wire:
  ``+inf + -inf`` is NaN) crashed ``heavy_hitters`` of a one-row cached sketch with
  ``range() arg 3 must not be zero``; it now ranks non-finite estimates first, the same way
  whatever the NaNs' bits.
* ``query()`` of no coordinates with cached hashes crashed the same way.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gssgd import CountSketch

# ----------------------------------------------------------------- non-finite sketch tables


def _reference_top(est: torch.Tensor, k: int) -> list[int]:
    """Rank all estimates: non-finite |estimate| first, then by |estimate|, ties to the lower
    index (what heavy_hitters documents)."""
    mag = est.abs().double().numpy()
    mag = np.where(np.isnan(mag), np.inf, mag)
    order = np.lexsort((np.arange(mag.size), -mag))  # last key first: -mag, then index
    return order[:k].tolist()


def _overflowed_sum(d: int, rows: int, cols: int, cache: bool) -> CountSketch:
    """Two ranks' sketches summed as gs-SGD does with table_dtype=float16: each table is
    divided by P = 2 and sent as float16 (where 1e9 overflows to +-inf), summed, times P."""
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(d, generator=gen), torch.randn(d, generator=gen)
    a[100], b[100] = 1e9, -1e9  # +inf + -inf: NaN in the summed table
    a[7000], b[7000] = 1e9, 1e9  # +-inf
    sketches = []
    for x in (a, b):
        sk = CountSketch(d, rows=rows, cols=cols, seed=11, cache_hashes=cache)
        sk.accumulate(x)
        sketches.append(sk)
    wire = [(sk.table / 2).to(torch.float16) for sk in sketches]
    summed = (wire[0] + wire[1]).to(torch.float32).mul_(2)
    return sketches[0].with_table(summed)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("cache", [True, False])
def test_overflowed_float16_table_ranks_non_finite_estimates_first(rows: int, cache: bool) -> None:
    d, cols, k = 20_000, 800, 40
    summed = _overflowed_sum(d, rows, cols, cache)
    assert torch.isnan(summed.table).any() and torch.isinf(summed.table).any()
    est = summed.query()
    for ordered in (True, False):
        idx, values = summed.heavy_hitters(k, ordered=ordered)
        want = _reference_top(est, k)
        got = idx.tolist() if ordered else sorted(idx.tolist())
        assert got == (want if ordered else sorted(want))
        assert torch.equal(values, est[idx]) or torch.equal(values.isnan(), est[idx].isnan())
    # the overflowed coordinates are among the chosen: their buckets rank first
    chosen = set(summed.heavy_hitters(k)[0].tolist())
    assert {100, 7000} <= chosen


@pytest.mark.parametrize("rows", [1, 3, 5])
def test_nan_bits_do_not_change_the_selection(rows: int) -> None:
    """Ranks holding the same table select the same set whatever their NaNs' bits (a
    +inf + -inf may give a negative NaN on one device, a positive one on another)."""
    d, cols = 8192, 256
    sk = CountSketch(d, rows=rows, cols=cols, seed=5, cache_hashes=True)
    sk.accumulate(torch.randn(d, generator=torch.Generator().manual_seed(1)))
    results = []
    for bits in (0x7FC00000, -0x400000, 0x7F800001, 0x7FFFFFFF):  # quiet, negative, payloads
        table = sk.table.clone()
        nan = torch.tensor([bits], dtype=torch.int32).view(torch.float32)
        assert torch.isnan(nan).all()
        table[:, 3] = nan  # one bucket per row
        table[0, 9] = torch.inf
        hh = sk.with_table(table).heavy_hitters(20)
        results.append(hh[0].tolist())
        assert results[-1] == _reference_top(sk.with_table(table).query(), 20)
    assert all(r == results[0] for r in results)


def test_one_row_cached_sketch_with_nan_at_the_threshold_no_longer_crashes() -> None:
    """The reported crash: one row, cached hashes, a NaN bucket where the k-th largest
    |value| lies (``range() arg 3 must not be zero`` before the fix)."""
    d = 10_000
    sk = CountSketch(d, rows=1, cols=400, cache_hashes=True)
    sk.accumulate(torch.randn(d, generator=torch.Generator().manual_seed(0)))
    sk.table[0, 5] = torch.nan
    idx, values = sk.heavy_hitters(10)
    assert idx.numel() == 10 and bool(values.isnan().all())  # bucket 5 holds > 10 coordinates
    assert idx.tolist() == _reference_top(sk.query(), 10)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("cache", [True, False])
def test_query_of_no_coordinates_is_empty(rows: int, cache: bool) -> None:
    sk = CountSketch(5000, rows=rows, cols=64, cache_hashes=cache, dtype=torch.float64)
    sk.accumulate(torch.randn(5000, dtype=torch.float64))
    out = sk.query(torch.empty(0, dtype=torch.long))
    assert out.shape == (0,) and out.dtype == torch.float64
    with pytest.raises(ValueError, match=r"k=0 is invalid: it must be an integer \[1, 5000\]"):
        sk.heavy_hitters(0)
