"""A study's summary as a markdown page and a plot (``summary.md``, ``curves.png``).

Both are pure functions of ``summary.json`` and the runs' curves, so a resumed study (or
a rerun of ``gssgd study --report``) writes them byte for byte the same.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gssgd.methods import SUBJECT_METHOD
from gssgd.plots import shrink_png
from gssgd.study.curves import Evaluation, seed_points

__all__ = ["fmt_bytes", "markdown", "plot", "value_axis"]


def fmt_bytes(n: float | None) -> str:
    """Decimal units: ``812 B``, ``8.04 kB``, ``6.00 MB``, ``1.2 GB`` (``-`` for none)."""
    if n is None or not math.isfinite(n):
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _value(metric: str, v: float | None) -> str:
    if v is None:
        return "–"
    return f"{100 * v:.2f}" if metric == "accuracy" else f"{v:.4f}"


def _setting(setting: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in setting.items())


def _seconds(s: float | None) -> str:
    return "–" if s is None else f"{s:.3g} s"


def _noise_line(ref: dict[str, Any], metric: str) -> str:
    """The flag of a target margin smaller than the reference's own seed spread."""
    if not ref.get("margin_inside_noise"):
        return ""
    unit = " points" if metric == "accuracy" else " %"
    return (f" **The margin ({100 * ref['margin']:g}{unit}) is smaller than "
            f"{ref['label']}'s own seed spread ({ref['seed_spread']:.2f}{unit}): reaching or "
            "missing the target is inside its noise.**")


def _gap(band: dict[str, Any], metric: str) -> str:
    """A gap band: mean (low to high), in points of accuracy or % of the loss."""
    if band["mean"] is None:
        return "–"
    unit = " pt" if metric == "accuracy" else " %"
    return f"{band['mean']:+.2f}{unit} ({band['low']:+.2f} to {band['high']:+.2f})"


def _row(m: dict[str, Any], metric: str) -> list[str]:
    band, reach = m.get("end", m["final"]), m["to_target"]
    failed = f", {band['failed']} stopped" if band.get("failed") else ""
    seeds = [r["bytes"] for r in reach["by_seed"]]
    shown = "–" if reach["bytes"] is None else fmt_bytes(reach["bytes"])
    spread = ", ".join("miss" if b is None else fmt_bytes(b) for b in seeds)
    times = m["modeled_s"] or {}
    return [m["label"], str(m["budget"]), _setting(m["best_setting"]),
            f"{_value(metric, band['mean'])} ({_value(metric, band['low'])}–"
            f"{_value(metric, band['high'])}{failed})",
            *([_gap(m["gap"], metric)] if "gap" in m else []),
            "–" if reach["steps"] is None else str(reach["steps"]), shown, spread,
            _seconds(times.get("1gbit")), _seconds(times.get("10gbit")),
            "–" if m["reduction"] is None else f"{fmt_bytes(m['run_bytes'])} ({m['reduction']:.3g}x)"]


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _verdict(name: str, ranking: dict[str, Any], gs_labels: list[str]) -> str:
    places = [f"{g} is #{ranking['order'].index(g) + 1} of {len(ranking['order'])}"
              if g in ranking["order"] else f"{g} does not reach it" for g in gs_labels]
    gs_place = f"; {'; '.join(places)}." if places else "."
    if ranking["leader"] is None:
        return f"- **{name}**: no method reaches the target."
    if ranking["margin"] is None:
        return f"- **{name}**: {ranking['leader']} alone reaches the target{gs_place}"
    return (f"- **{name}**: {ranking['leader']}, {ranking['margin']:.2f}x ahead of "
            f"{ranking['runner_up']} ({ranking['verdict']}{_ranges(name, ranking)}){gs_place}")


def _ranges(name: str, ranking: dict[str, Any]) -> str:
    """The seed ranges a lead rests on (bytes or modeled seconds to the target)."""
    ranges = ranking.get("seed_ranges")
    if not ranges:
        return ""
    show = fmt_bytes if name == "Fewest bytes" else (lambda v: f"{v:.3g} s")
    return "; seeds " + " vs ".join(
        f"{label} {'a seed misses' if r is None else f'{show(r[0])}–{show(r[1])}'}"
        for label, r in ranges.items())


def markdown(summary: dict[str, Any]) -> str:
    """The summary page: the setup, one row per method, the rankings with their verdicts."""
    metric, ref, run = summary["metric"], summary["reference"], summary["run"]
    unit = " %" if metric == "accuracy" else ""
    window = ref.get("window")  # None: a summary from before end values and stayed reaches
    value = "mean final" if window is None else f"mean of the last {window} evaluations'"
    head = (f"# Study {summary['study']}\n\n"
            f"{run.get('dataset')} / {run.get('model') or 'default model'}, "
            f"{run.get('workers')} workers, {run.get('steps')} steps, evaluated every "
            f"{run.get('eval_every')}; d = {summary['d']:,}. {_budget(summary)}, each best "
            f"re-run at seeds {summary['seeds']}. Target: {ref['label']}'s {value} {metric} "
            f"{_value(metric, ref['final_mean'])}{unit} -> {_value(metric, ref['target'])}{unit}."
            + _noise_line(ref, metric) +
            "\n\nBytes are the busiest link's, cumulative, to where the seeds' mean curve "
            + ("reaches the target" if window is None else "reaches the target and stays")
            + "; modeled time is the cost model's step (H200, 20 us latency) with these "
            "bytes.\n\n")
    header = ["method", "trials", "best setting", f"final {metric} (seeds)", "steps",
              "bytes to target", "by seed", "1 Gbit/s", "10 Gbit/s",
              "run's bytes (fewer than ref.)"]
    if window is not None:
        header[3:4] = [f"end {metric} (seeds)", f"gap to {ref['label']} (seeds)"]
    rows = [_row(m, metric) for m in summary["methods"]]
    gs = [m["label"] for m in summary["methods"] if m["method"] == SUBJECT_METHOD]
    names = {"bytes": "Fewest bytes", "time_1gbit": "Least time at 1 Gbit/s",
             "time_10gbit": "Least time at 10 Gbit/s"}
    verdicts = [_verdict(names[k], r, gs) for k, r in summary["rankings"].items()]
    verdicts.append(_reduction(summary["largest_reduction"], metric, ref["label"]))
    return (head + _table(header, rows) + "\n\n" + "\n".join(verdicts) + "\n"
            + _recipe_lines(summary.get("recipe")))


def _recipe_lines(recipe: dict[str, dict[str, Any]] | None) -> str:
    """The recipe knobs: each with the methods that fix or search it, and a flag where
    they set it differently."""
    if not recipe:
        return ""
    lines = []
    for knob, by_label in recipe.items():
        ways: dict[str, list[str]] = {}
        for label, value in by_label.items():
            way = (f"searched over {value['searched']}" if isinstance(value, dict)
                   else f"fixed at {value}")
            ways.setdefault(way, []).append(label)
        text = "; ".join(f"{way} for {', '.join(labels)}" for way, labels in ways.items())
        flag = " (**set differently across methods**)" if len(ways) > 1 else ""
        lines.append(f"- `{knob}`: {text}{flag}")
    return "\nRecipe knobs (the learning rate aside):\n\n" + "\n".join(lines) + "\n"


def _budget(summary: dict[str, Any]) -> str:
    """The search's design in a sentence: the trials per method, or an lr grid with its
    extensions and any best left on an edge."""
    design = summary.get("design")
    if design is None:
        return (f"Budget: **{summary['budget_per_method']} trials per method** "
                f"({summary['sampler']})")
    grid = ", ".join(f"{lr:g}" for lr in design["lr_grid"])
    added = [f"{m['label']} {', '.join(f'{lr:g}' for lr in m['lr_extensions'])}"
             for m in summary["methods"] if m.get("lr_extensions")]
    edge = ", ".join(design["on_edge"]) or "none"
    return (f"Design: **every method at the learning rates {grid}**, crossed with its other "
            f"knobs; a best on an edge adds the next rate past it, up to {design['extend']} "
            f"each side (added: {'; '.join(added) or 'none'}; bests still on an edge: "
            f"{edge}); {design['runs']} runs")


def _reduction(largest: dict[str, Any] | None, metric: str, reference: str) -> str:
    """The line on the largest bytes reduction whose final value still reaches the target."""
    if largest is None:
        return f"- **Largest bytes reduction within the target**: none but {reference} ends there."
    return (f"- **Largest bytes reduction within the target**: {largest['label']}, "
            f"{largest['reduction']:.3g}x fewer bytes than {reference} over the run (final "
            f"{metric} {_value(metric, largest['final'])}).")


def value_axis(accuracy: bool, target: float, finals: list[float]) -> tuple[float, float]:
    """The value axis: around the target (where the last points matter), widened to hold
    every method's final value."""
    if accuracy:
        low, high = target - 4, target + 1.5
        low, high = min([low, *(f - 1 for f in finals)]), max([high, *(f + 0.5 for f in finals)])
        return low, min(100.0, high)
    low, high = target / 1.03 * 0.97, target * 1.25
    return min([low, *(0.97 * f for f in finals)]), max([high, *(1.03 * f for f in finals)])


def plot(summary: dict[str, Any], curves: dict[str, list[list[Evaluation]]], path: Path) -> Path:
    """Each method's best setting: the seeds' mean curve against the busiest link's bytes
    (left) and against steps (right), the seeds' min–max as a band, the target dashed,
    zoomed to the values near the target and every method's final value (:func:`value_axis`: a
    method that misses the target is drawn, not cut off)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    scale = 100 if summary["metric"] == "accuracy" else 1
    finals = []  # each method's last mean value: every one is drawn, reached or not
    for label, seeds in curves.items():
        points = seed_points(seeds)
        values = [[v * scale for v in vals] for _, vals, _ in points]
        sent = [b for _, _, b in points]
        mean = [sum(v) / len(v) for v in values]
        steps = [s for s, _, _ in points]
        finals += mean[-1:]
        for ax, x in ((axes[0], sent), (axes[1], [s + 1 for s in steps])):
            (line,) = ax.plot(x, mean, label=label, lw=1.4)
            ax.fill_between(x, [min(v) for v in values], [max(v) for v in values],
                            color=line.get_color(), alpha=0.15, lw=0)
    target = summary["reference"]["target"] * scale
    for ax, xlabel in ((axes[0], "busiest link's bytes (cumulative)"), (axes[1], "step")):
        ax.axhline(target, color="k", ls="--", lw=0.8)
        ax.set_ylim(*value_axis(summary["metric"] == "accuracy", target, finals))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"test {summary['metric']}")
        ax.grid(alpha=0.3)
    axes[0].set_xscale("log")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"{summary['study']}: each method's best setting (seed band)")
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
    shrink_png(path)  # a palette PNG: a third of the bytes, the same file from the same runs
    return path
