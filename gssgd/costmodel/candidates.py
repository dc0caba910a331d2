"""A candidate of ``gssgd advise`` and the rule that picks one: each method's predicted
step, its evidence (:mod:`gssgd.costmodel.evidence`) and its tie margin, and :func:`pick`,
which recommends among the candidates a study measured reaching the target only, and a
faster one over the simpler dense (then dense16) only beyond its margin
(:mod:`gssgd.costmodel.advice` builds the candidates and reports the pick)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gssgd.costmodel.cluster import StepTime, Warmup
from gssgd.costmodel.evidence import Evidence
from gssgd.costmodel.method_specs import MethodSpec, method_spec
from gssgd.methods import REFERENCE_METHOD, get_method

__all__ = ["SIMPLEST", "Candidate", "pick"]

#: The keys of a warm-up in a spec's options: ``advise`` passes it by ``warmup_steps`` alone.
_WARMUP_KEYS = ("warmup_steps", "warmup_density")


@dataclass(frozen=True)
class Candidate:
    """One method's predicted step, its evidence and its tie margin."""

    name: str
    spec: MethodSpec
    step: StepTime
    evidence: Evidence
    settings: dict[str, Any] = field(default_factory=dict)
    warmup: Warmup = Warmup(0, 0, 0, 0.0)
    #: the workers its method's defaults are resolved for (gs's shape depends on P); None:
    #: the small-P defaults (a streamed gs keeps them)
    default_workers: int | None = None
    #: local steps: H inner steps between outer steps (None: a per-step method)
    local_steps: int | None = None
    #: the step model's held-out communication error for its family
    #: (:func:`~gssgd.costmodel.fit.margin_of`)
    comm_error: float = 0.0

    @property
    def model_error(self) -> float:
        """The step model's error for this step: its family's communication error times the
        communication's share of the predicted step (what backward does not hide)."""
        exposed = self.step.communication - self.step.hidden
        return self.comm_error * exposed / self.step.total if self.step.total else 0.0

    @property
    def margin(self) -> float:
        """How much faster than a simpler candidate it must be to be picked: the step
        model's error for this step plus the evidence's distance penalty."""
        return self.model_error + self.evidence.penalty

    @property
    def eligible(self) -> bool:
        """Whether it may be recommended: the study measured it reaching the target."""
        return bool(self.evidence.measured and self.evidence.reached)

    def run_seconds(self, steps: int) -> float:
        """Predicted seconds of a run of ``steps`` steps, its density warm-up included."""
        return steps * self.step.total + (self.warmup.extra_seconds if steps else 0.0)

    def target_steps(self, dense_steps: int) -> int | None:
        """Steps to dense's target when dense needs ``dense_steps``: its measured multiple
        of them (1 where a final-gap study found it within the target); None where it is
        not eligible."""
        if not self.eligible:
            return None
        ratio = self.evidence.steps_ratio
        return math.ceil(dense_steps * (1.0 if ratio is None else ratio))

    def target_seconds(self, dense_steps: int) -> float | None:
        """Predicted seconds to dense's target (:meth:`target_steps`)."""
        steps = self.target_steps(dense_steps)
        return None if steps is None else self.run_seconds(steps)

    def target_bytes(self, dense_steps: int) -> float | None:
        """Bytes the busiest worker sends until dense's target."""
        steps = self.target_steps(dense_steps)
        return None if steps is None else self.warmup.run_bytes_sent(steps)

    def rank_key(self, dense_steps: int) -> tuple[int, float]:
        """Report order: the eligible by time to the target, then those measured short of
        it, then those not measured, each by the step."""
        seconds = self.target_seconds(dense_steps)
        if seconds is not None:
            return (0, seconds)
        return (1 if self.evidence.measured else 2, self.step.total)

    @property
    def method(self) -> str:
        """The ``--method`` / ``HookState`` name (the variant's method)."""
        return self.spec.aggregator

    def options(self) -> dict[str, Any]:
        """The aggregator options this candidate sets away from its method's defaults at
        its number of workers, or streamed gs's (the density warm-up and PowerSGD's shapes
        aside)."""
        base = method_spec(self.spec.aggregator, self.spec.d, k=self.spec.k,
                           world_size=self.default_workers, shapes=self.spec.shapes,
                           streamed=self.settings.get("overlap") == "stream"
                           ).aggregator_options()
        mine = self.spec.aggregator_options()
        changed = {k: v for k, v in mine.items()
                   if base.get(k) != v and k not in _WARMUP_KEYS and k != "shapes"}
        if get_method(self.method).by_shape:
            changed["rank"] = self.spec.rank
        return changed | self.settings


#: The simplest candidates, simplest first: dense and its variants (dense16); another is
#: picked only when it beats the simplest measured one by more than its margin.
SIMPLEST: tuple[str, ...] = (REFERENCE_METHOD,
                             *(v.name for v in get_method(REFERENCE_METHOD).variants))


def pick(candidates: Sequence[Candidate], dense_steps: int) -> tuple[Candidate, str]:
    """The recommendation among ``candidates`` and why, in words (see the module doc).

    Steps: the baseline is dense; dense16 replaces it when faster to the target by more than
    dense16's margin. The fastest eligible candidate replaces the baseline when faster by
    more than its own margin. Where no candidate is eligible (no study of the family), the
    baseline is dense (else the first candidate), said so.
    """
    eligible = [c for c in candidates if c.eligible]
    if not eligible:
        base = next((c for c in candidates if c.name == SIMPLEST[0]), candidates[0])
        return base, ("no candidate's steps to the target were measured for this model: "
                      f"{base.name}, the simplest; measure the others with advise --study-spec")

    def seconds(c: Candidate) -> float:
        t = c.target_seconds(dense_steps)
        assert t is not None
        return t

    base: Candidate | None = None
    for name in SIMPLEST:
        c = next((c for c in eligible if c.name == name), None)
        if c is not None and (base is None or seconds(c) * (1 + c.margin) < seconds(base)):
            base = c
    best = min(eligible, key=seconds)
    if base is None:
        return best, "the fastest to the target of the methods measured reaching it"
    if best is base:
        dense = next((c for c in eligible if c.name == SIMPLEST[0]), None)
        if dense is None or dense is best:
            return best, "the fastest to the target of the methods measured reaching it"
        return best, (f"the fastest to the target of the methods measured reaching it, "
                      f"{seconds(dense) / seconds(best):.2f}x dense's time, beyond its margin "
                      f"of {best.margin:.0%}")
    speedup = seconds(base) / seconds(best)
    if seconds(best) * (1 + best.margin) < seconds(base):
        return best, (f"{speedup:.2f}x faster to the target than {base.name}, beyond its "
                      f"margin of {best.margin:.0%} (model error + evidence distance)")
    return base, (f"within the model's error: {best.name} is {speedup:.2f}x faster to the "
                  f"target by the model, inside its margin of {best.margin:.0%}")
