"""Which method makes a given training job fastest, from two answers kept apart:

* the **step** (compute + communication on the user's cluster) of every candidate, from the
  one step model (:func:`gssgd.costmodel.cluster.predict_step` with the device's constants
  and the network fitted in :mod:`gssgd.costmodel.fit`, whose held-out error is what the
  report prints);
* the **steps to dense's target**, only from a study of the model's family
  (:mod:`gssgd.costmodel.evidence`): the package's, or the user's own ``gssgd study``
  (``advise --evidence``).

The candidates are every benchmark method and variant (dense, dense16, topk, gtopk,
sketched, gs and its variants, PowerSGD at ranks 1, 2 and 4), gs streamed by the DDP hook,
and local steps (DiLoCo: dense outer steps every H = 10, 30 or 100 steps), less
:data:`gssgd.costmodel.fit.ADVISE_EXCLUDES`. PowerSGD's message depends on the layer
shapes: a model's own or an architecture family's at the given size
(:func:`gssgd.costmodel.architectures.layer_shapes`).

**The pick** (:func:`gssgd.costmodel.candidates.pick`) is made among the candidates the study measured reaching the
target (at every worker count it ran them at) only: each one's time to the target is its
step times dense's steps times its measured steps ratio. Dense is the simplest; dense16 the
next. A candidate is picked over the simpler one only when it is faster by more than its
**margin**: the step model's held-out communication error for its method family
(:func:`gssgd.costmodel.fit.margin_of`) times the communication's share of its
predicted step, plus the evidence's distance penalty
(:attr:`gssgd.costmodel.evidence.Evidence.penalty`); otherwise the simpler one is picked,
"within the model's error". A candidate measured short of the target, or not measured, is
listed with its step time only, never recommended.

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
from dataclasses import dataclass
from typing import Any

import torch

from gssgd.costmodel import store
from gssgd.costmodel.candidates import Candidate, pick
from gssgd.costmodel.cluster import (
    Link,
    StepTime,
    Warmup,
    predict_step,
    predict_warmup,
)
from gssgd.costmodel.devices import Device
from gssgd.costmodel.evidence import Study, evidence_for, row_key, study_for
from gssgd.costmodel.fit import ADVISE_EXCLUDES, fitted_network, margin_of
from gssgd.costmodel.method_specs import VARIANTS, method_spec
from gssgd.costmodel.network import Network
from gssgd.methods import get_variant
from gssgd.recipes import warmup_steps_recipe
from gssgd.validate import check_int

__all__ = [
    "BUCKETS_SETTINGS",
    "DEFAULT_RUN_STEPS",
    "LOCAL_STEPS",
    "Advice",
    "Candidate",
    "advise",
    "candidate_methods",
    "cluster_network",
    "fitted_network",
    "held_out_error",
    "pick",
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
#: gs streamed by the DDP hook: name -> (the benchmark variant it is modelled as, its hook
#: settings); a candidate when the hook can stream.
STREAM_CANDIDATE = ("gs-stream", "gs-backend", {"overlap": "stream"})
#: The hook settings of a method that compresses each tensor by its shape (PowerSGD): per
#: bucket, every bucket but the last averaged while backward runs (``overlap="buckets"``),
#: which is its whole-model algorithm overlapped (gssgd.costmodel.cluster).
BUCKETS_SETTINGS: dict[str, object] = {"whole_model": False, "overlap": "buckets"}
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
    number = float(match["num"]) * _SUFFIXES[match["suffix"]]
    value = round(number) if math.isfinite(number) else MAX_PARAMS + 1
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
    """The step model's held-out check as ``gssgd advise --calibrate`` measured it
    (``fit.json``; :func:`gssgd.costmodel.fit.held_out`): by run, by worker count and
    by vector size, each with its median and largest ``|relative error|`` overall, per
    method and per family; and what the runs covered (``validated_on``)."""
    fit = store.load("fit.json")
    return {**fit["held_out"], "validated_on": fit["validated_on"]}


def cluster_network(device: Device) -> Network:
    """The network ``advise`` predicts ``device``'s cluster with: the fitted one as it was
    measured for this machine's CPU (gloo, its efficiencies), else as a GPU cluster's
    (:meth:`~gssgd.costmodel.network.Network.for_cluster`)."""
    net = fitted_network()
    return net if device.name == "cpu" else net.for_cluster()


def candidate_methods() -> tuple[str, ...]:
    """The methods ``advise`` compares: the benchmark variants (registration order; not an
    alias of its method's defaults), gs streamed by the DDP hook, and local steps."""
    names = tuple(n for n in VARIANTS
                  if n not in ADVISE_EXCLUDES and not get_variant(n)[1].alias)
    return names + (STREAM_CANDIDATE[0],) + tuple(LOCAL_STEPS)


@dataclass(frozen=True)
class Advice:
    """Every candidate's predicted step and time to the target, in the order of
    :meth:`Candidate.rank_key`, the pick (:func:`pick`) and why, and the inputs.
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
    #: the recommended candidate's name (:func:`pick`) and why, in words
    pick: str = ""
    why: str = ""

    @property
    def recommended(self) -> Candidate:
        """The pick (:func:`pick`): measured to reach the target, and faster than the
        simpler candidates by more than its margin."""
        return next(c for c in self.candidates if c.name == self.pick)

    @property
    def best_measured(self) -> Candidate | None:
        """The fastest to the target of those measured reaching it (None: none was)."""
        return next((c for c in self.candidates if c.eligible), None)

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
            if name == "whole_model":  # the CLI's flag says the opposite
                if not value:
                    parts.append("--per-bucket")
                continue
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
                "why": self.why,
                "train_command": self.train_command(),
                "call": self.hook_call(),
            },
            "evidence": None if self.study is None else {
                "study": self.study.name, "title": self.study.title,
                "architecture": self.study.architecture or None,
                "target": self.study.target, "source": self.study.source,
                "model_size": {str(p): d for p, d in self.study.d.items()},
                "caveats": list(self.study.caveats)},
            "device": {"name": self.device.name, "summary": self.device.summary,
                       "source": self.device.source},
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
                         "missed_at_workers": list(e.missed_at), "trial": e.trial,
                         "workers_factor": e.p_factor, "size_factor": e.d_factor,
                         "confidence": e.confidence if e.measured else None,
                         "not_measured_because": e.why or None,
                         "its_method_measured": e.kin or None},
            "eligible": c.eligible,
            "margin": {"communication_error": c.comm_error, "model_error": c.model_error,
                       "evidence_penalty": e.penalty, "total": c.margin},
            "to_target": {"steps": c.target_steps(n), "seconds": c.target_seconds(n),
                          "bytes_sent": c.target_bytes(n)},
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
               study: Study | None, family: str, held: dict[str, Any]) -> Candidate:
    """One candidate's spec, predicted step, warm-up, evidence and model error (``held``:
    the step model's held-out check)."""
    variant, settings, overlap, h = name, {}, None, LOCAL_STEPS.get(name)
    streamed = name == STREAM_CANDIDATE[0]
    if streamed:
        _, variant, settings = STREAM_CANDIDATE
        overlap = "table"
    elif h:
        variant = "dense"
    method, _ = get_variant(variant)  # a clear error for an unknown name
    if method.aggregator is not None and method.aggregator.takes_shapes:
        settings, overlap = dict(BUCKETS_SETTINGS), "buckets"  # the same algorithm, overlapped
    warm = warmup_steps_recipe(method.name) if warmup_steps is None else warmup_steps
    # gs's default shape depends on P (sketch_default_shape); streaming has its own shape
    # (its regions cannot pre-filter: gssgd.ddp.streaming_gs)
    shape_for = None if streamed else workers
    spec = method_spec(variant, params, density, warmup_steps=warm, world_size=shape_for,
                       shapes=None if shapes is None else tuple(tuple(s) for s in shapes),
                       streamed=streamed)
    step = predict_step(spec, workers, link, device, network, fwdbwd_s=fwdbwd_s,
                        overlap="none" if h else overlap)
    warmup = predict_warmup(spec, workers, link, network)
    if h:
        step = _local_steps_step(step, h)
        warmup = Warmup(0, 0, warmup.step_bytes_sent // h, 0.0)
    row = row_key(spec, density, streamed=streamed, local_steps=h)
    return Candidate(name, spec, step, evidence_for(study, row, workers, family, params),
                     dict(settings), warmup, shape_for, h, margin_of(held, method.name))


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
    study: Study | None | str = "package",
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
            message; None: one near-square matrix, which flatters PowerSGD).
        family: the model's family (:data:`gssgd.costmodel.evidence.FAMILIES`).
        architecture: the model's architecture (``"lstm"``, ``"transformer"``, ...;
            :func:`gssgd.train.models.architecture_of` for a shipped model): within the family, the
            study of the same architecture where one was measured (None: the family's).
        fwdbwd_s: measured forward + backward seconds of one worker's batch (None: the
            device's per-parameter estimate).
        methods: the candidates (default :func:`candidate_methods`).
        warmup_steps: the density warm-up of the methods that take one; None: ``gssgd
            train``'s default (100 steps for a sparse method), 0: none.
        run_steps: the run length dense needs to its target (>= 1).
        network: the network's constants (default: :func:`cluster_network` of ``device``).
        study: the evidence: ``"package"`` (default: :func:`~gssgd.costmodel.evidence.
            study_for` the family and architecture), a user's ``Study``, or None.

    Raises:
        ValueError: a bad size, density, warm-up, run length or method name.
    """
    for label, value, low in (("warmup_steps", warmup_steps, 0), ("run_steps", run_steps, 1)):
        if value is not None:
            check_int(label, value, low)
    net = cluster_network(device) if network is None else network
    evidence = study_for(family, architecture) if study == "package" else study
    assert not isinstance(evidence, str)
    held = held_out_error()
    names = tuple(methods) if methods is not None else candidate_methods()
    out = [_candidate(n, params, workers, link, device, net, density, fwdbwd_s, warmup_steps,
                      shapes, evidence, family, held) for n in names]
    out.sort(key=lambda c: c.rank_key(run_steps))
    chosen, why = pick(out, run_steps)
    return Advice(tuple(out), params, workers, link, device, density, evidence, family,
                  run_steps, architecture, chosen.name, why)
