"""Gradient aggregators: one module per algorithm, one registry, one constructor.

Every aggregator has the same contract: ``update = agg.step(grad)`` is a collective over the
process group that returns the averaged update (1-D, length d, bitwise the same on every
rank) and keeps its error feedback inside; ``agg.last_stats`` says what the step cost.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from gssgd.aggregators.base import Aggregator, StepStats
from gssgd.aggregators.options import resolve_k
from gssgd.comm import world_size_of
from gssgd.sketch import HashCache

__all__ = [
    "AGGREGATORS", "Aggregator", "StepStats", "build_options", "canonical_options",
    "make_aggregator",
]

#: Method name -> aggregator class: the aggregator view of the method registry
#: (:data:`gssgd.methods.METHODS`), which fills it as methods are registered.
AGGREGATORS: dict[str, type[Aggregator]] = {}


def _check_registered(name: str) -> None:
    """Raise a ValueError naming the valid methods if ``name`` is not registered."""
    if name in AGGREGATORS:
        return
    if not AGGREGATORS:
        raise ValueError(
            f"unknown method {name!r}: no method is registered yet. The built-in ones register "
            "when gssgd.methods is imported; use gssgd.make_aggregator (which imports it), or "
            "import gssgd.methods first.")
    raise ValueError(f"unknown method {name!r}; valid methods: {', '.join(AGGREGATORS)}.")


def canonical_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with every alias of method ``name``'s options (``Options.aliases``, e.g.
    PowerSGD's ``matrix_approximation_rank``) replaced by the option's own name.

    Raises:
        ValueError: an unknown method, or an option given under both names.
    """
    _check_registered(name)
    out = dict(options)
    for alias, field_name in AGGREGATORS[name].Options.aliases.items():
        if alias in out:
            if field_name in out:
                raise ValueError(
                    f"{alias}={out[alias]!r} and {field_name}={out[field_name]!r} name the "
                    f"same option of {name!r}; give one of them."
                )
            out[field_name] = out.pop(alias)
    return out


def build_options(
    name: str,
    d: int,
    density: float | None = None,
    world_size: int | None = None,
    **options: object,
):
    """Validate ``name``, ``density``/``k`` and the method's options without any collective,
    and fill in the defaults an options dataclass leaves None (for ``d``, ``k`` and
    ``world_size`` ranks; None: unknown, the small-P defaults).

    Returns:
        ``(cls, k, options)``: the aggregator class, the resolved k and the options dataclass.

    Raises:
        ValueError: unknown method or option, or an option out of range.
    """
    _check_registered(name)
    cls = AGGREGATORS[name]
    k_given = options.pop("k", None)
    if cls.sends_all:
        if k_given is not None:
            raise ValueError(f"method {name!r} sends every coordinate and takes no k; drop k=.")
        resolve_k(d, density, None)  # validates d and density even though dense ignores them
        k = d
    else:
        k = resolve_k(d, density, k_given)  # type: ignore[arg-type]
    options = canonical_options(name, options)
    unknown = sorted(set(options) - set(cls.option_names()))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for method {name!r}; valid options: "
            f"{', '.join(cls.option_names())}."
        )
    opts = cls.Options(**options)  # type: ignore[arg-type]
    if hasattr(opts, "resolved"):  # defaults that depend on d, k and the number of workers
        opts = opts.resolved(d, k, world_size)
    return cls, k, opts


def make_aggregator(
    name: str,
    d: int,
    density: float | None = None,
    group: dist.ProcessGroup | None = None,
    hashes: HashCache | None = None,
    **options: object,
) -> Aggregator:
    """Build the aggregator ``name`` for gradients of length ``d``.

    Every option is validated before the process group is touched.

    Args:
        name: one of :data:`AGGREGATORS` (the registered methods that have an aggregator:
            ``gssgd.methods.METHODS``).
        d: gradient length.
        density: fraction of coordinates sent, in (0, 1]; default 0.01. ``k`` instead.
        group: process group; None means the default group.
        hashes: a :class:`~gssgd.sketch.HashCache` to keep the sketch's hash tables in
            (None: the aggregator's own); share one among aggregators of one sketch shape.
        **options: the method's options (its options dataclass, ``AGGREGATORS[name].Options``,
            beside its aggregator), and ``k``.

    Returns:
        The aggregator; call ``agg.step(grad)`` on every rank, every step.

    Raises:
        ValueError: unknown method or option, an option out of range, or both density and k.
        RuntimeError: torch.distributed is not initialised.

    Example:
        >>> agg = make_aggregator("gs", d=1_000_000, density=0.001)  # doctest: +SKIP
        >>> update = agg.step(flat_grad)
    """
    cls, k, opts = build_options(name, d, density, world_size_of(group), **options)
    return cls(d, k, opts, group=group, hashes=hashes)
