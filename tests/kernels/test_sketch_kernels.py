"""Sketch kernels against the torch path of :class:`gssgd.CountSketch` (``GSSGD_KERNELS=off``).

Sizes are small (the interpreter runs every program in numpy) but cover the edges: d below
cols (empty buckets), d not a multiple of the kernel's block, one and several rows (the 3-
and 5-row min/max networks and the counting median of 7), 16-bit inputs and tables.
"""

from __future__ import annotations

import pytest
import torch

from gssgd.sketch import CountSketch
from gssgd.sketch.count_sketch import signed_buckets
from tests.kernels.conftest import HAVE_TRITON

if HAVE_TRITON:
    from gssgd.kernels import sketch_ops

# (d, cols): d < cols (empty buckets), d not a multiple of the 1024 block, exactly two blocks.
SHAPES = [(50, 200), (3001, 97), (2048, 64)]
HALF = [torch.float16, torch.bfloat16]


def _reference(d: int, rows: int, cols: int, seed: int = 7, dtype=torch.float32) -> CountSketch:
    return CountSketch(d, rows=rows, cols=cols, seed=seed, dtype=dtype)


def _vector(d: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(d, generator=gen).to(dtype)


def _prefill(ref: CountSketch, seed: int = 9) -> torch.Tensor:
    """Put random non-zero values in ``ref``'s table and return a copy of them: a kernel
    must add onto what a table holds, so every accumulate test starts from such a table."""
    gen = torch.Generator().manual_seed(seed)
    ref.table.copy_(torch.randn(ref.rows, ref.cols, generator=gen).to(ref.table.dtype))
    assert ref.table.ne(0).all()
    return ref.table.clone()


#: accumulations per test: at least two, so that overwriting the table instead of adding to
#: it (or adding only the last vector) fails.
ACCUMULATIONS = (0, 1)


@pytest.mark.parametrize("rows", [1, 3, 5])
@pytest.mark.parametrize(("d", "cols"), SHAPES)
def test_accumulate_matches_torch_table(device: torch.device, rows: int, d: int, cols: int) -> None:
    ref = _reference(d, rows, cols)
    start = _prefill(ref)
    table = start.clone().to(device)  # .to alone is no copy on the CPU
    for seed in ACCUMULATIONS:  # the kernel adds onto what the table holds
        vec = _vector(d, seed)
        ref.accumulate(vec)
        sketch_ops.sketch_accumulate(table, vec.to(device), ref._params)
    torch.testing.assert_close(table.cpu(), ref.table, rtol=1e-5, atol=1e-5)
    if d < cols:  # empty buckets keep exactly what they held
        untouched = ref.table == start
        assert untouched.any()
        assert torch.equal(table.cpu() == start, untouched)


@pytest.mark.parametrize("vec_dtype", HALF)
def test_accumulate_16bit_vector_into_float32_table(device: torch.device, vec_dtype) -> None:
    ref = _reference(3001, 3, 97)
    table = _prefill(ref).to(device)
    for seed in ACCUMULATIONS:
        vec = _vector(3001, seed, dtype=vec_dtype)
        ref.accumulate(vec)
        sketch_ops.sketch_accumulate(table, vec.to(device), ref._params)
    torch.testing.assert_close(table.cpu(), ref.table, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [*HALF, torch.float64])
def test_accumulate_into_other_table_dtypes(device: torch.device, dtype) -> None:
    ref = _reference(3001, 3, 97, dtype=dtype)
    table = _prefill(ref).to(device)
    for seed in ACCUMULATIONS:
        vec = _vector(3001, seed)
        ref.accumulate(vec)
        sketch_ops.sketch_accumulate(table, vec.to(device), ref._params)
    assert table.dtype == dtype
    # 16-bit: the torch path rounds every partial sum, the kernel once at the end
    tol = 1e-12 if dtype == torch.float64 else 0.05 * float(ref.table.abs().max())
    torch.testing.assert_close(table.cpu(), ref.table, rtol=0, atol=tol)


def test_accumulate_into_strided_table(device: torch.device) -> None:
    ref = _reference(3001, 3, 97)
    start = _prefill(ref)
    wide = torch.full((3, 200), 7.0, device=device)
    wide[:, :97] = start.to(device)
    for seed in ACCUMULATIONS:
        vec = _vector(3001, seed)
        ref.accumulate(vec)
        sketch_ops.sketch_accumulate(wide[:, :97], vec.to(device), ref._params)
    torch.testing.assert_close(wide[:, :97].cpu(), ref.table, rtol=1e-5, atol=1e-5)
    assert wide[:, 97:].eq(7.0).all()  # the rest of the storage is left alone


def _filled(d: int, rows: int, cols: int, dtype=torch.float32) -> CountSketch:
    ref = _reference(d, rows, cols, dtype=dtype)
    ref.accumulate(_vector(d, seed=3).to(dtype))
    return ref


# 7 rows (the counting median, rows^2 gathers: slow in the interpreter) on one shape only
@pytest.mark.parametrize(
    ("rows", "d", "cols"), [(r, d, c) for r in (1, 3, 5) for d, c in SHAPES] + [(7, 2048, 64)]
)
def test_query_is_bitwise_the_torch_query(device: torch.device, rows: int, d: int, cols: int) -> None:
    ref = _filled(d, rows, cols)
    table = ref.table.to(device)
    assert torch.equal(sketch_ops.query(table, ref._params, d).cpu(), ref.query())
    idx = torch.tensor([d - 1, 0, d // 2, 0, 1 % d])
    got = sketch_ops.query(table, ref._params, d, idx.to(device))
    assert torch.equal(got.cpu(), ref.query(idx))
    assert sketch_ops.query(table, ref._params, d, idx[:0].to(device)).numel() == 0


@pytest.mark.parametrize("dtype", HALF)
def test_query_16bit_table(device: torch.device, dtype) -> None:
    ref = _filled(3001, 5, 97, dtype=dtype)
    got = sketch_ops.query(ref.table.to(device), ref._params, 3001)
    assert got.dtype == dtype
    assert torch.equal(got.cpu(), ref.query())


@pytest.mark.parametrize("rows", [3, 5, 7])
def test_query_propagates_nan_and_inf_like_torch(device: torch.device, rows: int) -> None:
    ref = _filled(3001, rows, 97)
    ref.table[0, :10] = float("nan")
    ref.table[rows - 1, 5:20] = float("inf")
    got = sketch_ops.query(ref.table.to(device), ref._params, 3001).cpu()
    torch.testing.assert_close(got, ref.query(), rtol=0, atol=0, equal_nan=True)


def _torch_candidates(ref: CountSketch, tau: torch.Tensor, majority: int) -> torch.Tensor:
    """The screening rule written out: |signed bucket value| >= tau in >= majority rows."""
    buckets = signed_buckets(torch.arange(ref.d), ref._params, ref.cols)
    doubled = torch.cat([ref.table, -ref.table], dim=1)
    votes = sum((doubled[r][buckets[r]].abs() >= tau).int() for r in range(ref.rows))
    return torch.nonzero(votes >= majority).flatten()


@pytest.mark.parametrize("rows", [1, 3, 5])
@pytest.mark.parametrize(("d", "cols"), SHAPES)
def test_candidates_are_the_screened_coordinates(
    device: torch.device, rows: int, d: int, cols: int
) -> None:
    ref = _filled(d, rows, cols)
    # tau exactly at a bucket's value: buckets that tie with it must count
    tau = ref.table.abs().flatten().sort().values[-(ref.table.numel() // 4) - 1]
    for majority in sorted({1, (rows + 1) // 2, rows}):
        got = sketch_ops.candidates(ref.table.to(device), ref._params, d, tau.to(device), majority)
        assert torch.equal(got.cpu(), _torch_candidates(ref, tau, majority))


def test_candidates_none_and_all(device: torch.device) -> None:
    ref = _filled(3001, 3, 97)
    table = ref.table.to(device)
    high = torch.tensor(float("inf"), device=device)
    assert sketch_ops.candidates(table, ref._params, 3001, high, 2).numel() == 0
    zero = torch.tensor(0.0, device=device)
    assert torch.equal(
        sketch_ops.candidates(table, ref._params, 3001, zero, 3).cpu(), torch.arange(3001)
    )


def test_candidates_reject_bad_majority(device: torch.device) -> None:
    ref = _filled(100, 3, 16)
    with pytest.raises(ValueError, match=r"majority=4 must be in \[1, rows=3\]"):
        sketch_ops.candidates(ref.table.to(device), ref._params, 100, torch.tensor(0.0).to(device), 4)


def test_kernels_reject_mismatched_rows(device: torch.device) -> None:
    ref = _filled(100, 3, 16)
    with pytest.raises(ValueError, match="table has 3 rows but params has 5"):
        sketch_ops.query(ref.table.to(device), _reference(100, 5, 16)._params, 100)


# ---------------------------------------------------------------- through CountSketch


@pytest.mark.parametrize("rows", [1, 3, 5])
@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize(("d", "cols", "k"), [(3000, 97, 5), (50, 200, 7)])
def test_count_sketch_heavy_hitters_same_with_kernels(
    monkeypatch: pytest.MonkeyPatch, device: torch.device, rows: int, cache: bool, d: int,
    cols: int, k: int,
) -> None:
    vec = _vector(d, seed=5)
    vec[torch.arange(0, d, max(1, d // k))] *= 30  # some heavy coordinates
    noise = 0.1 * _vector(d, seed=6)  # sketched first: the second accumulate adds onto it
    monkeypatch.setenv("GSSGD_KERNELS", "off")
    ref = CountSketch(d, rows=rows, cols=cols, seed=11, cache_hashes=cache)
    for part in (noise, vec):
        ref.accumulate(part)
    want_idx, want_est = ref.heavy_hitters(k)
    want_set = ref.heavy_hitters(k, ordered=False)[0]
    want_query = ref.query()  # the reference stays on the torch path: on a GPU machine, with
    # kernels on and no interpreter, a CPU tensor is refused (the dispatch rule)

    monkeypatch.setenv("GSSGD_KERNELS", "on")
    sk = CountSketch(d, rows=rows, cols=cols, seed=11, device=device, cache_hashes=cache)
    for part in (noise, vec):
        sk.accumulate(part.to(device))
    torch.testing.assert_close(sk.table.cpu(), ref.table, rtol=1e-5, atol=1e-5)
    sk = sk.with_table(ref.table.to(device))  # the same table: selections must agree exactly
    idx, est = sk.heavy_hitters(k)
    assert torch.equal(idx.cpu(), want_idx)
    assert torch.equal(est.cpu(), want_est)
    unordered = sk.heavy_hitters(k, ordered=False)[0]
    assert torch.equal(unordered.sort().values.cpu(), want_set.sort().values)
    assert torch.equal(sk.query().cpu(), want_query)


def test_count_sketch_ties_go_to_the_lower_index_with_kernels(
    monkeypatch: pytest.MonkeyPatch, device: torch.device
) -> None:
    d, k = 4096, 6
    vec = torch.zeros(d)
    vec[[4000, 17, 2500, 900, 33, 3000, 1200, 64]] = 5.0  # eight equal heavy values
    monkeypatch.setenv("GSSGD_KERNELS", "off")
    ref = CountSketch(d, rows=3, cols=2048, seed=2)
    ref.accumulate(vec)
    want = ref.heavy_hitters(k)[0]
    monkeypatch.setenv("GSSGD_KERNELS", "on")
    got = ref.to(device).heavy_hitters(k)[0]
    assert torch.equal(got.cpu(), want)
