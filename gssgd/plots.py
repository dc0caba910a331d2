"""Plots gssgd draws: a comparison's loss and accuracy against steps and against bytes sent
(``gssgd compare``), and the PNG shrinking every committed plot goes through (study reports).

Figures are drawn on a bare :class:`matplotlib.figure.Figure` with the Agg canvas (files
only, no display; pyplot's global backend is left alone). Matplotlib comes with the
``gssgd[cli]`` extra and is imported only when a plot is drawn: without it,
:func:`plot_comparison` raises :class:`MissingExtraError` naming the install command.

Example::

    runs = {"dense": read_metrics("runs/c/dense/metrics.jsonl"),
            "gs": read_metrics("runs/c/gs/metrics.jsonl")}
    plot_comparison(runs, "runs/c", text=False)   # [.../vs_step.png, .../vs_bytes.png]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["CLI_EXTRA", "PNG_COLOURS", "MissingExtraError", "new_figure", "plot_comparison",
           "require_matplotlib", "shrink_png", "smooth"]

#: How to install what the command line needs besides torch and numpy (tqdm, matplotlib).
CLI_EXTRA = "pip install 'gssgd[cli]'"


class MissingExtraError(ImportError):
    """An optional package of the ``gssgd[cli]`` extra is not installed."""


def require_matplotlib() -> None:
    """Raise :class:`MissingExtraError` unless matplotlib can be imported.

    Call it before a long run whose last act is plotting, so the run never ends in it.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise MissingExtraError(
            f"plots need matplotlib, which is not installed ({err}); install it with "
            f"{CLI_EXTRA}"
        ) from err


def new_figure(width: float, height: float, dpi: float | None = None) -> Any:
    """A ``width`` x ``height`` inch Figure on the Agg canvas (no pyplot, no display), at
    ``dpi`` (None: matplotlib's default)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` points (the first points average fewer)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_comparison(
    runs: dict[str, list[dict[str, Any]]], out_dir: Path | str, text: bool = False
) -> list[Path]:
    """Draw every method's curves into two PNG files.

    ``vs_step.png``: training loss (moving average) and test accuracy (text: test loss)
    against the step; ``vs_bytes.png``: the same against the cumulative bytes a worker
    sent, which shows what each method pays for its accuracy.

    Args:
        runs: method name -> its ``metrics.jsonl`` records.
        out_dir: where the PNGs go.
        text: plot test loss instead of test accuracy (language models).

    Returns:
        The paths written.

    Raises:
        MissingExtraError: matplotlib is not installed (the message says how to install it).
    """
    require_matplotlib()
    out_dir = Path(out_dir)
    metric, label = ("test_loss", "test loss") if text else ("test_accuracy", "test accuracy")
    written = []
    for x_key, x_label, name in (
        ("step", "step", "vs_step.png"),
        ("bytes_sent_total", "MB sent per worker (cumulative)", "vs_bytes.png"),
    ):
        fig = new_figure(11, 4.2)
        ax_loss, ax_metric = fig.subplots(1, 2)
        for method, records in runs.items():
            if not records:
                continue
            scale = 1e-6 if x_key != "step" else 1
            xs = [r[x_key] * scale for r in records]
            window = max(1, len(records) // 50)
            ax_loss.plot(xs, smooth([float(r["loss"]) for r in records], window), label=method)
            evaluated = [r for r in records if r.get(metric) is not None]
            ax_metric.plot(
                [r[x_key] * scale for r in evaluated],
                [float(r[metric]) for r in evaluated],
                marker="o",
                ms=3,
                label=method,
            )
        for ax, title in ((ax_loss, "training loss (moving average)"), (ax_metric, label)):
            ax.set_xlabel(x_label)
            ax.set_title(title)
            ax.grid(alpha=0.3)
            ax.legend()
        if x_key != "step":  # methods differ by orders of magnitude in bytes
            ax_loss.set_xscale("log")
            ax_metric.set_xscale("log")
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=110)
        written.append(path)
    return written


#: Colours a committed plot keeps (:func:`shrink_png`): matplotlib's antialiased lines and
#: bands look the same with 256, at a third of the bytes.
PNG_COLOURS = 256


def shrink_png(path: Path) -> None:
    """Size a PNG for the web, in place: its pixels reduced to a palette of
    :data:`PNG_COLOURS` colours (median cut, no dithering) and saved with zlib's best
    effort, about a third of matplotlib's bytes. Deterministic: the same pixels give the
    same file (with the same Pillow), so a plot remade from the same runs is byte for byte
    the committed one. Shrink a plot once: its palette is not a fixed point."""
    from PIL import Image  # matplotlib's own dependency

    with Image.open(path) as image:
        pixels = image.convert("RGB")
    palette = pixels.quantize(PNG_COLOURS, method=Image.Quantize.MEDIANCUT,
                              dither=Image.Dither.NONE)
    palette.save(path, format="PNG", optimize=True)
