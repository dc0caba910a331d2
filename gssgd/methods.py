"""The registry of methods: every way gssgd can average gradients, in one place.

Each :class:`Method` is one name with one code path:

* a gssgd **aggregator** (``dense``, ``topk``, ``gtopk``, ``sketched``, ``gs``,
  ``powersgd``): a class of
  :mod:`gssgd.aggregators` with its options dataclass and its ``traffic`` formula; it runs
  through :func:`gssgd.make_aggregator`, the DDP hook (:mod:`gssgd.ddp`), ``gssgd train``,
  ``gssgd compare``, ``gssgd bench comm`` and the cost model;
* a **DDP built-in** (``ddp-allreduce``: DDP's own all-reduce with no hook, ``ddp-fp16``:
  its ``fp16_compress_hook``, ``torch-powersgd``: PyTorch's PowerSGD hook): training only,
  as references from PyTorch itself. ``torch-powersgd`` was called ``powersgd`` until gssgd
  had a PowerSGD of its own; that name now runs gssgd's (the same algorithm, through the
  same hook, byte accounting and simulated world as every other method).

Everything a layer needs to know about a method is read from here: the training flags that
apply to it are the fields of its options dataclass (plus the settings listed in
``train_settings``), its benchmark variants are listed in ``variants``, its bytes come from
the aggregator's ``traffic`` classmethod, and the cost model's compute constant falls back
to the one of ``cost_like`` until it is calibrated.

A new compressor is one module in ``gssgd/aggregators/`` plus one call::

    from gssgd.methods import Method, register_method
    register_method(Method("randomk", "random-k with error feedback", aggregator=RandomK))

after which ``make_aggregator("randomk", ...)``, ``HookState("randomk", ...)``,
``gssgd train --method randomk`` and ``gssgd bench comm --methods randomk`` all work
(docs/extending.md walks through it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from gssgd.aggregators import AGGREGATORS, Aggregator
from gssgd.aggregators.dense import DenseAllReduce
from gssgd.aggregators.gs import GlobalSketchSGD
from gssgd.aggregators.gtopk import GlobalTopk
from gssgd.aggregators.options import CommonOptions
from gssgd.aggregators.powersgd import PowerSGD
from gssgd.aggregators.sketched_sgd import SketchedSGD
from gssgd.aggregators.topk import LocalTopk

__all__ = [
    "BENCH_VARIANTS",
    "DDP_HOOKS",
    "DDP_REFERENCE_METHOD",
    "FORMER_NAMES",
    "METHODS",
    "REFERENCE_METHOD",
    "SUBJECT_METHOD",
    "Method",
    "Variant",
    "get_method",
    "get_variant",
    "parse_methods",
    "register_method",
    "renamed_hint",
]

#: Option overrides of a variant, fixed or computed from the method's resolved options.
Overrides = Mapping[str, Any] | Callable[[CommonOptions], Mapping[str, Any]]


@dataclass(frozen=True)
class Variant:
    """A benchmark name for a method with some options changed (``gs-backend``, ...).

    Attributes:
        name: the benchmark name (``gssgd bench comm --methods``).
        summary: one line for ``--help`` and the reports.
        overrides: options applied on top of the method's resolved options: a mapping, or
            a function of the resolved options (``gs-small``: a quarter of the columns).
        alias: the method's defaults under a name kept for earlier runs (``gs-backend``,
            ``gs-half``): the same method, so ``gssgd advise`` does not list it twice.
    """

    name: str
    summary: str
    overrides: Overrides = field(default_factory=dict)
    alias: bool = False

    def apply(self, options: CommonOptions) -> CommonOptions:
        """``options`` with this variant's overrides (validated by the dataclass again)."""
        changes = self.overrides(options) if callable(self.overrides) else self.overrides
        return dataclasses.replace(options, **dict(changes))


@dataclass(frozen=True)
class Method:
    """One way to average gradients, as every layer sees it.

    Attributes:
        name: the name users type (``--method``, ``make_aggregator``, ``HookState``).
        summary: one line for ``--help``, tables and reports.
        aggregator: the :class:`~gssgd.aggregators.base.Aggregator` subclass, or None for a
            DDP built-in (trained through DDP's own hooks, not benchmarked by ``bench comm``).
        train_settings: training settings besides the aggregator's options that apply to
            this method (``start_iter``, ``powersgd_rank``, ...); the aggregator's options
            apply by their names (:meth:`option_names`).
        variants: benchmark variants of this method (the method itself is always one).
        cost_like: a method whose calibrated compute constant the cost model uses for this
            one until this one is calibrated (None: itself).
        lr, momentum: the training recipe ``gssgd train`` uses unless told otherwise (SGD's
            learning rate and momentum). None: :func:`gssgd.recipes.sgd_recipe`'s for its
            kind (sparse or not).
        ddp_hook: a DDP built-in's hook, by PyTorch's name: ``"allreduce"`` (DDP's own
            all-reduce, no hook registered), ``"fp16_compress_hook"`` or ``"powerSGD_hook"``;
            "" for a gssgd aggregator.

    Raises:
        ValueError: an empty name, or an aggregator that is not an Aggregator subclass.
    """

    name: str
    summary: str
    aggregator: type[Aggregator] | None = None
    train_settings: tuple[str, ...] = ()
    variants: tuple[Variant, ...] = ()
    cost_like: str | None = None
    lr: float | None = None
    momentum: float | None = None
    ddp_hook: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "," in self.name:
            raise ValueError(
                f"Method name {self.name!r} is invalid: it must be a non-empty string without "
                "commas (method lists are comma-separated). For example Method('randomk', ...)."
            )
        if self.aggregator is not None and not (
            isinstance(self.aggregator, type) and issubclass(self.aggregator, Aggregator)
        ):
            raise ValueError(
                f"Method {self.name!r}: aggregator={self.aggregator!r} is invalid: it must be "
                "a subclass of gssgd.Aggregator (or None for a DDP built-in)."
            )
        if self.ddp_hook and (self.ddp_hook not in DDP_HOOKS or self.aggregator is not None):
            raise ValueError(
                f"Method {self.name!r}: ddp_hook={self.ddp_hook!r} is invalid: a DDP built-in "
                f"(aggregator=None) names one of {DDP_HOOKS}; an aggregator's method leaves it "
                "empty."
            )

    @property
    def is_builtin(self) -> bool:
        """Whether this is one of DDP's own hooks (no gssgd aggregator)."""
        return self.aggregator is None

    @property
    def uncompressed(self) -> bool:
        """Whether this gssgd aggregator sends the gradient uncompressed (dense: every
        coordinate, at its payload's precision): the kind of method every compressor is
        measured against, with no residual, rank or shape to name it by. DDP's built-ins
        are not gssgd aggregators (False)."""
        return self.aggregator is not None and not self.aggregator.compresses

    @property
    def by_shape(self) -> bool:
        """Whether the method compresses each tensor by its shape (PowerSGD): its rank, not
        a density, sets its message."""
        return self.aggregator is not None and self.aggregator.takes_shapes

    @property
    def sparse(self) -> bool:
        """Whether the method sends k of d coordinates (takes ``density`` / ``k``)."""
        return self.aggregator is not None and not self.aggregator.sends_all

    def option_names(self) -> tuple[str, ...]:
        """The aggregator's option names (``k`` included for a sparse method)."""
        return () if self.aggregator is None else self.aggregator.option_names()



#: PyTorch's DDP hooks a built-in method can name (:attr:`Method.ddp_hook`).
DDP_HOOKS: tuple[str, ...] = ("allreduce", "fp16_compress_hook", "powerSGD_hook")

#: The method every comparison measures the others against: the studies' target, advise's
#: speed-ups, ``gssgd compare``'s "vs dense" column.
REFERENCE_METHOD = "dense"
#: The reference of a comparison that ran only DDP's own methods.
DDP_REFERENCE_METHOD = "ddp-allreduce"
#: The method the package is built around: a study's report says where it placed.
SUBJECT_METHOD = "gs"
#: Names that meant another method in an earlier release (a checkpoint may carry them):
#: old name -> the method's name now.
FORMER_NAMES: dict[str, str] = {"powersgd": "torch-powersgd"}

#: Name -> method, in registration order (the order of ``--help`` and the reports).
METHODS: dict[str, Method] = {}
#: Benchmark name -> (method, variant); a method's own name is a variant without overrides.
BENCH_VARIANTS: dict[str, tuple[Method, Variant]] = {}

#: Settings of the DDP hook that apply to every method through it.
_HOOK_SETTINGS = ("start_iter", "per_bucket")


def register_method(method: Method, *, replace: bool = False) -> Method:
    """Add ``method`` to :data:`METHODS` (and its aggregator to :data:`gssgd.AGGREGATORS`).

    Args:
        method: the method.
        replace: allow replacing a registered method of the same name (tests).

    Returns:
        ``method``, so a module can register and keep it in one line.

    Raises:
        ValueError: the name or one of its variants' names is taken, or the aggregator's
            ``name`` attribute differs from the method's name.
    """
    if method.name in METHODS and not replace:
        raise ValueError(
            f"a method named {method.name!r} is registered already; choose another name "
            "(or pass replace=True to replace it on purpose)."
        )
    if method.aggregator is not None and method.aggregator.name != method.name:
        raise ValueError(
            f"Method {method.name!r}: its aggregator {method.aggregator.__name__} has "
            f"name={method.aggregator.name!r}; set the class attribute name = {method.name!r}."
        )
    variants = (Variant(method.name, method.summary), *method.variants)
    for v in variants:
        owner = BENCH_VARIANTS.get(v.name)
        if owner is not None and owner[0].name != method.name:
            raise ValueError(
                f"benchmark name {v.name!r} of method {method.name!r} is taken by method "
                f"{owner[0].name!r}; name the variant differently."
            )
    if method.name in METHODS:
        unregister_method(method.name)
    METHODS[method.name] = method
    for v in variants:
        BENCH_VARIANTS[v.name] = (method, v)
    if method.aggregator is not None:
        AGGREGATORS[method.name] = method.aggregator
    return method


def unregister_method(name: str) -> None:
    """Remove a registered method and its variants (tests that register a toy method)."""
    method = METHODS.pop(name, None)
    if method is None:
        return
    for key in [k for k, (m, _) in BENCH_VARIANTS.items() if m.name == name]:
        del BENCH_VARIANTS[key]
    AGGREGATORS.pop(name, None)


def _choices(names: Iterable[str]) -> str:
    return ", ".join(names)


def get_method(name: str) -> Method:
    """The registered method ``name``.

    Raises:
        ValueError: an unknown name (the message lists the valid ones).
    """
    if name not in METHODS:
        raise ValueError(
            f"unknown method {name!r}; valid methods: {_choices(METHODS)}.{renamed_hint(name)}"
        )
    return METHODS[name]


def get_variant(name: str) -> tuple[Method, Variant]:
    """The method and variant of the benchmark name ``name``.

    Raises:
        ValueError: an unknown name or a DDP built-in (the message lists the valid ones).
    """
    found = BENCH_VARIANTS.get(name)
    if found is None or found[0].is_builtin:
        valid = [n for n, (m, _) in BENCH_VARIANTS.items() if not m.is_builtin]
        raise ValueError(
            f"unknown benchmark method {name!r}; valid methods: {_choices(valid)}. "
            "Pass a comma-separated subset, e.g. --methods dense,topk,gs."
        )
    return found


def renamed_hint(name: str) -> str:
    """For an unknown method ``name`` that looks like another one's old or usual name: a
    sentence naming the method to use (with a leading space), else ""."""
    if name in ("dense16", "fp16"):
        return (" For DDP's fp16 hook use ddp-fp16; for gssgd's 16-bit dense use dense with "
                "dtype float16 (--payload-dtype float16).")
    if name in ("ddp-powersgd", "pytorch-powersgd", "torch_powersgd", "powersgd-hook"):
        return (" PyTorch's own PowerSGD hook is torch-powersgd; gssgd's PowerSGD is "
                "powersgd.")
    return ""


def parse_methods(text: str | Iterable[str], valid: Iterable[str] | None = None) -> tuple[str, ...]:
    """A comma-separated method list, checked: the one parser of every ``--methods``.

    Args:
        text: ``"dense,topk,gs"`` or an iterable of names.
        valid: the names allowed here (default: every registered method).

    Returns:
        The names, in the given order, without repeats.

    Raises:
        ValueError: an empty list or an unknown name (the message lists the valid ones).
    """
    allowed = list(METHODS if valid is None else valid)
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text)]
    names = [n for n in names if n]
    if not names:
        raise ValueError(f"no method given; choose among {_choices(allowed)}")
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ValueError(
            f"unknown method(s) {', '.join(unknown)}; give a comma-separated list from "
            f"{_choices(allowed)}.{renamed_hint(unknown[0])}"
        )
    return tuple(dict.fromkeys(names))


def applies_to(setting: str) -> tuple[str, ...]:
    """The registered methods a training setting or aggregator option applies to."""
    return tuple(
        m.name
        for m in METHODS.values()
        if setting in m.option_names()
        or (setting == "density" and m.sparse)
        or setting in m.train_settings
        or (m.aggregator is not None and setting in _HOOK_SETTINGS)
    )


def _quarter_columns(options: CommonOptions) -> dict[str, Any]:
    return {"cols": max(256, options.cols // 4)}  # type: ignore[attr-defined]


register_method(
    Method(
        "dense",
        "dense all-reduce, float32 payload (the uncompressed baseline)",
        DenseAllReduce,
        variants=(
            Variant("dense16", "dense all-reduce, float16 payload scaled by 1/P",
                    {"dtype": torch.float16}),
        ),
    )
)
register_method(Method("topk", "local Top-k, all-gather of (index, value) pairs", LocalTopk))
register_method(Method(
    "gtopk", "global Top-k, recursive-doubling merges", GlobalTopk,
    variants=(
        Variant("gtopk-tree", "global Top-k as its authors' code runs it: a binomial tree "
                "to rank 0 with host merges, then a broadcast", {"exchange": "tree"}),
    ),
))
register_method(
    Method("sketched", "Sketched-SGD, star topology through rank 0", SketchedSGD)
)
register_method(
    Method(
        "gs",
        "gs-SGD, sketch all-reduce (float16 tables, ring) + exact round",
        GlobalSketchSGD,
        variants=(
            Variant("gs-backend", "gs-SGD with the backend's (ring) all-reduce (now the "
                    "default; the name kept for earlier runs)",
                    {"allreduce": "backend"}, alias=True),
            Variant("gs-rd", "gs-SGD with float32 tables summed by recursive doubling",
                    {"allreduce": "recursive_doubling", "table_dtype": torch.float32}),
            Variant("gs-hd", "gs-SGD with its tables and exact values summed by recursive "
                    "halving and doubling (the ring's bytes in 2 log2 P rounds)",
                    {"allreduce": "halving_doubling"}),
            Variant("gs-estimate", "gs-SGD without the exact round (exact=False)",
                    {"exact": False}),
            Variant("gs-small", "gs-SGD with a sketch of a quarter of the columns",
                    _quarter_columns),
            Variant("gs-half", "gs-SGD with float16 sketch tables on the wire (now the "
                    "default; the name kept for earlier runs)",
                    {"table_dtype": torch.float16}, alias=True),
        ),
    )
)
register_method(
    Method(
        "powersgd",
        "PowerSGD, rank-r factors of each matrix all-reduced, error feedback",
        PowerSGD,
        variants=(
            Variant("powersgd-r1", "PowerSGD at rank 1", {"rank": 1}),
            Variant("powersgd-r4", "PowerSGD at rank 4", {"rank": 4}),
        ),
        cost_like="dense",  # until calibrated: a few passes over the vector, like dense's
    )
)
register_method(Method("ddp-allreduce", "DDP's own all-reduce (no hook), float32",
                       ddp_hook="allreduce"))
register_method(Method("ddp-fp16", "DDP's fp16_compress_hook: float16 all-reduce",
                       ddp_hook="fp16_compress_hook"))
register_method(
    Method(
        "torch-powersgd",
        "PyTorch's PowerSGD hook (low-rank, error feedback; was named powersgd)",
        train_settings=("powersgd_rank", "start_iter"),
        ddp_hook="powerSGD_hook",
    )
)

#: What ``gssgd bench train`` runs without ``--methods``: DDP's own all-reduce beside every
#: built-in sparse method (the comparison the paper's throughput claims are about).
TRAIN_BENCH_METHODS: tuple[str, ...] = ("ddp-allreduce", "topk", "gtopk", "sketched", "gs")
