"""The ``gssgd bench comm`` table and plot, from its ``results.json`` mapping."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gssgd_lab.figures import new_figure, save_figure
from gssgd_lab.formatting import (
    fmt_bytes,
    fmt_seconds,
    link_label,
    method_names,
    render_table,
)

__all__ = ["comm_table", "plot_comm"]

#: The parts of a step, stacked bottom to top in the plot, and their colours.
_PARTS = ("compress", "communicate", "decompress", "other")
_COLORS = {
    "compress": "#4c72b0",
    "communicate": "#dd8452",
    "decompress": "#55a868",
    "other": "#b0b0b0",
}
_NOTE = (
    "time/step: median over steps of the slowest rank's agg.step; split: the rank with "
    "the most time outside collectives (other: non-finite guard,\nbookkeeping); bytes: "
    "mean over ranks, busiest: the most one rank sends or receives; gs speed-up = "
    "method's time / gs's time (> 1: gs is faster)"
)


def _comm_title(meta: Mapping[str, Any]) -> str:
    """One line of the run's settings: P, d, k, link, threads, steps, CPUs."""
    return (
        f"P={meta.get('workers')}  d={meta.get('d', 0):,}  k={meta.get('k', 0):,} "
        f"(density {meta.get('density')})  link {link_label(meta)}  "
        f"{meta.get('threads')} thread/worker  {meta.get('repeats')} timed steps "
        f"(+{meta.get('warmup')} warm-up)  {meta.get('cpu_count')} CPUs"
    )


def _busiest(row: Mapping[str, Any]) -> float:
    """The most bytes one rank moves in one direction in a step."""
    return max(
        row.get("bytes_sent_max_per_step", row["bytes_sent_per_step"]),
        row.get("bytes_received_max_per_step", row["bytes_received_per_step"]),
    )


def _table_row(name: str, r: Mapping[str, Any]) -> list[str]:
    """One method's cells of :func:`comm_table`."""
    speedup = r.get("speedup_of_gs")
    return [
        name,
        fmt_seconds(r["seconds_per_step"]),
        fmt_seconds(r["seconds_compress"]),
        fmt_seconds(r["seconds_communicate"]),
        fmt_seconds(r["seconds_decompress"]),
        fmt_seconds(r.get("seconds_other")),
        fmt_bytes(r["bytes_sent_per_step"]),
        fmt_bytes(r["bytes_received_per_step"]),
        fmt_bytes(_busiest(r)),
        str(r.get("rounds", "-")),
        "-" if speedup is None else f"{speedup:.2f}x",
    ]


def comm_table(results: Mapping[str, Any]) -> str:
    """The ``bench comm`` table: time per step, its split, bytes, rounds, gs's speed-up.

    Args:
        results: the mapping of ``results.json``.

    Returns:
        A multi-line string, title first.
    """
    header = [
        "method",
        "time/step",
        "compress",
        "communicate",
        "decompress",
        "other",
        "sent/step",
        "recv/step",
        "busiest",
        "rounds",
        "gs speed-up",
    ]
    rows = [_table_row(name, results[name]) for name in method_names(results)]
    return f"{_comm_title(results.get('_meta', {}))}\n{render_table(header, rows)}\n{_NOTE}"


def _plot_times(ax: Any, results: Mapping[str, Any], names: list[str]) -> None:
    """Stacked parts per method, the measured time per step as a black tick, labelled
    with the time and gs's speed-up."""
    xs = list(range(len(names)))
    bottom = [0.0] * len(names)
    for part in _PARTS:
        vals = [(results[n].get(f"seconds_{part}") or 0.0) * 1e3 for n in names]
        ax.bar(xs, vals, bottom=bottom, color=_COLORS[part], label=part, width=0.7)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    totals = [results[n]["seconds_per_step"] * 1e3 for n in names]
    ax.scatter(xs, totals, marker="_", s=400, color="black", label="time/step", zorder=3)
    for x, n, t in zip(xs, names, totals, strict=True):
        sp = results[n].get("speedup_of_gs")
        label = fmt_seconds(t / 1e3) + ("" if sp is None else f"\n{sp:.2f}x")
        ax.annotate(label, (x, t), ha="center", va="bottom", fontsize=7,
                    xytext=(0, 3), textcoords="offset points")  # fmt: skip
    ax.set_xticks(xs, names, rotation=30, ha="right")
    ax.set_ylabel("ms per aggregation step")
    ax.set_ylim(0, max(totals + bottom) * 1.25 or 1)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("time per step (label: x = time / gs's time)", fontsize=9)


def _plot_bytes(ax: Any, results: Mapping[str, Any], names: list[str]) -> None:
    """Bytes sent and received per step (means over ranks), the busiest rank as a tick."""
    xs = list(range(len(names)))
    width = 0.38
    sent = [max(results[n]["bytes_sent_per_step"], 1) for n in names]
    recv = [max(results[n]["bytes_received_per_step"], 1) for n in names]
    ax.bar([x - width / 2 for x in xs], sent, width=width, label="sent", color="#8172b3")
    ax.bar([x + width / 2 for x in xs], recv, width=width, label="received", color="#937860")
    busiest = [max(_busiest(results[n]), 1) for n in names]
    ax.scatter(xs, busiest, marker="_", s=300, color="black", label="busiest rank", zorder=3)
    ax.set_yscale("log")
    ax.set_xticks(xs, names, rotation=30, ha="right")
    ax.set_ylabel("bytes per step (mean over ranks)")
    ax.legend(fontsize=8)
    ax.set_title("bytes per step", fontsize=9)


def plot_comm(results: Mapping[str, Any], path: str | Path) -> Path:
    """Stacked bars of compress / communicate / decompress / other per method, and bytes.

    The parts are those of the critical path's rank, each a median over steps, so their
    sum is close to, not equal to, the measured time per step (the slowest rank's median),
    which is marked with a black tick and printed above with gs's speed-up.

    Returns:
        The path written.
    """
    names = method_names(results)
    fig = new_figure(max(8.0, 1.1 * len(names) + 5), 4.6)
    ax_t, ax_b = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    _plot_times(ax_t, results, names)
    _plot_bytes(ax_b, results, names)
    fig.suptitle(_comm_title(results.get("_meta", {})), fontsize=8)
    return save_figure(fig, path)
