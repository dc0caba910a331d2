"""Count Sketch: a linear summary of a long vector, whose table is a plain tensor.

A Count Sketch (Charikar, Chen, Farach-Colton 2002) of a vector ``x`` of length ``d`` is a
``rows x cols`` table. Row ``r`` owns two hash functions: a bucket ``h_r(i)`` in
``[0, cols)`` and a sign ``s_r(i)`` in ``{-1, +1}``. Sketching adds ``s_r(i) * x[i]`` to
``table[r, h_r(i)]`` for every coordinate and row. Querying coordinate ``i`` reads
``s_r(i) * table[r, h_r(i)]`` in every row and takes the median, which is an unbiased-ish
estimate of ``x[i]`` with error about ``||x||_2 / sqrt(cols)``.

The sketch is **linear**: ``sketch(x) + sketch(y) == sketch(x + y)`` when both use the same
hashes. gs-SGD relies on this: every worker sketches its own gradient with hashes derived
from one shared seed, and an all-reduce of the tables is the sketch of the global gradient.

Hashes are never drawn from the global RNG and are never stored by default. They are
computed on the fly, in chunks, from the seed with a multiply-add-shift hash
(Dietzfelbinger 1996): ``bucket = ((a_r * i + b_r) mod 2^64) >> 32 scaled to [0, cols)``,
``sign = top bit of (c_r * i + e_r) mod 2^64``. The 64-bit multipliers come from a
SplitMix64 stream of the seed, so every process computes identical hashes on CPU and CUDA.
Sketching a 100M-element vector therefore needs only a chunk of hash work space beyond the
vector; ``cache_hashes=True`` trades ``rows * d * 5`` bytes of memory for speed.

Example:
    >>> import torch, gssgd
    >>> x = torch.zeros(10_000); x[[3, 77]] = torch.tensor([5.0, -4.0])
    >>> sk = gssgd.CountSketch(10_000, rows=5, cols=64, seed=0)
    >>> sk.accumulate(x)
    >>> sk.heavy_hitters(2)[0].tolist()
    [3, 77]
"""

from __future__ import annotations

import torch

from gssgd._select import topk_indices

__all__ = ["CountSketch", "sketch_hash_params"]

_MASK64 = (1 << 64) - 1
_MASK32 = 0xFFFFFFFF
#: Coordinates hashed per chunk when hashes are computed on the fly (about 40 MB of work
#: space per row at int64, independent of d).
HASH_CHUNK = 1 << 20


def _splitmix64(state: int) -> tuple[int, int]:
    """One step of SplitMix64 (Steele, Lea, Flood 2014): returns (new_state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


def _as_int64(value: int) -> int:
    """Reinterpret an unsigned 64-bit integer as a signed one (what torch.int64 holds)."""
    return value - (1 << 64) if value >= (1 << 63) else value


def sketch_hash_params(seed: int, rows: int) -> list[tuple[int, int, int, int]]:
    """The per-row hash constants ``(a, b, c, e)`` derived from ``seed``, as signed int64.

    ``a`` and ``c`` are odd (multiply-shift needs odd multipliers). The same seed gives the
    same constants in every process, which is what makes sketches of different workers
    addable. Exposed so that fused kernels can reproduce the exact hashes.
    """
    state = (seed * 0xD1B54A32D192ED03 + 0x632BE59BD9B4E019) & _MASK64
    params = []
    for _ in range(rows):
        out = []
        for j in range(4):
            state, z = _splitmix64(state)
            out.append(_as_int64(z | 1 if j in (0, 2) else z))
        params.append((out[0], out[1], out[2], out[3]))
    return params


class CountSketch:
    """A Count Sketch of a length-``d`` vector with a ``(rows, cols)`` table.

    Args:
        d: length of the vectors this sketch summarises (>= 1).
        rows: number of independent hash rows; must be odd so the median is one of them.
        cols: buckets per row (>= 1). Estimation error scales like ``||x|| / sqrt(cols)``.
        seed: hash seed; sketches are addable only when built with the same seed.
        device: device of the table (and of the vectors it accepts).
        dtype: dtype of the table.
        cache_hashes: precompute and keep the bucket indices (int32) and signs (int8) of
            all ``d`` coordinates: ``5 * rows * d`` bytes, faster repeated sketching.

    Raises:
        ValueError: a size is out of range, or ``rows`` is even.
    """

    def __init__(
        self,
        d: int,
        rows: int = 5,
        cols: int = 4096,
        seed: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        cache_hashes: bool = False,
    ) -> None:
        _check_int("d", d, 1, None, "the length of the vector to sketch")
        _check_int("rows", rows, 1, None, "an odd number such as 5")
        if rows % 2 == 0:
            raise ValueError(
                f"rows={rows} is even; rows must be odd (1, 3, 5, ...) so that the median of "
                f"the rows is one of them. Use rows={rows + 1}."
            )
        _check_int("cols", cols, 1, None, "for example 10 * k")
        _check_int("seed", seed, 0, None, "any non-negative integer shared by all workers")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype={dtype} is not a floating-point dtype; use torch.float32.")
        self.d, self.rows, self.cols, self.seed = d, rows, cols, seed
        self.table = torch.zeros(rows, cols, device=device, dtype=dtype)
        self._params = sketch_hash_params(seed, rows)
        self._cache: tuple[torch.Tensor, torch.Tensor] | None = None
        if cache_hashes:
            self._cache = self._hashes(torch.arange(d, device=self.table.device), compact=True)

    # ------------------------------------------------------------------ hashing
    @property
    def device(self) -> torch.device:
        return self.table.device

    def _hashes(
        self, idx: torch.Tensor, compact: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat table positions ``r * cols + h_r(i)`` and signs ``s_r(i)`` for ``idx``.

        Returns ``(positions, signs)`` of shape ``(rows, len(idx))``: positions int64 (int32
        when ``compact``), signs in the table's dtype (int8 when ``compact``).
        """
        idx = idx.to(torch.int64)
        pos_rows, sign_rows = [], []
        for r, (a, b, c, e) in enumerate(self._params):
            hb = idx * a + b  # wraps mod 2^64 in int64, as multiply-shift wants
            bucket = (((hb >> 32) & _MASK32) * self.cols) >> 32
            pos = bucket + r * self.cols
            hs = idx * c + e
            neg = hs < 0  # top bit of the 64-bit word
            if compact:
                pos_rows.append(pos.to(torch.int32))
                sign_rows.append(1 - 2 * neg.to(torch.int8))
            else:
                pos_rows.append(pos)
                sign_rows.append(1 - 2 * neg.to(self.table.dtype))
        return torch.stack(pos_rows), torch.stack(sign_rows)

    def _chunks(self, indices: torch.Tensor | None):
        """Yield ``(slice_or_None, idx, positions, signs)`` over ``indices`` (or all of d)."""
        if indices is None:
            if self._cache is not None:
                pos, sgn = self._cache
                yield slice(0, self.d), None, pos, sgn.to(self.table.dtype)
                return
            for start in range(0, self.d, HASH_CHUNK):
                stop = min(self.d, start + HASH_CHUNK)
                idx = torch.arange(start, stop, device=self.device)
                pos, sgn = self._hashes(idx)
                yield slice(start, stop), idx, pos, sgn
            return
        for start in range(0, indices.numel(), HASH_CHUNK):
            idx = indices[start : start + HASH_CHUNK]
            if self._cache is not None:
                pos, sgn = self._cache[0][:, idx], self._cache[1][:, idx].to(self.table.dtype)
            else:
                pos, sgn = self._hashes(idx)
            yield slice(start, start + idx.numel()), idx, pos, sgn

    # ------------------------------------------------------------------ sketching
    def accumulate(self, vec: torch.Tensor) -> None:
        """Add the sketch of ``vec`` to the table, in place.

        Args:
            vec: 1-D tensor of length ``d`` on the sketch's device.

        Raises:
            ValueError: ``vec`` has the wrong shape or device.
        """
        self._check_vector(vec)
        flat = self.table.view(-1)
        vec = vec.to(self.table.dtype)
        for part, _idx, pos, sgn in self._chunks(None):
            vals = sgn * vec[part].unsqueeze(0)
            flat.index_add_(0, pos.reshape(-1), vals.reshape(-1))

    def zero_(self) -> CountSketch:
        """Reset the table to zeros (hashes are unchanged). Returns self."""
        self.table.zero_()
        return self

    def _check_compatible(self, other: object) -> CountSketch:
        if not isinstance(other, CountSketch):
            raise TypeError(f"can only merge a CountSketch with a CountSketch, not {type(other)}")
        mine = (self.d, self.rows, self.cols, self.seed)
        theirs = (other.d, other.rows, other.cols, other.seed)
        if mine != theirs:
            raise ValueError(
                f"cannot merge sketches with different (d, rows, cols, seed): {mine} vs "
                f"{theirs}; build both with the same arguments."
            )
        return other

    def __iadd__(self, other: CountSketch) -> CountSketch:
        self.table += self._check_compatible(other).table
        return self

    def __add__(self, other: CountSketch) -> CountSketch:
        self._check_compatible(other)
        out = self.copy()
        out.table += other.table
        return out

    def to(self, device: torch.device | str | None, dtype: torch.dtype | None = None) -> CountSketch:
        """This sketch with its table on ``device``/``dtype`` (self when already there)."""
        dtype = dtype or self.table.dtype
        if self.table.device == torch.device(device) and self.table.dtype == dtype:
            return self
        out = self.copy()
        out.table = self.table.to(device, dtype)
        if out._cache is not None:
            out._cache = (out._cache[0].to(device), out._cache[1].to(device))
        return out

    def copy(self) -> CountSketch:
        """A sketch with the same hashes and a copy of the table (the hash cache is shared)."""
        out = CountSketch.__new__(CountSketch)
        out.d, out.rows, out.cols, out.seed = self.d, self.rows, self.cols, self.seed
        out._params, out._cache = self._params, self._cache
        out.table = self.table.clone()
        return out

    # ------------------------------------------------------------------ queries
    def query(self, indices: torch.Tensor | None = None) -> torch.Tensor:
        """Median-of-rows estimates of the given coordinates (or of all ``d``).

        Args:
            indices: 1-D integer tensor of coordinates in ``[0, d)``, or None for all.

        Returns:
            1-D tensor of estimates in the table's dtype, one per coordinate.
        """
        if indices is not None:
            indices = self._check_indices(indices)
        n = self.d if indices is None else indices.numel()
        out = torch.empty(n, dtype=self.table.dtype, device=self.device)
        flat = self.table.view(-1)
        for part, _idx, pos, sgn in self._chunks(indices):
            vals = flat[pos.to(torch.int64)] * sgn
            out[part] = vals.median(dim=0).values if self.rows > 1 else vals[0]
        return out

    def heavy_hitters(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` coordinates with the largest ``|estimate|``.

        Ties are broken by the lower index, so every process holding the same table selects
        the same set.

        Args:
            k: how many coordinates, ``1 <= k <= d``.

        Returns:
            ``(indices, estimates)``: int64 indices ordered by decreasing ``|estimate|`` (ties:
            lower index first) and their estimates.

        Raises:
            ValueError: ``k`` is out of range.
        """
        _check_int("k", k, 1, self.d, "the number of heavy coordinates to recover")
        est = self.query()
        idx = topk_indices(est.abs(), k)
        return idx, est[idx]

    def l2_estimate(self) -> float:
        """Estimate of ``||x||_2`` of the sketched vector: median over rows of the row norm."""
        norms = self.table.float().pow(2).sum(dim=1).sqrt()
        return float(norms.median())

    # ------------------------------------------------------------------ checks
    def _check_vector(self, vec: torch.Tensor) -> None:
        if vec.dim() != 1 or vec.numel() != self.d:
            raise ValueError(
                f"expected a 1-D vector of length d={self.d}, got shape {tuple(vec.shape)}; "
                "flatten the gradient (torch.cat([g.flatten() for g in grads]))."
            )
        if vec.device != self.device:
            raise ValueError(
                f"vector is on {vec.device} but the sketch is on {self.device}; move one of them."
            )

    def _check_indices(self, indices: torch.Tensor) -> torch.Tensor:
        if indices.dim() != 1 or indices.dtype.is_floating_point:
            raise ValueError("indices must be a 1-D integer tensor")
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= self.d):
            raise ValueError(f"indices must lie in [0, {self.d}); got values outside it")
        return indices.to(self.device)

    def __repr__(self) -> str:
        return (
            f"CountSketch(d={self.d}, rows={self.rows}, cols={self.cols}, seed={self.seed}, "
            f"device={self.device}, dtype={self.table.dtype})"
        )


def _check_int(name: str, value: object, low: int, high: int | None, hint: str) -> None:
    """Raise a ValueError naming ``name``, its value and the valid range unless it fits."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    if ok and value >= low and (high is None or value <= high):
        return
    rng = f"[{low}, {high}]" if high is not None else f">= {low}"
    raise ValueError(f"{name}={value!r} is invalid: it must be an integer {rng} ({hint}).")
