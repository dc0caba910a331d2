"""One report toolkit for the studies: read runs, group them, band the seeds, find where a
run reaches a target, count the busiest link's bytes, and write tables and plots.

Every study under ``studies/<study>/`` trains runs (``runs/<study>/...``, git-ignored) and
commits what its report makes of them (``studies/<study>/results/``). The report scripts
are configurations of the pieces here, in the order a report uses them:

1. **Read** the finished runs: :func:`read_runs` (one :class:`Run` per directory with a
   ``summary.json``), :func:`worker_dirs` for a scaling study's ``P<P>/`` folders.
2. **Group** them by method and setting: :func:`group` (first-seen order, so a sorted
   read gives sorted groups).
3. **Band the seeds** of a group: :func:`seed_band` (mean and min–max; ``spread``).
4. **Judge** them on a :class:`Metric` (test accuracy, higher is better, or test loss,
   lower is better) against dense: :meth:`Metric.reaches`; the first evaluation that
   reaches dense's target: :func:`first_reaching`; on the seeds' mean curve, with the
   crossing interpolated: :func:`reach_on_mean_curve`.
5. **Count bytes** on the busiest rank's link, in its busier direction
   (:func:`gssgd.train.metrics.busier_bytes`, re-exported): per step after the warm-up
   (:func:`steady_bytes`) and cumulative (:func:`busier_totals`).
6. **Write** markdown tables (:func:`markdown_table`, :func:`markdown_row`; byte counts
   with :func:`gssgd.study.report.fmt_bytes` and docs splices with
   :func:`gssgd_lab.markdown.splice_markdown`, both re-exported) and plots
   (:func:`figure`, :func:`draw_band`, :func:`save_png`, :func:`shrink_png`), and the
   ``summary.json`` / ``summary.md`` pair a study commits (:func:`write_summary`).

Every output is a pure function of the runs: tables and JSON are built from sorted reads,
and a PNG from matplotlib's Agg renderer carries no date, so rerunning a report on the same
runs remakes its committed files byte for byte (tests/studies/test_report_toolkit.py checks
one). Example, a study's table of mean accuracy over seeds by method::

    runs = read_runs(Path("runs/my-study"), "s*/*")
    rows = []
    for method, seeds in group(runs, lambda r: r.name).items():
        band = seed_band([r.summary["final_test_accuracy"] for r in seeds])
        rows.append([method, f"{100 * band.mean:.2f}", f"{100 * band.spread:.2f}"])
    print(markdown_table(["method", "accuracy %", "spread"], rows))
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from gssgd.plots import PNG_COLOURS as PNG_COLOURS
from gssgd.plots import shrink_png as shrink_png
from gssgd.study.curves import ACCURACY as ACCURACY
from gssgd.study.curves import LOSS as LOSS
from gssgd.study.curves import Evaluation as Evaluation
from gssgd.study.curves import Metric as Metric
from gssgd.study.curves import busier_totals as busier_totals
from gssgd.study.curves import first_reaching as first_reaching
from gssgd.study.curves import reach_on_mean_curve as reach_on_mean_curve
from gssgd.study.report import fmt_bytes
from gssgd.train.metrics import busier_bytes, read_metrics, read_run
from gssgd_lab.markdown import splice_markdown

__all__ = [
    "ACCURACY",
    "LOSS",
    "Band",
    "Metric",
    "Run",
    "busier_bytes",
    "busier_totals",
    "draw_band",
    "figure",
    "first_reaching",
    "fmt_bytes",
    "group",
    "markdown_row",
    "markdown_table",
    "reach_on_mean_curve",
    "read_metrics",
    "read_runs",
    "save_png",
    "seed_band",
    "shrink_png",
    "splice_markdown",
    "steady_bytes",
    "worker_dirs",
    "write_summary",
]

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

# ----------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Run:
    """A finished run: its directory, ``summary.json`` and ``metrics.jsonl`` records."""

    path: Path
    summary: dict[str, Any]
    records: list[dict[str, Any]]

    @property
    def name(self) -> str:
        """The run's directory name, which the study scripts make its setting's name."""
        return self.path.name


def read_runs(root: Path, pattern: str = "*") -> list[Run]:
    """Every finished run under ``root`` whose directory matches ``pattern``, in path order.

    Args:
        root: the study's runs directory (or one of its ``P<P>/`` folders).
        pattern: a glob relative to ``root``, e.g. ``"s*/*"`` for ``s<seed>/<name>/``.

    Returns:
        One :class:`Run` per matching directory with a ``summary.json``
        (:func:`gssgd.train.metrics.read_run`); a run still training, or a folder that is
        not a run, is left out.
    """
    runs = []
    for path in sorted(root.glob(pattern)):
        got = read_run(path)
        if got is not None:
            runs.append(Run(path, *got))
    return runs


def worker_dirs(root: Path) -> list[tuple[int, Path]]:
    """A scaling study's ``P<P>/`` folders as (P, folder), by increasing P (not by name:
    ``P16`` comes after ``P4``)."""
    found = [(int(p.name[1:]), p) for p in root.glob("P*") if p.name[1:].isdigit()]
    return sorted(found)


def group(items: Iterable[T], key: Callable[[T], K]) -> dict[K, list[T]]:
    """``items`` by ``key(item)``: keys in first-seen order, each group in input order.

    A method and setting is usually the key (the run's name, or a (method, recipe,
    density) tuple); each group then holds that setting's seeds.
    """
    out: dict[K, list[T]] = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out


# ----------------------------------------------------------------------------- seeds


@dataclass(frozen=True)
class Band:
    """A setting's value over its seeds: the mean and the band from the lowest seed to the
    highest (with three seeds a standard deviation says little; the band shows them all)."""

    mean: float
    low: float
    high: float

    @property
    def spread(self) -> float:
        """The band's width, ``high - low``."""
        return self.high - self.low


def seed_band(values: Sequence[float]) -> Band:
    """The :class:`Band` of one setting's seeds.

    Args:
        values: one number per seed (at least one).

    Returns:
        The exact mean (:func:`statistics.mean`, correctly rounded), the min and the max.

    Raises:
        statistics.StatisticsError: when ``values`` is empty.
    """
    return Band(statistics.mean(values), min(values), max(values))


# ----------------------------------------------------------------------------- targets


# ----------------------------------------------------------------------------- bytes


def steady_bytes(summary: dict[str, Any], records: list[dict[str, Any]]) -> list[float]:
    """The busiest rank's bytes of each measured step after the density warm-up.

    Args:
        summary: the run's summary.json (its ``measured_from_step``).
        records: the run's metrics records.

    Returns:
        :func:`busier_bytes` of each step from ``measured_from_step`` on whose ``k`` is the
        run's final ``k`` (the warm-up over); their mean is the run's steady bytes per step,
        their median its per-step message (without the rare audit steps of gs's guard).
    """
    final_k = records[-1].get("k")
    return [
        busier_bytes(r)
        for r in records
        if r["step"] >= summary["measured_from_step"] and r.get("k") == final_k
    ]


# ----------------------------------------------------------------------------- tables


def markdown_row(cells: str | Iterable[str]) -> str:
    """``| a | b |``: one row of a markdown table, from its cells or from their text
    already joined by ``" | "`` (an f-string of a whole row reads like the row)."""
    return "| " + (cells if isinstance(cells, str) else " | ".join(cells)) + " |"


def markdown_table(header: str | Sequence[str], rows: Iterable[str | Sequence[str]]) -> str:
    """A markdown table: the header, the ``|---|`` rule and one line per row.

    Args:
        header: the column titles, as a list or as the header line's text
            (``"method | seeds | bytes"``, split at ``" | "``).
        rows: each row as :func:`markdown_row` takes it (cells unpadded, so that a diff of
            two tables shows the cells that changed).

    Returns:
        The table's lines, joined by newlines (no newline at the end).
    """
    titles = header.split(" | ") if isinstance(header, str) else header
    return "\n".join([markdown_row(titles), "|" + "---|" * len(titles), *map(markdown_row, rows)])


def write_summary(
    out: Path, summary: Any, markdown: str, indent: int = 1, name: str = "summary"
) -> list[Path]:
    """Write a study's two committed files into ``out`` (made if missing).

    Args:
        out: the study's results folder (``studies/<study>/results/``).
        summary: the numbers, as ``<name>.json`` (indented by ``indent``, newline-ended).
        markdown: the tables, as ``<name>.md``, as given.
        name: the files' stem.

    Returns:
        The two paths written, JSON first.
    """
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.md"]
    paths[0].write_text(json.dumps(summary, indent=indent) + "\n")
    paths[1].write_text(markdown)
    return paths


# ----------------------------------------------------------------------------- plots


def figure(ncols: int = 1, nrows: int = 1, **kwargs: Any) -> tuple[Any, Any]:
    """A matplotlib figure and its axes (``Figure.subplots``), drawn by the Agg renderer
    and held by no global state (nothing to close, no display needed).

    Args:
        ncols, nrows: the grid of panels.
        kwargs: for :meth:`matplotlib.figure.Figure.subplots` (``sharey``) and the figure
            (``figsize``).

    Returns:
        (figure, axes): one axes, or an array of them as ``Figure.subplots`` returns.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figsize = kwargs.pop("figsize", None)
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def draw_band(
    ax: Any, xs: Sequence[float], bands: Sequence[Band], scale: float = 1.0, **style: Any
) -> Any:
    """One setting's curve through its seeds' means, with the min–max band shaded.

    Args:
        ax: the matplotlib axes.
        xs: the x of each point (bytes, steps).
        bands: the :class:`Band` at each point.
        scale: a factor for the y values (100: accuracy in %).
        style: for ``ax.plot`` (``label``, ``color``).

    Returns:
        The line drawn (its colour for other marks of the same setting).
    """
    (line,) = ax.plot(xs, [scale * b.mean for b in bands], "o-", **style)
    ax.fill_between(
        xs,
        [scale * b.low for b in bands],
        [scale * b.high for b in bands],
        color=line.get_color(),
        alpha=0.15,
    )
    return line


def save_png(fig: Any, path: Path, dpi: int = 110, shrink: bool = True) -> Path:
    """Write ``fig`` as a PNG and return ``path``.

    The Agg renderer writes no date and no random state, so the same figure makes the same
    bytes (with the same matplotlib, whose version the PNG names). ``shrink`` (default):
    sized for the web afterwards (:func:`shrink_png`), as every committed plot is.
    """
    fig.savefig(path, dpi=dpi)
    if shrink:
        shrink_png(path)
    return path
