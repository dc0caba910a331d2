"""gs-SGD's options: the sketch options of :mod:`~gssgd.aggregators.sketching` and what only
gs-SGD has (the exact round, the all-reduce, the collapse guard and its audit, reusing a
candidate set, selecting by chunk)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gssgd._validate import bad_value, is_int
from gssgd.aggregators.guard import AUDITS
from gssgd.aggregators.sketching import SketchedOptions

__all__ = ["ALLREDUCES", "GSOptions"]

#: How gs can sum its tables and exact values (``GSOptions.allreduce``).
ALLREDUCES = ("recursive_doubling", "backend", "halving_doubling")


@dataclass(frozen=True)
class GSOptions(SketchedOptions):
    """gs-SGD options on top of the sketch options.

    Attributes:
        exact: fetch the exact sums of the candidates in a second all-reduce (True), or
            use the sketch's estimates (False, one round; mass is not conserved).
        allreduce: how the sketch tables are summed: "recursive_doubling", "backend" (the
            backend's ring) or "halving_doubling" (a reduce-scatter by recursive halving and
            an all-gather by recursive doubling: the ring's bytes in 2 log2 P rounds);
            None: by the number of workers (:func:`~gssgd.aggregators.sizing.sketch_default_shape`).
        guard: what to do when an audit finds the sketch collapsed (see
            :mod:`gssgd.aggregators.guard`; audits come at step 20, then spaced to add at
            most 5 % of gs's bytes, every 200 steps or more): "grow"
            doubles ``cols`` and the ``m*k`` candidates (every
            rank alike, at most twice, up to ``d / (2 * rows)`` columns and ``d / 8``
            candidates) and raises :class:`~gssgd.aggregators.guard.SketchCollapseError` on
            a further collapse; "raise" raises it at once, with a message saying what to
            change; "off" never audits.
        audit: how an audit finds the mass exact global top-k would deliver
            (:mod:`gssgd.aggregators.guard`): "tops" (default) fetches the exact global
            values of the union of every rank's largest coordinates, a pool of about
            :data:`~gssgd.aggregators.guard.AUDIT_POOL` times k (a few per cent of a dense
            all-reduce at low density; it estimates the best mass from below, so the
            recall from above); "dense" all-reduces the whole vector (exact, the cost of a
            dense step); "both" runs the two, decides on the dense one and logs both
            recalls (to compare them).
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
            Needs the exact round.

    ``allreduce`` left None takes
    :func:`~gssgd.aggregators.sizing.sketch_default_shape`'s value too.
    """

    exact: bool = True
    allreduce: str | None = None
    guard: str = "grow"
    audit: str = "tops"
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
            raise bad_value("chunk", self.chunk,
                            f"it cuts d={d} into {chunks} chunks, more than the k={k} coordinates "
                            "a step delivers, so the lower chunks would take every share and the "
                            "rest would never move",
                            f"Use chunk >= ceil(d / k) = {-(-d // k)}, or a higher density.")
        return super().resolved(d, k, world_size)  # type: ignore[return-value]

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.exact, bool):
            raise bad_value("exact", self.exact, "it must be True or False", "Use exact=True.")
        if self.allreduce not in (None, *ALLREDUCES):
            raise bad_value(
                "allreduce",
                self.allreduce,
                f"it must be one of {', '.join(ALLREDUCES)}",
                "Use 'backend' for a bandwidth-optimal ring at large P.",
            )
        if self.audit not in AUDITS:
            raise bad_value("audit", self.audit, f"it must be one of {', '.join(AUDITS)}",
                            "Use 'tops' (a few per cent of a dense all-reduce) or 'dense'.")
        if self.guard not in ("grow", "raise", "off"):
            raise bad_value("guard", self.guard, "it must be 'grow', 'raise' or 'off'",
                            "Use 'grow'.")
        if not is_int(self.reuse) or self.reuse < 1:
            raise bad_value("reuse", self.reuse,
                            "it must be an integer >= 1 (1: sketch every step; R: every R-th)",
                            "Use reuse=1, or for example reuse=2 to sketch every other step.")
        if self.reuse > 1 and not self.exact:
            raise bad_value("reuse", self.reuse,
                            "reusing the candidate set needs the exact round, which exact=False "
                            "turns off", "Use exact=True with reuse > 1, or reuse=1.")
        if not is_int(self.chunk) or self.chunk < 0:
            raise bad_value("chunk", self.chunk,
                            "it must be an integer >= 0 (0: one selection over the whole vector; "
                            "C: by chunk of C coordinates)",
                            "For example chunk=4096 (SparseLoCo's).")
        if self.chunk and not self.exact:
            raise bad_value("chunk", self.chunk,
                            "selecting by chunk needs the exact round, which exact=False turns off",
                            "Use exact=True with chunk, or chunk=0.")
        if self.feedback == "fetchsgd" and self.exact:
            raise bad_value("exact", self.exact,
                            "feedback='fetchsgd' keeps the error in sketch space and has no exact "
                            "round", "Pass exact=False (--no-exact) with feedback='fetchsgd'.")
