"""``gssgd bench model``'s report: calibrate (or take the defaults), report the errors on
measured points, predict larger clusters, and write the tables and plots."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gssgd.aggregators.sizing import DEFAULT_ROWS
from gssgd.bench.formatting import fmt_rate
from gssgd.bench.model_charts import error_table, grid_table, plot_fit, plot_lines
from gssgd.costmodel.fit import (
    Measurement,
    calibrate,
    error_summary,
    load_measurements,
    prediction_errors,
)
from gssgd.costmodel.method_specs import VARIANTS, MethodSpec, method_spec
from gssgd.costmodel.predict import CostModel
from gssgd.methods import get_method

__all__ = ["PREDICTION_DS", "PREDICTION_RATES", "PREDICTION_WORKERS", "model_report"]

#: Link rates of the prediction grid (bit/s): 0.1, 1, 10 and 100 Gbit/s.
PREDICTION_RATES: tuple[int, ...] = (10**8, 10**9, 10**10, 10**11)
#: Worker counts of the prediction grid: 2, 4, ..., 1024.
PREDICTION_WORKERS: tuple[int, ...] = tuple(2**i for i in range(1, 11))
#: Vector lengths of the prediction table (the plot uses a finer grid).
PREDICTION_DS: tuple[int, ...] = (10**6, 10**7, 10**8, 10**9)
#: Vector lengths of the time-vs-d plot: 1e5 .. 1e9, two per decade.
_PLOT_DS: tuple[int, ...] = tuple(int(10 ** (e / 2)) for e in range(10, 19))
_OVERRIDABLE = ("alpha", "beta0", "eta")

#: ``{panel title: {method: (xs, seconds)}}``, what :func:`plot_lines` draws.
Panels = dict[str, dict[str, tuple[list[int], list[float]]]]


def model_report(
    calibrate_dirs: Sequence[str | Path],
    check_dirs: Sequence[str | Path],
    out_dir: str | Path,
    *,
    methods: Sequence[str] | None = None,
    density: float | None = None,
    d: int = 10**8,
    workers: int = 64,
    rates: Sequence[int] = PREDICTION_RATES,
    fit_alpha: bool = False,
    overrides: Mapping[str, float | None] | None = None,
    echo: Callable[[str], object] = print,
) -> dict[str, Any]:
    """Calibrate (or take the defaults), report errors, predict, and write tables and plots.

    Writes ``out_dir/model.json`` (parameters, per-point errors, predictions), ``tables.txt``,
    ``model_vs_workers.png`` (time vs P at ``d``, one panel per rate), ``model_vs_d.png``
    (time vs d at ``workers``) and, with measured points, ``model_fit.png``.

    Args:
        calibrate_dirs: ``bench comm`` output directories to fit on (may be empty).
        check_dirs: further directories to report the error on, not fitted.
        out_dir: where to write.
        methods: methods to predict (default: those measured, else every registered one).
        density: density of the predictions (default: the calibration runs', else 0.001).
        d: vector length of the time-vs-P predictions.
        workers: P of the time-vs-d predictions.
        rates: link rates (bit/s) of the predictions.
        fit_alpha: fit alpha rather than take the runs' latency probes (see
            :func:`gssgd.costmodel.fit.calibrate`).
        overrides: values of ``alpha``, ``beta0`` or ``eta`` to use instead of the fitted
            ones, for what-if predictions (e.g. a 20 us network: ``{"alpha": 2e-5}``);
            the errors on measured points are those of the calibrated model.
        echo: where the tables go.

    Raises:
        ValueError: an unknown or non-positive override.
        FileNotFoundError: a directory without ``results.json``.

    Returns:
        The content of model.json.
    """
    given = _checked_overrides(overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    calib, check = _load(calibrate_dirs), _load(check_dirs)
    model = calibrate(calib, fit_alpha=fit_alpha) if calib else CostModel.default()
    result: dict[str, Any] = {"model": model.as_dict()}
    sections = [_describe(model), *_measured_errors(model, calib, check, out, result)]
    if given:
        model = dataclasses.replace(model, **given)
        text = ", ".join(f"{k}={v:g}" for k, v in given.items())
        sections.append(f"the predictions below use {text} (given, not calibrated)")
        result["predictions_model"] = model.as_dict()
    grid = _Grid.of(calib + check, methods, density, d, workers)
    tables, result["predictions"] = _predict(model, grid, rates, out)
    sections += tables
    _write(out, "\n\n".join(sections), result, echo)
    return result


def _load(directories: Sequence[str | Path]) -> list[Measurement]:
    """Every measured point of the ``bench comm`` runs in ``directories``."""
    return [m for directory in directories for m in load_measurements(directory)]


def _write(out: Path, text: str, result: dict[str, Any], echo: Callable[[str], object]) -> None:
    """Write ``tables.txt`` and ``model.json``, and echo the tables."""
    (out / "tables.txt").write_text(text + "\n")
    (out / "model.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    echo(text)
    echo(f"wrote {out / 'model.json'}, {out / 'tables.txt'} and the plots in {out}")


def _measured_errors(
    model: CostModel,
    calib: Sequence[Measurement],
    check: Sequence[Measurement],
    out: Path,
    result: dict[str, Any],
) -> list[str]:
    """The error tables of the calibration and check points (their rows go into
    ``result``), and ``model_fit.png`` when there is any measured point."""
    sections = []
    for label, points in (("calibration", calib), ("check", check)):
        if points:
            sections.append(_report_errors(model, label, points, result))
    if calib or check:
        plot_fit(
            prediction_errors(model, calib),
            out / "model_fit.png",
            "cost model: predicted vs measured",
            check=prediction_errors(model, check),
        )
    return sections


def _checked_overrides(overrides: Mapping[str, float | None] | None) -> dict[str, float]:
    """The given what-if values (None: not given).

    Raises:
        ValueError: a name other than alpha, beta0 and eta, or a value that is not > 0.
    """
    bad = {k: v for k, v in (overrides or {}).items() if k not in _OVERRIDABLE}
    if bad or any(not 0 < v < math.inf for v in (overrides or {}).values() if v is not None):
        raise ValueError(
            f"overrides {dict(overrides or {})} must set alpha, beta0 or eta to finite numbers > 0"
        )
    return {k: float(v) for k, v in (overrides or {}).items() if v is not None}


def _describe(model: CostModel) -> str:
    """The model's parameters, where they come from, and its notes."""
    if model.source == "defaults":
        head = (
            "cost model: documented defaults (no calibration data; pass --calibrate DIR "
            "with directories written by `gssgd bench comm`)"
        )
    else:
        head = f"cost model {model.source}"
    lines = [
        head,
        f"  alpha = {model.alpha * 1e6:.1f} us per round (latency-bound message)",
        f"  beta  = max({model.beta0 * 1e9:.3g} ns/B (software, per core), "
        f"8 / ({model.eta:.3g} x rate) (wire)) per byte",
        "  gamma = "
        + ", ".join(f"{k} {v * 1e9:.3g}" for k, v in model.gamma.items())
        + " ns per element",
        *(f"  note: {n}" for n in model.notes),
    ]
    return "\n".join(lines)


def _report_errors(
    model: CostModel, label: str, points: Sequence[Measurement], result: dict[str, Any]
) -> str:
    """The error table of ``points``; their rows and summary go into ``result``."""
    rows = prediction_errors(model, points)
    summary = error_summary(rows)
    title = (
        f"relative error on the {len(rows)} {label} points (predicted / measured - 1): "
        f"median |err| {summary['median_abs_rel_error']:.0%}, "
        f"max |err| {summary['max_abs_rel_error']:.0%}"
    )
    result[f"{label}_errors"] = [
        {
            "run": r.measurement.source,
            "workers": r.measurement.world_size,
            "link_bps": r.measurement.rate_bps,
            "method": r.measurement.spec.name,
            "d": r.measurement.spec.d,
            "measured": r.measurement.seconds_per_step,
            "predicted": r.predicted,
            "rel_error": r.rel_error,
        }
        for r in rows
    ]
    result[f"{label}_summary"] = summary
    return error_table(rows, title)


@dataclass
class _Grid:
    """What the predictions are made for: methods, density, sketch rows, d and P."""

    names: list[str]
    density: float
    rows: int
    d: int
    workers: int
    _specs: dict[tuple[str, int], MethodSpec] = field(default_factory=dict, repr=False)

    @classmethod
    def of(
        cls,
        measured: Sequence[Measurement],
        methods: Sequence[str] | None,
        density: float | None,
        d: int,
        workers: int,
    ) -> _Grid:
        """The given methods (else those measured, else every registered one), the given
        density (else that of the first measured sparse method, else 0.001), and the
        measured sketches' rows (else the default)."""
        seen = list(dict.fromkeys(m.spec.name for m in measured))
        sparse = [m.spec for m in measured if get_method(m.spec.aggregator).sparse]
        sketches = [s for s in sparse if s.rows]
        if density is None:
            density = sparse[0].k / sparse[0].d if sparse else 0.001
        rows = sketches[0].rows if sketches else DEFAULT_ROWS
        return cls(list(methods or seen or VARIANTS), density, rows, d, workers)

    def seconds(self, model: CostModel, name: str, d: int, workers: int, rate: int) -> float:
        """The model's seconds per step of ``name`` (its spec made once per ``d``)."""
        spec = self._specs.get((name, d))
        if spec is None:
            spec = self._specs[(name, d)] = method_spec(name, d, self.density, rows=self.rows)
        return model.predict(spec, workers, rate).total


def _predict(
    model: CostModel, grid: _Grid, rates: Sequence[int], out: Path
) -> tuple[list[str], dict[str, Any]]:
    """Predict every method at every rate: the tables, the JSON, and the two plots."""
    sections: list[str] = []
    vs_p: Panels = {}
    vs_d: Panels = {}
    predictions: dict[str, Any] = {"d": grid.d, "workers": grid.workers, "density": grid.density}
    for rate in rates:
        label = f"{fmt_rate(rate)}/s links"
        cell_p = {
            (p, n): grid.seconds(model, n, grid.d, p, rate)
            for p in PREDICTION_WORKERS
            for n in grid.names
        }
        cell_d = {
            (dd, n): grid.seconds(model, n, dd, grid.workers, rate)
            for dd in PREDICTION_DS
            for n in grid.names
        }
        vs_p[label] = {
            n: (list(PREDICTION_WORKERS), [cell_p[(p, n)] for p in PREDICTION_WORKERS])
            for n in grid.names
        }
        vs_d[label] = {
            n: (list(_PLOT_DS), [grid.seconds(model, n, dd, grid.workers, rate) for dd in _PLOT_DS])
            for n in grid.names
        }
        sections += _rate_tables(grid, rate, cell_p, cell_d)
        predictions[str(rate)] = {
            "vs_workers": {
                n: {str(p): cell_p[(p, n)] for p in PREDICTION_WORKERS} for n in grid.names
            },
            "vs_d": {n: {str(dd): cell_d[(dd, n)] for dd in PREDICTION_DS} for n in grid.names},
        }
    _plot_predictions(model, grid, vs_p, vs_d, out)
    return sections, predictions


def _rate_tables(
    grid: _Grid,
    rate: int,
    cell_p: Mapping[tuple[Any, str], float],
    cell_d: Mapping[tuple[Any, str], float],
) -> list[str]:
    """The time-vs-P and time-vs-d tables at one link rate."""
    at = f"predicted seconds per step at {fmt_rate(rate)}/s"
    tail = f"density {grid.density:g}, a core per worker"
    return [
        grid_table(
            f"{at}, d={grid.d:.0e}, {tail}", "P", PREDICTION_WORKERS, grid.names, cell_p
        ),
        grid_table(
            f"{at}, P={grid.workers}, {tail}",
            "d",
            PREDICTION_DS,
            grid.names,
            cell_d,
            row_format=lambda v: f"{v:.0e}",
        ),
    ]


def _plot_predictions(model: CostModel, grid: _Grid, vs_p: Panels, vs_d: Panels, out: Path) -> None:
    """``model_vs_workers.png`` and ``model_vs_d.png``: one panel per link rate."""
    plot_lines(
        out / "model_vs_workers.png",
        vs_p,
        "workers P",
        f"cost model: seconds per step vs P (d={grid.d:.0e}, density {grid.density:g}; "
        f"{model.source})",
        base_x=2,
    )
    plot_lines(
        out / "model_vs_d.png",
        vs_d,
        "gradient length d",
        f"cost model: seconds per step vs d (P={grid.workers}, density {grid.density:g}; "
        f"{model.source})",
    )
