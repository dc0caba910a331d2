"""Matplotlib figures for the benchmarks' plots, without pyplot.

Plots are drawn on a bare :class:`matplotlib.figure.Figure` with the Agg canvas, so the
benchmarks never touch pyplot's global state or need a display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gssgd import plots

__all__ = ["new_figure", "save_figure"]


def new_figure(width: float, height: float) -> Any:
    """A ``width`` x ``height`` inch figure at 110 dpi on an Agg canvas
    (:func:`gssgd.plots.new_figure`)."""
    return plots.new_figure(width, height, dpi=110)


def save_figure(fig: Any, path: str | Path) -> Path:
    """Lay ``fig`` out tightly and write it to ``path`` (PNG by its suffix); returns the path."""
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    return out
