"""The hook's tuned settings (:class:`HookSettings`), validated before any process group is
touched, and the values of ``overlap=`` (:data:`OVERLAP_MODES`, :func:`check_overlap`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gssgd.aggregators import AGGREGATORS, build_options, canonical_options
from gssgd.aggregators.feedback import SKETCH_RULES
from gssgd.validate import is_int

__all__ = [
    "OVERLAP_MODES", "STREAMING_METHODS", "HookSettings", "check_overlap",
    "own_options",
]

#: The values of ``HookState(..., overlap=)`` and ``gssgd train --overlap``.
OVERLAP_MODES: tuple[str, ...] = ("none", "stream", "buckets")
#: The methods ``overlap="stream"`` serves (it relies on the Count Sketch being linear).
STREAMING_METHODS: tuple[str, ...] = ("gs",)


def own_options(method: str) -> str:
    """The options ``method`` takes, for an error message (its options' fields, ``k`` for a
    sparse method, and the aliases), e.g. ``"rank, warm_start, ..."``."""
    cls = AGGREGATORS[method]
    names = [name for name in cls.option_names() if name != "shapes"]
    names += [] if cls.sends_all else ["density"]
    names += [f"{alias} (= {name})" for alias, name in cls.Options.aliases.items()]
    return ", ".join(names)


def check_overlap(overlap: object, method: str, whole_model: bool, options: dict) -> None:
    """Validate ``overlap`` against the method and mode (no process group needed).

    Raises:
        ValueError: an unknown value, or ``"stream"`` with anything but whole-model gs
            without ``local_clip``; the message names the value and the fix.
    """
    if overlap not in OVERLAP_MODES:
        raise ValueError(
            f"overlap={overlap!r} is invalid: it must be one of {', '.join(OVERLAP_MODES)}. "
            "'stream' all-reduces gs's sketch bucket by bucket during backward; 'buckets' "
            "averages each bucket (per-bucket mode) on a thread while backward runs; 'none' "
            "averages each bucket before the backward goes on."
        )
    if overlap == "none":
        return
    if overlap == "buckets":
        if whole_model:
            raise ValueError(
                "overlap='buckets' averages each DDP bucket on its own while backward runs; "
                "pass whole_model=False (gssgd train: --per-bucket), or overlap='stream' for "
                "whole-model gs.")
        if options.get("nonfinite") == "propagate":
            raise ValueError(
                "overlap='buckets' cannot be used with nonfinite='propagate' (a GradScaler's "
                "default): that waits for the last bucket to leave every residual untouched "
                "on an overflow. Use overlap='none' with a scaler.")
        return
    if method not in STREAMING_METHODS:
        raise ValueError(
            f"overlap='stream' is for method 'gs' only (got {method!r}): it relies on the "
            "Count Sketch being linear. Use overlap='none' with other methods."
        )
    if not whole_model:
        raise ValueError(
            "overlap='stream' streams whole-model gs (one global selection); pass "
            "whole_model=True (gssgd train: drop --per-bucket), or overlap='none'."
        )
    if options.get("prefilter"):
        raise ValueError(
            f"prefilter={options['prefilter']!r} cannot be used with overlap='stream': the "
            "pre-filter needs the whole gradient's top coordinates before the first bucket "
            "is sketched. Drop prefilter or use overlap='none'."
        )
    if options.get("chunk"):
        raise ValueError(
            f"chunk={options['chunk']!r} cannot be used with overlap='stream': the streamed "
            "buckets recover their candidates bucket by bucket, not by chunk. Use chunk=0 or "
            "overlap='none'."
        )
    if options.get("reuse", 1) != 1:
        raise ValueError(
            f"reuse={options['reuse']!r} cannot be used with overlap='stream': the streamed "
            "buckets sketch every step. Use reuse=1 or overlap='none'."
        )
    streaming = [name for name, rule in SKETCH_RULES.items() if rule.streams]
    if options.get("feedback", "ef") not in streaming:
        raise ValueError(
            f"feedback={options['feedback']!r} cannot be used with overlap='stream': the "
            "streamed buckets compensate piece by piece, which only feedback="
            f"{' or '.join(repr(n) for n in streaming)} do. Use one of them, or overlap='none'."
        )
    if options.get("local_clip") is not None:
        raise ValueError(
            f"local_clip={options['local_clip']!r} cannot be used with overlap='stream': "
            "clipping needs the whole gradient's norm before the first bucket is sent. "
            "Drop local_clip or use overlap='none'."
        )


@dataclass(frozen=True)
class HookSettings:
    """The tuned settings of a :class:`~gssgd.ddp.HookState`, validated once at construction.

    Attributes:
        method: one of :data:`gssgd.AGGREGATORS`.
        density: fraction of coordinates sent per vector (bucket or whole model), or None.
        start_iter: the first compressed iteration (>= 1); earlier ones all-reduce densely.
        whole_model: compress the whole gradient as one vector instead of bucket by bucket.
        options: the method's options (``k``, ``rows``, ``cols``, ``momentum``, ...).
        overlap: "none", or "stream" (whole-model gs only) to all-reduce the sketch bucket
            by bucket during backward (:mod:`gssgd.ddp.streaming_gs`).

    Raises:
        ValueError: any setting out of range, naming the value, the range and the fix.
    """

    method: str
    density: float | None = None
    start_iter: int = 2
    whole_model: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    overlap: str = "none"

    def __post_init__(self) -> None:
        if self.method not in AGGREGATORS:
            raise ValueError(
                f"method={self.method!r} is invalid: it must be one of "
                f"{', '.join(AGGREGATORS)}. For example HookState('gs', density=0.01)."
            )
        if not is_int(self.start_iter) or self.start_iter < 1:
            raise ValueError(
                f"start_iter={self.start_iter!r} is invalid: it must be an integer >= 1, "
                "because DDP rebuilds its buckets after iteration 0 and compression must "
                "start on the rebuilt layout. Use start_iter=2 (the default) or more."
            )
        if not isinstance(self.whole_model, bool):
            raise ValueError(
                f"whole_model={self.whole_model!r} is invalid: it must be True or False."
            )
        # PyTorch's names (matrix_approximation_rank) become the method's own
        object.__setattr__(self, "options", canonical_options(self.method, self.options))
        if self.density is not None and AGGREGATORS[self.method].sends_all:
            raise ValueError(
                f"density={self.density!r} does not apply to {self.method!r}: it "
                + ("sends every coordinate" if not AGGREGATORS[self.method].compresses else
                   "sets its message by its own options, not a density")
                + f". Drop density=; {self.method!r} takes {own_options(self.method)}."
            )
        k = self.options.get("k")
        if k is not None and (not is_int(k) or k < 1):
            raise ValueError(
                f"k={k!r} is invalid: it must be an integer >= 1 (and at most the length of "
                "every compressed vector). Or give density= instead."
            )
        if AGGREGATORS[self.method].takes_shapes and "shapes" in self.options:
            raise ValueError(
                f"shapes={self.options['shapes']!r} cannot be given to the hook: it passes "
                f"each vector's parameter shapes to {self.method!r} itself (per bucket, or the "
                "whole model's). Drop shapes=."
            )
        # Validate density and every option against a dummy length that admits k; k is
        # resolved again for each vector's real length when it is first compressed.
        build_options(self.method, k if k is not None else 1, self.density, **self.options)
        check_overlap(self.overlap, self.method, self.whole_model, self.options)

    def check_k(self, d: int, where: str) -> None:
        """Raise a clear error when an explicit ``k`` exceeds the vector length ``d``.

        Raises:
            ValueError: ``k > d``.
        """
        k = self.options.get("k")
        if k is not None and k > d:
            raise ValueError(
                f"k={k} is larger than {where}, which holds d={d} gradient elements; k must "
                f"be in [1, {d}]. Give density= (k is then resolved per vector), a smaller k, "
                + (
                    "or a larger bucket_cap_mb / whole_model=True."
                    if not self.whole_model
                    else "or compress a larger model."
                )
            )
