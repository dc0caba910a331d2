"""How big the sketching methods' sketches are by default: one rule for gs-SGD and
Sketched-SGD, a function of the gradient length d, the k a step delivers and the number of
workers P.

The rule has two shapes. Below :data:`MANY_WORKERS` workers a step sums few tables, so a
wide float32 table (40·k columns) and many exact candidates (m = 32) buy recall cheaply, and
recursive doubling's log2 P rounds cost little. From :data:`MANY_WORKERS` on, the tables'
bytes dominate: each rank sketches only its 8·k largest coordinates (so the summed sketch
holds at most 8·k·P of them, not every rank's tail), the table shrinks to 16·k columns of
float16 with m = 8, and the backend's ring all-reduce sums it (its ``2(P-1)/P`` payloads per
rank do not grow with P).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "DEFAULT_ROWS", "MANY_WORKERS", "SketchShape", "default_candidates", "default_sketch_cols",
    "sketch_default_shape",
]

#: Default rows of a sketch (odd, so the median is one of them).
DEFAULT_ROWS = 1
#: From this many workers on, the sketching methods take their many-workers shape.
MANY_WORKERS = 16


def default_sketch_cols(d: int, k: int, rows: int = 1) -> int:
    """The small-P sketch width: ``40 * k`` columns, capped at ``d / (4 * rows)`` (past that a
    sketch cannot beat sending the vector) unless that cap is below 256 columns.

    One row of 40·k columns recovers as much of the exact global top-k mass, once the exact
    candidate round repairs the estimates, as five rows of 10·k at equal bytes, for a fifth
    of the sketching and recovery compute.
    """
    return max(1, min(40 * k, max(256, d // (4 * rows))))


def default_candidates(d: int, k: int) -> int:
    """The small-P ``m``: 32 candidates per delivered coordinate, capped so ``m * k <= d / 8``
    (exact candidates buy more recall per byte than columns)."""
    return max(1, min(32, d // (8 * k)))


@dataclass(frozen=True)
class SketchShape:
    """The sketching methods' default sketch and wire for one (d, k, P): see
    :func:`sketch_default_shape` (``allreduce`` is gs-SGD's only).

    Attributes:
        cols: columns of each row.
        candidates: m, exact candidates per delivered coordinate.
        allreduce: how gs-SGD sums tables: "recursive_doubling" or "backend" (ring).
        table_dtype: the tables' dtype on the wire.
        prefilter: f: each rank sketches its f·k largest coordinates; 0: all of them.
    """

    cols: int
    candidates: int
    allreduce: str
    table_dtype: torch.dtype
    prefilter: int  # 0: off


def sketch_default_shape(d: int, k: int, rows: int = DEFAULT_ROWS,
                         world_size: int | None = None) -> SketchShape:
    """The defaults of both sketching methods for ``d``, ``k``, ``rows`` and ``world_size``
    workers: the one place they are decided.

    * ``world_size`` < :data:`MANY_WORKERS` (or None, unknown): one row of
      :func:`default_sketch_cols` (40·k) columns, m = :func:`default_candidates` (32),
      float32 tables summed by recursive doubling, and a pre-filter of 8·k (it costs no
      bytes and keeps a narrow sketch from collapsing on heavy-tailed gradients).
    * ``world_size`` >= :data:`MANY_WORKERS`: 16·k columns, m = 8, float16 tables summed by
      the backend's ring all-reduce, the pre-filter of 8·k.

    The small-P caps apply to both (at most ``d / (4 * rows)`` columns, at least 256; at most
    ``d / 8`` candidates). Sketched-SGD takes the same shape (``allreduce`` aside: its tables
    go to a server, which widens 16-bit tables and sums them in float32).
    """
    if world_size is None or world_size < MANY_WORKERS:
        return SketchShape(default_sketch_cols(d, k, rows), default_candidates(d, k),
                           "recursive_doubling", torch.float32, 8)
    return SketchShape(
        cols=max(1, min(16 * k, max(256, d // (4 * rows)))),
        candidates=max(1, min(8, d // (8 * k))),
        allreduce="backend",
        table_dtype=torch.float16,
        prefilter=8,
    )
