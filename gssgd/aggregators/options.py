"""Typed, validated options of every aggregator (one frozen dataclass per method).

Each dataclass checks its values in ``__post_init__`` and raises a ``ValueError`` that names
the option, the value, the valid range and the fix, before any collective runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import ClassVar

import torch

from gssgd.sketch import CountSketch, HashCache, hash_cache_bytes

__all__ = [
    "CommonOptions",
    "DenseOptions",
    "TopkOptions",
    "SketchedOptions",
    "GSOptions",
    "resolve_k",
    "default_sketch_cols",
    "default_candidates",
    "sketch_default_shape",
    "SketchShape",
    "DEFAULT_DENSITY",
    "MANY_WORKERS",
    "FEEDBACKS",
    "OWN_MOMENTUM_FEEDBACKS",
]

#: What a non-finite gradient does (``CommonOptions.nonfinite``).
NONFINITE_MODES = ("skip", "raise", "propagate")
#: Density used when neither ``density`` nor ``k`` is given.
DEFAULT_DENSITY = 0.01
#: Default rows of a sketch (odd, so the median is one of them; see default_sketch_cols).
DEFAULT_ROWS = 1
#: Largest hash cache (bytes) a sketching aggregator keeps by default.
HASH_CACHE_LIMIT = 1 << 30


def _bad(name: str, value: object, valid: str, fix: str) -> ValueError:
    return ValueError(f"{name}={value!r} is invalid: {valid}. {fix}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def resolve_k(d: int, density: float | None, k: int | None) -> int:
    """The number of coordinates a sparse method sends: ``max(1, round(density * d))`` or ``k``.

    Args:
        d: vector length (>= 1).
        density: fraction in (0, 1], or None (then ``k`` or the default 0.01 is used).
        k: explicit count in [1, d], or None.

    Raises:
        ValueError: both given, or either out of range.
    """
    if not _is_int(d) or d < 1:
        raise _bad("d", d, "it must be an integer >= 1", "Pass the number of gradient elements.")
    if density is not None and k is not None:
        raise ValueError(
            f"both density={density!r} and k={k!r} were given; give only one of them "
            "(k = max(1, round(density * d)) otherwise)."
        )
    if k is not None:
        if not _is_int(k) or not 1 <= k <= d:
            raise _bad("k", k, f"it must be an integer in [1, d={d}]", "Choose a smaller k.")
        return k
    density = DEFAULT_DENSITY if density is None else density
    if (
        isinstance(density, bool)
        or not isinstance(density, (int, float))
        or not math.isfinite(density)
        or not 0 < density <= 1
    ):
        raise _bad("density", density, "it must be a number in (0, 1]", "For example density=0.01.")
    return max(1, round(density * d))


def default_sketch_cols(d: int, k: int, rows: int = 1) -> int:
    """The default sketch width: ``40 * k`` columns, never more than ``d / (4 * rows)``.

    From the sizing study (docs/sizing.md) and the training sweep (docs/study.md): at equal
    bytes, one row of 40·k columns recovers as much of the exact global top-k mass as five
    rows of 10·k once the exact candidate round repairs the estimates, trains to a far higher
    accuracy at density 0.001 (MNIST CNN: 92% against 65% in 400 steps), and costs a fifth of
    the sketching and recovery compute. The cap keeps one round's table under a quarter of
    the gradient: where ``40 * k`` exceeds it, a sketch cannot beat sending the vector.
    """
    return max(1, min(40 * k, max(256, d // (4 * rows))))


def default_candidates(d: int, k: int) -> int:
    """The default ``m``: 32 candidates per selected coordinate, capped so ``m * k <= d / 8``.

    Exact candidates buy more recall per byte than columns (docs/sizing.md).
    """
    return max(1, min(32, d // (8 * k)))


#: From this many workers on, gs-SGD takes its many-workers shape (:func:`sketch_default_shape`).
MANY_WORKERS = 16


@dataclass(frozen=True)
class SketchShape:
    """The sketching methods' default sketch and wire for one (d, k, P): see
    :func:`sketch_default_shape` (``allreduce`` is gs-SGD's only)."""

    cols: int
    candidates: int
    allreduce: str
    table_dtype: torch.dtype
    prefilter: int  # 0: off


def sketch_default_shape(d: int, k: int, rows: int = DEFAULT_ROWS,
                         world_size: int | None = None) -> SketchShape:
    """The defaults of both sketching methods, gs-SGD and Sketched-SGD, as a function of d,
    k and the number of workers P: the one place they are decided (docs/study.md, "Many
    workers", has gs's measurements; "Sketched-SGD sized for P" Sketched-SGD's).

    * P < :data:`MANY_WORKERS` (or unknown): the shape of the small-P studies: one row of
      :func:`default_sketch_cols` (40·k) columns, m = :func:`default_candidates` (32),
      float32 tables summed by recursive doubling (log2 P rounds), and the pre-filter of
      8·k. The pre-filter costs no bytes; on the character LSTM at density 0.001 under
      momentum SGD (P = 4, lr 0.8 and 1.6, three seeds each) it kept every run from the
      sketch collapse that stopped two of six runs without it, at the same loss, and on
      the MNIST CNN (P = 4, density 0.001, three seeds) it changed gs's accuracy by less
      than the seeds' spread (97.81 % against 97.80 %).
    * P >= :data:`MANY_WORKERS`: the many-workers shape. The tables are summed by the
      backend's ring all-reduce, whose ``2(P-1)/P`` payloads per rank do not grow with P
      where recursive doubling's ``log2 P`` do; each rank sketches only its own 8·k largest
      coordinates (the summed sketch then holds at most 8·k·P of them rather than every
      rank's tail, so a narrow table still finds the heavy ones); the tables travel as
      float16 (only the choice of candidates sees the rounding); and the sketch shrinks to
      16·k columns with m = 8. On the MNIST CNN at density 0.001 this shape matched or
      beat 40·k / m = 32 in accuracy at P = 16 and 64 for about a fifth of its bytes.

    The caps of the small-P rules still apply (a table of at most ``d / (4 * rows)`` columns,
    at least 256; at most ``d / 8`` candidates), and gs's collapse guard audits every shape.

    Sketched-SGD takes the same shape (``allreduce`` aside: its tables go to a server, which
    widens 16-bit tables and sums them in float32). Measured on the MNIST CNN at density
    0.001, 400 steps, global batch 128: at P = 4 the pre-filter moved it by less than a
    seed's noise (97.85 % against 97.92 %, no bytes); at P = 16 the many-workers shape cut
    the server's busiest link from 349,980 to 77,820 bytes a step (4.5×) and cost 0.37
    point (97.49 % against 97.86 %, mean of three seeds), where gs lost about 0.1 point to
    it. A higher density buys the accuracy back for fewer bytes than the small-P shape.
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


@dataclass(frozen=True)
class CommonOptions:
    """Options every method takes.

    Attributes:
        nonfinite: what every rank does when a gradient on any rank holds NaN/Inf.
            "skip" (default): skip the step (zero update, residual and momentum untouched).
            "raise": raise FloatingPointError. "propagate": return an all-NaN update on
            every rank (residual, momentum and step count untouched), as DDP's all-reduce
            would hand on the overflow; the mode for ``torch.amp.GradScaler``, which then
            skips ``optimizer.step`` and lowers its scale (the default when the hook is
            given ``scaler=``; see :mod:`gssgd.amp`).
        max_consecutive_skips: after this many non-finite steps in a row every rank raises
            (a model whose parameters went non-finite would otherwise skip forever).
    """

    nonfinite: str = "skip"
    max_consecutive_skips: int = 100
    aliases: ClassVar[dict[str, str]] = {}  #: other names of options (alias -> name)

    def __post_init__(self) -> None:
        if self.nonfinite not in NONFINITE_MODES:
            raise _bad(
                "nonfinite",
                self.nonfinite,
                "it must be 'skip', 'raise' or 'propagate'",
                "Use 'skip', or 'propagate' with torch.amp.GradScaler.",
            )
        if not _is_int(self.max_consecutive_skips) or self.max_consecutive_skips < 1:
            raise _bad(
                "max_consecutive_skips",
                self.max_consecutive_skips,
                "it must be an integer >= 1",
                "For example 100.",
            )

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: The payload dtypes dense's ``dtype`` and gs's ``table_dtype`` take, by name (the names
#: the command line and TrainConfig use).
PAYLOAD_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
_DENSE_DTYPES = tuple(PAYLOAD_DTYPES.values())


@dataclass(frozen=True)
class DenseOptions(CommonOptions):
    """Dense all-reduce. ``dtype``: payload dtype (float32, float16 or bfloat16)."""

    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dtype not in _DENSE_DTYPES:
            raise _bad(
                "dtype",
                self.dtype,
                "it must be torch.float32, torch.float16 or torch.bfloat16",
                "Use torch.float16 for a 16-bit payload.",
            )


#: What ``feedback`` accepts (:class:`TopkOptions`; "fetchsgd" the sketching methods only).
FEEDBACKS: tuple[str, ...] = ("ef", "ef21", "global", "onebit", "fetchsgd")
#: The feedback modes that keep the momentum themselves (the optimizer must not add its own).
OWN_MOMENTUM_FEEDBACKS: tuple[str, ...] = ("global", "onebit", "fetchsgd")


def _check_momentum(value: float, masking: bool = True) -> None:
    if not isinstance(masking, bool):
        raise _bad("momentum_masking", masking, "it must be True or False", "")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise _bad(
            "momentum",
            value,
            "it must be a number in [0, 1) (0 turns local momentum off)",
            "For example momentum=0.9.",
        )


@dataclass(frozen=True)
class TopkOptions(CommonOptions):
    """Options of every sparse method with error feedback (topk, gtopk, sketched, gs).

    The training-recipe tools of Deep Gradient Compression (Lin et al., ICLR 2018):

    Attributes:
        momentum: local momentum ("momentum correction": velocity kept per rank, zeroed
            where delivered unless ``momentum_masking=False``); 0 = off. Not with the
            optimizer's momentum.
        momentum_masking: DGC's masking (True): zero a delivered coordinate's velocity;
            False: momentum SGD exactly at density 1 (:func:`gssgd.ddp.compressed_sgd`).
        warmup_steps: density warm-up: the first ``warmup_steps`` aggregation steps send
            exponentially fewer coordinates, from ``warmup_density`` down to the target
            (:class:`~gssgd.aggregators.schedule.DensityWarmup`); 0 = off.
        warmup_density: the density of the first warm-up step, in (0, 1] (DGC: 0.25).
        local_clip: local gradient clipping: each rank scales its gradient to an l2 norm of
            at most ``local_clip / sqrt(P)`` before it enters the residual, so the sum over
            P ranks stays within about ``local_clip``; None = off.
        feedback: what the error feedback compresses and what the step returns
            (``momentum`` is the momentum of each mode; docs/study.md, "Keep your
            optimizer", has the measurements):

            * ``"ef"`` (default): classic error feedback: compress ``e + g`` (``e + u``
              with DGC's local momentum), return the sparse averaged update.
            * ``"ef21"``: EF21 (Richtarik et al. 2021) and, with ``momentum``, EF21-SGDM
              (Fatkhullin et al. 2023): every rank keeps ``v = momentum*v + g`` (no
              masking), compresses ``e + (v - v_prev)``, and every rank returns the same
              dense estimate ``G += update`` of the ranks' mean ``v``: the optimizer steps
              on a smooth but lagging estimate instead of on sparse bursts. With
              ``momentum=0.9`` and plain SGD it trains, behind the classic feedback under
              momentum SGD; without inner momentum, under momentum SGD or AdamW, it lags
              or diverges (the DDP hook warns).
            * ``"global"``: classic error feedback on ``e + g``, and momentum kept by the
              aggregator on the aggregated update, alike on every rank, with masking:
              ``M[delivered] = 0`` (the coordinates the update carries), then
              ``M = momentum*M + update``; the step returns ``M``. A coordinate's earlier
              velocity stops where a fresh delivery (which carries its accumulated
              gradients) arrives, as DGC masks its local velocity. Needs ``momentum`` > 0
              and plain SGD.
            * ``"onebit"``: 1-bit Adam's compression stage (Tang et al. 2021) with this
              method's compressor: every rank compresses ``e + momentum*m + (1 -
              momentum)*g``, where ``m`` is the last step's update (alike on every rank),
              and the update it returns is the new ``m``: a compressed exponential moving
              average of the gradients. Pair it with
              :class:`~gssgd.optim.FrozenVarianceAdamW` (``momentum`` = its beta1), which
              steps on ``m`` with the variance frozen after a dense warm-up.
            * ``"fetchsgd"`` (Sketched-SGD and gs-SGD only; FetchSGD, Rothchild et al.
              2020): no residual on the ranks; the summed sketch ``S`` of the gradients
              feeds a velocity ``S_u = momentum*S_u + S`` and an error ``S_e += S_u`` kept
              in sketch space (alike on every rank for gs, on the server for Sketched-SGD);
              the top k of ``S_e``'s estimates are delivered, and ``S_e`` and ``S_u`` are
              zeroed in the buckets they touch (the authors' code; subtracting their
              sketch from ``S_e``, as the paper writes it, diverges). One round of
              tables, no exact round (gs needs ``exact=False``) and no density warm-up
              (its tables keep one shape); use plain SGD and ``rows`` > 1 (one row cannot
              tell a bucket's coordinates apart).
    """

    momentum: float = 0.0
    momentum_masking: bool = True
    warmup_steps: int = 0
    warmup_density: float = 0.25
    local_clip: float | None = None
    feedback: str = "ef"
    #: the ``feedback`` modes this method implements
    feedbacks: ClassVar[tuple[str, ...]] = ("ef", "ef21", "global", "onebit")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_momentum(self.momentum, self.momentum_masking)
        if self.feedback not in self.feedbacks:
            sketching = "" if "fetchsgd" in self.feedbacks else (
                " ('fetchsgd' needs a sketching method: sketched or gs)")
            raise _bad("feedback", self.feedback,
                       f"it must be one of {', '.join(self.feedbacks)} for this method"
                       + sketching,
                       "Use 'ef' (the default) or 'ef21' (with momentum=0.9: EF21-SGDM).")
        if self.feedback == "fetchsgd" and self.warmup_steps:
            raise _bad("warmup_steps", self.warmup_steps,
                       "feedback='fetchsgd' keeps its error in tables of one shape, which cannot "
                       "recover a warm-up's larger k", "Use warmup_steps=0 (--warmup-steps 0).")
        if self.feedback == "global" and self.momentum == 0:
            raise _bad("momentum", self.momentum,
                       "feedback='global' is the aggregator's momentum, so it must be in "
                       "(0, 1)", "For example momentum=0.9 (--local-momentum 0.9).")
        if not _is_int(self.warmup_steps) or self.warmup_steps < 0:
            raise _bad("warmup_steps", self.warmup_steps, "it must be an integer >= 0",
                       "For example warmup_steps=100, or 0 for no density warm-up.")
        if (
            isinstance(self.warmup_density, bool)
            or not isinstance(self.warmup_density, (int, float))
            or not 0 < self.warmup_density <= 1
        ):
            raise _bad("warmup_density", self.warmup_density, "it must be a number in (0, 1]",
                       "For example warmup_density=0.25 (DGC's starting density).")
        if self.local_clip is not None and (
            isinstance(self.local_clip, bool)
            or not isinstance(self.local_clip, (int, float))
            or not math.isfinite(self.local_clip)
            or self.local_clip <= 0
        ):
            raise _bad("local_clip", self.local_clip, "it must be a number > 0 or None",
                       "For example local_clip=1.0, or None for no clipping.")


@dataclass(frozen=True)
class SketchedOptions(TopkOptions):
    """Sketch options shared by Sketched-SGD and gs-SGD.

    Attributes:
        rows: hash rows of the Count Sketch (odd).
        cols: buckets per row, or None for :func:`default_sketch_cols`.
        candidates: m; the sketch proposes m * k candidates (capped at d) whose exact
            values are then fetched; None for :func:`default_candidates`.
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
    :func:`sketch_default_shape`'s values for the run's d, k and number of workers.
    """

    rows: int = DEFAULT_ROWS
    cols: int | None = None
    candidates: int | None = None
    seed: int = 0
    hash_cache: bool | None = None
    table_dtype: torch.dtype | None = None
    prefilter: int | None = None
    feedbacks: ClassVar[tuple[str, ...]] = FEEDBACKS
    #: the fields :meth:`resolved` fills from :func:`sketch_default_shape` when left None
    shape_fields: ClassVar[tuple[str, ...]] = ("cols", "candidates", "table_dtype", "prefilter")

    def use_hash_cache(self, d: int) -> bool:
        """Whether a sketch of length ``d`` should cache its hashes."""
        if self.hash_cache is None:
            return hash_cache_bytes(d, self.rows) <= HASH_CACHE_LIMIT
        return self.hash_cache

    def make_sketch(self, d: int, hashes: HashCache, cols: int | None = None) -> CountSketch:
        """The Count Sketch these options describe, for vectors of length ``d``, keeping its
        hash tables in ``hashes`` when :meth:`use_hash_cache` says so."""
        return CountSketch(
            d,
            rows=self.rows,
            cols=self.cols if cols is None else cols,
            seed=self.seed,
            cache_hashes=hashes if self.use_hash_cache(d) else False,
        )

    def resolved(self, d: int, k: int, world_size: int | None = None) -> SketchedOptions:
        """These options with every default (None) among :attr:`shape_fields` filled in
        from :func:`sketch_default_shape` for ``d``, ``k`` and ``world_size`` ranks (None:
        unknown, the small-P shape): one rule sizes both sketching methods."""
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

        Both grow with ``step_k / k`` from the steady ``cols`` and ``candidates``, within the
        sizing rule's caps (``d / (4 * rows)`` columns, at least 256; ``d / 8`` candidates,
        at least ``step_k``), so a warm-up step recovers its larger k as well as a steady
        step recovers k.
        """
        scale = step_k // k
        cols_t = max(cols, min(cols * scale, max(256, d // (4 * self.rows))))
        cands_t = min(d, max(step_k, min(candidates * scale, d // 8)))
        return cols_t, cands_t

    def __post_init__(self) -> None:
        super().__post_init__()
        if not _is_int(self.rows) or self.rows < 1 or self.rows % 2 == 0:
            raise _bad(
                "rows",
                self.rows,
                "it must be an odd integer >= 1 so the median of the rows is one of them",
                "For example rows=5.",
            )
        if self.cols is not None and (not _is_int(self.cols) or self.cols < 1):
            raise _bad("cols", self.cols, "it must be an integer >= 1 or None", "Leave it None.")
        if self.candidates is not None and (not _is_int(self.candidates) or self.candidates < 1):
            raise _bad(
                "candidates",
                self.candidates,
                "it must be an integer >= 1 or None",
                "For example 32.",
            )
        if not _is_int(self.seed) or self.seed < 0:
            raise _bad("seed", self.seed, "it must be an integer >= 0", "For example seed=0.")
        if self.hash_cache not in (None, True, False):
            raise _bad(
                "hash_cache",
                self.hash_cache,
                "it must be None, True or False",
                "Leave it None to cache when it fits.",
            )
        if self.table_dtype is not None and self.table_dtype not in _DENSE_DTYPES:
            raise _bad(
                "table_dtype",
                self.table_dtype,
                "it must be torch.float32, torch.float16 or torch.bfloat16",
                "Use torch.float16 to halve the sketch's bytes.",
            )
        if self.prefilter is not None and (
            isinstance(self.prefilter, bool) or not isinstance(self.prefilter, int)
            or self.prefilter < 0
        ):
            raise _bad("prefilter", self.prefilter,
                       "it must be an integer >= 0 (0: off; f: each rank sketches its f*k "
                       "largest coordinates)", "Use 8, or 0 to sketch the whole vector.")
        if self.feedback == "fetchsgd" and self.prefilter:
            raise _bad("prefilter", self.prefilter,
                       "feedback='fetchsgd' keeps no residual on the ranks, so a pre-filter "
                       "would lose what it drops", "Use prefilter=0 with feedback='fetchsgd'.")


@dataclass(frozen=True)
class GSOptions(SketchedOptions):
    """gs-SGD options on top of the sketch options.

    Attributes:
        exact: fetch the exact sums of the candidates in a second all-reduce (True), or
            use the sketch's estimates (False, one round; mass is not conserved).
        allreduce: how the sketch tables are summed: "recursive_doubling" or "backend";
            None: by the number of workers (:func:`sketch_default_shape`).
        guard: what to do when an audit finds the sketch collapsed (see
            :mod:`gssgd.aggregators.guard`; audits cost one dense all-reduce at step 20,
            then spaced to add at most 5 % of gs's bytes, every 200 steps or more): "grow"
            doubles ``cols`` and the ``m*k`` candidates (every
            rank alike, at most twice, up to ``d / (2 * rows)`` columns and ``d / 8``
            candidates) and raises :class:`~gssgd.aggregators.guard.SketchCollapseError` on
            a further collapse; "raise" raises it at once, with a message saying what to
            change; "off" never audits.
        reuse: R >= 1: sketch only every R-th step after any density warm-up; the R - 1
            steps between skip the table all-reduce and fetch the exact sums at the last
            sketched step's ``m*k`` candidates (the same on every rank, so still no
            indices), keeping the top k of them. Ok-Topk (Li & Hoefler, PPoPP 2022) reuses
            its selection threshold across steps the same way: the heavy coordinates of an
            error-fed gradient drift slowly, and what falls outside the kept set waits in
            the residual for the next sketch. 1 (default): sketch every step. Needs the
            exact round (``exact=True``). A sketch the guard has grown, or a step with no
            kept set, sketches. The collapse guard audits and counts sketching steps only.
        chunk: C >= 1: select by chunk of C consecutive coordinates, as DeMo and SparseLoCo
            do (:mod:`gssgd.aggregators.chunked`): the m*k candidates are shared out over
            the chunks in proportion to their lengths, the k delivered in proportion to the
            candidates each holds, and each chunk takes its largest; the guard then
            measures against the exact vector's top k chosen the same way. At most k
            chunks (C >= ceil(d / k)): with more, the lower chunks would take every share
            and the rest never move. 0 (default): one selection over the whole vector.
            Needs the exact round. Measured on the character LSTM at 16 workers
            (docs/study.md): at density 0.001 chunks of 4,096 and 1,024 made gs diverge;
            at 0.01 (DeMo and SparseLoCo select 1.56 % of each chunk) chunks of 4,096
            trained but ended behind one global selection (+6.1 against +5.2 % above
            dense).

    ``allreduce`` left None takes :func:`sketch_default_shape`'s value too.
    """

    exact: bool = True
    allreduce: str | None = None
    guard: str = "grow"
    reuse: int = 1
    chunk: int = 0
    shape_fields: ClassVar[tuple[str, ...]] = SketchedOptions.shape_fields + ("allreduce",)

    def resolved(self, d: int, k: int, world_size: int | None = None) -> GSOptions:
        """:meth:`SketchedOptions.resolved`, and ``chunk`` checked against ``d`` and ``k``.

        Raises:
            ValueError: more chunks than k (each must get a share of every step's k).
        """
        chunks = -(-d // self.chunk) if self.chunk else 0
        if chunks > k:
            raise _bad("chunk", self.chunk,
                       f"it cuts d={d} into {chunks} chunks, more than the k={k} coordinates "
                       "a step delivers, so the lower chunks would take every share and the "
                       "rest would never move",
                       f"Use chunk >= ceil(d / k) = {-(-d // k)}, or a higher density.")
        return super().resolved(d, k, world_size)  # type: ignore[return-value]

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.exact, bool):
            raise _bad("exact", self.exact, "it must be True or False", "Use exact=True.")
        if self.allreduce not in (None, "recursive_doubling", "backend"):
            raise _bad(
                "allreduce",
                self.allreduce,
                "it must be 'recursive_doubling' or 'backend'",
                "Use 'backend' for a bandwidth-optimal ring at large P.",
            )
        if self.guard not in ("grow", "raise", "off"):
            raise _bad("guard", self.guard, "it must be 'grow', 'raise' or 'off'", "Use 'grow'.")
        if not _is_int(self.reuse) or self.reuse < 1:
            raise _bad("reuse", self.reuse,
                       "it must be an integer >= 1 (1: sketch every step; R: every R-th)",
                       "Use reuse=1, or for example reuse=2 to sketch every other step.")
        if self.reuse > 1 and not self.exact:
            raise _bad("reuse", self.reuse,
                       "reusing the candidate set needs the exact round, which exact=False "
                       "turns off", "Use exact=True with reuse > 1, or reuse=1.")
        if not _is_int(self.chunk) or self.chunk < 0:
            raise _bad("chunk", self.chunk,
                       "it must be an integer >= 0 (0: one selection over the whole vector; "
                       "C: by chunk of C coordinates)", "For example chunk=4096 (SparseLoCo's).")
        if self.chunk and not self.exact:
            raise _bad("chunk", self.chunk,
                       "selecting by chunk needs the exact round, which exact=False turns off",
                       "Use exact=True with chunk, or chunk=0.")
        if self.feedback == "fetchsgd" and self.exact:
            raise _bad("exact", self.exact,
                       "feedback='fetchsgd' keeps the error in sketch space and has no exact "
                       "round", "Pass exact=False (--no-exact) with feedback='fetchsgd'.")
