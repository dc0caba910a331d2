"""The cost model report's tables and plots (``gssgd bench model``): predicted seconds on a
grid, measured against predicted, and their log-log plots."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gssgd.bench.figures import new_figure, save_figure
from gssgd.bench.formatting import fmt_rate, fmt_seconds, render_table

__all__ = ["error_table", "grid_table", "plot_fit", "plot_lines"]


def grid_table(
    title: str,
    row_label: str,
    rows: Sequence[Any],
    columns: Sequence[str],
    cell: Mapping[tuple[Any, str], float],
    row_format: Callable[[Any], str] = str,
) -> str:
    """A table of predicted seconds: one row per ``rows`` value, one column per method,
    plus the fastest method of each row."""
    header = [row_label, *columns, "fastest"]
    body = []
    for r in rows:
        vals = {c: cell[(r, c)] for c in columns}
        best = min(vals, key=vals.__getitem__)
        body.append([row_format(r), *(fmt_seconds(vals[c]) for c in columns), best])
    return f"{title}\n{render_table(header, body)}"


def error_table(rows: Sequence[Any], title: str) -> str:
    """Measured vs predicted seconds per step, with the relative error, one row per point.

    Args:
        rows: :class:`gssgd.costmodel.ErrorRow` objects.
        title: the first line.
    """
    header = ["run", "P", "link", "method", "measured", "predicted", "rel. error"]
    body = []
    for r in rows:
        m = r.measurement
        link = "none" if m.rate_bps is None else fmt_rate(m.rate_bps)
        body.append(
            [
                Path(m.source).name,
                str(m.world_size),
                link,
                m.spec.name,
                fmt_seconds(m.seconds_per_step),
                fmt_seconds(r.predicted),
                f"{r.rel_error:+.0%}",
            ]
        )
    return f"{title}\n{render_table(header, body, left=1)}"


def plot_lines(
    path: str | Path,
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]],
    xlabel: str,
    title: str,
    *,
    base_x: int = 10,
    points: Mapping[str, Mapping[str, tuple[float, float]]] | None = None,
) -> Path:
    """One log-log panel per key of ``panels`` (e.g. a link rate), one line per method.

    Args:
        path: the PNG to write.
        panels: ``{panel title: {method: (xs, seconds)}}``.
        xlabel, title: axis label and figure title.
        base_x: log base of the x axis (2 for worker counts).
        points: measured points to overlay, ``{panel title: {method: (x, seconds)}}``.
    """
    n = len(panels)
    cols = 2 if n > 1 else 1
    rows = math.ceil(n / cols)
    fig = new_figure(6.0 * cols, 3.9 * rows)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    cmap = {}
    for ax, (panel, lines) in zip(axes, panels.items(), strict=False):
        for method, (xs, ys) in lines.items():
            (line,) = ax.plot(xs, ys, marker=".", label=method)
            cmap[method] = line.get_color()
        for method, (x, y) in ((points or {}).get(panel) or {}).items():
            ax.scatter([x], [y], marker="x", s=40, color=cmap.get(method, "black"), zorder=3)
        ax.set_xscale("log", base=base_x)
        ax.set_yscale("log")
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("predicted seconds per step")
        ax.grid(True, which="major", alpha=0.3)
    for ax in axes[n:]:
        ax.set_visible(False)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, path)


def plot_fit(rows: Sequence[Any], path: str | Path, title: str, check: Sequence[Any] = ()) -> Path:
    """Predicted vs measured seconds per step (log-log) with the line of equality.

    Args:
        rows: the calibration points (:class:`gssgd.costmodel.ErrorRow`), as dots.
        path: the PNG to write.
        title: the plot's title.
        check: held-out points, drawn as crosses in their method's colour.
    """
    fig = new_figure(5.2, 4.8)
    ax = fig.subplots()
    groups: dict[str, tuple[list[Any], list[Any]]] = {}
    for r in rows:
        groups.setdefault(r.measurement.spec.name, ([], []))[0].append(r)
    for r in check:
        groups.setdefault(r.measurement.spec.name, ([], []))[1].append(r)
    lo, hi = math.inf, 0.0
    for i, (method, (fitted, held_out)) in enumerate(groups.items()):
        color = f"C{i % 10}"
        for rs, marker in ((fitted, "o"), (held_out, "x")):
            if not rs:
                continue
            xs = [r.measurement.seconds_per_step for r in rs]
            ys = [r.predicted for r in rs]
            label = method if marker == "o" or not fitted else None
            ax.scatter(xs, ys, label=label, s=18, marker=marker, color=color)
            lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
    if hi > 0:
        ax.plot([lo / 1.5, hi * 1.5], [lo / 1.5, hi * 1.5], color="gray", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured seconds per step")
    ax.set_ylabel("predicted seconds per step")
    ax.legend(fontsize=7)
    ax.set_title(title + ("  (x: check points, not fitted)" if check else ""), fontsize=9)
    return save_figure(fig, path)
