"""Which method makes a given training job fastest: every candidate's predicted step on the
cost model (:func:`gssgd.costmodel.cluster.predict_step`, with the device's constants and
:func:`~gssgd.costmodel.network.cluster_network`), times the steps one study measured it to
need to reach dense's target (:mod:`gssgd.costmodel.evidence`), the fastest to that target,
and how to ask for it (a ``gssgd train`` command line and a Python call).

The candidates are every benchmark method and variant (dense, dense16, topk, gtopk,
sketched, gs and its variants, PowerSGD at ranks 1, 2 and 4), gs streamed by the DDP hook,
and local steps (DiLoCo: dense outer steps every H = 10, 30 or 100 steps), less
:data:`gssgd.costmodel.check.ADVISE_EXCLUDES`. PowerSGD's message depends on the layer
shapes, so ``advise`` needs them: a shipped model's (``model_shapes``) or an architecture
family's at the given size (:func:`gssgd.costmodel.architectures.layer_shapes`).

Ranking (:meth:`Candidate.rank_key`): by the predicted time to the target, where a
candidate's steps are dense's times its measured ratio; a candidate the study did not
measure (another family, a P beyond 2x, a density not run) is ranked by its time per step
alone (dense's steps) and marked so; one measured short of the target comes last, with
one the study did not run whose method's every measured setting missed (a faster step of
an unmeasured setting is no promise then).

Example:
    >>> a = advise(params=25_600_000, workers=64, link=Link(10**10, 20e-6),
    ...            device=get_device("h200"), density=0.001,
    ...            shapes=layer_shapes("resnet", 25_600_000), family="image")
    >>> a.recommended.name, a.train_command(), a.hook_call()
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gssgd.costmodel import store
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
from gssgd.costmodel.evidence import Evidence, Study, evidence_for, row_key, study_for
from gssgd.costmodel.method_specs import VARIANTS, MethodSpec, method_spec
from gssgd.costmodel.network import Network, cluster_network
from gssgd.methods import get_variant
from gssgd.recipes import warmup_steps_recipe

__all__ = [
    "DEFAULT_RUN_STEPS",
    "LOCAL_STEPS",
    "Advice",
    "Candidate",
    "advise",
    "candidate_methods",
    "held_out_error",
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
#: gs streamed by the DDP hook: name -> (the benchmark variant it is modelled as, its hook
#: settings); a candidate when the hook can stream.
STREAM_CANDIDATE = ("gs-stream", "gs-backend", {"overlap": "stream"})
#: Local steps (DiLoCo: H inner steps, then a dense outer step): name -> H.
LOCAL_STEPS: dict[str, int] = {"diloco-h10": 10, "diloco-h30": 30, "diloco-h100": 100}


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


def held_out_error() -> dict[str, Any]:
    """The cost model's held-out error on this machine's emulated links, as ``gssgd advise
    --calibrate`` measured it (``fit.json``): points, median and largest ``|relative
    error|``, each method's, runs, and where."""
    return dict(store.load("fit.json")["held_out"])


def fitted_network() -> Network:
    """The network fitted on this machine's emulated links (``fit.json``)."""
    return Network.from_dict(store.load("fit.json")["network"])


def candidate_methods() -> tuple[str, ...]:
    """The methods ``advise`` compares: the benchmark variants (registration order), gs
    streamed when the DDP hook can stream it, and local steps."""
    names = tuple(n for n in VARIANTS if n not in ADVISE_EXCLUDES)
    stream = (STREAM_CANDIDATE[0],) if stream_overlap_available() else ()
    return names + stream + tuple(LOCAL_STEPS)


@dataclass(frozen=True)
class Candidate:
    """One method's predicted step and its evidence."""

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

    def run_seconds(self, steps: int) -> float:
        """Predicted seconds of a run of ``steps`` steps, its density warm-up included."""
        return steps * self.step.total + (self.warmup.extra_seconds if steps else 0.0)

    def target_steps(self, dense_steps: int) -> int | None:
        """Steps to dense's target when dense needs ``dense_steps``: the measured multiple
        of them, or dense's own where the steps were not measured (see the module doc);
        None where it was measured short of the target."""
        e = self.evidence
        if e.measured and not e.reached:
            return None
        ratio = e.steps_ratio if e.steps_ratio is not None else 1.0
        return math.ceil(dense_steps * ratio)

    def target_seconds(self, dense_steps: int) -> float | None:
        """Predicted seconds to dense's target (:meth:`target_steps`)."""
        steps = self.target_steps(dense_steps)
        return None if steps is None else self.run_seconds(steps)

    def target_bytes(self, dense_steps: int) -> float | None:
        """Bytes the busiest worker sends until dense's target."""
        steps = self.target_steps(dense_steps)
        return None if steps is None else self.warmup.run_bytes_sent(steps)

    def rank_key(self, dense_steps: int) -> tuple[int, float]:
        """Advice order: by the time to the target; last, by the step, those that rank with
        the misses (:meth:`ranks_with_the_misses`)."""
        if self.ranks_with_the_misses(dense_steps):
            return (1, self.step.total)
        seconds = self.target_seconds(dense_steps)
        assert seconds is not None
        return (0, seconds)

    def ranks_with_the_misses(self, dense_steps: int) -> bool:
        """Measured short of the target, or not run where its method's every measured
        setting missed it (a faster step of an unmeasured setting is no promise then)."""
        return self.target_seconds(dense_steps) is None or self.evidence.kin_missed

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
        if self.method == "powersgd":
            changed["rank"] = self.spec.rank
        return changed | self.settings


@dataclass(frozen=True)
class Advice:
    """Every candidate's predicted step and time to the target, in the order of
    :meth:`Candidate.rank_key` (the first is the recommendation), and the inputs.
    ``run_steps`` is the run length dense needs: the others' times to the target scale it
    by their measured steps ratio."""

    candidates: tuple[Candidate, ...]
    params: int
    workers: int
    link: Link
    device: Device
    density: float
    study: Study | None
    family: str
    run_steps: int = DEFAULT_RUN_STEPS
    architecture: str | None = None

    @property
    def recommended(self) -> Candidate:
        """The first in order: the fastest to the target."""
        return self.candidates[0]

    @property
    def best_measured(self) -> Candidate | None:
        """The first in order whose steps to the target were measured (None: none was)."""
        return next((c for c in self.candidates if c.evidence.steps_ratio is not None), None)

    @property
    def fastest_step(self) -> Candidate:
        """The candidate with the shortest predicted step, whatever its convergence."""
        return min(self.candidates, key=lambda c: c.step.total)

    def train_command(self, candidate: Candidate | None = None) -> str:
        """A ``gssgd train`` command line that runs ``candidate`` (default: the recommended)."""
        c = candidate or self.recommended
        parts = ["gssgd train", f"--method {c.method}", f"--workers {self.workers}"]
        if c.local_steps:
            return " ".join(parts + [f"--local-steps {c.local_steps}"])
        if c.spec.k != c.spec.d:
            parts.append(f"--density {self.density:g}")
        if c.spec.warmup_steps != warmup_steps_recipe(c.method):
            parts.append(f"--warmup-steps {c.spec.warmup_steps}")
        for name, value in c.options().items():
            flag = {"dtype": "--payload-dtype", "rank": "--powersgd-rank"}.get(
                name, "--" + name.replace("_", "-"))
            if isinstance(value, bool):
                parts.append(flag if value else "--no-" + flag[2:])
            else:
                parts.append(f"{flag} {_plain(value)}")
        return " ".join(parts)

    def hook_call(self, candidate: Candidate | None = None) -> str:
        """The Python call for a DDP script (default: the recommended candidate): a
        ``HookState(...)``, or ``LocalSteps(...)`` for local steps."""
        c = candidate or self.recommended
        if c.local_steps:
            return f"LocalSteps(model, {c.method!r}, local_steps={c.local_steps})"
        args = [repr(c.method)]
        if c.spec.k != c.spec.d:
            args.append(f"density={self.density:g}")
        args.append("model=ddp_model")  # whole-model selection in model order
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
                "params": self.params, "workers": self.workers, "link_bps": self.link.rate_bps,
                "latency_s": self.link.latency_s, "device": self.device.name,
                "density": self.density, "run_steps": self.run_steps, "family": self.family,
                "architecture": self.architecture,
            },
            "methods": {c.name: self._method_record(c) for c in self.candidates},
            "fastest_step": self.fastest_step.name,
            "best_measured": None if self.best_measured is None else self.best_measured.name,
            "recommended": {
                "name": self.recommended.name,
                "method": self.recommended.method,
                "options": _jsonable(self.recommended.options()),
                "seconds_per_step": self.recommended.step.total,
                "train_command": self.train_command(),
                "call": self.hook_call(),
            },
            "evidence": None if self.study is None else {
                "study": self.study.name, "title": self.study.title,
                "architecture": self.study.architecture or None,
                "target": self.study.target, "source": self.study.source},
            "model_error": held_out_error(),
        }

    def _method_record(self, c: Candidate) -> dict[str, Any]:
        """One candidate's JSON record: its step, its warm-up, a run, and its evidence."""
        n, e = self.run_steps, c.evidence
        return {
            "method": c.method,
            "options": _jsonable(c.options()),
            **c.step.as_dict(),
            "bytes_sent_per_step": c.warmup.step_bytes_sent,
            "warmup": c.warmup.as_dict(),
            "run": {"steps": n, "seconds": c.run_seconds(n),
                    "bytes_sent": c.warmup.run_bytes_sent(n)},
            "evidence": {"row": e.row, "measured_at_workers": e.workers, "seeds": e.seeds,
                         "gap": e.gap, "steps_ratio": e.steps_ratio, "reached": e.reached,
                         "not_measured_because": e.why or None,
                         "its_method_measured": e.kin or None,
                         "its_method_missed": e.kin_missed},
            "to_target": {"steps": c.target_steps(n), "seconds": c.target_seconds(n),
                          "bytes_sent": c.target_bytes(n),
                          "steps_measured": e.steps_ratio is not None},
        }


def _plain(value: Any) -> str:
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else str(value)


def _jsonable(options: dict[str, Any]) -> dict[str, Any]:
    return {k: _plain(v) if isinstance(v, torch.dtype) else v for k, v in options.items()}


def _local_steps_step(step: StepTime, h: int) -> StepTime:
    """A DiLoCo step: the inner step's forward and backward every step, the dense outer
    step's compression and communication once every ``h`` (after the inner steps: nothing
    hidden)."""
    return StepTime(fwdbwd=step.fwdbwd, compression=step.compression / h,
                    latency=step.latency / h, bandwidth=step.bandwidth / h, hidden=0.0,
                    pattern=step.pattern, overlap="none")


def _candidate(name: str, params: int, workers: int, link: Link, device: Device,
               network: Network, density: float, fwdbwd_s: float | None,
               warmup_steps: int | None, shapes: Sequence[Sequence[int]] | None,
               study: Study | None, family: str) -> Candidate:
    """One candidate's spec, predicted step, warm-up and evidence."""
    variant, settings, overlap, h = name, {}, None, LOCAL_STEPS.get(name)
    if name == STREAM_CANDIDATE[0]:
        _, variant, settings = STREAM_CANDIDATE
        overlap = "table"
    elif h:
        variant = "dense"
    method, _ = get_variant(variant)  # a clear error for an unknown name
    warm = warmup_steps_recipe(method.name) if warmup_steps is None else warmup_steps
    # gs's default shape depends on P (sketch_default_shape); streaming has its own shape
    # (its regions cannot pre-filter: gssgd.ddp.stream)
    shape_for = None if overlap is not None else workers
    spec = method_spec(variant, params, density, warmup_steps=warm, world_size=shape_for,
                       shapes=None if shapes is None else tuple(tuple(s) for s in shapes),
                       streamed=overlap is not None)
    step = predict_step(spec, workers, link, device, network, fwdbwd_s=fwdbwd_s,
                        overlap="none" if h else overlap)
    warmup = predict_warmup(spec, workers, link, network)
    if h:
        step = _local_steps_step(step, h)
        warmup = Warmup(0, 0, warmup.step_bytes_sent // h, 0.0)
    row = row_key(spec, density, streamed=overlap is not None, local_steps=h)
    return Candidate(name, spec, step, evidence_for(study, row, workers, family),
                     dict(settings), warmup, shape_for, h)


def advise(
    *,
    params: int,
    workers: int,
    link: Link,
    device: Device,
    density: float = 0.001,
    shapes: Sequence[Sequence[int]] | None = None,
    family: str = "image",
    fwdbwd_s: float | None = None,
    methods: Sequence[str] | None = None,
    warmup_steps: int | None = None,
    run_steps: int = DEFAULT_RUN_STEPS,
    network: Network | None = None,
    architecture: str | None = None,
) -> Advice:
    """Predict every candidate's step and time to dense's target, and rank them (see the
    module doc).

    Args:
        params: the model's parameter count (the gradient length d).
        workers: P >= 2.
        link: every worker's link.
        device: the workers' device.
        density: fraction of coordinates the sparse methods send.
        shapes: the model's layer shapes in order, adding up to ``params`` (PowerSGD's
            message; None: PowerSGD reads the vector as one near-square matrix, which
            flatters it, so the command line always passes shapes).
        family: the model's family (:data:`gssgd.costmodel.evidence.FAMILIES`): which study
            the evidence comes from.
        architecture: the model's architecture (``"lstm"``, ``"transformer"``, ...;
            :func:`gssgd.costmodel.architectures.architecture_of`): within the family, the
            study of the same architecture where one was measured (None: the family's).
        fwdbwd_s: measured forward + backward seconds of one worker's batch (None: the
            device's per-parameter estimate).
        methods: the candidates (default :func:`candidate_methods`).
        warmup_steps: the density warm-up of the methods that take one; None: ``gssgd
            train``'s default (100 steps for a sparse method), 0: none.
        run_steps: the run length dense needs to its target (>= 1).
        network: the network's constants (default: :func:`cluster_network` of the fitted
            one).

    Raises:
        ValueError: a bad size, density, warm-up, run length or method name.
    """
    for label, value, low in (("warmup_steps", warmup_steps, 0), ("run_steps", run_steps, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < low):  # fmt: skip
            raise ValueError(f"{label}={value!r} must be an integer >= {low}")
    net = cluster_network(fitted_network()) if network is None else network
    study = study_for(family, architecture)
    names = tuple(methods) if methods is not None else candidate_methods()
    out = [_candidate(n, params, workers, link, device, net, density, fwdbwd_s, warmup_steps,
                      shapes, study, family) for n in names]
    out.sort(key=lambda c: c.rank_key(run_steps))
    return Advice(tuple(out), params, workers, link, device, density, study, family, run_steps,
                  architecture)
