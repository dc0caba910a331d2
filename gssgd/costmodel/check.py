"""The cost model fitted on this machine's emulated links and checked on every measured
cell, each held out from its own fit.

A *cell* is one ``gssgd bench comm`` run (one P, one d, one link) and its methods. For each
cell, the model is fitted on every *other* cell (leave one run out) and predicts the held-out
cell's step times; the errors over all cells are the model's measured error, and the same
predictions say how often the method the model ranks first was the measured fastest (or
within 10 % of it), which is what ``gssgd advise`` relies on.

The fit (:func:`fit_model`) is :func:`gssgd.costmodel.fit.calibrate` (the round's cost
``alpha`` from the latency probes, the software's ``beta0`` per byte) plus four things of
this machine and its emulated links, each fitted on the training runs only:

1. compute per element that grows with ``d`` (:class:`ComputeLaw`): per method,
   ``gamma(d) = gamma_1M * (d / 1M) ** slope``, a least-squares line through
   ``log(seconds_compute / (d * share))`` against ``log d``. The slope is the caches: a
   vector of 1M floats (4 MB) stays near the cores, one of 25M (100 MB) streams from
   memory, so dense's few passes cost 2.6 times as much per element at 25M as at 1M
   (slope 0.3), the top-k methods' selection 1.3 times (slopes 0.08-0.1) and gs's
   sketching about the same (slope 0-0.1).
2. two costs per round: a round *inside one gloo collective* (the ring all-reduce, the
   all-gather, the control all-gather) costs ``alpha``, the median of the training runs'
   latency probes (a 4-byte all-gather timed in each run); a round that *a Python loop
   drives* (each exchange of recursive doubling, each send or receive of the star through
   rank 0, with a combine in between) costs ``driven_round_s * share`` more, ``share``
   being the run's compute share (ranks per core), the driven round fitted by least
   squares: the
   rank returns to Python, combines, and its partner, sharing a core with ``share - 1``
   other ranks, has to be scheduled again before the next message moves, so the wait grows
   with the ranks per core. It is a property of workers that share cores, so a cluster
   (one core per worker) does not carry it;
3. one efficiency per collective pattern (:func:`gssgd.costmodel.network.pattern_of`): the
   median, over the pattern's points whose wire time is at least a fifth of their
   communication, of ``wire time / (measured - compute - latency)``;
4. a burst credit: tbf lets a full bucket (``LinkShape(rate).burst_bytes``: 50 KB at
   100 Mbit/s, 500 KB at 1 Gbit/s) leave at memory speed after an idle moment, so each round
   on the critical path sends up to ``credit * burst`` bytes without wire time. ``credit``
   is chosen from :data:`BURST_CREDITS` by the fit's squared relative error (steps 2 and 3
   are redone for each).

The fitted model is the cost model itself (:func:`gssgd.costmodel.cluster.predict_step`)
with a :class:`~gssgd.costmodel.network.Network` of these constants and the CPU's compute
laws: what the check predicts with is what ``gssgd advise`` predicts a cluster with, there
with the cluster's device and :func:`~gssgd.costmodel.network.cluster_network` (the fitted
pattern efficiencies, none of the terms of workers sharing cores or of tbf). A bench comm
step has no backward pass, so nothing overlaps here. ``gssgd advise --calibrate RUNS...``
fits it on every run, checks it leaving one run out, and stores both in
``gssgd/costmodel/data/fit.json`` (:func:`calibration_record`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gssgd.costmodel.cluster import Link, communication_seconds, predict_step
from gssgd.costmodel.compute_law import ComputeLaw, fit_compute_law
from gssgd.costmodel.devices import Device
from gssgd.costmodel.fit import (
    ErrorRow,
    Measurement,
    calibrate,
    error_summary,
    load_measurements,
)
from gssgd.costmodel.link_rate import LinkShape
from gssgd.costmodel.network import PATTERNS, Network, pattern_of, rounds_of, step_traffic

__all__ = [
    "BURST_CREDITS",
    "FittedModel",
    "RecommendationRow",
    "calibration_record",
    "error_record",
    "find_runs",
    "fit_driven_round",
    "fit_model",
    "held_out_errors",
    "per_method_errors",
    "recommendation_check",
]

#: Benchmark variants ``gssgd advise`` never recommends: gs without its exact round diverged
#: in training (docs/benchmarks.md, "Levers").
ADVISE_EXCLUDES: tuple[str, ...] = ("gs-estimate",)
#: A point counts towards its pattern's efficiency when its wire time is at least this share
#: of its communication (smaller messages are latency- or tbf-burst-bound).
_WIRE_SHARE = 0.2
#: The burst credits the fit chooses among (0: no credit; 1: a full bucket every round).
BURST_CREDITS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
#: The efficiencies and the driven round are refitted in turn (each uses the other) until
#: the driven round moves by less than this fraction, or this many times.
_ALTERNATION_TOL, _ALTERNATIONS = 1e-9, 30


@dataclass
class FittedModel:
    """The cost model with the constants of this machine's emulated links.

    Attributes:
        network: round, driven round, pattern efficiencies, burst credit, software per byte.
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
        """The model's step time for a measured aggregation step (no forward or backward)."""
        step = predict_step(m.spec, m.world_size, Link(m.rate_bps), self.device, self.network,
                            fwdbwd_s=0.0, overlap="none", compute_share=m.compute_share)
        return step.total

    def compute_seconds(self, m: Measurement) -> float:
        return self.device.compression_seconds(m.spec, m.compute_share)

    def latency(self, m: Measurement) -> float:
        return communication_seconds(m.spec, m.world_size, Link(m.rate_bps), self.network,
                                     compute_share=m.compute_share)[0]


def find_runs(root: str | Path) -> list[Path]:
    """Every ``gssgd bench comm`` results directory under ``root`` (sorted)."""
    out = []
    for path in sorted(Path(root).rglob("results.json")):
        try:
            load_measurements(path.parent)
        except ValueError:
            continue  # another benchmark's results (bench train)
        out.append(path.parent)
    return out


def _compute_laws(measurements: Sequence[Measurement]) -> dict[str, ComputeLaw]:
    """Step 1 of the module doc: one :class:`ComputeLaw` per method."""
    points: dict[str, list[tuple[int, float]]] = {}
    for m in measurements:
        if m.seconds_compute > 0:
            per_core = m.seconds_compute / (m.spec.d * m.compute_share)
            points.setdefault(m.spec.name, []).append((m.spec.d, per_core))
    return {name: fit_compute_law(p) for name, p in points.items()}


def fit_model(measurements: Sequence[Measurement]) -> FittedModel:
    """Fit the round and software costs (:func:`gssgd.costmodel.fit.calibrate`), compute per
    method, the driven round, one efficiency per pattern and the burst credit (see the
    module doc).

    Raises:
        ValueError: no measurements.
    """
    base = calibrate(measurements)
    compute = _compute_laws(measurements)
    best: tuple[float, FittedModel] | None = None
    for credit in BURST_CREDITS:
        network = Network(round_s=base.alpha, software_s_per_byte=base.beta0,
                          burst_credit=credit, default_efficiency=base.eta)
        model = FittedModel(network, compute)
        _alternate(model, measurements)
        cost = sum((model.predict(m) / m.seconds_per_step - 1.0) ** 2 for m in measurements)
        if best is None or cost < best[0]:
            best = (cost, model)
    assert best is not None
    sources = sorted({m.source for m in measurements})
    best[1].network = dataclasses.replace(
        best[1].network, source=f"fitted on {len(sources)} gssgd bench comm runs")
    return best[1]


def _alternate(model: FittedModel, measurements: Sequence[Measurement]) -> None:
    """Refit the efficiencies and the driven round in turn until the latter settles."""
    for _ in range(_ALTERNATIONS):
        before = model.network.driven_round_s
        efficiency = _pattern_efficiency(model, measurements)
        model.network = dataclasses.replace(model.network, efficiency=efficiency)
        driven = fit_driven_round(model, measurements)
        model.network = dataclasses.replace(model.network, driven_round_s=driven)
        if abs(driven - before) <= _ALTERNATION_TOL * max(abs(driven), 1e-12):
            return


def fit_driven_round(model: FittedModel, measurements: Sequence[Measurement]) -> float:
    """The seconds per driven round and unit of compute share that minimise the squared
    relative error of the step, the rest of ``model`` fixed (step 2 of the module doc).

    The step is linear in it: ``pred = rest + a * share * driven_rounds``, so the best ``a``
    is ``sum(f * (1 - rest / y)) / sum(f * f)`` with ``f = share * driven_rounds / y``,
    clipped at 0; ``model``'s own value when no point has a driven round.
    """
    num = den = 0.0
    without = FittedModel(dataclasses.replace(model.network, driven_round_s=0.0),
                          model.compute)
    for m in measurements:
        driven = rounds_of(m.spec, m.world_size).driven * m.compute_share
        if driven == 0:
            continue
        f = driven / m.seconds_per_step
        num += f * (1.0 - without.predict(m) / m.seconds_per_step)
        den += f * f
    return model.network.driven_round_s if den == 0 else max(0.0, num / den)


def _pattern_efficiency(model: FittedModel, measurements: Sequence[Measurement]
                        ) -> dict[str, float]:
    """Per pattern, the median of wire time over communication (step 3 of the module doc)."""
    ratios: dict[str, list[float]] = {p: [] for p in PATTERNS}
    for m in measurements:
        if m.rate_bps is None:
            continue
        t = step_traffic(m.spec, m.world_size)
        credit = model.network.burst_credit * LinkShape(m.rate_bps).burst_bytes * t.rounds
        wire = max(0.0, t.critical_bytes + t.header_bytes - credit) * 8.0 / m.rate_bps
        comm = m.seconds_per_step - m.seconds_compute - model.latency(m)
        if comm > 0 and wire >= _WIRE_SHARE * comm:
            ratios[pattern_of(m.spec)].append(wire / comm)
    return {p: statistics.median(r) for p, r in ratios.items() if r}


def _by_run(measurements: Iterable[Measurement]) -> dict[str, list[Measurement]]:
    runs: dict[str, list[Measurement]] = {}
    for m in measurements:
        runs.setdefault(m.source, []).append(m)
    return runs


def held_out_errors(measurements: Sequence[Measurement]) -> list[ErrorRow]:
    """Each run's points predicted by the model fitted on all the other runs."""
    runs = _by_run(measurements)
    rows = []
    for source, held in runs.items():
        rest = [m for s, ms in runs.items() if s != source for m in ms]
        model = fit_model(rest)
        rows += [ErrorRow(m, model.predict(m)) for m in held]
    return rows


def per_method_errors(rows: Sequence[ErrorRow]) -> dict[str, dict[str, float]]:
    """:func:`~gssgd.costmodel.fit.error_summary` of each method's held-out rows."""
    by: dict[str, list[ErrorRow]] = {}
    for r in rows:
        by.setdefault(r.measurement.spec.name, []).append(r)
    return {name: error_summary(rs) for name, rs in sorted(by.items())}


def error_record(rows: Sequence[ErrorRow], runs: int) -> dict[str, Any]:
    """The held-out check's summary: the points, the median and largest ``|relative
    error|``, each method's, the runs, and in how many of them the method ranked first was
    measured fastest or within 10 % of it."""
    summary = error_summary(rows)
    return {
        "points": summary["n"],
        "median_abs_rel_error": summary["median_abs_rel_error"],
        "max_abs_rel_error": summary["max_abs_rel_error"],
        "per_method": per_method_errors(rows),
        "runs": runs,
        "recommended_within_10pct": sum(r.within() for r in recommendation_check(rows)),
    }


def calibration_record(runs: Sequence[Path], where: str) -> dict[str, Any]:
    """What ``fit.json`` stores: the model fitted on every run (its network and the CPU's
    compute laws) and its held-out check (leave one run out) over ``runs``. A pure function
    of the runs (no date: the same runs give the same file on any day; git dates it).

    Args:
        runs: ``gssgd bench comm`` result directories.
        where: a few words on where they ran (the report prints them).
    """
    measurements = [m for r in runs for m in load_measurements(r)]
    model = fit_model(measurements)
    error = error_record(held_out_errors(measurements), len(runs))
    error["where"] = where
    return {
        "runs": [str(r) for r in runs],
        "network": model.network.as_dict(),
        "cpu_compute": {name: {"gamma": law.gamma, "slope": law.slope}
                        for name, law in sorted(model.compute.items())},
        "held_out": error,
    }


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
    rows: Sequence[ErrorRow], exclude: Sequence[str] = ADVISE_EXCLUDES
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
        out.append(
            RecommendationRow(
                run=run,
                recommended=best.measurement.spec.name,
                fastest=fastest.measurement.spec.name,
                recommended_seconds=best.measurement.seconds_per_step,
                fastest_seconds=fastest.measurement.seconds_per_step,
            )
        )
    return out
