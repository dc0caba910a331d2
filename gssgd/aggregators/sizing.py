"""How big the sketching methods' sketches are by default: one rule for gs-SGD and
Sketched-SGD, a function of the gradient length d, the k a step delivers and the number of
workers P.

One rule for every P: one row; each rank sketches only its 8·k largest coordinates (so the
summed sketch holds at most 8·k·P of them, not every rank's tail); float16 tables summed by
the backend's ring all-reduce (``2(P-1)/P`` payloads per rank, which do not grow with P).
Only the table's width and the exact candidates follow P: below :data:`MANY_WORKERS`
workers 40·k columns and m = 32 candidates per delivered coordinate (few tables are summed,
and a language model's flatter gradient needs the recall: fewer candidates cost the
character LSTM loss and the CNN nothing); from it 16·k columns and m = 8, where the
tables' bytes dominate a step.

Streamed gs (:mod:`gssgd.ddp.streaming_gs`) sketches every coordinate (a pre-filter needs the
whole gradient before the first bucket), so it keeps float32 tables (40·k columns, m = 32:
:func:`streaming_options`) at every P.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

__all__ = [
    "DEFAULT_CANDIDATES", "DEFAULT_ROWS", "MANY_WORKERS", "SketchShape", "default_candidates",
    "default_sketch_cols", "sketch_default_shape", "streaming_options",
]

#: Default rows of a sketch (odd, so the median is one of them).
DEFAULT_ROWS = 1
#: From this many workers on, the sketching methods take their narrower (16·k) table.
MANY_WORKERS = 16
#: m from :data:`MANY_WORKERS` workers on (capped at d / 8); below it :func:`default_candidates`.
DEFAULT_CANDIDATES = 8


def default_sketch_cols(d: int, k: int, rows: int = 1) -> int:
    """The wide sketch width (below :data:`MANY_WORKERS` workers, and streamed gs's at any
    P): ``40 * k`` columns, capped at ``d / (4 * rows)`` (past that a sketch cannot beat
    sending the vector) unless that cap is below 256 columns.

    One row of 40·k columns recovers as much of the exact global top-k mass, once the exact
    candidate round repairs the estimates, as five rows of 10·k at equal bytes, for a fifth
    of the sketching and recovery compute.
    """
    return max(1, min(40 * k, max(256, d // (4 * rows))))


def default_candidates(d: int, k: int) -> int:
    """``m`` below :data:`MANY_WORKERS` workers (and streamed gs's at any P): 32 candidates
    per delivered coordinate, capped so ``m * k <= d / 8`` (exact candidates buy recall
    back where a wide sketch of few tables still misses some of a flat gradient's top-k)."""
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

    def options(self) -> dict[str, Any]:
        """The shape as aggregator options, by field name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def sketch_default_shape(d: int, k: int, rows: int = DEFAULT_ROWS,
                         world_size: int | None = None) -> SketchShape:
    """The defaults of both sketching methods for ``d``, ``k``, ``rows`` and ``world_size``
    workers (None: unknown, taken as fewer than :data:`MANY_WORKERS`): the one place they
    are decided (the module doc has the rule).

    * every P: each rank's 8·k largest coordinates, float16 tables, the backend's ring;
    * below :data:`MANY_WORKERS` workers: :func:`default_sketch_cols` (40·k) columns and
      m = :func:`default_candidates` (32);
    * from it: 16·k columns and m = :data:`DEFAULT_CANDIDATES` (8), under the same caps (at
      most ``d / (4 * rows)`` columns, at least 256; at most ``d / 8`` candidates).

    Sketched-SGD takes the same shape (``allreduce`` aside: its tables go to a server, which
    widens 16-bit tables and sums them in float32).
    """
    if world_size is None or world_size < MANY_WORKERS:
        cols, candidates = default_sketch_cols(d, k, rows), default_candidates(d, k)
    else:
        cols = max(1, min(16 * k, max(256, d // (4 * rows))))
        candidates = max(1, min(DEFAULT_CANDIDATES, d // (8 * k)))
    return SketchShape(cols, candidates, "backend", torch.float16, prefilter=8)


def streaming_options(d: int, k: int, given: dict[str, Any]) -> dict[str, Any]:
    """The options streamed gs runs with, at every P: ``given`` (an option set to None
    counts as not given) over its own shape, the small-P width and m
    (:func:`default_sketch_cols`, :func:`default_candidates`) in float32 tables summed by
    the backend's ring, and never a pre-filter (it sketches every coordinate, bucket by
    bucket). A bad value is left for :func:`gssgd.aggregators.build_options` to refuse
    with its message."""
    chosen = {n: v for n, v in given.items() if v is not None}
    rows = chosen.get("rows", DEFAULT_ROWS)
    rows = rows if isinstance(rows, int) and rows > 0 else DEFAULT_ROWS
    shape = SketchShape(default_sketch_cols(d, k, rows), default_candidates(d, k), "backend",
                        torch.float32, 0)
    return {**shape.options(), **chosen, "prefilter": 0}
