"""The hashes of gssgd's Count Sketches, and the cache that keeps them.

Every row ``r`` of a sketch owns a bucket hash and a sign hash of the multiply-add-shift
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

from collections.abc import Callable

import torch

__all__ = ["HashCache", "HashIndex", "hash_cache_bytes", "signed_buckets", "sketch_hash_params"]

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
