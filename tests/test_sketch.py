"""CountSketch: linearity, recovery, recall, hashing across processes, validation."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from gssgd import CountSketch
from gssgd._select import topk_indices
from gssgd.sketch import median_of_rows


def _planted(d: int, k: int, signal: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(d, generator=gen)
    heavy = torch.randperm(d, generator=gen)[:k]
    signs = torch.randint(0, 2, (k,), generator=gen) * 2 - 1
    x[heavy] += signal * signs
    return x, heavy


@pytest.mark.parametrize("cache", [False, True])
def test_sketch_is_linear(cache: bool) -> None:
    d = 5000
    x, y = torch.randn(d), torch.randn(d)
    sx, sy, sxy = (CountSketch(d, rows=5, cols=200, seed=3, cache_hashes=cache) for _ in range(3))
    sx.accumulate(x)
    sy.accumulate(y)
    sxy.accumulate(x + y)
    torch.testing.assert_close((sx + sy).table, sxy.table, rtol=1e-5, atol=1e-4)
    sx += sy
    torch.testing.assert_close(sx.table, sxy.table, rtol=1e-5, atol=1e-4)


def test_cached_and_streamed_hashes_agree() -> None:
    d = 3000
    x = torch.randn(d)
    a = CountSketch(d, rows=3, cols=100, seed=9)
    b = CountSketch(d, rows=3, cols=100, seed=9, cache_hashes=True)
    a.accumulate(x)
    b.accumulate(x)
    assert torch.equal(a.table, b.table)
    idx = torch.tensor([0, 17, 2999])
    assert torch.equal(a.query(idx), b.query(idx))


def test_sparse_vector_is_recovered_exactly_when_cols_far_exceed_k() -> None:
    # A light coordinate is mis-estimated only if it meets heavy ones in 3 of 5 rows:
    # about 10 * (k / cols)^3 * d = 0.003 expected such coordinates here.
    d, k = 20_000, 10
    x = torch.zeros(d)
    heavy = torch.randperm(d, generator=torch.Generator().manual_seed(1))[:k]
    x[heavy] = torch.linspace(1, 10, k)
    sk = CountSketch(d, rows=5, cols=400 * k, seed=0)
    sk.accumulate(x)
    idx, est = sk.heavy_hitters(k)
    assert set(idx.tolist()) == set(heavy.tolist())
    torch.testing.assert_close(est, x[idx])


@pytest.mark.parametrize(
    ("snr", "recall_at_k", "recall_at_4k"), [(8.0, 0.35, 0.95), (2.0, 0.15, 0.4)]
)
def test_heavy_hitter_recall_on_planted_signals(
    snr: float, recall_at_k: float, recall_at_4k: float
) -> None:
    """rows 5, cols 10k; k planted coordinates in N(0, 1) noise.

    SNR is the planted size over the sketch's noise scale ``||noise|| / sqrt(cols)``. With
    k heavy coordinates in 10k buckets, about 10% of each row's buckets hold one, so many
    light coordinates meet heavy ones in 3 of 5 rows and borrow their size: the top k by
    estimate misses about half of the planted set even at high SNR, while the top 4k
    (gs-SGD's m*k candidates, then checked exactly) holds nearly all of it.
    """
    d, k = 200_000, 100
    x, heavy = _planted(d, k, snr * math.sqrt(d / (10 * k)))
    sk = CountSketch(d, rows=5, cols=10 * k, seed=0)
    sk.accumulate(x)
    planted = set(heavy.tolist())
    assert len(set(sk.heavy_hitters(k)[0].tolist()) & planted) / k >= recall_at_k
    assert len(set(sk.heavy_hitters(4 * k)[0].tolist()) & planted) / k >= recall_at_4k


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("k", [1, 50, 400, 3000])
def test_fast_heavy_hitters_equal_ranking_all_estimates(rows: int, cache: bool, k: int) -> None:
    d = 60_000
    x, _ = _planted(d, 50, 8.0, seed=k)
    sk = CountSketch(d, rows=rows, cols=1000, seed=4, cache_hashes=cache)
    sk.accumulate(x)
    est = sk.query()
    want = topk_indices(est.abs(), k)
    idx, vals = sk.heavy_hitters(k)
    assert torch.equal(idx, want)
    assert torch.equal(vals, est[want])
    idx, vals = sk.heavy_hitters(k, ordered=False)  # the same set, in any order
    assert torch.equal(torch.sort(idx).values, torch.sort(want).values)
    assert torch.equal(vals, est[idx])


def test_heavy_hitter_ties_go_to_the_lower_index() -> None:
    d = 64
    x = torch.zeros(d)
    x[[40, 10, 30]] = 1.0
    sk = CountSketch(d, rows=1, cols=4096, seed=0)
    sk.accumulate(x)
    assert sk.heavy_hitters(2)[0].tolist() == [10, 30]
    assert topk_indices(torch.tensor([1.0, 2.0, 2.0, 2.0, 0.5]), 2).tolist() == [1, 2]


def test_l2_estimate_is_close() -> None:
    x = torch.randn(50_000)
    sk = CountSketch(x.numel(), rows=5, cols=2000, seed=1)
    sk.accumulate(x)
    assert abs(sk.l2_estimate() / float(x.norm()) - 1) < 0.1


def test_query_given_indices_matches_query_all() -> None:
    x = torch.randn(10_000)
    sk = CountSketch(x.numel(), rows=3, cols=500, seed=2)
    sk.accumulate(x)
    idx = torch.tensor([5, 9999, 123])
    assert torch.equal(sk.query(idx), sk.query()[idx])


def test_median_networks_equal_torch_median() -> None:
    for rows in (1, 3, 5, 7):
        values = list(torch.randn(rows, 1000))
        assert torch.equal(median_of_rows(values), torch.stack(values).median(0).values)


_HASH_SCRIPT = """
import torch, gssgd
sk = gssgd.CountSketch(1000, rows=5, cols=64, seed={seed})
sk.accumulate(torch.arange(1000, dtype=torch.float32))
print(sk.table.sum(dim=1).tolist(), sk.table[2, :8].tolist())
"""


def test_same_seed_gives_the_same_hashes_in_another_process() -> None:
    def run(seed: int) -> str:
        code = _HASH_SCRIPT.format(seed=seed)
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout

    here = CountSketch(1000, rows=5, cols=64, seed=7)
    here.accumulate(torch.arange(1000, dtype=torch.float32))
    expected = f"{here.table.sum(dim=1).tolist()} {here.table[2, :8].tolist()}\n"
    assert run(7) == expected
    assert run(8) != expected


def test_hash_memory_does_not_grow_with_d() -> None:
    """Sketching 20M elements needs a bounded work space beyond the vector (in a subprocess)."""
    code = (
        "import resource, torch, gssgd\n"
        "x = torch.randn(20_000_000)\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "sk = gssgd.CountSketch(x.numel(), rows=5, cols=20000, seed=0)\n"
        "sk.accumulate(x); sk.heavy_hitters(100)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    extra_mb = int(out.stdout.strip())
    # rows * d * 8 bytes would be 800 MB; the chunked hashes need a few hundred at most.
    assert extra_mb < 400, extra_mb


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rows": 4}, "rows=4 is even"),
        ({"rows": 0}, "rows=0 is invalid"),
        ({"cols": 0}, "cols=0 is invalid"),
        ({"seed": -1}, "seed=-1 is invalid"),
        ({"dtype": torch.int32}, "not a floating-point dtype"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CountSketch(100, **kwargs)


def test_merging_different_sketches_raises() -> None:
    a, b = CountSketch(100, seed=1), CountSketch(100, seed=2)
    with pytest.raises(ValueError, match="cannot merge sketches"):
        a + b
    with pytest.raises(ValueError, match="expected a 1-D vector of length d=100"):
        a.accumulate(torch.zeros(99))
    with pytest.raises(ValueError, match="k=101 is invalid"):
        a.heavy_hitters(101)


def test_sketches_of_one_shape_share_one_hash_cache() -> None:
    a = CountSketch(5000, rows=1, cols=200, seed=3, cache_hashes=True)
    b = CountSketch(5000, rows=1, cols=200, seed=3, cache_hashes=True)
    c = CountSketch(5000, rows=1, cols=200, seed=4, cache_hashes=True)
    assert a._cache is b._cache and a._cache is not c._cache
    assert a.with_table(a.table.clone())._cache is a._cache
    x = torch.randn(5000)
    a.accumulate(x)
    b.accumulate(x)
    assert torch.equal(a.table, b.table)
    assert torch.equal(a.heavy_hitters(40)[0], CountSketch(5000, 1, 200, 3).with_table(
        a.table).heavy_hitters(40)[0])  # the uncached path agrees
