"""The Count Sketch's table: sketching a vector into it, merging tables, and queries.

:class:`CountSketch` holds a ``(rows, cols)`` table and the seed of its hashes
(:mod:`gssgd.sketch.hashing`). :meth:`CountSketch.accumulate` adds a vector's sketch to the
table, ``+`` and :meth:`CountSketch.with_table` merge and wrap tables,
:meth:`CountSketch.query` estimates coordinates (:func:`~gssgd.sketch.estimates.median_of_rows`),
and the heavy-hitter recovery comes from :class:`~gssgd.sketch.heavy_hitters.HeavyHitters`.
Without a hash cache, hashes are computed per chunk of :data:`HASH_CHUNK` coordinates, so
the work space stays bounded whatever ``d`` is.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from gssgd import kernels
from gssgd.sketch.checks import check_int
from gssgd.sketch.estimates import median_of_rows
from gssgd.sketch.hashing import HashCache, _HashIndex, signed_buckets, sketch_hash_params
from gssgd.sketch.heavy_hitters import HeavyHitters

__all__ = ["HASH_CHUNK", "CountSketch"]

#: Coordinates hashed per chunk when hashes are computed on the fly (about 20 MB of work
#: space per row at int64, independent of d).
HASH_CHUNK = 1 << 19


class CountSketch(HeavyHitters):
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
        check_int("d", d, 1, None, "the length of the vector to sketch")
        check_int("rows", rows, 1, None, "an odd number such as 5")
        if rows % 2 == 0:
            raise ValueError(
                f"rows={rows} is even; rows must be odd (1, 3, 5, ...) so that the median of "
                f"the rows is one of them. Use rows={rows + 1}."
            )
        check_int("cols", cols, 1, None, "for example 10 * k")
        check_int("seed", seed, 0, None, "any non-negative integer shared by all workers")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype={dtype} is not a floating-point dtype; use torch.float32.")
        self.d, self.rows, self.cols, self.seed = d, rows, cols, seed
        self.table = torch.zeros(rows, cols, device=device, dtype=dtype)
        self._params = sketch_hash_params(seed, rows)
        self._hashes: HashCache | None = None  # where the cached tables live, if anywhere
        self._index: _HashIndex | None = None  # this shape's cached tables
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

    def _build_index(self) -> _HashIndex:
        """Hash all ``d`` coordinates once: the read-only tables behind ``cache_hashes``."""
        buckets = self._all_signed_buckets()
        row0 = buckets[0] % self.cols
        occupancy = torch.bincount(row0, minlength=self.cols)
        if self.rows == 1:  # coordinates grouped by bucket (ascending within each), and
            # where each bucket's group starts: see _heavy_hitters_one_row
            starts = torch.cumsum(occupancy, 0) - occupancy
            return _HashIndex(buckets, None, occupancy, torch.argsort(row0, stable=True), starts)
        # buckets < 2 * cols < 2^31: int32 indexes as well, at half the bytes
        return _HashIndex(buckets, buckets.to(torch.int32), occupancy, None, None)

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
                lambda: _HashIndex(*(None if t is None else t.to(device) for t in moved)),
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
