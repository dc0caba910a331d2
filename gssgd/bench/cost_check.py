"""The cluster cost model checked on every measured cell, each held out from its own fit.

A *cell* is one ``gssgd bench comm`` run (one P, one d, one link) and its methods. For each
cell, the model is fitted on every *other* cell (leave one run out) and predicts the held-out
cell's step times; the errors over all cells are the model's measured error, and the same
predictions say how often the method the model ranks first was the measured fastest (or
within 10 % of it), which is what ``gssgd advise`` relies on.

The fit (:func:`fit_cells`) is :func:`gssgd.bench.cost_fit.calibrate` (``alpha`` from the
latency probes, ``beta0``, each method's compute per element) plus two things of the
emulated links:

1. one efficiency per collective pattern (:func:`gssgd.bench.cost_cluster.pattern_of`): the
   median, over the pattern's points whose wire time is at least a fifth of their
   communication, of ``wire time / (measured - compute - alpha * rounds)``;
2. a burst credit: tbf lets a full bucket (``LinkShape(rate).burst_bytes``: 32 KB at
   100 Mbit/s, 500 KB at 1 Gbit/s) leave at memory speed after an idle moment, so each round
   on the critical path sends up to ``credit * burst`` bytes without wire time. ``credit``
   is chosen from :data:`BURST_CREDITS` by the fit's squared relative error (step 1 is
   redone for each).

Both are properties of this machine's emulation: the cluster model
(:mod:`gssgd.bench.cost_cluster`) uses neither. A bench comm step has no backward pass, so
nothing overlaps here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gssgd.bench.cost_cluster import PATTERNS, pattern_of
from gssgd.bench.cost_fit import ErrorRow, Measurement, calibrate, load_measurements
from gssgd.bench.cost_predict import CostModel
from gssgd.bench.link_rate import LinkShape
from gssgd.bench.method_specs import traffic
from gssgd.comm import Traffic

__all__ = [
    "ADVISE_EXCLUDES",
    "BURST_CREDITS",
    "CellModel",
    "RecommendationRow",
    "find_runs",
    "fit_cells",
    "held_out_errors",
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


@dataclass
class CellModel:
    """A :class:`CostModel` with one wire efficiency per collective pattern and a burst
    credit (the emulated links' token bucket; see the module doc)."""

    base: CostModel
    efficiency: dict[str, float] = field(default_factory=dict)
    burst_credit: float = 0.0

    def eta(self, pattern: str) -> float:
        return self.efficiency.get(pattern, self.base.eta)

    def wire_bytes(self, m: Measurement, t: Traffic) -> float:
        """The critical bytes that pay wire time: less the burst credit of each round."""
        if m.rate_bps is None:
            return float(t.critical_bytes)
        credit = self.burst_credit * LinkShape(m.rate_bps).burst_bytes * t.rounds
        return max(0.0, t.critical_bytes - credit)

    def predict(self, m: Measurement) -> float:
        """The model's step time for a measured point, at its run's compute share."""
        t = traffic(m.spec, m.world_size)
        bandwidth = m.compute_share * self.base.beta0 * t.critical_bytes
        if m.rate_bps is not None:
            wire = self.wire_bytes(m, t) * 8.0 / (self.eta(pattern_of(m.spec)) * m.rate_bps)
            bandwidth = max(bandwidth, wire)
        compute = m.compute_share * self.base.gamma_of(m.spec) * m.spec.d
        return self.base.alpha * t.rounds + bandwidth + compute


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


def fit_cells(measurements: Sequence[Measurement]) -> CellModel:
    """Fit ``alpha``, ``beta0``, compute per method, one efficiency per pattern and the burst
    credit (see the module doc).

    Raises:
        ValueError: no measurements.
    """
    base = calibrate(measurements)
    best: tuple[float, CellModel] | None = None
    for credit in BURST_CREDITS:
        model = CellModel(base, burst_credit=credit)
        model.efficiency = _pattern_efficiency(model, measurements)
        cost = sum((model.predict(m) / m.seconds_per_step - 1.0) ** 2 for m in measurements)
        if best is None or cost < best[0]:
            best = (cost, model)
    assert best is not None
    return best[1]


def _pattern_efficiency(model: CellModel, measurements: Sequence[Measurement]) -> dict[str, float]:
    """Per pattern, the median of wire time over communication (step 1 of the module doc)."""
    ratios: dict[str, list[float]] = {p: [] for p in PATTERNS}
    for m in measurements:
        if m.rate_bps is None:
            continue
        t = traffic(m.spec, m.world_size)
        wire = model.wire_bytes(m, t) * 8.0 / m.rate_bps
        comm = m.seconds_per_step - m.seconds_compute - model.base.alpha * t.rounds
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
        model = fit_cells(rest)
        rows += [ErrorRow(m, model.predict(m)) for m in held]
    return rows


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
