"""What every method's options share: the base dataclass, ``k`` from density, and the names
of the payload dtypes.

Each method's own options dataclass lives beside its aggregator (``TopkOptions`` in
:mod:`~gssgd.aggregators.topk`, ``SketchedOptions`` in :mod:`~gssgd.aggregators.sketching`,
``GSOptions`` in :mod:`~gssgd.aggregators.gs`, ...). Each checks its values in
``__post_init__`` and raises a ``ValueError`` that names the option, the value, the valid
range and the fix (:func:`gssgd.validate.bad_value`), before any collective runs.

The density warm-up (DGC's exponential ramp of the density to its target,
:class:`DensityWarmup`) is here too: every sparse method's options carry one.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

import torch

from gssgd.aggregators.feedback import ErrorFeedback
from gssgd.validate import bad_value, check_number, is_int

__all__ = [
    "CommonOptions",
    "DEFAULT_DENSITY",
    "DensityWarmup",
    "NONFINITE_MODES",
    "PAYLOAD_DTYPES",
    "resolve_k",
]


#: What a non-finite gradient does (``CommonOptions.nonfinite``).
NONFINITE_MODES = ("skip", "raise", "propagate")
#: Density used when neither ``density`` nor ``k`` is given.
DEFAULT_DENSITY = 0.01

#: The payload dtypes dense's ``dtype`` and gs's ``table_dtype`` take, by name (the names
#: the command line and TrainConfig use).
PAYLOAD_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}



def resolve_k(d: int, density: float | None, k: int | None) -> int:
    """The number of coordinates a sparse method sends: ``max(1, round(density * d))`` or ``k``.

    Args:
        d: vector length (>= 1).
        density: fraction in (0, 1], or None (then ``k`` or the default 0.01 is used).
        k: explicit count in [1, d], or None.

    Raises:
        ValueError: both given, or either out of range.
    """
    if not is_int(d) or d < 1:
        raise bad_value("d", d, "it must be an integer >= 1",
                        "Pass the number of gradient elements.")
    if density is not None and k is not None:
        raise ValueError(
            f"both density={density!r} and k={k!r} were given; give only one of them "
            "(k = max(1, round(density * d)) otherwise)."
        )
    if k is not None:
        if not is_int(k) or not 1 <= k <= d:
            raise bad_value("k", k, f"it must be an integer in [1, d={d}]", "Choose a smaller k.")
        return k
    density = DEFAULT_DENSITY if density is None else density
    check_number("density", density, "in (0, 1]", lambda v: 0 < v <= 1,
                 "For example density=0.01.")
    return max(1, round(density * d))



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
    #: the error-feedback rules the method implements, by the ``feedback`` name that selects
    #: them (:mod:`gssgd.aggregators.feedback`); a method without a ``feedback`` option
    #: takes its "ef" rule
    feedback_rules: ClassVar[dict[str, type[ErrorFeedback]]] = {"ef": ErrorFeedback}
    #: the names of :attr:`feedback_rules` (what ``feedback`` accepts)
    feedbacks: ClassVar[tuple[str, ...]] = ("ef",)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "feedbacks" in cls.__dict__:
            raise TypeError(
                f"{cls.__name__} sets feedbacks; declare the rules instead: feedback_rules = "
                "{name: rule class} (gssgd.aggregators.feedback), and feedbacks follows.")
        cls.feedbacks = tuple(cls.feedback_rules)

    def __post_init__(self) -> None:
        if self.nonfinite not in NONFINITE_MODES:
            raise bad_value(
                "nonfinite",
                self.nonfinite,
                "it must be 'skip', 'raise' or 'propagate'",
                "Use 'skip', or 'propagate' with torch.amp.GradScaler.",
            )
        if not is_int(self.max_consecutive_skips) or self.max_consecutive_skips < 1:
            raise bad_value(
                "max_consecutive_skips",
                self.max_consecutive_skips,
                "it must be an integer >= 1",
                "For example 100.",
            )

    def as_dict(self) -> dict[str, object]:
        """Every option by name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def make_feedback(self) -> ErrorFeedback:
        """A fresh error-feedback rule of these options: the one ``feedback`` names (the
        method's "ef" rule when the options have no ``feedback``), with their momentum."""
        name = getattr(self, "feedback", "ef")
        if name not in self.feedback_rules:
            raise bad_value("feedback", name, f"it must be one of {', '.join(self.feedbacks)} "
                            "for this method", "Use 'ef' (classic error feedback).")
        return self.feedback_rules[name].from_options(self)


@dataclass(frozen=True)
class DensityWarmup:
    """The k of each aggregation step under DGC's exponential density warm-up.

    Attributes:
        d: vector length.
        k: the target count (after the warm-up).
        steps: warm-up length in aggregation steps (0: no warm-up).
        start_density: the density of step 0, in (0, 1].

    Example:
        >>> w = DensityWarmup(d=100_000, k=100, steps=4, start_density=0.25)
        >>> [w.k_at(t) for t in range(6)]
        [25000, 6287, 1581, 398, 100, 100]
    """

    d: int
    k: int
    steps: int
    start_density: float

    @property
    def start_k(self) -> int:
        """``k0``: the count of step 0 (never below the target)."""
        return max(self.k, min(self.d, round(self.start_density * self.d)))

    def k_at(self, step: int) -> int:
        """The count of aggregation step ``step`` (0-based)."""
        if step >= self.steps or self.start_k == self.k:
            return self.k
        k0 = self.start_k
        return max(self.k, min(k0, round(k0 * (self.k / k0) ** (step / self.steps))))

    def distinct_k(self) -> list[int]:
        """Every count the schedule uses, largest first."""
        return sorted({self.k_at(t) for t in range(self.steps + 1)}, reverse=True)
