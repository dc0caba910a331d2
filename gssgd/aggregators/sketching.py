"""What the sketching methods share: their options and the pieces of their ``step``.

Sketched-SGD (:mod:`~gssgd.aggregators.sketched_sgd`), gs-SGD (:mod:`~gssgd.aggregators.gs`) and
streaming gs-SGD (:mod:`gssgd.ddp.streaming_gs`) each Count-Sketch their error-compensated vector,
send the table, and recover heavy coordinates from the summed sketch. This module holds what
they have in common, so each ``step`` shows only its own communication:

* :class:`SketchedOptions`: the sketch's shape (rows, columns, exact candidates, hash seed),
  its wire dtype and the local pre-filter; unset shape fields are filled by
  :func:`~gssgd.aggregators.sketching.sketch_default_shape`.
* :class:`SketchingAggregator`: the step's sketch (larger ones during a density warm-up),
  the pre-filtered vector it sketches, and the 16-bit table payload and its widening.

The module ends with the sizing rule of every sketch (:func:`sketch_default_shape`,
:data:`DEFAULT_ROWS`, :func:`default_candidates`, :func:`default_sketch_cols`): how many
rows, columns and exact candidates a sketch of ``d`` coordinates and ``k`` survivors gets.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import torch

from gssgd.aggregators.base import Aggregator
from gssgd.aggregators.feedback import SKETCH_RULES, ErrorFeedback
from gssgd.aggregators.options import PAYLOAD_DTYPES
from gssgd.aggregators.topk import TopkOptions
from gssgd.selection import keep_largest
from gssgd.sketch import CountSketch, HashCache, hash_cache_bytes
from gssgd.validate import bad_value, check_int, is_int

__all__ = [
    "DEFAULT_CANDIDATES",
    "DEFAULT_ROWS",
    "HASH_CACHE_LIMIT",
    "MANY_WORKERS",
    "SketchShape",
    "SketchedOptions",
    "SketchingAggregator",
    "default_candidates",
    "default_sketch_cols",
    "sketch_default_shape",
    "streaming_options",
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


#: Largest hash cache (bytes) a sketching aggregator keeps by default.
HASH_CACHE_LIMIT = 1 << 30


@dataclass(frozen=True)
class SketchedOptions(TopkOptions):
    """Sketch options shared by Sketched-SGD and gs-SGD.

    Attributes:
        rows: hash rows of the Count Sketch (odd).
        cols: buckets per row, or None for :func:`~gssgd.aggregators.sketching.default_sketch_cols`.
        candidates: m; the sketch proposes m * k candidates (capped at d) whose exact
            values are then fetched; None for :func:`~gssgd.aggregators.sketching.default_candidates`.
        seed: hash seed shared by all ranks.
        hash_cache: keep every coordinate's buckets in memory
            (:func:`gssgd.sketch.hash_cache_bytes`: ``16 * d`` bytes for one row,
            ``12 * rows * d`` for more) for speed; None (default) caches when that is at
            most ``HASH_CACHE_LIMIT`` bytes.
        table_dtype: dtype of the sketch tables on the wire: torch.float32, or float16 /
            bfloat16 to halve the sketch's bytes (scaled by 1/P before the cast, like
            dense's 16-bit payload). Only the choice of candidates sees the rounding: the
            exact round, the update and the residuals stay in the gradient's dtype.
            float16 overflows past 65504 per bucket (of the mean over ranks); bfloat16
            does not, at a coarser rounding. None: by the number of workers. (Sketched-SGD's
            reference sends float16 sketches too: its ``transferHalf``.)
        prefilter: 0 (sketch all of ``a_p``), or f >= 1: each rank sketches only
            its own ``f * k`` largest coordinates of ``a_p`` (a local pre-filter). The
            summed sketch then holds at most ``P * f * k`` coordinates instead of the whole
            gradient's tail, so a narrow table recovers the heavy ones more cleanly; the
            exact round still sums all of ``a_p`` at the candidates, so no mass is lost.
            Costs a local top-``f*k`` selection per step. None: by the number of workers.

    ``cols``, ``candidates``, ``table_dtype`` and ``prefilter`` left None take
    :func:`~gssgd.aggregators.sketching.sketch_default_shape`'s values
    for the run's d, k and number of workers.
    """

    rows: int = DEFAULT_ROWS
    cols: int | None = None
    candidates: int | None = None
    seed: int = 0
    hash_cache: bool | None = None
    table_dtype: torch.dtype | None = None
    prefilter: int | None = None
    feedback_rules: ClassVar[dict[str, type[ErrorFeedback]]] = SKETCH_RULES
    #: the fields :meth:`resolved` fills from the sizing rule
    #: (:func:`~gssgd.aggregators.sketching.sketch_default_shape`) when left None
    shape_fields: ClassVar[tuple[str, ...]] = ("cols", "candidates", "table_dtype", "prefilter")

    def use_hash_cache(self, d: int) -> bool:
        """Whether a sketch of length ``d`` should cache its hashes."""
        if self.hash_cache is None:
            return hash_cache_bytes(d, self.rows) <= HASH_CACHE_LIMIT
        return self.hash_cache

    def make_sketch(self, d: int, hashes: HashCache, cols: int | None = None,
                    cache: bool = True) -> CountSketch:
        """The Count Sketch these options describe, for vectors of length ``d``, keeping its
        hash tables in ``hashes`` when :meth:`use_hash_cache` says so (and ``cache``: a
        sketch of one step, such as a density warm-up's, hashes as it goes instead)."""
        return CountSketch(
            d,
            rows=self.rows,
            cols=self.cols if cols is None else cols,
            seed=self.seed,
            cache_hashes=hashes if cache and self.use_hash_cache(d) else False,
        )

    def resolved(self, d: int, k: int, world_size: int | None = None) -> SketchedOptions:
        """These options with every default (None) among :attr:`shape_fields` filled in
        from :func:`~gssgd.aggregators.sketching.sketch_default_shape` for ``d``, ``k`` and
        ``world_size`` ranks (None: unknown, the small-P shape): one rule sizes both
        sketching methods."""
        shape = sketch_default_shape(d, k, self.rows, world_size)
        defaults = {name: getattr(shape, name) for name in self.shape_fields}
        if self.feedback == "fetchsgd":
            defaults["prefilter"] = 0  # no residual would keep what a pre-filter drops
        return replace(self, **{n: v for n, v in defaults.items() if getattr(self, n) is None})

    def num_candidates(self, k: int, d: int) -> int:
        """``m * k`` candidates, capped at ``d``."""
        return min(self.candidates * k, d)

    def shape_at(self, d: int, k: int, step_k: int) -> tuple[int, int]:
        """Columns and candidates of a step that sends ``step_k``: the options' own (``cols``
        resolved, ``m * k`` candidates) when ``step_k == k``, else :meth:`warmup_shape`'s."""
        cols, candidates = self.cols, self.num_candidates(k, d)
        assert cols is not None, "resolve the options first (gssgd.aggregators.build_options)"
        if step_k == k:
            return cols, candidates
        return self.warmup_shape(d, k, step_k, cols, candidates)

    def warmup_shape(
        self, d: int, k: int, step_k: int, cols: int, candidates: int
    ) -> tuple[int, int]:
        """Columns and candidates for a density warm-up step that sends ``step_k > k``.

        Both grow in proportion to ``step_k / k`` from the steady ``cols`` and
        ``candidates`` (rounded up), within the sizing rule's caps (``d / (4 * rows)``
        columns, at least 256; ``d / 8`` candidates, at least ``step_k``), so a warm-up step
        recovers its larger k as well as a steady step recovers k, and its bytes follow the
        schedule.
        """
        cols_t = max(cols, min(-(-cols * step_k // k), max(256, d // (4 * self.rows))))
        cands_t = min(d, max(step_k, min(-(-candidates * step_k // k), d // 8)))
        return cols_t, cands_t

    def __post_init__(self) -> None:
        super().__post_init__()
        if not is_int(self.rows) or self.rows < 1 or self.rows % 2 == 0:
            raise bad_value(
                "rows",
                self.rows,
                "it must be an odd integer >= 1 so the median of the rows is one of them",
                "For example rows=5.",
            )
        if self.cols is not None and (not is_int(self.cols) or self.cols < 1):
            raise bad_value("cols", self.cols, "it must be an integer >= 1 or None",
                            "Leave it None.")
        if self.candidates is not None and (not is_int(self.candidates) or self.candidates < 1):
            raise bad_value(
                "candidates",
                self.candidates,
                "it must be an integer >= 1 or None",
                "For example 32.",
            )
        if not is_int(self.seed) or self.seed < 0:
            raise bad_value("seed", self.seed, "it must be an integer >= 0", "For example seed=0.")
        if self.hash_cache not in (None, True, False):
            raise bad_value(
                "hash_cache",
                self.hash_cache,
                "it must be None, True or False",
                "Leave it None to cache when it fits.",
            )
        if self.table_dtype is not None and self.table_dtype not in PAYLOAD_DTYPES.values():
            raise bad_value(
                "table_dtype",
                self.table_dtype,
                "it must be torch.float32, torch.float16 or torch.bfloat16",
                "Use torch.float16 to halve the sketch's bytes.",
            )
        if self.prefilter is not None:
            check_int("prefilter", self.prefilter, 0, fix="0: off; f: each rank sketches its f*k "
                      "largest coordinates. Use 8, or 0 to sketch the whole vector.")
        if self.feedback == "fetchsgd" and self.prefilter:
            raise bad_value("prefilter", self.prefilter,
                            "feedback='fetchsgd' keeps no residual on the ranks, so a pre-filter "
                            "would lose what it drops", "Use prefilter=0 with feedback='fetchsgd'.")


class SketchingAggregator(Aggregator):
    """Base of the sketching methods: a steady sketch and ``m*k`` candidates, and the
    pieces of a sketching step.

    Attributes:
        cols: the steady sketch's columns.
        sketch: the steady-state :class:`~gssgd.sketch.CountSketch` (the options' shape).
        num_candidates: ``m * k``, the exact round's candidates (capped at d).
    """

    Options: ClassVar[type[SketchedOptions]] = SketchedOptions
    options: SketchedOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._warm_sketch: CountSketch | None = None  # the density warm-up's current one
        self.num_candidates = self.options.num_candidates(self.k, self.d)
        self._build_sketch(self.options.cols)

    def _build_sketch(self, cols: int) -> None:
        """The steady sketch, of ``cols`` columns (gs-SGD's guard may grow it later)."""
        self.cols = cols
        self.sketch = self._new_sketch(cols)

    def _new_sketch(self, cols: int | None = None, cache: bool = True) -> CountSketch:
        """Sketching methods: an empty sketch of ``d`` coordinates, ``cols`` columns (None:
        the options' own) and the options' rows, hashes and table dtype; ``cache=False``
        for a sketch that lives a step or two (its hash tables would outlive it)."""
        return self.options.make_sketch(self.d, self.hashes, cols, cache=cache)

    def _sketch_of_step(self, like: torch.Tensor) -> tuple[CountSketch, int]:
        """Sketching methods: this step's empty sketch (on the device and in the dtype of
        ``like``, the error-compensated vector: float32 at least) and candidate count: the
        steady ``self.sketch`` and ``self.num_candidates``, or, during a density warm-up,
        larger ones (:meth:`SketchedOptions.warmup_shape`). The warm-up's shape changes
        from step to step, so its sketch hashes as it goes (no cached hash tables) and is
        kept only while the next step has the same shape."""
        if self.step_k == self.k:
            self._warm_sketch = None
            self.sketch = self.sketch.to(like.device, like.dtype).zero_()
            return self.sketch, self.num_candidates
        cols, candidates = self.options.warmup_shape(
            self.d, self.k, self.step_k, self.sketch.cols, self.num_candidates
        )
        warm = self._warm_sketch
        if warm is None or warm.cols != cols:
            warm = self._new_sketch(cols, cache=False)
        self._warm_sketch = warm.to(like.device, like.dtype).zero_()
        return self._warm_sketch, candidates

    def _warmup_contribution(self, accumulated: torch.Tensor, k: int) -> None:
        """A warm-up step sent dense contributes all of ``a_p``: its sketch and exact round
        would have summed every coordinate (a pre-filter only narrows what is sketched)."""
        return None

    def _prefiltered(self, accumulated: torch.Tensor, k: int) -> torch.Tensor:
        """Sketching methods: what this rank sketches: ``a_p``, or with ``prefilter`` f >= 1
        only its ``f * k`` largest coordinates (the rest zero)."""
        f = self.options.prefilter
        return keep_largest(accumulated, f * k) if f else accumulated

    def _table_payload(self, table: torch.Tensor) -> torch.Tensor:
        """Sketching methods: a table as it goes on the wire, in ``table_dtype`` (a 16-bit
        table is the mean over ranks, scaled by 1/P before the cast, so it fits)."""
        wire = self.options.table_dtype
        if wire == table.dtype:
            return table
        with self._timed("compress"):
            return (table / self.world_size).to(wire)

    def _widened(self, summed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Sketching methods: a summed 16-bit table of means (:meth:`_table_payload`) back
        as the sum, in ``dtype``."""
        return summed.to(dtype).mul_(self.world_size)
