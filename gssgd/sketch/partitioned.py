"""A Count Sketch whose table is partitioned into regions, one per piece of the vector.

Whole-model gs-SGD hashes every coordinate of the gradient over the whole table, so no
part of the table is final before the last gradient is known. Streaming gs
(:mod:`gssgd.ddp.streaming_gs`) needs the opposite: piece ``b`` of the vector (a DDP bucket) is
hashed **only into its own region** of the table, so that region is final, and can be
all-reduced, as soon as piece ``b`` is known.

Layout (``rows`` rows, ``cols`` columns in all, pieces of sizes ``d_0 .. d_{B-1}``):

1. Columns: region ``b`` gets ``c_b`` columns, in proportion to ``d_b`` with every region
   at least one column and ``sum(c_b) == cols`` (:func:`region_columns`).
2. Hashes: region ``b`` is an ordinary :class:`~gssgd.sketch.CountSketch` of length
   ``d_b`` and width ``c_b`` with the shared seed; coordinate ``j`` of piece ``b`` (global
   coordinate ``offset_b + j``) lands in column ``col_offset_b + h(j)`` of the whole table.
   With a single piece the layout is exactly the unpartitioned sketch.
3. Storage: one flat tensor of ``rows * cols`` numbers, region after region; region ``b``
   is the contiguous slice viewed as ``(rows, c_b)``, so it can be sent on its own.
4. Recovery: the top ``K`` coordinates by ``|estimate|`` over the whole vector (ties to the
   lower global index), found from each region's own top ``min(K, d_b)``: a coordinate in
   the global top K is in its region's top K, so the union holds the answer
   (:meth:`PartitionedSketch.heavy_hitters`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from gssgd.selection import topk_indices
from gssgd.sketch.count_sketch import CountSketch, nonfinite_as_largest
from gssgd.validate import check_int

__all__ = ["PartitionedSketch", "region_columns"]


def region_columns(sizes: Sequence[int], cols: int) -> list[int]:
    """Split ``cols`` columns among pieces of ``sizes`` coordinates.

    Rule: every region gets one column, and the other ``cols - B`` columns are apportioned
    in proportion to the sizes by the largest-remainder (Hamilton) method: region ``b``
    first gets ``floor((cols - B) * d_b / d)``, then the columns left over go one each to
    the regions with the largest remainders ``(cols - B) * d_b mod d``, ties to the lower
    index. Integer arithmetic only, so every rank computes the same split.

    Args:
        sizes: the pieces' lengths ``d_b`` (each >= 1), in region order.
        cols: the total column count (>= the number of pieces).

    Returns:
        The column count of each region; they sum to ``cols``.

    Raises:
        ValueError: an empty or non-positive size, or fewer columns than pieces.
    """
    if not sizes or any(not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"sizes={list(sizes)!r} is invalid: it must be a non-empty list of "
                         "positive integers (the length of each piece).")
    if not isinstance(cols, int) or cols < len(sizes):
        raise ValueError(
            f"cols={cols!r} is invalid for {len(sizes)} pieces: every region needs at least "
            f"one column, so cols must be an integer >= {len(sizes)}. Raise cols (or the "
            "density), or use fewer, larger DDP buckets (a larger bucket_cap_mb)."
        )
    d, spare = sum(sizes), cols - len(sizes)
    out = [1 + spare * n // d for n in sizes]
    left = cols - sum(out)
    by_remainder = sorted(range(len(sizes)), key=lambda b: (-(spare * sizes[b] % d), b))
    for b in by_remainder[:left]:
        out[b] += 1
    return out


class PartitionedSketch:
    """A ``rows x cols`` Count Sketch table split into one region per piece of the vector.

    Args:
        sizes: the pieces' lengths, in region (and coordinate) order.
        cols: total columns over all regions (see :func:`region_columns`).
        make_region: ``make_region(d_b, c_b)`` builds the :class:`CountSketch` of one region
            (the same rows and seed for all; e.g. ``GSOptions.make_sketch`` with its hash cache).
        device, dtype: of the table.

    Attributes:
        sizes, offsets: each piece's length and first global coordinate.
        region_cols, col_offsets: each region's columns and first column.
        table: the flat ``rows * cols`` table, region after region.
        regions: each region's CountSketch, whose ``table`` is a view into ``table``.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        cols: int,
        make_region: Callable[[int, int], CountSketch],
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.sizes = list(sizes)
        self.region_cols = region_columns(self.sizes, cols)
        self.cols = cols
        self.offsets = _starts(self.sizes)
        self.col_offsets = _starts(self.region_cols)
        self.d = sum(self.sizes)
        self._make_region = make_region
        built = [make_region(n, c) for n, c in zip(self.sizes, self.region_cols, strict=True)]
        self.rows = built[0].rows
        self.table = torch.zeros(self.rows * cols, device=device, dtype=dtype)
        self.regions = [
            sk.to(self.table.device, dtype).with_table(self.region_table(b))
            for b, sk in enumerate(built)
        ]

    def region_table(self, b: int) -> torch.Tensor:
        """Region ``b`` of the table: a contiguous ``(rows, c_b)`` view (writes go through)."""
        start = self.rows * self.col_offsets[b]
        return self.table[start : start + self.rows * self.region_cols[b]].view(
            self.rows, self.region_cols[b]
        )

    def piece(self, b: int) -> slice:
        """The global coordinates of piece ``b``."""
        return slice(self.offsets[b], self.offsets[b] + self.sizes[b])

    def to(self, device: torch.device | str, dtype: torch.dtype) -> PartitionedSketch:
        """This layout with its table on ``device``/``dtype`` (self when already there)."""
        if self.table.device == torch.device(device) and self.table.dtype == dtype:
            return self
        out = PartitionedSketch.__new__(PartitionedSketch)
        out.__dict__.update(self.__dict__)
        out.table = self.table.to(device, dtype)
        out.regions = [
            sk.to(device, dtype).with_table(out.region_table(b))
            for b, sk in enumerate(self.regions)
        ]
        return out

    def zero_(self) -> PartitionedSketch:
        """Reset the whole table to zeros. Returns self."""
        self.table.zero_()
        return self

    def accumulate(self, b: int, piece: torch.Tensor) -> None:
        """Add the sketch of piece ``b`` (length ``d_b``) into region ``b``, in place."""
        self.regions[b].accumulate(piece)

    def heavy_hitters(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` global coordinates with the largest ``|estimate|``, in increasing order.

        Ties go to the lower global index and non-finite estimates rank first, exactly as
        ranking all ``d`` estimates would (the rules of :meth:`CountSketch.heavy_hitters`).

        Steps: (1) each region's top ``k`` (a global top-k coordinate is in its region's
        top k), or all its estimates where ``d_b < 16 k`` (where screening cannot pay);
        (2) shift them to global indices in increasing order, so that position order is
        index order; (3) the top k of the union by ``|estimate|``, ties to the
        lower position; (4) sort by index.

        Returns:
            ``(indices, estimates)``: int64 global indices in increasing order and their
            estimates.

        Raises:
            ValueError: ``k`` is not in ``[1, d]``.
        """
        check_int("k", k, 1, self.d)
        found, estimates = [], []
        for b, sk in enumerate(self.regions):
            if sk.d < 16 * k or not bool(torch.isfinite(sk.table).all()):
                # k is a large share of the region (heavy_hitters would estimate all d_b
                # anyway), or non-finite buckets: every estimate, already in index order
                idx = torch.arange(sk.d, device=self.table.device)
                est = sk.query()
            else:
                idx, est = sk.heavy_hitters(k, ordered=False)
                order = torch.argsort(idx)
                idx, est = idx[order], est[order]
            found.append(idx + self.offsets[b])
            estimates.append(est)
        cand, est = torch.cat(found), torch.cat(estimates)
        keep = torch.sort(topk_indices(nonfinite_as_largest(est.abs()), k, ordered=False)).values
        return cand[keep], est[keep]

    def l2_estimate(self) -> float:
        """Estimate of the sketched vector's l2 norm: the median over rows of the row norm,
        each row's norm taken over all regions (as for an unpartitioned table)."""
        sq = torch.stack([r.table.float().pow(2).sum(dim=1) for r in self.regions]).sum(dim=0)
        return float(sq.sqrt().median())


def _starts(sizes: Sequence[int]) -> list[int]:
    out, acc = [], 0
    for n in sizes:
        out.append(acc)
        acc += n
    return out
