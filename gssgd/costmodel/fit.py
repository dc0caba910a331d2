"""The cost model's fit: the ``bench comm`` measurements it reads, the calibration of
alpha, beta0, eta and gamma to them, and its errors on measured points.

The model itself is :class:`gssgd.costmodel.predict.CostModel`, described in
:mod:`gssgd.costmodel`.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gssgd.costmodel.method_specs import MethodSpec, traffic
from gssgd.costmodel.predict import CostModel

__all__ = [
    "ErrorRow",
    "Measurement",
    "calibrate",
    "error_summary",
    "load_measurements",
    "prediction_errors",
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


# --------------------------------------------------------------------------- calibration


def calibrate(
    measurements: Sequence[Measurement],
    base: CostModel | None = None,
    *,
    fit_alpha: bool = False,
) -> CostModel:
    """Fit the model to measured steps.

    Steps:
        1. ``gamma[method]``: the median of ``seconds_compute / (d * compute_share)`` over
           the method's points: compute per element on a core of its own. (Sharing cores is
           taken to stretch all compute alike, which overstates it for work one rank does
           while the others wait, such as Sketched-SGD's server recovery.)
        2. ``alpha``: the median of the runs' latency probes (``_meta.latency_probe``: the
           time per round of a 4-byte all-gather), when every run has one and ``fit_alpha``
           is False; otherwise it is fitted in step 3. Measuring it is the default because
           runs at one P hold few distinct round counts, and a fit then books the waits of
           ranks that share cores (a constant per step) as latency, which a prediction at
           P = 1024 multiplies by a thousand ring steps.
        3. ``beta0`` and ``eta`` (and a free ``alpha``): minimise the squared relative error
           of ``alpha * rounds + bytes * max(share * beta0, 8 / (eta * rate))`` against
           ``y = seconds_per_step - seconds_compute``: first on a log grid (``alpha`` in
           closed form at each node), then exactly: with each point's regime (software- or
           wire-bound) fixed at the best node the model is linear, and non-negative least
           squares solves it; repeated while a regime changes. ``beta0`` needs a loopback
           run (on a shaped link the wire hides it), ``eta`` a run on a shaped link.

    Parameters the data cannot determine keep ``base``'s value; ``notes`` says which.

    Args:
        measurements: from :func:`load_measurements` (one or more runs).
        base: the model whose values stand in for what cannot be fitted (the defaults).
        fit_alpha: fit ``alpha`` even when latency probes exist.

    Returns:
        A new :class:`CostModel`.

    Raises:
        ValueError: no measurements.
    """
    if not measurements:
        raise ValueError(
            "no measurements to calibrate on; pass directories written by `gssgd bench comm`"
        )
    base = base or CostModel.default()
    alpha, notes = _alpha_from_probes(measurements, fit_alpha)
    unknowns = _unknowns(measurements, alpha, base, notes)
    points = _Points.of(measurements)
    b0, eta, best_alpha = _grid_search(points, unknowns, base)
    b0, eta, best_alpha = _refine(points, unknowns, b0, eta, best_alpha)
    sources = sorted({m.source for m in measurements})
    return CostModel(
        alpha=float(best_alpha if alpha is None else alpha),
        beta0=b0,
        eta=eta,
        gamma={**base.gamma, **_gamma_per_core(measurements)},
        source="calibrated on " + ", ".join(sources),
        notes=notes,
    )


def _unknowns(
    measurements: Sequence[Measurement], alpha: float | None, base: CostModel, notes: list[str]
) -> _Unknowns:
    """What the runs can determine: ``beta0`` needs a loopback run, ``eta`` a run on a
    rate-limited link, ``alpha`` is fixed when the probes gave it. A parameter they cannot
    determine keeps ``base``'s value, and a line in ``notes`` says so."""
    unknowns = _Unknowns(
        fixed_alpha=alpha,
        beta0=any(m.rate_bps is None for m in measurements),
        eta=any(m.rate_bps is not None for m in measurements),
    )
    if not unknowns.beta0:
        notes.append(
            f"beta0 (software cost per byte) kept at {base.beta0:.3g} s/B: it needs a "
            "--link none run"
        )
    if not unknowns.eta:
        notes.append(f"eta kept at {base.eta:g}: it needs a run on a rate-limited link")
    return unknowns


def _gamma_per_core(measurements: Sequence[Measurement]) -> dict[str, float]:
    """Each method's median compute per element on a core of its own."""
    by_method: dict[str, list[float]] = {}
    for m in measurements:
        by_method.setdefault(m.spec.name, []).append(
            m.seconds_compute / (m.spec.d * m.compute_share)
        )
    return {name: statistics.median(v) for name, v in by_method.items()}


def _alpha_from_probes(
    measurements: Sequence[Measurement], fit_alpha: bool
) -> tuple[float | None, list[str]]:
    """The median latency probe (None: alpha is to be fitted) and the note saying so."""
    probes = {m.source: m.alpha_probe for m in measurements}
    if fit_alpha or any(p is None for p in probes.values()):
        return None, []
    runs = f"{len(probes)} run" + ("s" if len(probes) > 1 else "")
    alpha = statistics.median(probes.values())  # type: ignore[type-var]
    return alpha, [f"alpha measured by the latency probes of the runs ({runs})"]


@dataclass(frozen=True)
class _Unknowns:
    """What the fit solves for: alpha unless ``fixed_alpha`` is set, beta0 and eta if true."""

    fixed_alpha: float | None
    beta0: bool
    eta: bool


@dataclass(frozen=True)
class _Points:
    """The measured points as the fit of alpha, beta0 and eta sees them (arrays, one entry
    per point): rounds, bytes on the busiest link (the payload's critical bytes and gloo's
    preambles, which cost the same per byte: :meth:`CostModel.predict`), compute share,
    wire seconds per byte at the nominal rate (0 on loopback) and ``y``, the step time minus
    its compute."""

    rounds: np.ndarray
    volume: np.ndarray
    share: np.ndarray
    wire: np.ndarray
    y: np.ndarray

    @classmethod
    def of(cls, measurements: Sequence[Measurement]) -> _Points:
        t = [traffic(m.spec, m.world_size) for m in measurements]
        return cls(
            rounds=np.array([x.rounds for x in t], dtype=float),
            volume=np.array([x.critical_bytes + x.header_bytes for x in t], dtype=float),
            share=np.array([m.compute_share for m in measurements]),
            wire=np.array([0.0 if m.rate_bps is None else 8.0 / m.rate_bps for m in measurements]),
            y=np.array([max(m.seconds_per_step - m.seconds_compute, 1e-9) for m in measurements]),
        )

    def software(self, beta0: float, eta: float) -> np.ndarray:
        """Which points are software-bound (rather than wire-bound) at ``beta0``, ``eta``."""
        return self.share * beta0 >= self.wire / eta

    def cost(self, alpha: float, beta0: float, eta: float) -> float:
        """The squared relative error of the model's non-compute time."""
        model = alpha * self.rounds + self.volume * np.maximum(self.share * beta0, self.wire / eta)
        return float(_relative_cost(model, self.y))

    def best_alpha(self, bandwidth: np.ndarray, fixed: float | None) -> np.ndarray:
        """The best non-negative alpha for each row of ``bandwidth`` (closed form)."""
        if fixed is not None:
            return np.full(bandwidth.shape[:-1], fixed)
        r = self.rounds / self.y
        a = np.sum(r * (1.0 - bandwidth / self.y), axis=-1) / max(float(np.sum(r * r)), 1e-300)
        return np.maximum(a, 0.0)


def _grid_search(
    points: _Points, unknowns: _Unknowns, base: CostModel
) -> tuple[float, float, float]:
    """Step 3a: the best (beta0, eta, alpha) on a log grid of beta0 and eta."""
    b0_grid = np.logspace(-12, -6, 241) if unknowns.beta0 else np.array([base.beta0])
    eta_grid = (
        np.logspace(np.log10(0.05), np.log10(2.0), 161) if unknowns.eta else np.array([base.eta])
    )
    soft = points.share[None, None, :] * b0_grid[:, None, None]
    bandwidth = points.volume * np.maximum(soft, points.wire / eta_grid[None, :, None])
    a = points.best_alpha(bandwidth, unknowns.fixed_alpha)
    cost = _relative_cost(a[..., None] * points.rounds + bandwidth, points.y)
    i, j = np.unravel_index(int(np.argmin(cost)), cost.shape)
    return float(b0_grid[i]), float(eta_grid[j]), float(a[i, j])


def _refine(
    points: _Points, unknowns: _Unknowns, b0: float, eta: float, alpha: float
) -> tuple[float, float, float]:
    """Step 3b: with each point's regime fixed the model is linear in (alpha, beta0, 1/eta);
    solve it, keep the solution if it beats the grid's point, repeat while a regime changes."""
    for _ in range(5):
        step = _linear_step(points, unknowns, b0, eta, alpha)
        if step is None:
            break
        new_b0, new_eta, new_alpha = step
        if points.cost(new_alpha, new_b0, new_eta) > points.cost(alpha, b0, eta):
            break  # the grid's point is better: keep it
        changed = np.any(points.software(new_b0, new_eta) != points.software(b0, eta))
        b0, eta, alpha = new_b0, new_eta, new_alpha
        if not changed:
            break
    return b0, eta, alpha


def _linear_step(
    points: _Points, unknowns: _Unknowns, b0: float, eta: float, alpha: float
) -> tuple[float, float, float] | None:
    """The non-negative least-squares (beta0, eta, alpha) with the regimes of ``b0``, ``eta``
    (None when nothing is free)."""
    software = points.software(b0, eta)
    feats = {
        "alpha": points.rounds,
        "beta0": points.volume * points.share * software,
        "inv_eta": points.volume * points.wire * ~software,
    }
    on = (unknowns.fixed_alpha is None, unknowns.beta0, unknowns.eta)
    free = [f for f, is_free in zip(feats, on, strict=True) if is_free]
    if not free:
        return None
    known = (unknowns.fixed_alpha or 0.0) * points.rounds
    if not unknowns.beta0:
        known = known + b0 * feats["beta0"]
    if not unknowns.eta:
        known = known + feats["inv_eta"] / eta
    design = np.stack([feats[f] / points.y for f in free], axis=1)
    x = dict(zip(free, _nnls(design, 1.0 - known / points.y), strict=True))
    new_b0 = float(x.get("beta0", b0)) if unknowns.beta0 else b0
    new_eta = eta
    if unknowns.eta and x.get("inv_eta", 0.0) > 0:
        new_eta = 1.0 / float(x["inv_eta"])
    if unknowns.fixed_alpha is not None:
        return new_b0, new_eta, unknowns.fixed_alpha
    return new_b0, new_eta, float(x.get("alpha", alpha))


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a handful of unknowns: the best feasible solution of
    the unconstrained least-squares problems over every subset of the columns."""
    n = a.shape[1]
    best, best_cost = np.zeros(n), float(np.sum(b**2))
    for size in range(1, n + 1):
        for cols in itertools.combinations(range(n), size):
            x_sub, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(x_sub < 0):
                continue
            x = np.zeros(n)
            x[list(cols)] = x_sub
            cost = float(np.sum((a @ x - b) ** 2))
            if cost < best_cost - 1e-15 * max(1.0, best_cost):
                best, best_cost = x, cost
    return best


def _relative_cost(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.sum(((pred - y) / y) ** 2, axis=-1)


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class ErrorRow:
    """A measured step next to the model's prediction; ``rel_error = pred/measured - 1``."""

    measurement: Measurement
    predicted: float

    @property
    def rel_error(self) -> float:
        return self.predicted / self.measurement.seconds_per_step - 1.0


def prediction_errors(model: CostModel, measurements: Iterable[Measurement]) -> list[ErrorRow]:
    """The model's prediction for each measured point (with its run's compute share)."""
    return [
        ErrorRow(m, model.predict(m.spec, m.world_size, m.rate_bps, m.compute_share).total)
        for m in measurements
    ]


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
