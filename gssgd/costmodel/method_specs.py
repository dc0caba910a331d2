"""What fixes a benchmark method's message pattern (:class:`MethodSpec`) and its traffic.

A benchmark method is a registered aggregator method of :mod:`gssgd.methods` or one of its
variants (``gs-backend``, ``dense16``, ...). :func:`method_spec` resolves its sizes exactly
as :func:`gssgd.make_aggregator` would, then applies the variant's overrides; nothing here
is keyed on a method's name, so a method registered later is benchmarked and modelled
like the built-in ones. :func:`traffic` is the aggregator's own ``traffic`` formula.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from gssgd.aggregators import build_options
from gssgd.aggregators.base import index_dtype
from gssgd.aggregators.options import resolve_k
from gssgd.aggregators.sketching import DEFAULT_ROWS, streaming_options
from gssgd.comm import Traffic
from gssgd.methods import BENCH_VARIANTS, get_method, get_variant
from gssgd.validate import check_int

__all__ = [
    "DEFAULT_METHODS",
    "VARIANTS",
    "MethodSpec",
    "method_spec",
    "traffic",
    "warmup_traffic",
]


class _BenchVariants(Mapping[str, str]):
    """Benchmark name -> one-line description, of every registered aggregator method and
    variant: read from :data:`gssgd.methods.BENCH_VARIANTS` on every access, so a method
    registered after this module's import is listed (and accepted by ``--methods``)."""

    @staticmethod
    def _current() -> dict[str, str]:
        return {
            name: variant.summary
            for name, (method, variant) in BENCH_VARIANTS.items()
            if not method.is_builtin
        }

    def __getitem__(self, name: str) -> str:
        return self._current()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())

    def __repr__(self) -> str:
        return f"VARIANTS({self._current()!r})"


#: Benchmark method names (an aggregator method of :data:`gssgd.METHODS`, or one of its
#: variants) -> description, in registration order; a live view of the registry.
VARIANTS: Mapping[str, str] = _BenchVariants()

#: What ``gssgd bench comm`` runs unless told otherwise (the methods registered when this
#: module was imported; the command line takes its default from :data:`VARIANTS`).
DEFAULT_METHODS: tuple[str, ...] = tuple(VARIANTS)

_DTYPE_OF_BYTES = {4: torch.float32, 2: torch.float16}


@dataclass(frozen=True)
class MethodSpec:
    """Everything that fixes one benchmark method's message pattern.

    Attributes:
        name: the benchmark name (a method or variant of :data:`gssgd.methods.BENCH_VARIANTS`).
        aggregator: the :data:`gssgd.AGGREGATORS` name it runs.
        d, k: vector length and coordinates per rank (``k = d`` for dense).
        value_bytes: bytes of a value on the wire (4; 2 for a 16-bit dense payload).
        index_bytes: bytes of an index (4 when ``d < 2^31``, else 8).
        rows, cols, candidates: the sketch shape and m (0 for methods without a sketch).
        table_bytes: bytes of a sketch-table entry on the wire (4; 2 for 16-bit tables).
        exact: gs only: whether the exact second round runs.
        allreduce: gs only: "recursive_doubling" or "backend".
        exchange: gTop-k only: "doubling" (recursive doubling) or "tree" (its authors'
            reduce to rank 0 and broadcast).
        prefilter: gs only: each rank sketches its ``prefilter * k`` largest coordinates
            (0: all of them); no change to the bytes.
        seed: the hash seed of the sketching methods.
        warmup_steps, warmup_density: the density warm-up (sparse methods; 0 steps: none):
            the first ``warmup_steps`` steps send more, from ``warmup_density`` down
            (:class:`gssgd.aggregators.options.DensityWarmup`).
        rank: PowerSGD's rank r (0 for the other methods).
        shapes: the layer shapes the vector concatenates, for a method that compresses by
            shape (PowerSGD); None for the others.
    """

    name: str
    aggregator: str
    d: int
    k: int
    value_bytes: int = 4
    index_bytes: int = 4
    rows: int = 0
    cols: int = 0
    candidates: int = 0
    table_bytes: int = 4
    exact: bool = True
    allreduce: str = "recursive_doubling"
    exchange: str = "doubling"
    prefilter: int = 0
    seed: int = 0
    warmup_steps: int = 0
    warmup_density: float = 0.25
    rank: int = 0
    shapes: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        if self.shapes is not None:  # from JSON: lists (a spec is hashed, cached)
            object.__setattr__(self, "shapes", tuple(tuple(s) for s in self.shapes))

    @property
    def num_candidates(self) -> int:
        """``C = min(m * k, d)``: the coordinates whose exact values the second round fetches."""
        return min(self.candidates * self.k, self.d)

    @property
    def sketch_bytes(self) -> int:
        """``S = rows * cols * T``: one sketch table on the wire (``T``: ``table_bytes``)."""
        return self.rows * self.cols * self.table_bytes

    def aggregator_options(self) -> dict[str, Any]:
        """Keyword arguments of :func:`gssgd.make_aggregator` (after ``name`` and ``d``).

        Read generically from the fields of the aggregator's options dataclass, so a
        registered method gets its spec's shape back without a case of its own.
        """
        cls = get_method(self.aggregator).aggregator
        assert cls is not None
        names = {f.name for f in dataclasses.fields(cls.Options)}
        opts: dict[str, Any] = {} if cls.sends_all else {"k": self.k}
        if "dtype" in names:
            opts["dtype"] = _DTYPE_OF_BYTES[self.value_bytes]
        if "rows" in names and self.rows:
            opts.update(rows=self.rows, cols=self.cols, candidates=self.candidates, seed=self.seed)
        if "exact" in names:
            opts["exact"] = self.exact
        if "allreduce" in names:
            opts["allreduce"] = self.allreduce
        if "exchange" in names:
            opts["exchange"] = self.exchange
        if "prefilter" in names:
            opts["prefilter"] = self.prefilter
        if "guard" in names:
            # Every timed step must have the same message pattern: the collapse guard's
            # audits (at step 20, then every 200 steps or more) are left out of the
            # benchmark.
            opts["guard"] = "off"
        if "table_dtype" in names:
            opts["table_dtype"] = _DTYPE_OF_BYTES[self.table_bytes]
        if "warmup_steps" in names and self.warmup_steps:
            opts.update(warmup_steps=self.warmup_steps, warmup_density=self.warmup_density)
        if "rank" in names and self.rank:
            opts["rank"] = self.rank
        if "shapes" in names and self.shapes is not None:
            opts["shapes"] = self.shapes
        return opts

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready copy (what ``results.json`` stores under ``spec``)."""
        return dataclasses.asdict(self)


def method_spec(
    name: str,
    d: int,
    density: float | None = None,
    *,
    k: int | None = None,
    rows: int = DEFAULT_ROWS,
    cols: int | None = None,
    candidates: int | None = None,
    seed: int = 0,
    warmup_steps: int = 0,
    warmup_density: float = 0.25,
    world_size: int | None = None,
    shapes: tuple[tuple[int, ...], ...] | None = None,
    streamed: bool = False,
) -> MethodSpec:
    """The :class:`MethodSpec` of benchmark method ``name`` for vectors of length ``d``.

    Args:
        name: a registered aggregator method or one of its variants (``gs-backend``, ...).
        d: gradient length.
        density: fraction of coordinates sent (``k = max(1, round(density * d))``).
        k: the count instead of ``density``.
        rows: sketch rows (odd); used by methods with a sketch.
        cols: sketch columns; None for the aggregators' default
            (:func:`gssgd.aggregators.sketching.sketch_default_shape`). ``gs-small`` uses a
            quarter of it (at least 256).
        candidates: m; the sketch proposes ``m * k`` candidates; None for the aggregators'
            default (:func:`gssgd.aggregators.sketching.sketch_default_shape`).
        seed: hash seed.
        warmup_steps, warmup_density: a density warm-up, for a method whose options take
            one (others ignore it): see :func:`warmup_traffic`.
        world_size: the number of workers the method's defaults are resolved for (gs's
            shape depends on it: :func:`gssgd.aggregators.sketching.sketch_default_shape`);
            None: the defaults below 16 workers.
        shapes: the layer shapes, for PowerSGD (None: one near-square matrix).
        streamed: gs as the DDP hook streams it (its sizes:
            :func:`gssgd.aggregators.sketching.streaming_options`; ``world_size`` changes none).

    Returns:
        The spec, every size resolved as :func:`gssgd.make_aggregator` would (through
        :func:`gssgd.aggregators.build_options`), then the variant's overrides applied.

    Raises:
        ValueError: an unknown name (the message lists the valid ones), or a bad size.
    """
    method, variant = get_variant(name)
    cls = method.aggregator
    assert cls is not None
    names = {f.name for f in dataclasses.fields(cls.Options)}
    shape = {"rows": rows, "cols": cols, "candidates": candidates, "seed": seed,
             "warmup_steps": warmup_steps, "warmup_density": warmup_density,
             "shapes": shapes}  # fmt: skip
    given = {n: v for n, v in shape.items() if n in names}
    kk = resolve_k(d, density, None if cls.sends_all else k)  # validates d and the level
    if streamed:
        given = streaming_options(d, kk, given)
    level = {"density": density} if cls.sends_all else {"density": None, "k": kk}
    _, kk, opts = build_options(method.name, d, world_size=world_size, **level, **given)
    return _spec_of_options(name, method.name, d, kk, variant.apply(opts))


def _spec_of_options(name: str, aggregator: str, d: int, k: int, opts: Any) -> MethodSpec:
    """The spec of resolved aggregator options ``opts``: each field read from the options
    the aggregator has, the spec's default where it has none."""
    return MethodSpec(
        name,
        aggregator,
        d,
        k,
        value_bytes=getattr(opts, "dtype", torch.float32).itemsize,
        index_bytes=index_dtype(d).itemsize,
        rows=getattr(opts, "rows", 0),
        cols=getattr(opts, "cols", 0) or 0,
        candidates=getattr(opts, "candidates", 0) or 0,
        table_bytes=getattr(opts, "table_dtype", torch.float32).itemsize,
        exact=getattr(opts, "exact", True),
        allreduce=getattr(opts, "allreduce", "recursive_doubling"),
        exchange=getattr(opts, "exchange", "doubling"),
        prefilter=getattr(opts, "prefilter", 0),
        seed=getattr(opts, "seed", 0),
        warmup_steps=getattr(opts, "warmup_steps", 0),
        warmup_density=getattr(opts, "warmup_density", 0.25),
        rank=getattr(opts, "rank", 0),
        shapes=getattr(opts, "shapes", None),
    )


def traffic(spec: MethodSpec, world_size: int, *, step: int | None = None) -> Traffic:
    """Bytes, rounds and critical-path bytes of one step of ``spec`` on ``world_size`` ranks.

    The method's own formula: its aggregator's ``traffic`` classmethod (built from the
    patterns of :mod:`gssgd.comm`, the one place byte formulas live).

    Args:
        spec: the method (see :func:`method_spec`).
        world_size: P >= 1.
        step: the 0-based aggregation step, whose k and sketch a density warm-up sets
            (``spec.warmup_steps``); None: the steady state after any warm-up.

    Returns:
        The :class:`~gssgd.comm.Traffic` of that step (the first step's rank-agreement
        check left out).

    Raises:
        ValueError: ``world_size`` < 1 or a negative ``step``, or an unknown aggregator.
        NotImplementedError: the method does not describe its traffic.
    """
    p = world_size
    check_int("world_size", p, 1)
    if step is not None:
        check_int("step", step, 0, fix="Or None for the steady state.")
    cls, k, opts = build_options(spec.aggregator, spec.d, None, **spec.aggregator_options())
    if step is None or not spec.warmup_steps:  # the same at every step: any plugin's formula
        return cls.traffic(spec.d, k, opts, p)
    return cls.traffic(spec.d, k, opts, p, step=step)


@functools.lru_cache(maxsize=4096)
def warmup_traffic(spec: MethodSpec, world_size: int) -> Traffic:
    """The summed traffic of the density warm-up's ``spec.warmup_steps`` steps (steps
    0 .. warmup_steps - 1; all zero without a warm-up).

    Each distinct k of the schedule (about ``log2(k0 / k) + 1`` of them) is computed once,
    and each (spec, world size) once a process (``advise`` asks again for every link).
    """
    total = Traffic.none(world_size)
    cls, k, opts = build_options(spec.aggregator, spec.d, None, **spec.aggregator_options())
    by_k: dict[int, Traffic] = {}
    for t in range(spec.warmup_steps):
        k_t = cls.k_at_step(spec.d, k, opts, t)
        if k_t not in by_k:
            by_k[k_t] = traffic(spec, world_size, step=t)
        total = total + by_k[k_t]
    return total
