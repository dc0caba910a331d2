"""Top-k selection: the sampled threshold and the int64 ordering give exactly the old result."""

from __future__ import annotations

import math

import pytest
import torch

from gssgd import selection
from gssgd.selection import (
    exact_topk_indices,
    sampled_topk_indices,
    topk_indices,
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small tensors on a shared machine: threads only contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _reference(values: torch.Tensor, k: int, ordered: bool = True) -> torch.Tensor:
    """The selection as it was before sampling and the int64 ordering (verbatim)."""
    top_vals, top_idx = torch.topk(values, k, sorted=False)
    threshold = top_vals.min()
    picked_ties = int((top_vals == threshold).sum())
    all_ties = int((values == threshold).sum())
    if all_ties != picked_ties:
        above = torch.nonzero(values > threshold).flatten()
        ties = torch.nonzero(values == threshold).flatten()[: k - above.numel()]
        top_idx = torch.cat([above, ties])
    if not ordered:
        return top_idx
    top_idx = top_idx.sort().values
    order = torch.sort(values[top_idx], descending=True, stable=True).indices
    return top_idx[order]


def _data(kind: str, n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Adversarial inputs, NaN-free; most are ``|x|``-like, "signed" is not."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen, dtype=torch.float64)
    if kind == "normal":
        x = x.abs()
    elif kind == "signed":  # negative values: the largest, not the largest |x|
        pass
    elif kind == "ties":  # few levels: long runs of equal values at any threshold
        x = torch.randint(0, 6, (n,), generator=gen).double()
    elif kind == "ties_at_top":  # a block of equal values straddling the k-th largest
        x = x.abs()
        x[torch.randperm(n, generator=gen)[: n // 3]] = 1.5
    elif kind == "all_equal":
        x = torch.full((n,), 0.75, dtype=torch.float64)
    elif kind == "zeros":
        x = torch.zeros(n, dtype=torch.float64)
    elif kind == "signed_zeros":  # -0.0 == 0.0: a tie broken by index, not by sign
        x = torch.zeros(n, dtype=torch.float64)
        x[torch.rand(n, generator=gen, dtype=torch.float64) < 0.5] = -0.0
        x[torch.randperm(n, generator=gen)[: n // 50]] = 1.0
    elif kind == "sparse":  # fewer nonzeros than most k: the rest tie at zero
        x = x.abs() * (torch.rand(n, generator=gen, dtype=torch.float64) < 0.02)
    elif kind == "cauchy":  # heavy tails (overflow to inf in 16-bit, never NaN)
        u = torch.rand(n, generator=gen, dtype=torch.float64)
        x = torch.tan(math.pi * (u - 0.5)).abs()
    elif kind == "huge":  # a few enormous values over a normal bulk
        x = x.abs()
        x[torch.randperm(n, generator=gen)[:5]] = 1e30
    elif kind == "inf":
        x[torch.randperm(n, generator=gen)[:7]] = math.inf
        x[torch.randperm(n, generator=gen)[:7]] = -math.inf
    else:
        raise AssertionError(kind)
    out = x.to(dtype)
    assert not out.isnan().any()
    return out


KINDS = [
    "normal",
    "signed",
    "ties",
    "ties_at_top",
    "all_equal",
    "zeros",
    "signed_zeros",
    "sparse",
    "cauchy",
    "huge",
    "inf",
]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _ks(n: int) -> list[int]:
    ks = {1, 2, 3, int(math.sqrt(n)), n // 100, n // 20, n // 3, n // 2, n // 2 + 1, n - 1, n}
    return sorted(k for k in ks if 1 <= k <= n)


def _check(values: torch.Tensor, k: int) -> str:
    ref = _reference(values, k)
    exact = exact_topk_indices(values, k)
    sampled, path = sampled_topk_indices(values, k)
    assert exact.dtype == sampled.dtype == torch.int64
    assert torch.equal(exact, ref), ("exact", k)
    assert torch.equal(sampled, ref), ("sampled", k, path)
    assert torch.equal(topk_indices(values, k), ref)
    # Unordered: the same set (sampled in its own order; exact and auto in the old order).
    ref_set = _reference(values, k, ordered=False)
    assert torch.equal(exact_topk_indices(values, k, ordered=False), ref_set)
    assert torch.equal(topk_indices(values, k, ordered=False), ref_set)
    unordered, _ = sampled_topk_indices(values, k, ordered=False)
    assert torch.equal(unordered.sort().values, ref.sort().values)
    # torch.topk agrees on the values (it may pick other equal ones).
    top = torch.topk(values, k).values
    assert torch.equal(values[ref], top)
    return path


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [77, 1000, 10_007])
def test_matches_reference(kind: str, dtype: torch.dtype, n: int) -> None:
    paths = {k: _check(_data(kind, n, dtype), k) for k in _ks(n)}
    assert all(p in ("sampled", "small", "few", "many") for p in paths.values())
    if kind in ("all_equal", "zeros"):  # everything survives any threshold
        assert all(p in ("many", "small") for p in paths.values())
    if kind == "normal" and n >= 1000:  # the sampled path, not a fallback, did the work
        assert all(paths[k] == "sampled" for k in _ks(n) if 10 <= k <= n // 20), paths


@pytest.mark.parametrize("seed", range(8))
def test_random_sizes_and_ks(seed: int) -> None:
    gen = torch.Generator().manual_seed(100 + seed)
    n = int(torch.randint(2, 30_000, (1,), generator=gen))
    kind = KINDS[seed % len(KINDS)]
    values = _data(kind, n, DTYPES[seed % len(DTYPES)], seed)
    for k in torch.randint(1, n + 1, (4,), generator=gen).tolist():
        _check(values, k)


def test_misleading_sample_falls_back() -> None:
    """A sample that sees only the largest values sets the threshold too high: fewer than
    k survive, and the exact path answers. One that sees only zeros keeps everything."""
    n, k = 20_000, 400
    stride, rank = selection._sample_plan(n, k)
    assert stride >= 2 and rank < k
    positions = selection._sample_positions(n, stride, torch.device("cpu"))
    values = torch.rand(n, generator=torch.Generator().manual_seed(1))
    values[positions] = 10 + torch.arange(positions.numel(), dtype=values.dtype)
    idx, path = sampled_topk_indices(values, k)
    assert path == "few"
    assert torch.equal(idx, _reference(values, k))

    values = torch.rand(n, generator=torch.Generator().manual_seed(2)) + 1
    values[positions] = 0
    idx, path = sampled_topk_indices(values, k)
    assert path == "many"
    assert torch.equal(idx, _reference(values, k))


def test_sample_plan_bounds() -> None:
    for n in [2, 33, 1000, 10_007, 10**6, 10**8]:
        for k in {1, 7, max(1, n // 1000), max(1, n // 100), max(1, n // 3), n}:
            stride, rank = selection._sample_plan(n, k)
            size = n // stride
            assert 1 <= rank <= size <= n
            assert stride >= 1
            if n >= 64:
                assert size <= max(1, n // 32)
            # The threshold sits above the sample's expected share of the top k.
            assert rank >= min(size, k * size / n)


def test_auto_choice_and_global_rng_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    n = selection.SAMPLED_MIN_N
    values = _data("normal", n, torch.float32)
    calls: list[str] = []
    real = selection.sampled_topk_indices

    def counting(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(result[1])
        return result

    monkeypatch.setattr(selection, "sampled_topk_indices", counting)
    state = torch.get_rng_state()
    k = n // 100
    assert torch.equal(topk_indices(values, k), _reference(values, k))
    assert calls == ["sampled"]
    topk_indices(values, k, ordered=False)  # unordered: auto keeps the old order (exact)
    topk_indices(values[:-1], k)  # below the crossover
    topk_indices(values, int(selection.SAMPLED_MAX_DENSITY * n) + 1)  # too dense
    assert calls == ["sampled"]
    topk_indices(values, k, method="sampled")
    topk_indices(values, k, method="exact")
    assert calls == ["sampled", "sampled"]
    assert torch.equal(torch.get_rng_state(), state)


def test_deterministic_and_non_contiguous() -> None:
    base = _data("ties_at_top", 40_000, torch.float32)
    values = base[::2]  # a strided view
    k = 300
    first, path = sampled_topk_indices(values, k)
    assert path == "sampled"
    again, _ = sampled_topk_indices(values.clone(), k)
    assert torch.equal(first, again)
    assert torch.equal(first, _reference(values.contiguous(), k))


@pytest.mark.parametrize("method", ["auto", "exact", "sampled"])
def test_validation(method: str) -> None:
    values = torch.rand(10)
    for k in (0, 11, -1):
        with pytest.raises(ValueError, match="must be in"):
            topk_indices(values, k, method=method)
    with pytest.raises(ValueError, match="method"):
        topk_indices(values, 3, method="fast")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_int64_ordering_matches_stable_sorts(dtype: torch.dtype) -> None:
    """The one-sort ordering against the two-sort one: signs, zeros of both signs, infs,
    subnormals, ties."""
    tiny = torch.finfo(dtype).tiny
    special = torch.tensor(
        [0.0, -0.0, math.inf, -math.inf, tiny, -tiny, tiny / 4, -tiny / 4, 1.0, -1.0, 1.0, -1.0],
        dtype=dtype,
    )
    gen = torch.Generator().manual_seed(5)
    values = torch.cat([special, torch.randn(3000, generator=gen).to(dtype), special])
    values[::9] = values[4]
    idx = torch.randperm(values.numel(), generator=gen)[:2000]
    old = idx.sort().values
    old = old[torch.sort(values[old], descending=True, stable=True).indices]
    assert torch.equal(selection._by_value_then_index(values, idx), old)
