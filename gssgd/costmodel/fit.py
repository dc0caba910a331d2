"""The fit of the one step model ``gssgd advise`` predicts with: the ``gssgd bench comm``
runs it reads (:class:`Measurement`, :func:`load_measurements`), its constants fitted on this
machine's emulated links, and its check there on measured steps it was not fitted on.

A *run* is one ``gssgd bench comm`` result (one P, one d, one link) and its methods. The
model is :func:`gssgd.costmodel.cluster.predict_step` with one
:class:`~gssgd.costmodel.network.Network`. Every term is in it on this machine and on a
cluster alike; what differs is only its inputs:

* the link: its rate; its per-message latency (here the run's own probe, a 4-byte
  all-gather timed in the run, ``_meta.latency_probe``: what gloo, Python and the scheduler
  add to a message; on a cluster ``--latency``); its token bucket (here tbf's, which lets
  a bucket leave at memory speed after an idle moment; a real link has none);
* the workers per core ``s`` (here the run's compute probe; 1 on a cluster), which a
  round a Python loop drives waits for (its partner shares a core with ``s - 1`` others);
* the compute: here the run's measured compute, as a device's measured constants give it
  on a cluster (:mod:`gssgd.costmodel.devices`; a GPU's are not checked by these runs,
  and the report says so).

The fit (:func:`fit_model`), on the training runs only:

1. one efficiency per collective pattern (:func:`gssgd.costmodel.network.pattern_of`): the
   fraction of the link's rate the pattern's payload reaches. A step is
   ``rest + wire / eta``, so ``1 / eta`` is the least-squares solution of the relative
   error over the pattern's points (:func:`_least_squares`); patterns with fewer than two
   points take the efficiency over all points; none above 1;
2. the driven round: seconds a Python-driven round waits per other worker on its partner's
   core, least squares likewise (refitted in turn with 1 until it settles);
3. the burst credit: the share of the token bucket each round sends free, chosen from
   :data:`BURST_CREDITS` by the squared relative error;
4. and, for ``--device cpu`` only, the CPU's compression laws (:class:`ComputeLaw`: per
   method, ``gamma(d) = gamma_1M * (d / 1M) ** slope``, least squares in log-log).

The check (:func:`held_out`) predicts every measured step with a model fitted without it,
three ways: leaving out its run, its worker count, or its vector size. It records the
step's error and the **communication's alone** (the measured step less its measured
compute, against the prediction less the same: what a cluster's step rests on where
communication dominates), overall, per method and per family. ``advise``'s tie margin for
a method is its family's communication error (:func:`margin_of`: the worst median of the
three hold-outs) times the communication's share of the method's predicted step. ``gssgd
advise --calibrate RUNS...`` fits on every run, checks, and stores both in
``gssgd/costmodel/data/fit.json`` (:func:`calibration_record`), every float rounded to
:data:`SIGNIFICANT` digits so that the file remade on another CPU is the same bytes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gssgd.costmodel import store
from gssgd.costmodel.cluster import Link, communication_seconds
from gssgd.costmodel.compute_law import ComputeLaw, fit_compute_law
from gssgd.costmodel.devices import Device
from gssgd.costmodel.link_rate import LinkShape
from gssgd.costmodel.method_specs import MethodSpec
from gssgd.costmodel.network import PATTERNS, Network, pattern_of, rounds_of

__all__ = [
    "ADVISE_EXCLUDES",
    "BURST_CREDITS",
    "HOLD_OUTS",
    "PROBED_LATENCY_S",
    "SIGNIFICANT",
    "ErrorRow",
    "FittedModel",
    "Measurement",
    "RecommendationRow",
    "calibration_record",
    "error_record",
    "emulated_step_seconds",
    "error_summary",
    "fit_model",
    "fitted_network",
    "held_out",
    "held_out_errors",
    "load_measurements",
    "margin_of",
    "per_method_errors",
    "rated",
    "recommendation_check",
    "rounded",
    "validated_on",
]

# --------------------------------------------------------------------------- measurements


@dataclass(frozen=True)
class Measurement:
    """One measured method of one ``bench comm`` run.

    Attributes:
        spec: the method's spec; world_size, rate_bps: the run's P and link (None: loopback).
        seconds_per_step: the measured step time; seconds_compute: its time outside
            collectives (compress + decompress + other, on the critical path's rank).
        source: the results directory it came from.
        alpha_probe: the run's measured seconds per latency-bound round, if it has one.
        compute_share: the factor by which sharing cores stretched the run's compute: its
            compute probe's ``share`` (``_meta.compute_probe``), else
            ``max(1, P * threads / cores)``.
    """

    spec: MethodSpec
    world_size: int
    rate_bps: int | None
    seconds_per_step: float
    seconds_compute: float
    source: str = ""
    alpha_probe: float | None = None
    compute_share: float = 1.0


def load_measurements(directory: str | Path) -> list[Measurement]:
    """Read the methods of ``DIRECTORY/results.json`` written by ``gssgd bench comm``.

    Raises:
        FileNotFoundError: there is no results.json (the message says how to make one).
        ValueError: the file lacks the fields the model needs.
    """
    path = Path(directory)
    path = path / "results.json" if path.is_dir() else path
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist; pass a directory written by `gssgd bench comm --out DIR`"
        )
    data = json.loads(path.read_text())
    meta = data.get("_meta")
    if not isinstance(meta, dict) or "workers" not in meta or "link_bps" not in meta:
        raise ValueError(
            f"{path} has no '_meta' with 'workers' and 'link_bps'; it was not written by "
            "`gssgd bench comm` (or by an older version): rerun the benchmark"
        )
    probe = (meta.get("latency_probe") or {}).get("alpha")
    run = {
        "world_size": int(meta["workers"]),
        "rate_bps": meta["link_bps"],
        "source": str(path.parent),
        "alpha_probe": None if probe is None else float(probe),
        "compute_share": _compute_share(meta),
    }
    out = []
    for name, row in data.items():
        if name.startswith("_"):
            continue
        try:
            seconds_compute = (
                float(row["seconds_compress"])
                + float(row["seconds_decompress"])
                + float(row.get("seconds_other", 0.0))
            )
            out.append(
                Measurement(
                    spec=MethodSpec(**row["spec"]),
                    seconds_per_step=float(row["seconds_per_step"]),
                    seconds_compute=seconds_compute,
                    **run,
                )
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(
                f"{path}: method {name!r} lacks a field the model needs: {exc}"
            ) from None
    return out


def _compute_share(meta: dict[str, Any]) -> float:
    """The run's compute probe's share; without a probe, the workers' threads are taken to
    have shared the cores evenly."""
    share = (meta.get("compute_probe") or {}).get("share")
    if share is not None:
        return share
    cores = meta.get("cpu_count") or 0
    return max(1.0, meta["workers"] * meta.get("threads", 1) / cores) if cores else 1.0


@dataclass(frozen=True)
class ErrorRow:
    """A measured step next to the model's prediction; ``rel_error = pred/measured - 1``."""

    measurement: Measurement
    predicted: float

    @property
    def rel_error(self) -> float:
        return self.predicted / self.measurement.seconds_per_step - 1.0


def error_summary(rows: Sequence[ErrorRow]) -> dict[str, float]:
    """Median and largest ``|relative error|`` (and the count) of ``rows``."""
    errs = [abs(r.rel_error) for r in rows if math.isfinite(r.rel_error)]
    if not errs:
        return {"n": 0, "median_abs_rel_error": math.nan, "max_abs_rel_error": math.nan}
    return {
        "n": len(errs),
        "median_abs_rel_error": statistics.median(errs),
        "max_abs_rel_error": max(errs),
    }


# --------------------------------------------------------------------------- the fit

#: Benchmark variants ``gssgd advise`` never recommends: gs without its exact round diverged
#: in training (docs/benchmarks.md, "Levers"). (Nor a variant that is its method's defaults
#: under an earlier name: ``Variant.alias``.)
ADVISE_EXCLUDES: tuple[str, ...] = ("gs-estimate",)
#: How the check holds points out: by run, by worker count, by vector size.
HOLD_OUTS: dict[str, Callable[[Measurement], Hashable]] = {
    "run": lambda m: m.source,
    "workers": lambda m: m.world_size,
    "d": lambda m: m.spec.d,
}
#: The burst credits the fit chooses among (the share of the emulation's token bucket each
#: round sends free; 0: none, 1: a full bucket every round).
BURST_CREDITS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
#: The efficiencies and the driven round are refitted in turn until the latter moves by
#: less than this fraction, or this many times.
_ALTERNATION_TOL, _ALTERNATIONS = 1e-9, 30
#: Seconds a message takes on this machine's emulated links, for :func:`emulated_step_seconds`:
#: the latency probes of the fitted runs measured 0.8-3.3 ms.
PROBED_LATENCY_S = 0.003
#: Significant digits of every float fit.json stores (a refit on another CPU differs in
#: the last digits of a double; six digits are far inside the model's error).
SIGNIFICANT = 6


@dataclass
class FittedModel:
    """The step model with the constants fitted on this machine's emulated links.

    Attributes:
        network: the pattern efficiencies (nothing else: see the module doc).
        compute: the CPU's compression law per benchmark method.
    """

    network: Network
    compute: dict[str, ComputeLaw] = field(default_factory=dict)

    @property
    def device(self) -> Device:
        """This machine's CPU as the cost model sees it: the fitted compute laws."""
        return Device(name="cpu", summary="this machine's CPU (fitted)",
                      fwdbwd_s_per_param=0.0, compute=self.compute, overlap_efficiency=0.0)

    def predict(self, m: Measurement) -> float:
        """The model's step time for a measured aggregation step (no forward or backward):
        the run's measured compute, as a device's measured constants give it on a cluster,
        and the communication predicted on the run's link with its probed latency."""
        latency, bandwidth = communication_seconds(m.spec, m.world_size, _link(m),
                                                   self.network, compute_share=m.compute_share)
        return m.seconds_compute + latency + bandwidth

    def predict_compute(self, m: Measurement) -> float:
        """The CPU's compression law's compute for a measured step (``--device cpu``)."""
        return self.device.compression_seconds(m.spec, m.compute_share)


def _link(m: Measurement) -> Link:
    """The run's link as advise's ``--link``/``--latency`` would give it: its rate, its
    probed seconds per message, and the emulation's token bucket (a real link has none)."""
    return _emulated_link(m.rate_bps, m.alpha_probe or 0.0)


def _emulated_link(rate_bps: int | None, latency_s: float) -> Link:
    """An emulated link of ``rate_bps`` (None: loopback) with its tbf token bucket."""
    return Link(rate_bps, latency_s, 0 if rate_bps is None else LinkShape(rate_bps).burst_bytes)


def fitted_network() -> Network:
    """The network the step model predicts with (``fit.json``'s, :func:`calibration_record`)."""
    return Network.from_dict(store.load("fit.json")["network"])


def emulated_step_seconds(spec: MethodSpec, world_size: int, rate_bps: int | None,
                          compute_share: float = 1.0) -> float:
    """One aggregation step of ``spec`` on ``world_size`` workers of this machine's emulated
    links (``rate_bps``; None: loopback) by the stored fit: its communication at
    :data:`PROBED_LATENCY_S` a message and the CPU's compression laws, with the workers'
    ``compute_share``. ``gssgd bench`` sizes its time limits by it (they only catch
    stalls)."""
    from gssgd.costmodel.devices import get_device

    latency, bandwidth = communication_seconds(
        spec, world_size, _emulated_link(rate_bps, PROBED_LATENCY_S), fitted_network(),
        compute_share=compute_share)
    return latency + bandwidth + get_device("cpu").compression_seconds(spec, compute_share)


def _compute_laws(measurements: Sequence[Measurement]) -> dict[str, ComputeLaw]:
    """Part 4 of the module doc: one :class:`ComputeLaw` per method."""
    points: dict[str, list[tuple[int, float]]] = {}
    for m in measurements:
        if m.seconds_compute > 0:
            per_core = m.seconds_compute / (m.spec.d * m.compute_share)
            points.setdefault(m.spec.name, []).append((m.spec.d, per_core))
    return {name: fit_compute_law(p) for name, p in points.items()}


def _least_squares(points: Sequence[tuple[float, float, float]]) -> float | None:
    """The ``x >= 0`` minimising ``sum(((rest + f * x) / y - 1) ** 2)`` over
    ``(rest, f, y)`` points: ``sum((f / y) * (1 - rest / y)) / sum((f / y) ** 2)`` (None:
    no point has ``f``)."""
    num = sum((f / y) * (1.0 - r / y) for r, f, y in points)
    den = sum((f / y) ** 2 for r, f, y in points)
    return None if den == 0 else max(num / den, 0.0)


def _efficiencies(model: FittedModel, measurements: Sequence[Measurement]
                  ) -> tuple[dict[str, float], float]:
    """Part 1 of the module doc: each pattern's efficiency, and the one over all points,
    the rest of ``model`` fixed (a step is ``rest + wire / eta``: least squares in
    ``1 / eta``)."""
    ideal = FittedModel(dataclasses.replace(model.network, efficiency={},
                                            default_efficiency=1.0), model.compute)
    by_pattern: dict[str, list[tuple[float, float, float]]] = {p: [] for p in PATTERNS}
    for m in measurements:
        if m.rate_bps is None:
            continue
        _, wire = communication_seconds(m.spec, m.world_size, _link(m), ideal.network,
                                        compute_share=m.compute_share)
        rest = ideal.predict(m) - wire  # compute and latency
        by_pattern[pattern_of(m.spec)].append((rest, wire, m.seconds_per_step))
    inverse = _least_squares([p for ps in by_pattern.values() for p in ps])
    default = 1.0 if not inverse else min(1.0, 1.0 / inverse)
    out = {}
    for pattern, points in by_pattern.items():
        inv = _least_squares(points) if len(points) >= 2 else None
        if inv:
            out[pattern] = min(1.0, 1.0 / inv)  # no payload outruns its link
    return out, default


def _driven_round(model: FittedModel, measurements: Sequence[Measurement]) -> float:
    """Part 2 of the module doc: the seconds of a driven round's wait per other worker on
    the partner's core, the rest of ``model`` fixed (least squares; ``model``'s own value
    where no point has a driven round and a shared core)."""
    without = FittedModel(dataclasses.replace(model.network, driven_round_s=0.0),
                          model.compute)
    points = []
    for m in measurements:
        waits = rounds_of(m.spec, m.world_size).driven * max(0.0, m.compute_share - 1.0)
        if waits:
            points.append((without.predict(m), waits, m.seconds_per_step))
    found = _least_squares(points)
    return model.network.driven_round_s if found is None else found


def fit_model(measurements: Sequence[Measurement]) -> FittedModel:
    """Fit the compute laws, the pattern efficiencies, the driven round and the burst
    credit (see the module doc).

    Raises:
        ValueError: no measurements.
    """
    if not measurements:
        raise ValueError("no measurements to fit: pass gssgd bench comm result directories")
    compute = _compute_laws(measurements)
    best: tuple[float, FittedModel] | None = None
    for credit in BURST_CREDITS:
        model = FittedModel(Network(burst_credit=credit), compute)
        for _ in range(_ALTERNATIONS):  # the efficiencies and the driven round in turn
            efficiency, default = _efficiencies(model, measurements)
            model.network = dataclasses.replace(model.network, efficiency=efficiency,
                                                default_efficiency=default)
            before, driven = model.network.driven_round_s, _driven_round(model, measurements)
            model.network = dataclasses.replace(model.network, driven_round_s=driven)
            if abs(driven - before) <= _ALTERNATION_TOL * max(driven, 1e-12):
                break
        cost = sum((model.predict(m) / m.seconds_per_step - 1.0) ** 2 for m in measurements)
        if best is None or cost < best[0]:
            best = (cost, model)
    assert best is not None
    sources = sorted({m.source for m in measurements})
    best[1].network = dataclasses.replace(
        best[1].network, source=f"fitted on {len(sources)} gssgd bench comm runs")
    return best[1]


def held_out_errors(measurements: Sequence[Measurement], by: str = "run") -> list[ErrorRow]:
    """Each point predicted by the model fitted on the points of every other group of
    :data:`HOLD_OUTS` ``by`` (``"run"``, ``"workers"`` or ``"d"``); a group that leaves
    nothing to fit on is skipped."""
    key = HOLD_OUTS[by]
    groups: dict[Hashable, list[Measurement]] = {}
    for m in measurements:
        groups.setdefault(key(m), []).append(m)
    rows = []
    for name, held in groups.items():
        rest = [m for g, ms in groups.items() if g != name for m in ms]
        if rest:
            model = fit_model(rest)
            rows += [ErrorRow(m, model.predict(m)) for m in held]
    return rows


def family_of_variant(name: str) -> str:
    """The method family a benchmark variant's error counts for: its aggregator
    (``gs-small`` -> ``gs``, ``powersgd-r1`` -> ``powersgd``, ``dense16`` -> ``dense``)."""
    from gssgd.methods import get_variant

    return get_variant(name)[0].name


def per_method_errors(rows: Sequence[ErrorRow], key: Callable[[str], str] = str
                      ) -> dict[str, dict[str, float]]:
    """:func:`error_summary` of each method's rows (``key`` groups
    the variants: :func:`family_of_variant` for families)."""
    by: dict[str, list[ErrorRow]] = {}
    for r in rows:
        by.setdefault(key(r.measurement.spec.name), []).append(r)
    return {name: error_summary(rs) for name, rs in sorted(by.items())}


def communication_rows(rows: Sequence[ErrorRow]) -> list[ErrorRow]:
    """``rows`` as the communication alone: each measured step less its measured compute
    against the prediction less the same (points whose step is all compute left out)."""
    out = []
    for r in rows:
        m = r.measurement
        measured = m.seconds_per_step - m.seconds_compute
        if measured > 0:
            out.append(ErrorRow(dataclasses.replace(m, seconds_per_step=measured),
                                r.predicted - m.seconds_compute))
    return out


def _summary(rows: Sequence[ErrorRow]) -> dict[str, Any]:
    summary = error_summary(rows)
    return {
        "points": summary["n"],
        "median_abs_rel_error": summary["median_abs_rel_error"],
        "max_abs_rel_error": summary["max_abs_rel_error"],
        "per_method": per_method_errors(rows),
        "per_family": per_method_errors(rows, family_of_variant),
    }


def error_record(rows: Sequence[ErrorRow]) -> dict[str, Any]:
    """One hold-out's summary: the points, the median and largest ``|relative error|`` of
    the step, each method's and each family's; and the same of the communication alone
    (``communication``: :func:`communication_rows`), which is what a cluster's step rests
    on where communication dominates it."""
    return {**_summary(rows), "communication": _summary(communication_rows(rows))}


def held_out(measurements: Sequence[Measurement]) -> dict[str, Any]:
    """The check of the module doc: :func:`error_record` of each hold-out, and in how many
    runs the method ranked first (held out by run) was measured fastest or within 10 %."""
    rows = {by: held_out_errors(measurements, by) for by in HOLD_OUTS}
    out: dict[str, Any] = {by: error_record(r) for by, r in rows.items()}
    recs = recommendation_check(rows["run"])  # the hold-out by run, fitted once
    out["runs"] = len({m.source for m in measurements})
    out["recommended_within_10pct"] = sum(r.within() for r in recs)
    out["recommendation_runs"] = len(recs)
    return out


def margin_of(held: dict[str, Any], family: str) -> float:
    """A method family's communication error: the largest of its medians held out by run,
    by worker count and by vector size (the overall median where the family was not
    measured). ``advise`` scales it by the communication's share of the predicted step."""
    comm = [held[by]["communication"] for by in HOLD_OUTS]
    found = [c["per_family"].get(family, {}).get("median_abs_rel_error") for c in comm]
    found = [f for f in found if f is not None and math.isfinite(f)]
    if found:
        return max(found)
    return max(c["median_abs_rel_error"] for c in comm)


def validated_on(measurements: Sequence[Measurement]) -> dict[str, Any]:
    """What the runs cover: worker counts, vector sizes, link rates."""
    return {"workers": sorted({m.world_size for m in measurements}),
            "d": sorted({m.spec.d for m in measurements}),
            "link_bps": sorted({m.rate_bps for m in measurements if m.rate_bps is not None}),
            "methods": sorted({m.spec.name for m in measurements})}


def rounded(value: Any) -> Any:
    """``value`` with every float rounded to :data:`SIGNIFICANT` significant digits (what a
    refit writes: the same bytes on any CPU, whose last digits of a double may differ)."""
    if isinstance(value, float):
        return float(f"{value:.{SIGNIFICANT}g}") if math.isfinite(value) else value
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v) for v in value]
    return value


def calibration_record(runs: Sequence[Path]) -> dict[str, Any]:
    """What ``fit.json`` stores: the model fitted on every run (its network and the CPU's
    compute laws), what the runs cover, and the held-out check over them. A pure function
    of the runs (no date: the same runs give the same file on any day; git dates it), its
    floats rounded (:data:`SIGNIFICANT`)."""
    measurements = rated(m for r in runs for m in load_measurements(r))
    model = fit_model(measurements)
    return rounded({
        "runs": [str(r) for r in runs],
        "network": model.network.as_dict(),
        "cpu_compute": {name: {"gamma": law.gamma, "slope": law.slope}
                        for name, law in sorted(model.compute.items())},
        "validated_on": validated_on(measurements),
        "held_out": held_out(measurements),
    })


def rated(measurements: Iterable[Measurement]) -> list[Measurement]:
    """The measurements on a rate-limited link: what the step model is fitted and checked
    on (``advise`` takes no unlimited link)."""
    return [m for m in measurements if m.rate_bps is not None]


@dataclass(frozen=True)
class RecommendationRow:
    """One held-out run: the method the model ranked first and how it did."""

    run: str
    recommended: str
    fastest: str
    recommended_seconds: float
    fastest_seconds: float

    @property
    def ratio(self) -> float:
        """Measured time of the recommended method over the fastest's (1 = it was)."""
        return self.recommended_seconds / self.fastest_seconds

    def within(self, tolerance: float = 0.10) -> bool:
        return self.ratio <= 1.0 + tolerance + 1e-12


def recommendation_check(
    rows: Iterable[ErrorRow], exclude: Sequence[str] = ADVISE_EXCLUDES
) -> list[RecommendationRow]:
    """Per run: the predicted-fastest method against the measured-fastest (of the methods
    ``gssgd advise`` may recommend)."""
    out = []
    by_run: dict[str, list[ErrorRow]] = {}
    for r in rows:
        if r.measurement.spec.name not in exclude and math.isfinite(r.predicted):
            by_run.setdefault(r.measurement.source, []).append(r)
    for run, rs in by_run.items():
        best = min(rs, key=lambda r: r.predicted)
        fastest = min(rs, key=lambda r: r.measurement.seconds_per_step)
        out.append(RecommendationRow(
            run=run, recommended=best.measurement.spec.name,
            fastest=fastest.measurement.spec.name,
            recommended_seconds=best.measurement.seconds_per_step,
            fastest_seconds=fastest.measurement.seconds_per_step))
    return out

