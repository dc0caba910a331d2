"""Which method makes a given training job fastest: every candidate's predicted step on the
cluster cost model (:mod:`gssgd.costmodel.cluster`), times the steps it needs to reach
dense's accuracy as the frontier study measured them (:mod:`gssgd.costmodel.reach`), the
fastest to that target, and how to ask for it (a ``gssgd train`` command line and a
``HookState(...)`` call). A method that steps fastest but was measured short of dense's
accuracy (gTop-k at density 0.001) is ranked after those that got there.

The candidates are the benchmark methods of :data:`gssgd.costmodel.method_specs.VARIANTS`
(every registered method and variant: dense, dense16, topk, gtopk, sketched, gs and its
variants), less :data:`gssgd.costmodel.check.ADVISE_EXCLUDES`. A variant's options are
read from its spec: the aggregator options that differ from its method's defaults.

Example:
    >>> a = advise(params=25_600_000, workers=64, link=Link(10**10, 20e-6),
    ...            device=get_device("h200"), density=0.001)
    >>> a.recommended.name, a.train_command(), a.hook_call()
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gssgd.costmodel.check import ADVISE_EXCLUDES
from gssgd.costmodel.cluster import (
    Link,
    StepTime,
    Warmup,
    predict_step,
    predict_warmup,
    stream_overlap_available,
)
from gssgd.costmodel.devices import Device
from gssgd.costmodel.method_specs import VARIANTS, MethodSpec, method_spec
from gssgd.costmodel.reach import REACH_WHERE, Reach, powersgd_reach, reach
from gssgd.methods import get_method, get_variant

__all__ = [
    "MEASURED_ERROR",
    "Advice",
    "Candidate",
    "advise",
    "candidate_methods",
    "parse_params",
    "parse_workers",
]

_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9, "t": 10**12}
_PARAMS_RE = re.compile(r"^(?P<num>\d+(?:\.\d*)?(?:e\d+)?|\.\d+)\s*(?P<suffix>[kmgbt]?)$")
#: Parameter counts ``advise`` takes: 1000 (k = 1 at density 0.001) .. 10^13.
MIN_PARAMS, MAX_PARAMS = 10**3, 10**13
#: Worker counts ``advise`` takes.
MIN_WORKERS, MAX_WORKERS = 2, 65_536
#: The run length ``advise`` totals over by default: ``gssgd train``'s default ``--steps``
#: (:class:`gssgd.train.config.TrainConfig`; tests check they agree).
DEFAULT_RUN_STEPS = 500
#: The keys of a warm-up in a spec's options: ``advise`` passes it by ``warmup_steps`` alone.
_WARMUP_KEYS = ("warmup_steps", "warmup_density")


def parse_params(text: str) -> int:
    """A parameter count such as ``25.6M``, ``124m``, ``1.3B``, ``7e9`` or ``25600000``.

    Suffixes: k = 10^3, M = 10^6, G or B = 10^9, T = 10^12 (case does not matter).

    Raises:
        ValueError: not of that form, or outside 1000..10^13 (the message says so).
    """
    cleaned = text.strip().lower().replace("_", "") if isinstance(text, str) else ""
    match = _PARAMS_RE.match(cleaned)
    if match is None:
        raise ValueError(
            f"parameter count {text!r} is not understood: give a number with an optional "
            "suffix k, M, B (or G), T, e.g. --params 25.6M or --params 1.3B"
        )
    value = round(float(match["num"]) * _SUFFIXES[match["suffix"]])
    if not MIN_PARAMS <= value <= MAX_PARAMS:
        raise ValueError(
            f"parameter count {text!r} = {value} is outside 1000..1e13; give the model's "
            "parameter count, e.g. --params 25.6M"
        )
    return value


def parse_workers(text: str | int) -> int:
    """A worker count in 2..65536.

    Raises:
        ValueError: not a whole number in that range.
    """
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(
            f"workers {text!r} is not a whole number; give the data-parallel worker count "
            "(GPUs), e.g. --workers 64"
        ) from None
    if not MIN_WORKERS <= value <= MAX_WORKERS:
        raise ValueError(
            f"workers {text!r} is outside {MIN_WORKERS}..{MAX_WORKERS}; give the number of "
            "data-parallel workers, e.g. --workers 64 (with one worker nothing is communicated)"
        )
    return value


#: The cost model's measured error, from ``scripts/cost_map.py`` (leave one run out over the
#: 15 ``gssgd bench comm`` runs of docs/results made with the current default sketch; the
#: full record is docs/results/cost_cluster/check.json): median and largest |relative error|
#: of the step time, points, and how often the method ranked first was the measured
#: fastest or within 10 % of it. A copy, rounded, because the runs are not installed with
#: the package and recomputing takes seconds: tests/costmodel/test_advise.py recomputes it
#: from the runs (:func:`gssgd.costmodel.check.measured_error`) and fails when it differs.
MEASURED_ERROR: dict[str, Any] = {
    "points": 144,
    "median_abs_rel_error": 0.069,
    "max_abs_rel_error": 0.481,
    "runs": 15,
    "recommended_within_10pct": 14,
    "where": "this machine's emulated 100 Mbit/s and 1 Gbit/s links and loopback, P = 4 and 8",
}


#: gs streamed by the DDP hook: the table's regions all-reduced by the backend (a ring)
#: during backward, then the exact round (also by the ring); a candidate when the hook can
#: stream. Name -> (the benchmark variant it is modelled as, its hook settings).
STREAM_CANDIDATE = ("gs-stream", "gs-backend", {"overlap": "stream"})


def candidate_methods() -> tuple[str, ...]:
    """The methods ``advise`` compares: the benchmark variants (registration order), then
    ``gs-stream`` when the DDP hook can stream gs."""
    names = tuple(n for n in VARIANTS if n not in ADVISE_EXCLUDES)
    return names + ((STREAM_CANDIDATE[0],) if stream_overlap_available() else ())


@dataclass(frozen=True)
class Candidate:
    """One method's predicted step."""

    name: str
    spec: MethodSpec
    step: StepTime
    settings: dict[str, Any] = field(default_factory=dict)
    warmup: Warmup = Warmup(0, 0, 0, 0.0)
    reach: Reach | None = None
    #: the workers its method's defaults are resolved for (gs's shape depends on P); None:
    #: the small-P defaults (a streamed gs keeps them)
    default_workers: int | None = None

    def run_seconds(self, steps: int) -> float:
        """Predicted seconds of a run of ``steps`` steps, its density warm-up included."""
        return steps * self.step.total + (self.warmup.extra_seconds if steps else 0.0)

    def target_steps(self, dense_steps: int) -> int | None:
        """Steps to dense's accuracy target when dense needs ``dense_steps``: the measured
        multiple of them (:mod:`gssgd.costmodel.reach`); None where not reached or not
        measured."""
        if self.reach is None or self.reach.steps_ratio is None:
            return None
        return math.ceil(dense_steps * self.reach.steps_ratio)

    def target_seconds(self, dense_steps: int) -> float | None:
        """Predicted seconds to dense's accuracy target (:meth:`target_steps`)."""
        steps = self.target_steps(dense_steps)
        return None if steps is None else self.run_seconds(steps)

    def target_bytes(self, dense_steps: int) -> float | None:
        """Bytes the busiest worker sends until dense's accuracy target."""
        steps = self.target_steps(dense_steps)
        return None if steps is None else self.warmup.run_bytes_sent(steps)

    def rank_key(self, dense_steps: int) -> tuple[int, float]:
        """Advice order: those measured to reach the target, by the time to it; then those
        not measured, by the step; then those measured short of it, by the step."""
        seconds = self.target_seconds(dense_steps)
        if seconds is not None:
            return (0, seconds)
        return (1 if self.reach is None else 2, self.step.total)

    @property
    def method(self) -> str:
        """The ``--method`` / ``HookState`` name (the variant's method)."""
        return self.spec.aggregator

    def options(self) -> dict[str, Any]:
        """The aggregator options this candidate sets away from its method's defaults at
        its number of workers (the density warm-up aside: :meth:`Advice.train_command` and :meth:`Advice.hook_call`
        state it where it differs from theirs)."""
        base = method_spec(self.spec.aggregator, self.spec.d, k=self.spec.k,
                           world_size=self.default_workers).aggregator_options()
        mine = self.spec.aggregator_options()
        changed = {k: v for k, v in mine.items() if base.get(k) != v and k not in _WARMUP_KEYS}
        return changed | self.settings


@dataclass(frozen=True)
class Advice:
    """Every candidate's predicted step and time to the accuracy target, in the order of
    :meth:`Candidate.rank_key` (the first is the recommendation), and the inputs.
    ``run_steps`` is the run length dense needs: the others' times to the target scale it
    by their measured steps ratio."""

    candidates: tuple[Candidate, ...]
    params: int
    workers: int
    link: Link
    device: Device
    density: float
    run_steps: int = DEFAULT_RUN_STEPS

    @property
    def powersgd(self) -> Reach | None:
        """PowerSGD's measured convergence at the nearest P (its lowest rank that reached
        dense's accuracy): not a candidate, as its step needs the layer shapes, but named
        beside the advice (:func:`gssgd.costmodel.reach.powersgd_reach`)."""
        return powersgd_reach(self.workers)

    @property
    def recommended(self) -> Candidate:
        """The first in order: the fastest to dense's accuracy where it was measured."""
        return self.candidates[0]

    @property
    def fastest_step(self) -> Candidate:
        """The candidate with the shortest predicted step, whatever its convergence."""
        return min(self.candidates, key=lambda c: c.step.total)

    def train_command(self, candidate: Candidate | None = None) -> str:
        """A ``gssgd train`` command line that runs ``candidate`` (default: the recommended)."""
        c = candidate or self.recommended
        parts = ["gssgd train", f"--method {c.method}", f"--workers {self.workers}"]
        if c.spec.k != c.spec.d:
            parts.append(f"--density {self.density:g}")
        if c.spec.warmup_steps != get_method(c.method).recipe_warmup_steps():
            parts.append(f"--warmup-steps {c.spec.warmup_steps}")
        for name, value in c.options().items():
            flag = "--payload-dtype" if name == "dtype" else "--" + name.replace("_", "-")
            if isinstance(value, bool):
                parts.append(flag if value else "--no-" + flag[2:])
            else:
                parts.append(f"{flag} {_plain(value)}")
        return " ".join(parts)

    def hook_call(self, candidate: Candidate | None = None) -> str:
        """The ``HookState(...)`` call for DDP (default: the recommended candidate)."""
        c = candidate or self.recommended
        args = [repr(c.method)]
        if c.spec.k != c.spec.d:  # sparse: selects over the whole model, as the model assumes
            args += [f"density={self.density:g}", "whole_model=True"]
        if c.spec.warmup_steps:  # the hook's own default is no warm-up
            args.append(f"warmup_steps={c.spec.warmup_steps}")
        for name, value in c.options().items():
            args.append(
                f"{name}={value!r}" if not isinstance(value, torch.dtype) else f"{name}={value}"
            )
        return f"HookState({', '.join(args)})"

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record (what ``gssgd advise --json`` prints)."""
        return {
            "inputs": {
                "params": self.params,
                "workers": self.workers,
                "link_bps": self.link.rate_bps,
                "latency_s": self.link.latency_s,
                "device": self.device.name,
                "density": self.density,
                "run_steps": self.run_steps,
            },
            "methods": {c.name: self._method_record(c) for c in self.candidates},
            "fastest_step": self.fastest_step.name,
            "recommended": {
                "name": self.recommended.name,
                "method": self.recommended.method,
                "options": _jsonable(self.recommended.options()),
                "seconds_per_step": self.recommended.step.total,
                "speedup_over_dense": self.speedup_over("dense"),
                "train_command": self.train_command(),
                "hook_call": self.hook_call(),
            },
            "model_error": dict(MEASURED_ERROR),
            "convergence": REACH_WHERE,
            "powersgd_not_modelled": None if self.powersgd is None else {
                "rank": int(self.powersgd.row.removeprefix("powersgd-r")),
                "measured_at_workers": self.powersgd.workers,
                "seeds": self.powersgd.seeds,
                "accuracy_gap_points": self.powersgd.gap_points,
                "steps_ratio": self.powersgd.steps_ratio,
            },
        }

    def _method_record(self, c: Candidate) -> dict[str, Any]:
        """One candidate's JSON record: its step, its warm-up, and a run of ``run_steps``."""
        n = self.run_steps
        return {
            "method": c.method,
            "options": _jsonable(c.options()),
            **c.step.as_dict(),
            "bytes_sent_per_step": c.warmup.step_bytes_sent,
            "warmup": c.warmup.as_dict(),
            "run": {
                "steps": n,
                "seconds": c.run_seconds(n),
                "bytes_sent": c.warmup.run_bytes_sent(n),
                "bytes_sent_per_step": c.warmup.run_bytes_sent(n) / n,
            },
            "to_target": None
            if c.reach is None
            else {
                "reached": c.reach.reached,
                "measured_at_workers": c.reach.workers,
                "seeds": c.reach.seeds,
                "accuracy_gap_points": c.reach.gap_points,
                "steps_ratio": c.reach.steps_ratio,
                "steps": c.target_steps(n),
                "seconds": c.target_seconds(n),
                "bytes_sent": c.target_bytes(n),
            },
        }

    def speedup_over(self, name: str) -> float | None:
        """The named candidate's step time over the recommended one's (None if absent)."""
        for c in self.candidates:
            if c.name == name:
                return c.step.total / self.recommended.step.total
        return None


def _plain(value: Any) -> str:
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else str(value)


def _jsonable(options: dict[str, Any]) -> dict[str, Any]:
    return {k: _plain(v) if isinstance(v, torch.dtype) else v for k, v in options.items()}


def advise(
    *,
    params: int,
    workers: int,
    link: Link,
    device: Device,
    density: float = 0.001,
    fwdbwd_s: float | None = None,
    methods: Sequence[str] | None = None,
    warmup_steps: int | None = None,
    run_steps: int = DEFAULT_RUN_STEPS,
) -> Advice:
    """Predict every candidate's step and time to dense's accuracy, and rank them
    (:meth:`Candidate.rank_key`: by the time to the target where the frontier study
    measured the candidate's convergence, :mod:`gssgd.costmodel.reach`; by the step
    otherwise). Each candidate also carries its density warm-up's bytes and seconds, and a
    run's.

    Args:
        params: the model's parameter count (the gradient length d).
        workers: P >= 2.
        link: every worker's link.
        device: the workers' device.
        density: fraction of coordinates the sparse methods send.
        fwdbwd_s: measured forward + backward seconds of one worker's batch (None: the
            device's per-parameter estimate).
        methods: the candidates (default :func:`candidate_methods`).
        warmup_steps: the density warm-up of the methods that take one; None: ``gssgd
            train``'s default (:meth:`gssgd.methods.Method.recipe_warmup_steps`: 100 steps
            for a sparse method), 0: none.
        run_steps: the run length the per-run figures total over (>= 1): dense's run to
            its accuracy; a method's time to the target scales it by the method's steps
            ratio.

    Raises:
        ValueError: a bad size, density, warm-up, run length or method name.
    """
    for label, value, low in (("warmup_steps", warmup_steps, 0), ("run_steps", run_steps, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < low):  # fmt: skip
            raise ValueError(f"{label}={value!r} must be an integer >= {low}")
    names = tuple(methods) if methods is not None else candidate_methods()
    out = []
    for name in names:
        variant, settings, overlap = name, {}, None
        if name == STREAM_CANDIDATE[0]:
            _, variant, settings = STREAM_CANDIDATE
            overlap = "table"
        method, _ = get_variant(variant)  # a clear error for an unknown name
        warm = method.recipe_warmup_steps() if warmup_steps is None else warmup_steps
        # gs's default shape depends on P (sketch_default_shape); streaming keeps the small-P
        # shape (its regions cannot pre-filter: gssgd.ddp.stream)
        shape_for = None if overlap is not None else workers
        spec = method_spec(variant, params, density, warmup_steps=warm, world_size=shape_for)
        step = predict_step(spec, workers, link, device, fwdbwd_s=fwdbwd_s, overlap=overlap)
        warmup = predict_warmup(spec, workers, link, device)
        converged = reach(spec, workers, density, streamed=overlap is not None)
        out.append(Candidate(name, spec, step, dict(settings), warmup, converged, shape_for))
    out.sort(key=lambda c: c.rank_key(run_steps))
    return Advice(tuple(out), params, workers, link, device, density, run_steps)
