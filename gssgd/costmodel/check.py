"""The cluster cost model checked on every measured cell, each held out from its own fit.

A *cell* is one ``gssgd bench comm`` run (one P, one d, one link) and its methods. For each
cell, the model is fitted on every *other* cell (leave one run out) and predicts the held-out
cell's step times; the errors over all cells are the model's measured error, and the same
predictions say how often the method the model ranks first was the measured fastest (or
within 10 % of it), which is what ``gssgd advise`` relies on.

The fit (:func:`fit_cells`) is :func:`gssgd.costmodel.fit.calibrate` (``alpha`` from the
latency probes, ``beta0``) plus four things of this machine and its emulated links, each
fitted on the training runs only:

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
   rank 0, with a combine in between) costs ``driven_alpha * share``, ``share`` being the
   run's compute share (ranks per core) and ``driven_alpha`` fitted by least squares: the
   rank returns to Python, combines, and its partner, sharing a core with ``share - 1``
   other ranks, has to be scheduled again before the next message moves, so the wait grows
   with the ranks per core. It is several times the probe's (2.2 ms times a share of
   1.4-4.5, against 1.2 ms), and it is a property of workers that share cores, so the
   cluster model (one core per worker) does not carry it;
3. one efficiency per collective pattern (:func:`gssgd.costmodel.cluster.pattern_of`): the
   median, over the pattern's points whose wire time is at least a fifth of their
   communication, of ``wire time / (measured - compute - latency)``;
4. a burst credit: tbf lets a full bucket (``LinkShape(rate).burst_bytes``: 50 KB at
   100 Mbit/s, 500 KB at 1 Gbit/s) leave at memory speed after an idle moment, so each round
   on the critical path sends up to ``credit * burst`` bytes without wire time. ``credit``
   is chosen from :data:`BURST_CREDITS` by the fit's squared relative error (steps 2 and 3
   are redone for each).

All four are properties of this machine and its emulation: the cluster model
(:mod:`gssgd.costmodel.cluster`) uses none of them. A bench comm step has no backward
pass, so nothing overlaps here.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gssgd.comm import Traffic
from gssgd.costmodel.cluster import PATTERNS, pattern_of
from gssgd.costmodel.compute_law import COMPUTE_REF_D, ComputeLaw, fit_compute_law
from gssgd.costmodel.fit import (
    ErrorRow,
    Measurement,
    calibrate,
    error_summary,
    load_measurements,
)
from gssgd.costmodel.link_rate import LinkShape
from gssgd.costmodel.method_specs import MethodSpec, traffic
from gssgd.costmodel.predict import CostModel
from gssgd.methods import get_method

__all__ = [
    "ADVISE_EXCLUDES",
    "BURST_CREDITS",
    "CHECK_RUNS",
    "COMPUTE_REF_D",
    "DRIVEN_PATTERNS",
    "CellModel",
    "ComputeLaw",
    "RecommendationRow",
    "Rounds",
    "check_runs",
    "error_record",
    "find_runs",
    "fit_cells",
    "fit_compute_law",
    "fit_driven_alpha",
    "held_out_errors",
    "measured_error",
    "recommendation_check",
    "rounds_of",
]

#: Benchmark variants ``gssgd advise`` never recommends: gs without its exact round diverged
#: in training (docs/benchmarks.md, "Levers"); PowerSGD's bytes depend on the model's layer
#: shapes, which the cost model does not see (it reads the vector as one near-square
#: matrix, :func:`gssgd.aggregators.lowrank.default_shapes`), so its prediction would
#: flatter it on most models.
ADVISE_EXCLUDES: tuple[str, ...] = ("gs-estimate", "powersgd")
#: A point counts towards its pattern's efficiency when its wire time is at least this share
#: of its communication (smaller messages are latency- or tbf-burst-bound).
_WIRE_SHARE = 0.2
#: The burst credits the fit chooses among (0: no credit; 1: a full bucket every round).
BURST_CREDITS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
#: The patterns whose bulk rounds a Python loop drives (one send/receive per round, a
#: combine between rounds), rather than one gloo collective call.
DRIVEN_PATTERNS: tuple[str, ...] = ("recursive_doubling", "star")
#: The efficiencies and ``driven_alpha`` are refitted in turn (each uses the other) until
#: ``driven_alpha`` moves by less than this fraction, or this many times.
_ALTERNATION_TOL, _ALTERNATIONS = 1e-9, 30


# --------------------------------------------------------------------------- rounds


@dataclass(frozen=True)
class Rounds:
    """A method's rounds at one P, split by what drives them.

    Attributes:
        collective: rounds inside one gloo collective call (ring all-reduce, all-gather,
            the control all-gather): each costs the link latency the probe measures.
        driven: rounds a Python loop drives (recursive-doubling exchanges, the star's sends
            and receives): each also waits for its partner to be scheduled again.
    """

    collective: int
    driven: int

    @property
    def total(self) -> int:
        return self.collective + self.driven


@functools.lru_cache(maxsize=4096)
def _traffic(spec: MethodSpec, world_size: int) -> Traffic:
    """``traffic`` of a spec (cached: the fit asks for the same points many times)."""
    return traffic(spec, world_size)


@functools.lru_cache(maxsize=4096)
def _pattern(spec: MethodSpec) -> str:
    """``pattern_of`` a spec (cached: it reads two traffic formulas, asked for every point
    of every fit)."""
    return pattern_of(spec)


@functools.lru_cache(maxsize=4096)
def rounds_of(spec: MethodSpec, world_size: int) -> Rounds:
    """Split ``spec``'s rounds at ``world_size`` into collective and driven ones.

    Steps: the method's :class:`~gssgd.comm.Traffic` rounds, less its control all-gather's
    (the aggregator's ``control_traffic``), are its bulk rounds; they are driven when its
    pattern (:func:`pattern_of`) is one of :data:`DRIVEN_PATTERNS`, else collective.

    Returns:
        The split; ``total`` equals the traffic's rounds.
    """
    total = _traffic(spec, world_size).rounds
    if _pattern(spec) not in DRIVEN_PATTERNS:
        return Rounds(collective=total, driven=0)
    cls = get_method(spec.aggregator).aggregator
    assert cls is not None
    control = cls.control_traffic(world_size).rounds
    return Rounds(collective=control, driven=max(0, total - control))


# --------------------------------------------------------------------------- compute


def _compute_laws(measurements: Sequence[Measurement]) -> dict[str, ComputeLaw]:
    """Step 1 of the module doc: one :class:`ComputeLaw` per method."""
    points: dict[str, list[tuple[int, float]]] = {}
    for m in measurements:
        if m.seconds_compute > 0:
            per_core = m.seconds_compute / (m.spec.d * m.compute_share)
            points.setdefault(m.spec.name, []).append((m.spec.d, per_core))
    return {name: fit_compute_law(p) for name, p in points.items()}


# --------------------------------------------------------------------------- the model


@dataclass
class CellModel:
    """A :class:`CostModel` with the four terms of this machine (see the module doc).

    Attributes:
        base: alpha (seconds per collective round), beta0 and the constant gammas (for a
            method without a :class:`ComputeLaw`).
        efficiency: the fraction of the nominal rate each pattern's payload reaches.
        burst_credit: the share of the tbf bucket each round sends free.
        driven_alpha: seconds per driven round per unit of compute share (None: a driven
            round costs ``base.alpha`` like a collective one).
        compute: each method's compute law.
    """

    base: CostModel
    efficiency: dict[str, float] = field(default_factory=dict)
    burst_credit: float = 0.0
    driven_alpha: float | None = None
    compute: dict[str, ComputeLaw] = field(default_factory=dict)

    def eta(self, pattern: str) -> float:
        return self.efficiency.get(pattern, self.base.eta)

    def latency(self, m: Measurement) -> float:
        """Seconds of the step's rounds: collective ones at ``base.alpha`` (the training
        runs' median probe), driven ones at ``driven_alpha`` times the run's compute share."""
        r = rounds_of(m.spec, m.world_size)
        if self.driven_alpha is None:
            return self.base.alpha * r.total
        return self.base.alpha * r.collective + self.driven_alpha * m.compute_share * r.driven

    def compute_seconds(self, m: Measurement) -> float:
        """The method's compute at the run's compute share (its law, else base gamma)."""
        law = self.compute.get(m.spec.name)
        if law is None:
            return m.compute_share * self.base.gamma_of(m.spec) * m.spec.d
        return law.seconds(m.spec.d, m.compute_share)

    def wire_bytes(self, m: Measurement, t: Traffic) -> float:
        """The bytes on the busiest link that pay wire time (the payload's critical bytes and
        gloo's preambles): less the burst credit of each round."""
        volume = t.critical_bytes + t.header_bytes
        if m.rate_bps is None:
            return float(volume)
        credit = self.burst_credit * LinkShape(m.rate_bps).burst_bytes * t.rounds
        return max(0.0, volume - credit)

    def bandwidth(self, m: Measurement) -> float:
        """Seconds of the step's bytes, gloo's preambles included: the slower of the software
        stack and the wire."""
        t = _traffic(m.spec, m.world_size)
        software = m.compute_share * self.base.beta0 * (t.critical_bytes + t.header_bytes)
        if m.rate_bps is None:
            return software
        wire = self.wire_bytes(m, t) * 8.0 / (self.eta(_pattern(m.spec)) * m.rate_bps)
        return max(software, wire)

    def predict(self, m: Measurement) -> float:
        """The model's step time for a measured point, at its run's compute share."""
        return self.latency(m) + self.bandwidth(m) + self.compute_seconds(m)


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


#: How many runs the documented check holds (docs/results/grid's and the ``*_default`` ones).
CHECK_RUNS = 15


def check_runs(results: str | Path) -> list[Path]:
    """The ``gssgd bench comm`` runs of the documented check under ``results`` (the
    repository's docs/results): those made with the current default sketch, grid/comm_*
    and comm_*_default.

    Raises:
        FileNotFoundError: not the :data:`CHECK_RUNS` runs the check was made on.
    """
    root = Path(results)
    runs = sorted((root / "grid").glob("comm_*")) + sorted(root.glob("comm_*_default"))
    if len(runs) != CHECK_RUNS:
        raise FileNotFoundError(
            f"{root} holds {len(runs)} of the check's {CHECK_RUNS} bench comm runs "
            "(grid/comm_* and comm_*_default); run from a full checkout of the repository"
        )
    return runs


def measured_error(runs: Sequence[Path]) -> dict[str, float | int]:
    """The held-out check's summary over ``runs`` (leave one run out): the points, the
    median and largest ``|relative error|``, the runs, and in how many of them the method
    ranked first was measured fastest or within 10 % of it. What
    :data:`gssgd.costmodel.advice.MEASURED_ERROR` states (about 10 s for the 15 runs)."""
    return error_record(held_out_errors([m for r in runs for m in load_measurements(r)]),
                        len(runs))


def error_record(rows: Sequence[ErrorRow], runs: int) -> dict[str, float | int]:
    """:func:`measured_error`'s record from held-out rows already computed over ``runs``
    runs (:func:`held_out_errors`)."""
    summary = error_summary(rows)
    return {
        "points": summary["n"],
        "median_abs_rel_error": summary["median_abs_rel_error"],
        "max_abs_rel_error": summary["max_abs_rel_error"],
        "runs": runs,
        "recommended_within_10pct": sum(r.within() for r in recommendation_check(rows)),
    }


def fit_cells(measurements: Sequence[Measurement]) -> CellModel:
    """Fit ``alpha``, ``beta0``, compute per method, ``driven_alpha``, one efficiency per
    pattern and the burst credit (see the module doc).

    Raises:
        ValueError: no measurements.
    """
    base = calibrate(measurements)
    compute = _compute_laws(measurements)
    best: tuple[float, CellModel] | None = None
    for credit in BURST_CREDITS:
        model = CellModel(base, burst_credit=credit, compute=compute)
        _alternate(model, measurements)
        cost = sum((model.predict(m) / m.seconds_per_step - 1.0) ** 2 for m in measurements)
        if best is None or cost < best[0]:
            best = (cost, model)
    assert best is not None
    return best[1]


def _alternate(model: CellModel, measurements: Sequence[Measurement]) -> None:
    """Refit the efficiencies and ``driven_alpha`` in turn until ``driven_alpha`` settles."""
    for _ in range(_ALTERNATIONS):
        before = model.driven_alpha
        model.efficiency = _pattern_efficiency(model, measurements)
        model.driven_alpha = fit_driven_alpha(model, measurements)
        after = model.driven_alpha
        if before is None or after is None:
            continue
        if abs(after - before) <= _ALTERNATION_TOL * max(abs(after), 1e-12):
            return


def fit_driven_alpha(model: CellModel, measurements: Sequence[Measurement]) -> float | None:
    """The seconds per driven round and unit of compute share that minimise the squared
    relative error of the step, the rest of ``model`` fixed (step 2 of the module doc).

    The step is linear in it: ``pred = rest + a * share * driven_rounds``, so the best ``a``
    is ``sum(f * (1 - rest / y)) / sum(f * f)`` with ``f = share * driven_rounds / y``,
    clipped at 0.

    Returns:
        The fitted value, or ``model.driven_alpha`` when no point has a driven round.
    """
    num = den = 0.0
    without = dataclasses.replace(model, driven_alpha=0.0)
    for m in measurements:
        driven = rounds_of(m.spec, m.world_size).driven * m.compute_share
        if driven == 0:
            continue
        f = driven / m.seconds_per_step
        num += f * (1.0 - without.predict(m) / m.seconds_per_step)
        den += f * f
    return model.driven_alpha if den == 0 else max(0.0, num / den)


def _pattern_efficiency(model: CellModel, measurements: Sequence[Measurement]) -> dict[str, float]:
    """Per pattern, the median of wire time over communication (step 3 of the module doc)."""
    ratios: dict[str, list[float]] = {p: [] for p in PATTERNS}
    for m in measurements:
        if m.rate_bps is None:
            continue
        t = _traffic(m.spec, m.world_size)
        wire = model.wire_bytes(m, t) * 8.0 / m.rate_bps
        comm = m.seconds_per_step - m.seconds_compute - model.latency(m)
        if comm > 0 and wire >= _WIRE_SHARE * comm:
            ratios[_pattern(m.spec)].append(wire / comm)
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
