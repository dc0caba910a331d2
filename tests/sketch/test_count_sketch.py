"""CountSketch: linearity, recovery, recall, hashing across processes, validation."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from gssgd import CountSketch
from gssgd.selection import topk_indices
from gssgd.sketch import HashCache, hash_cache_bytes, median_of_rows, sketch_hash_params
from tests.aggregators.reference import (
    RefSketch,
    bucket_and_sign,
    buckets_and_signs,
    hash_constants,
)

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        ],
    ),
]


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


@pytest.mark.slow  # sketches 20M elements: about 45 s on a loaded 2-core machine
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


def test_sketches_given_one_hash_cache_share_its_tables() -> None:
    cache = HashCache()
    a = CountSketch(5000, rows=1, cols=200, seed=3, cache_hashes=cache)
    b = CountSketch(5000, rows=1, cols=200, seed=3, cache_hashes=cache)
    c = CountSketch(5000, rows=1, cols=200, seed=4, cache_hashes=cache)
    assert a._cache is b._cache and a._cache is not c._cache and len(cache) == 2
    assert a.with_table(a.table.clone())._cache is a._cache
    own = CountSketch(5000, rows=1, cols=200, seed=3, cache_hashes=True)  # a cache of its own
    assert own._cache is not a._cache and torch.equal(own._cache, a._cache)
    assert cache.nbytes == 2 * (hash_cache_bytes(5000, 1) + 2 * 8 * 200)  # + bucket counts, starts
    cache.clear()
    assert len(cache) == 0 and a._cache is not None  # sketches keep what they hold
    x = torch.randn(5000)
    a.accumulate(x)
    b.accumulate(x)
    assert torch.equal(a.table, b.table)
    assert torch.equal(a.heavy_hitters(40)[0], CountSketch(5000, 1, 200, 3).with_table(
        a.table).heavy_hitters(40)[0])  # the uncached path agrees


# ------------------------------------------------------------------ the hash, pinned
# (bucket, sign) of rows 0, 1, 2 at cols = 1000 for a few seeds and coordinates (two of them
# past 2^31, where 64-bit wrap-around matters). Computed once by the independent
# reimplementation of the documented scheme in tests/aggregators/reference.py (plain Python
# integers) and cross-checked there against gssgd: a change to the hash, to its constants or
# to the SplitMix64 stream changes these numbers, and with them every sketch ever made
# (sketches of different versions would no longer add up).
PIN_ROWS, PIN_COLS = 3, 1000
PINNED: dict[tuple[int, int], list[tuple[int, int]]] = {
    (0, 0): [(165, -1), (538, -1), (295, -1)],
    (0, 1): [(527, -1), (824, -1), (583, -1)],
    (0, 2): [(890, -1), (110, 1), (870, 1)],
    (0, 1000): [(561, 1), (904, 1), (434, 1)],
    (0, 2**31 + 7): [(435, 1), (607, 1), (914, -1)],
    (0, 10**12 + 39): [(476, 1), (556, -1), (299, -1)],
    (1, 0): [(963, 1), (663, -1), (738, 1)],
    (1, 1): [(322, -1), (631, -1), (540, 1)],
    (1, 2): [(682, 1), (599, -1), (342, -1)],
    (1, 1000): [(246, 1), (446, -1), (714, 1)],
    (1, 2**31 + 7): [(636, 1), (907, -1), (567, -1)],
    (1, 10**12 + 39): [(357, -1), (402, -1), (910, 1)],
    (12345, 0): [(99, -1), (396, 1), (878, 1)],
    (12345, 1): [(40, -1), (235, -1), (464, -1)],
    (12345, 2): [(981, 1), (74, -1), (51, 1)],
    (12345, 1000): [(998, -1), (174, -1), (345, 1)],
    (12345, 2**31 + 7): [(512, -1), (328, -1), (317, -1)],
    (12345, 10**12 + 39): [(85, 1), (644, -1), (925, -1)],
}
PIN_SEEDS = sorted({seed for seed, _ in PINNED})
PIN_COORDS = sorted({i for _, i in PINNED})


def test_the_independent_hash_gives_the_pinned_buckets_and_signs() -> None:
    for (seed, i), want in PINNED.items():
        assert bucket_and_sign(i, seed, PIN_ROWS, PIN_COLS) == want, (seed, i)
        if i < 2000:  # the vectorised numpy version the reference sketch uses
            buckets, signs = buckets_and_signs(2000, seed, PIN_ROWS, PIN_COLS)
            assert [(int(buckets[r, i]), int(signs[r, i])) for r in range(PIN_ROWS)] == want


@pytest.mark.parametrize("seed", [0, 1, 7, 12345, 2**40 + 3])
def test_hash_constants_equal_sketch_hash_params(seed: int) -> None:
    """The reimplemented SplitMix64 stream gives gssgd's constants (as unsigned 64 bits);
    a and c are odd."""
    mine = hash_constants(seed, 5)
    assert [tuple(v % 2**64 for v in row) for row in sketch_hash_params(seed, 5)] == mine
    assert all(a % 2 == 1 and c % 2 == 1 for a, _, c, _ in mine)


@pytest.mark.parametrize("device", DEVICES)
def test_gssgd_hashes_the_pinned_coordinates_to_the_pinned_buckets_and_signs(device: str) -> None:
    """On this device, coordinates past 2^31 included (the sketch's length is 2^41; no
    vector of that length is ever made: only the hashes of the given coordinates)."""
    idx = torch.tensor(PIN_COORDS, device=device)
    for seed in PIN_SEEDS:
        sk = CountSketch(2**41, rows=PIN_ROWS, cols=PIN_COLS, seed=seed, device=device)
        signed = sk._signed_buckets(idx).cpu()  # h + cols * [s < 0], shape (rows, n)
        for j, i in enumerate(PIN_COORDS):
            got = [(int(v) % PIN_COLS, -1 if v >= PIN_COLS else 1) for v in signed[:, j]]
            assert got == PINNED[(seed, i)], (seed, i)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache", [False, True])
def test_sketching_a_one_hot_vector_puts_its_sign_in_the_pinned_bucket(
    device: str, cache: bool
) -> None:
    """The public way: the table of e_i holds s_r(i) at h_r(i) in every row, zero elsewhere."""
    d = 2000
    for (seed, i), want in PINNED.items():
        if i >= d:
            continue
        sk = CountSketch(d, rows=PIN_ROWS, cols=PIN_COLS, seed=seed, device=device,
                         cache_hashes=cache)  # fmt: skip
        x = torch.zeros(d, device=device)
        x[i] = 1.0
        sk.accumulate(x)
        table = sk.table.cpu()
        for r, (bucket, sign) in enumerate(want):
            assert torch.nonzero(table[r]).flatten().tolist() == [bucket], (seed, i, r)
            assert table[r, bucket] == sign, (seed, i, r)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("rows", "cols", "cache"), [(1, 750, True), (1, 301, False),
                                                     (5, 300, False), (5, 1200, True)])
def test_every_coordinate_hashes_as_the_independent_implementation_says(
    device: str, rows: int, cols: int, cache: bool
) -> None:
    """All d coordinates, through sketching and querying: gssgd's table and estimates equal
    the float64 reference sketch's (to float32 rounding)."""
    d, seed = 20_000, 11
    x = torch.randn(d, generator=torch.Generator().manual_seed(5))
    sk = CountSketch(d, rows=rows, cols=cols, seed=seed, device=device, cache_hashes=cache)
    sk.accumulate(x.to(device))
    ref = RefSketch(d, rows, cols, seed)
    ref.accumulate(x.double().numpy())
    np.testing.assert_allclose(sk.table.cpu().double().numpy(), ref.table, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(sk.query().cpu().double().numpy(), ref.query(), rtol=1e-5,
                               atol=1e-4)  # fmt: skip
    buckets, signs = buckets_and_signs(d, seed, rows, cols)
    signed = sk._signed_buckets(torch.arange(d, device=device)).cpu().numpy()
    assert np.array_equal(signed % cols, buckets)
    assert np.array_equal(np.where(signed >= cols, -1.0, 1.0), signs)
