"""The Count Sketch: its hashes, sketching a vector into its table, merging tables, queries,
recovery.

:class:`CountSketch` holds a ``(rows, cols)`` table and the seed of its hashes
(the hashes come first in this module, below). :meth:`CountSketch.accumulate` adds a vector's sketch to the
table, ``+`` and :meth:`CountSketch.with_table` merge and wrap tables,
:meth:`CountSketch.query` estimates coordinates (the median of their signed buckets over the
rows, :func:`median_of_rows`), and :meth:`CountSketch.heavy_hitters` recovers the ``k``
heaviest without estimating all ``d``: it screens the coordinates against a threshold
sampled from the table and estimates only the survivors (a one-row sketch with cached
hashes walks its buckets instead); every route gives the same set as ranking all ``d``
estimates (every non-finite estimate first, :func:`nonfinite_as_largest`; ties to the lower
index).
Without a hash cache, hashes are computed per chunk of :data:`HASH_CHUNK` coordinates, so
the work space stays bounded whatever ``d`` is.

**The hashes.** Every row ``r`` of a sketch owns a bucket hash and a sign hash of the multiply-add-shift
family (Dietzfelbinger 1996), on coordinates ``i`` as 64-bit integers::

    bucket_r(i) = (((a_r * i + b_r) mod 2^64) >> 32) * cols >> 32      in [0, cols)
    sign_r(i)   = -1 if the top bit of (c_r * i + e_r) mod 2^64 is set, else +1

The constants ``(a_r, b_r, c_r, e_r)`` come from a SplitMix64 stream of the seed
(:func:`sketch_hash_params`; ``a`` and ``c`` odd), so every process, on CPU or CUDA,
computes the same hashes from the same seed: what makes the workers' sketches addable.
:func:`signed_buckets` evaluates them with torch's int64 arithmetic (which wraps mod 2^64).

:class:`HashCache` keeps the evaluated hashes of all ``d`` coordinates for sketches that
ask for it; its owner creates it and decides which sketches share it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from gssgd import kernels
from gssgd.selection import topk_indices
from gssgd.validate import check_int

__all__ = [
    "CountSketch",
    "HASH_CHUNK",
    "HashCache",
    "HashIndex",
    "check_int",
    "hash_cache_bytes",
    "median_of_rows",
    "nonfinite_as_largest",
    "signed_buckets",
    "sketch_hash_params",
]


_MASK64 = (1 << 64) - 1
_MASK32 = 0xFFFFFFFF


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


def signed_buckets(idx: torch.Tensor, params: list[tuple[int, int, int, int]], cols: int) -> torch.Tensor:
    """Signed buckets of coordinates ``idx``: ``bucket_r(i) + cols * [sign_r(i) < 0]``.

    Args:
        idx: coordinates (any integer dtype, any device).
        params: :func:`sketch_hash_params` of the sketch's seed and rows.
        cols: buckets per row.

    Returns:
        int64 tensor of shape ``(rows, len(idx))``, values in ``[0, 2 * cols)``: an index into
        the doubled row ``[+table[r], -table[r]]``, so sketching is a scatter-add and querying
        a gather, with no multiplication by the sign.
    """
    idx = idx.to(torch.int64)
    out = []
    for a, b, c, e in params:
        hb = idx * a + b  # wraps mod 2^64 in int64, as multiply-add-shift wants
        bucket = (((hb >> 32) & _MASK32) * cols) >> 32
        negative = (idx * c + e) < 0  # the top bit of the sign hash
        out.append(bucket + cols * negative)
    return torch.stack(out)


class HashIndex:
    """The cached tables of one ``(d, rows, cols, seed, device)``: built once, read-only."""

    __slots__ = ("buckets", "buckets32", "occupancy", "by_bucket", "bucket_starts")

    def __init__(
        self,
        buckets: torch.Tensor,
        buckets32: torch.Tensor | None,
        occupancy: torch.Tensor,
        by_bucket: torch.Tensor | None,
        bucket_starts: torch.Tensor | None,
    ) -> None:
        self.buckets, self.buckets32 = buckets, buckets32
        self.occupancy, self.by_bucket, self.bucket_starts = occupancy, by_bucket, bucket_starts

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        """Every part, in the constructor's order (to move the index to another device)."""
        return self.buckets, self.buckets32, self.occupancy, self.by_bucket, self.bucket_starts


class HashCache:
    """Cached hash tables of Count Sketches, one entry per ``(d, rows, cols, seed, device)``.

    Explicitly owned: whoever creates it decides which sketches share it, and the tables go
    when the owner lets go of it. :class:`CountSketch` reads it with ``cache_hashes=cache``;
    a sketch's ``copy()``, ``with_table()`` and ``to()`` keep using the same cache, so a
    grown or moved sketch builds only what it lacks. Each entry costs
    :func:`hash_cache_bytes` of memory.

    Example:
        >>> cache = HashCache()
        >>> a = CountSketch(10_000, rows=1, cols=400, cache_hashes=cache)
        >>> b = CountSketch(10_000, rows=1, cols=400, cache_hashes=cache)  # shares a's tables
        >>> len(cache)
        1
    """

    def __init__(self) -> None:
        self._indexes: dict[tuple, HashIndex] = {}

    def get(self, key: tuple, build: Callable[[], HashIndex]) -> HashIndex:
        """The tables of ``key``, built (and kept) on first use."""
        index = self._indexes.get(key)
        if index is None:
            index = self._indexes[key] = build()
        return index

    def clear(self) -> None:
        """Drop every cached table (sketches that hold one keep theirs alive)."""
        self._indexes.clear()

    def __len__(self) -> int:
        return len(self._indexes)

    @property
    def nbytes(self) -> int:
        """Bytes of every cached table."""
        return sum(
            t.numel() * t.element_size()
            for index in self._indexes.values()
            for t in index.tensors()
            if t is not None
        )


def hash_cache_bytes(d: int, rows: int) -> int:
    """Bytes a :class:`CountSketch` with ``cache_hashes=True`` keeps beside its table.

    int64 signed buckets (``8 * rows * d``) plus, with one row, the coordinates sorted by
    bucket (``8 * d``), or, with more rows, an int32 copy of the buckets (``4 * rows * d``).
    """
    return 8 * rows * d + (8 * d if rows == 1 else 4 * rows * d)


#: Coordinates hashed per chunk when hashes are computed on the fly (about 20 MB of work
#: space per row at int64, independent of d).
HASH_CHUNK = 1 << 19


def nonfinite_as_largest(magnitude: torch.Tensor) -> torch.Tensor:
    """``magnitude`` (``|estimates|``) with NaN as +inf: a total order that ranks every
    non-finite estimate first and equally (ties then go to the lower index)."""
    return torch.where(torch.isnan(magnitude), torch.inf, magnitude)



def median_of_rows(values: list[torch.Tensor]) -> torch.Tensor:
    """Element-wise median of an odd number of equal-length vectors (one: itself, uncopied).

    Three and five rows use min/max networks (a few element-wise passes, instead of
    ``torch.median``'s sort); the result is the same order statistic, bit for bit.
    """
    n = len(values)
    if n == 1:
        return values[0]
    if n == 3:
        a, b, c = values
        return torch.maximum(torch.minimum(a, b), torch.minimum(torch.maximum(a, b), c))
    if n == 5:
        a, b, c, d, e = values
        lo_ab, hi_ab = torch.minimum(a, b), torch.maximum(a, b)
        lo_cd, hi_cd = torch.minimum(c, d), torch.maximum(c, d)
        # Neither the least nor the greatest of a..d can be the median of five.
        x, y = torch.maximum(lo_ab, lo_cd), torch.minimum(hi_ab, hi_cd)
        return torch.maximum(torch.minimum(x, y), torch.minimum(torch.maximum(x, y), e))
    return torch.stack(values).median(dim=0).values


class CountSketch:
    """A Count Sketch of a length-``d`` vector with a ``(rows, cols)`` table.

    Args:
        d: length of the vectors this sketch summarises (>= 1).
        rows: number of independent hash rows; must be odd so the median is one of them.
        cols: buckets per row (>= 1). Estimation error scales like ``||x|| / sqrt(cols)``.
        seed: hash seed; sketches are addable only when built with the same seed.
        device: device of the table (and of the vectors it accepts).
        dtype: dtype of the table.
        cache_hashes: precompute and keep the signed buckets of all ``d`` coordinates,
            for faster repeated sketching and queries (``hash_cache_bytes(d, rows)``
            bytes: int64 for the scatter-add, an int32 copy for the gathers, or with one
            row the coordinates sorted by bucket).

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
        cache_hashes: bool | HashCache = False,
    ) -> None:
        check_int("d", d, 1, fix="It is the length of the vector to sketch.")
        check_int("rows", rows, 1, fix="An odd number such as 5.")
        if rows % 2 == 0:
            raise ValueError(
                f"rows={rows} is even; rows must be odd (1, 3, 5, ...) so that the median of "
                f"the rows is one of them. Use rows={rows + 1}."
            )
        check_int("cols", cols, 1, fix="For example 10 * k.")
        check_int("seed", seed, 0, fix="Any non-negative integer shared by all workers.")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype={dtype} is not a floating-point dtype; use torch.float32.")
        self.d, self.rows, self.cols, self.seed = d, rows, cols, seed
        self.table = torch.zeros(rows, cols, device=device, dtype=dtype)
        self._params = sketch_hash_params(seed, rows)
        self._hashes: HashCache | None = None  # where the cached tables live, if anywhere
        self._index: HashIndex | None = None  # this shape's cached tables
        if cache_hashes is True:
            cache_hashes = HashCache()
        if isinstance(cache_hashes, HashCache):
            self._hashes = cache_hashes
            self._index = cache_hashes.get(self._index_key(), self._build_index)
        elif cache_hashes is not False:
            raise ValueError(
                f"cache_hashes={cache_hashes!r} is invalid: it must be True, False or a "
                "gssgd.sketch.HashCache to share. Use True."
            )

    def _index_key(self) -> tuple:
        return (self.d, self.rows, self.cols, self.seed, str(self.table.device))

    def _build_index(self) -> HashIndex:
        """Hash all ``d`` coordinates once: the read-only tables behind ``cache_hashes``."""
        buckets = self._all_signed_buckets()
        row0 = buckets[0] % self.cols
        occupancy = torch.bincount(row0, minlength=self.cols)
        if self.rows == 1:  # coordinates grouped by bucket (ascending within each), and
            # where each bucket's group starts: see _heavy_hitters_one_row
            starts = torch.cumsum(occupancy, 0) - occupancy
            return HashIndex(buckets, None, occupancy, torch.argsort(row0, stable=True), starts)
        # buckets < 2 * cols < 2^31: int32 indexes as well, at half the bytes
        return HashIndex(buckets, buckets.to(torch.int32), occupancy, None, None)

    # The parts of the hash cache (None without one).
    @property
    def _cache(self) -> torch.Tensor | None:
        """int64 signed buckets, (rows, d): what the scatter-add reads."""
        return None if self._index is None else self._index.buckets

    @property
    def _cache32(self) -> torch.Tensor | None:
        """The same in int32 (several rows only): gathers read half the bytes."""
        return None if self._index is None else self._index.buckets32

    @property
    def _occupancy(self) -> torch.Tensor | None:
        """Coordinates per row-0 bucket."""
        return None if self._index is None else self._index.occupancy

    @property
    def _by_bucket(self) -> torch.Tensor | None:
        """One row only: the coordinates sorted by bucket."""
        return None if self._index is None else self._index.by_bucket

    # ------------------------------------------------------------------ hashing
    @property
    def device(self) -> torch.device:
        return self.table.device

    def _signed_buckets(self, idx: torch.Tensor) -> torch.Tensor:
        """Signed buckets of ``idx``: ``h_r(i) + cols * [s_r(i) < 0]``, shape (rows, n).

        int64, or int32 when read from the int32 copy of the cache (only gathers use this;
        the scatter-add of :meth:`accumulate` reads the int64 cache).

        A signed bucket indexes a *doubled* row ``[+table[r], -table[r]]`` (length 2*cols),
        so that sketching is a plain scatter-add and querying a plain gather: the sign never
        needs a multiplication.
        """
        if self._cache is not None:
            return (self._cache if self._cache32 is None else self._cache32).index_select(1, idx)
        return signed_buckets(idx, self._params, self.cols)

    def _all_signed_buckets(self) -> torch.Tensor:
        idx = torch.arange(self.d, device=self.device)
        return torch.cat(
            [self._signed_buckets(idx[s : s + HASH_CHUNK]) for s in range(0, self.d, HASH_CHUNK)],
            dim=1,
        )

    def _chunks(
        self, indices: torch.Tensor | None, for_gather: bool = False
    ) -> Iterator[tuple[slice, torch.Tensor]]:
        """Yield ``(part, signed_buckets)`` over ``indices`` (all of d when None), chunked
        unless hashes are cached, so hash work space stays bounded whatever d is.
        ``for_gather``: the buckets only index gathers, so the int32 cache will do."""
        n = self.d if indices is None else indices.numel()
        if self._cache is not None and indices is None:
            cached = self._cache32 if for_gather and self._cache32 is not None else self._cache
            yield slice(0, n), cached
            return
        # cached: one chunk (at least 1, as range() needs; no indices yield none)
        step = max(n, 1) if self._cache is not None else HASH_CHUNK
        for start in range(0, n, step):
            stop = min(n, start + step)
            if indices is None:
                idx = torch.arange(start, stop, device=self.device)
            else:
                idx = indices[start:stop]
            yield slice(start, stop), self._signed_buckets(idx)

    # ------------------------------------------------------------------ sketching
    def accumulate(self, vec: torch.Tensor) -> None:
        """Add the sketch of ``vec`` to the table, in place.

        One scatter-add per row and chunk into the doubled table ``(rows, 2*cols)``; the positive
        half minus the negative half is then added to ``table``.

        Args:
            vec: 1-D tensor of length ``d`` on the sketch's device.

        Raises:
            ValueError: ``vec`` has the wrong shape or device.
        """
        self._check_vector(vec)
        if kernels.use_kernels(self.table):  # hashes computed in the kernel, no cache read
            kernels.sketch_accumulate(self.table, vec, self._params)
            return
        vec = vec.to(self.table.dtype)
        doubled = torch.zeros(self.rows, 2 * self.cols, dtype=self.table.dtype, device=self.device)
        for part, buckets in self._chunks(None):
            for r in range(self.rows):  # row by row: faster than one expanded 2-D call
                doubled[r].scatter_add_(0, buckets[r], vec[part])
        self.table += doubled[:, : self.cols] - doubled[:, self.cols :]

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

    def to(
        self, device: torch.device | str | None, dtype: torch.dtype | None = None
    ) -> CountSketch:
        """This sketch with its table on ``device``/``dtype`` (self when already there)."""
        dtype = dtype or self.table.dtype
        if self.table.device == torch.device(device) and self.table.dtype == dtype:
            return self
        out = self.copy()
        out.table = self.table.to(device, dtype)
        if self._hashes is not None and self._index is not None:
            moved = self._index.tensors()
            out._index = self._hashes.get(
                out._index_key(),
                lambda: HashIndex(*(None if t is None else t.to(device) for t in moved)),
            )
        return out

    def with_table(self, table: torch.Tensor) -> CountSketch:
        """A sketch with these hashes around ``table`` (not copied), e.g. an all-reduced sum."""
        if tuple(table.shape) != (self.rows, self.cols):
            raise ValueError(
                f"table has shape {tuple(table.shape)}, expected {(self.rows, self.cols)}"
            )
        out = CountSketch.__new__(CountSketch)
        out.d, out.rows, out.cols, out.seed = self.d, self.rows, self.cols, self.seed
        out._params, out.table = self._params, table
        out._hashes, out._index = self._hashes, self._index
        return out

    def copy(self) -> CountSketch:
        """A sketch with the same hashes and a copy of the table (the hash cache is shared)."""
        return self.with_table(self.table.clone())

    # ------------------------------------------------------------------ queries
    def _doubled(self) -> torch.Tensor:
        return torch.cat([self.table, -self.table], dim=1)

    def _estimates(self, buckets: torch.Tensor, doubled: torch.Tensor) -> torch.Tensor:
        """Median over rows of the signed bucket values (one gather per row)."""
        values = [doubled[r].index_select(0, buckets[r]) for r in range(self.rows)]
        return median_of_rows(values)

    def query(self, indices: torch.Tensor | None = None) -> torch.Tensor:
        """Median-of-rows estimates of the given coordinates (or of all ``d``).

        Args:
            indices: 1-D integer tensor of coordinates in ``[0, d)``, or None for all.

        Returns:
            1-D tensor of estimates in the table's dtype, one per coordinate.
        """
        if indices is not None:
            indices = self._check_indices(indices)
        if kernels.use_kernels(self.table):
            return kernels.query(self.table, self._params, self.d, indices)
        n = self.d if indices is None else indices.numel()
        out = torch.empty(n, dtype=self.table.dtype, device=self.device)
        doubled = self._doubled()
        for part, buckets in self._chunks(indices, for_gather=True):
            out[part] = self._estimates(buckets, doubled)
        return out

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

    # ------------------------------------------------------------------ recovery
    def heavy_hitters(self, k: int, ordered: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` coordinates with the largest ``|estimate|``.

        Ties are broken by the lower index, so every process holding the same table selects
        the same set. The result equals ranking all ``d`` estimates, but is found without
        estimating every coordinate (unless the table holds NaN or Inf, below):

        1. Estimate a strided sample of the coordinates and take a threshold ``tau`` a
           little below where the k-th largest ``|estimate|`` should lie.
        2. A coordinate whose median estimate reaches ``tau`` has a bucket with
           ``|value| >= tau`` in a majority of rows. Keep the coordinates that do (one byte
           gather per row; no medians).
        3. Estimate only the survivors. If at least k of them reach ``tau``, their top k is
           exactly the top k of all d; otherwise fall back to estimating everything.

        A table with NaN or ±Inf buckets (a float16 table that overflowed on the wire, where
        ``+inf + -inf`` is NaN) is ranked by estimating all ``d`` coordinates, and a
        non-finite ``|estimate|`` counts as the largest: such coordinates come first, ties
        among them (and among all equal values) to the lower index, so every rank holding the
        same table selects the same set, whatever its NaNs' bits. Overflow means huge values,
        so these are the heaviest coordinates; their returned estimates are the non-finite
        values themselves (gs-SGD's exact round replaces them with exact sums).

        Args:
            k: how many coordinates, ``1 <= k <= d``.
            ordered: sort the result; False returns the same set in an unspecified order.

        Returns:
            ``(indices, estimates)``: int64 indices ordered by decreasing ``|estimate|`` (ties:
            lower index first) and their estimates.

        Raises:
            ValueError: ``k`` is out of range.
        """
        check_int("k", k, 1, self.d, fix="It is the number of heavy coordinates to recover.")
        if not bool(torch.isfinite(self.table).all()):
            return self._rank_all(k, ordered, nonfinite_first=True)
        # Sample every stride-th coordinate, sparsely enough to be cheap yet holding a few
        # dozen of the k heaviest; with k above d/16 screening cannot pay, estimate all.
        stride = min(16, self.d // (8 * k))
        if self.d < 1024 or stride < 2:
            return self._rank_all(k, ordered)
        fused = kernels.use_kernels(self.table)  # screening and queries in Triton kernels
        if self._by_bucket is not None and not fused:
            return self._heavy_hitters_one_row(k, ordered)
        tau = self._sample_threshold(k, stride, fused)
        cand, est = self._screen(tau, fused)
        est_abs = est.abs()
        if int((est_abs >= tau).sum()) < k:  # too few survivors reach tau: rank all d
            return self._rank_all(k, ordered)
        keep = topk_indices(est_abs, k, ordered)
        return cand[keep], est[keep]

    def _rank_all(
        self, k: int, ordered: bool, nonfinite_first: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``heavy_hitters`` by estimating all ``d`` coordinates and ranking them.

        ``nonfinite_first``: a NaN or infinite ``|estimate|`` ranks as the largest (ties
        among them to the lower index), for tables holding non-finite buckets.
        """
        est = self.query()
        score = est.abs()
        if nonfinite_first:
            score = nonfinite_as_largest(score)
        idx = topk_indices(score, k, ordered)
        return idx, est[idx]

    def _sample_threshold(self, k: int, stride: int, fused: bool) -> torch.Tensor:
        """Step 1 of ``heavy_hitters``: ``tau``, a little below the k-th largest
        ``|estimate|`` as seen in the estimates of every ``stride``-th coordinate (a 0-d
        tensor in the table's dtype)."""
        if fused:  # in range by construction: no index check (it would sync the GPU)
            sample = torch.arange(0, self.d, stride, device=self.device)
            sample_abs = kernels.query(self.table, self._params, self.d, sample).abs()
        else:
            if self._cache is not None:  # a strided view of the cache: no gather, no hashing
                cached = self._cache if self._cache32 is None else self._cache32
                sample_buckets = cached[:, ::stride]
            else:
                sample_buckets = self._signed_buckets(
                    torch.arange(0, self.d, stride, device=self.device)
                )
            sample_abs = self._estimates(sample_buckets, self._doubled()).abs()
        want = min(sample_abs.numel(), 2 * -(-k // stride) + 16)
        return torch.topk(sample_abs, want, sorted=False).values.min()

    def _screen(self, tau: torch.Tensor, fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Steps 2 and 3 of ``heavy_hitters``: the coordinates with a bucket of
        ``|value| >= tau`` in a majority of rows (ascending) and their estimates."""
        majority = (self.rows + 1) // 2
        if fused:  # candidates lie in [0, d) by construction: queried without a check
            cand = kernels.candidates(self.table, self._params, self.d, tau, majority)
            return cand, kernels.query(self.table, self._params, self.d, cand)
        cand = self._screen_torch(tau, majority)
        return cand, self.query(cand) if cand.numel() else cand.to(self.table.dtype)

    def _screen_torch(self, tau: torch.Tensor, majority: int) -> torch.Tensor:
        """The screening of :meth:`_screen` on the torch path: per chunk of coordinates,
        count the rows whose bucket reaches ``tau`` (one byte gather per row, no medians)."""
        heavy = torch.cat([self.table.abs() >= tau] * 2, dim=1).to(torch.uint8)
        survivors = []
        for part, buckets in self._chunks(None, for_gather=True):
            votes = heavy[0].index_select(0, buckets[0])
            for r in range(1, self.rows):
                votes += heavy[r].index_select(0, buckets[r])
            survivors.append(torch.nonzero(votes >= majority).flatten() + part.start)
        return torch.cat(survivors)

    def _heavy_hitters_one_row(self, k: int, ordered: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``heavy_hitters`` of a one-row sketch with cached hashes, in O(cols + candidates).

        With one row a coordinate's estimate is its bucket's signed value, so the top k are
        found from the buckets alone:

        1. Walk the buckets by decreasing ``|value|`` until they hold ``k`` coordinates
           (bucket occupancy is known): that bucket's ``|value|`` is the exact threshold
           ``tau`` of the k-th largest ``|estimate|``.
        2. Take every coordinate of the buckets with ``|value| > tau`` and, from the
           buckets at exactly ``tau``, the lowest coordinates up to k (ties go to the lower
           index, as ranking all d would), read from an index of the coordinates sorted by
           bucket (built with the hash cache): no pass over all ``d`` coordinates.
        3. With ``ordered``, sort them by decreasing ``|estimate|`` (ties: lower index).
        """
        cols = self.cols
        size = self.table[0].abs()
        guess = min(cols, 2 * -(-k * cols // self.d) + 16)  # buckets to hold k coordinates
        while True:
            order = torch.topk(size, guess).indices
            held = torch.cumsum(self._occupancy[order], 0)
            if int(held[-1]) >= k or guess == cols:
                break
            guess = min(cols, 4 * guess)
        tau = size[order[int(torch.searchsorted(held, k))]]
        # Buckets above tau are taken whole; of those exactly at tau (one, unless values
        # tie), the lowest coordinates fill up to k, as ranking all d would pick them.
        above = self._coords_of_buckets(torch.nonzero(size > tau).flatten())
        at_tau = self._coords_of_buckets(torch.nonzero(size == tau).flatten())
        at_tau = torch.sort(at_tau).values[: k - above.numel()]
        chosen = torch.cat([above, at_tau])
        if ordered:  # by decreasing |estimate|, ties to the lower index
            chosen = torch.sort(chosen).values
            est = self.query(chosen)
            keep = topk_indices(est.abs(), k, ordered=True)
            return chosen[keep], est[keep]
        return chosen, self.query(chosen)

    def _coords_of_buckets(self, buckets: torch.Tensor) -> torch.Tensor:
        """The coordinates hashed (in row 0) to ``buckets``, bucket after bucket."""
        counts = self._occupancy[buckets]
        starts = self._index.bucket_starts[buckets]  # where each bucket's group begins
        shift = torch.repeat_interleave(starts - (torch.cumsum(counts, 0) - counts), counts)
        return self._by_bucket[torch.arange(shift.numel(), device=self.device) + shift]
