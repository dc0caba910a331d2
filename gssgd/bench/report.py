"""Tables and plots of the benchmarks (text for the terminal, PNG through matplotlib's Agg).

(Longer than the project's ~500-line guide only by its docstrings; the code, tables and
plots of the two benchmarks sharing their formatting helpers, is under 470 lines.)

Plots are drawn on a bare :class:`matplotlib.figure.Figure` with the Agg canvas, so this
module never touches pyplot's global state or needs a display.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "comm_table",
    "error_table",
    "fmt_bytes",
    "fmt_seconds",
    "grid_table",
    "plot_comm",
    "plot_fit",
    "plot_lines",
    "plot_train",
    "splice_markdown",
    "train_progress_line",
    "train_table",
]

_PARTS = ("compress", "communicate", "decompress", "other")
_COLORS = {
    "compress": "#4c72b0",
    "communicate": "#dd8452",
    "decompress": "#55a868",
    "other": "#b0b0b0",
}


def fmt_seconds(seconds: float | None) -> str:
    """``123 us``, ``12.3 ms``, ``1.23 s``: three significant digits in a readable unit."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 1000:
        return f"{seconds:.3g} s"
    return f"{seconds:.0f} s"


def fmt_bytes(n: float | None) -> str:
    """Decimal units: ``812 B``, ``8.04 kB``, ``6.00 MB``, ``1.2 GB``."""
    if n is None or not math.isfinite(n):
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def splice_markdown(path: str | Path, blocks: Mapping[str, str]) -> list[str]:
    """Replace, in the markdown file ``path``, the text between ``<!-- BEGIN name -->`` and
    ``<!-- END name -->`` with ``blocks[name]`` (the prose around the markers is kept).

    Returns:
        The names whose markers the file lacks (left unwritten).
    """
    path = Path(path)
    text = path.read_text()
    missing = []
    for name, body in blocks.items():
        pattern = re.compile(rf"(<!-- BEGIN {re.escape(name)} -->\n).*?(<!-- END {re.escape(name)} -->)", re.S)
        if not pattern.search(text):
            missing.append(name)
            continue
        text = pattern.sub(lambda m, body=body: m[1] + body.rstrip() + "\n" + m[2], text)
    path.write_text(text)
    return missing


def _render(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """Columns padded to their widest cell; the first ``left`` columns left-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).ljust(w) if i < left else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "-" * len(line(header))
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def _methods(results: Mapping[str, Any]) -> list[str]:
    return [name for name in results if not name.startswith("_")]


def _link(meta: Mapping[str, Any]) -> str:
    """``100mbit (namespaces)``: the link a run used, and how (and what was asked for)."""
    link = meta.get("link", "?")
    where = "namespaces" if meta.get("mode") == "namespaces" else "loopback"
    requested = meta.get("link_requested")
    if requested and requested != link:
        where += f", {requested} requested"
    return f"{link} ({where})"


def _comm_title(meta: Mapping[str, Any]) -> str:
    return (
        f"P={meta.get('workers')}  d={meta.get('d', 0):,}  k={meta.get('k', 0):,} "
        f"(density {meta.get('density')})  link {_link(meta)}  "
        f"{meta.get('threads')} thread/worker  {meta.get('repeats')} timed steps "
        f"(+{meta.get('warmup')} warm-up)  {meta.get('cpu_count')} CPUs"
    )


def _busiest(row: Mapping[str, Any]) -> float:
    """The most bytes one rank moves in one direction in a step."""
    return max(
        row.get("bytes_sent_max_per_step", row["bytes_sent_per_step"]),
        row.get("bytes_received_max_per_step", row["bytes_received_per_step"]),
    )


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
    rows = []
    for name in _methods(results):
        r = results[name]
        speedup = r.get("speedup_of_gs")
        rows.append(
            [
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
        )
    note = (
        "time/step: median over steps of the slowest rank's agg.step; split: the rank with "
        "the most time outside collectives (other: non-finite guard,\nbookkeeping); bytes: "
        "mean over ranks, busiest: the most one rank sends or receives; gs speed-up = "
        "method's time / gs's time (> 1: gs is faster)"
    )
    return f"{_comm_title(results.get('_meta', {}))}\n{_render(header, rows)}\n{note}"


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def plot_comm(results: Mapping[str, Any], path: str | Path) -> Path:
    """Stacked bars of compress / communicate / decompress / other per method, and bytes.

    The parts are those of the critical path's rank, each a median over steps, so their
    sum is close to, not equal to, the measured time per step (the slowest rank's median),
    which is marked with a black tick and printed above with gs's speed-up.

    Returns:
        The path written.
    """
    names = _methods(results)
    fig = _figure(max(8.0, 1.1 * len(names) + 5), 4.6)
    ax_t, ax_b = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    xs = list(range(len(names)))
    bottom = [0.0] * len(names)
    for part in _PARTS:
        vals = [(results[n].get(f"seconds_{part}") or 0.0) * 1e3 for n in names]
        ax_t.bar(xs, vals, bottom=bottom, color=_COLORS[part], label=part, width=0.7)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    totals = [results[n]["seconds_per_step"] * 1e3 for n in names]
    ax_t.scatter(xs, totals, marker="_", s=400, color="black", label="time/step", zorder=3)
    for x, n, t in zip(xs, names, totals, strict=True):
        sp = results[n].get("speedup_of_gs")
        label = fmt_seconds(t / 1e3) + ("" if sp is None else f"\n{sp:.2f}x")
        ax_t.annotate(label, (x, t), ha="center", va="bottom", fontsize=7,
                      xytext=(0, 3), textcoords="offset points")  # fmt: skip
    ax_t.set_xticks(xs, names, rotation=30, ha="right")
    ax_t.set_ylabel("ms per aggregation step")
    ax_t.set_ylim(0, max(totals + bottom) * 1.25 or 1)
    ax_t.legend(fontsize=8, loc="upper right")
    ax_t.set_title("time per step (label: x = time / gs's time)", fontsize=9)
    width = 0.38
    sent = [max(results[n]["bytes_sent_per_step"], 1) for n in names]
    recv = [max(results[n]["bytes_received_per_step"], 1) for n in names]
    ax_b.bar([x - width / 2 for x in xs], sent, width=width, label="sent", color="#8172b3")
    ax_b.bar([x + width / 2 for x in xs], recv, width=width, label="received", color="#937860")
    busiest = [max(_busiest(results[n]), 1) for n in names]
    ax_b.scatter(xs, busiest, marker="_", s=300, color="black", label="busiest rank", zorder=3)
    ax_b.set_yscale("log")
    ax_b.set_xticks(xs, names, rotation=30, ha="right")
    ax_b.set_ylabel("bytes per step (mean over ranks)")
    ax_b.legend(fontsize=8)
    ax_b.set_title("bytes per step", fontsize=9)
    fig.suptitle(_comm_title(results.get("_meta", {})), fontsize=8)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    return out


def grid_table(
    title: str,
    row_label: str,
    rows: Sequence[Any],
    columns: Sequence[str],
    cell: Mapping[tuple[Any, str], float],
    row_format=str,
) -> str:
    """A table of predicted seconds: one row per ``rows`` value, one column per method,
    plus the fastest method of each row."""
    header = [row_label, *columns, "fastest"]
    body = []
    for r in rows:
        vals = {c: cell[(r, c)] for c in columns}
        best = min(vals, key=vals.__getitem__)
        body.append([row_format(r), *(fmt_seconds(vals[c]) for c in columns), best])
    return f"{title}\n{_render(header, body)}"


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
    fig = _figure(6.0 * cols, 3.9 * rows)
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
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    return out


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
    return f"{title}\n{_render(header, body, left=1)}"


def fmt_rate(bps: float) -> str:
    """``100mbit``, ``1gbit``, ``2.5gbit``."""
    for unit, size in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= size:
            return f"{bps / size:g}{unit}"
    return f"{bps:g}bit"


def plot_fit(rows: Sequence[Any], path: str | Path, title: str, check: Sequence[Any] = ()) -> Path:
    """Predicted vs measured seconds per step (log-log) with the line of equality.

    Args:
        rows: the calibration points (:class:`gssgd.costmodel.ErrorRow`), as dots.
        path: the PNG to write.
        title: the plot's title.
        check: held-out points, drawn as crosses in their method's colour.
    """
    fig = _figure(5.2, 4.8)
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
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    return out


# --------------------------------------------------------------------------- bench train


def _train_title(meta: Mapping[str, Any]) -> str:
    k = meta.get("k")
    return (
        f"P={meta.get('workers')}  {meta.get('dataset')} {meta.get('model')} "
        f"(d={meta.get('d', 0):,}{f', k={k:,}' if k else ''}, density {meta.get('density')})  "
        f"batch {meta.get('batch_size')}/worker  {meta.get('steps')} steps  "
        f"link {_link(meta)}  {meta.get('cpu_count')} CPUs, load {meta.get('load_average_1min_before')}"
    )


def _fmt_speedup(row: Mapping[str, Any], key: str) -> str:
    value = row.get(key)
    if value is not None:
        return f"{value:.2f}x"
    at_least = row.get(f"{key}_at_least")
    return f">{at_least:.2f}x" if at_least is not None else "-"


def _fmt_to_target(row: Mapping[str, Any]) -> str:
    if row.get("seconds_to_target") is None:
        return "not reached"
    return f"{fmt_seconds(row['seconds_to_target'])} (step {row['step_to_target']})"


def train_progress_line(method: str, row: Mapping[str, Any], target: float) -> str:
    """One line about a finished ``bench train`` method, for the progress output."""
    parts = [f"{method}: {row.get('status')}"]
    if row.get("samples_per_second"):
        parts.append(f"{row['samples_per_second']:,.0f} samples/s "
                     f"({fmt_seconds(row['seconds_per_step'])}/step)")  # fmt: skip
    if row.get("final_test_accuracy") is not None:
        parts.append(f"test accuracy {row['final_test_accuracy']:.4f}")
    reached = row.get("seconds_to_target") is not None
    parts.append(f"{target:g} " + (f"reached after {_fmt_to_target(row)}" if reached else
                                   "not reached"))  # fmt: skip
    return ", ".join(parts) + f"; {row.get('seconds_run', 0):.0f} s"


def train_table(results: Mapping[str, Any]) -> str:
    """The ``bench train`` table: throughput, compute vs overhead, bytes, accuracy, time to
    target, and gs's speed-ups over each method.

    Args:
        results: the mapping of ``results.json``.
    """
    meta = results.get("_meta", {})
    target = meta.get("target_accuracy")
    header = [
        "method",
        "samples/s",
        "time/step",
        "compute",
        "overhead",
        "sent/step",
        "final acc",
        f"time to {target:g}" if target is not None else "time to target",
        "gs thr. x",
        "gs tta x",
        "status",
    ]
    rows = []
    estimated = False
    for name in _methods(results):
        r = results[name]
        sps = r.get("samples_per_second")
        acc = r.get("final_test_accuracy")
        compute = fmt_seconds(r.get("seconds_compute_per_step"))
        overhead = fmt_seconds(r.get("seconds_overhead_per_step"))
        if r.get("compute_includes_communication"):
            compute += "*"
            overhead += "*" if r.get("overhead_estimated") else ""
            estimated = True
        rows.append(
            [
                name,
                "-" if sps is None else f"{sps:,.0f}",
                fmt_seconds(r.get("seconds_per_step")),
                compute,
                overhead,
                fmt_bytes(r.get("bytes_sent_per_step")),
                "-" if acc is None else f"{acc:.4f}",
                _fmt_to_target(r),
                _fmt_speedup(r, "gs_throughput_speedup"),
                _fmt_speedup(r, "gs_time_to_target_speedup"),
                str(r.get("status")),
            ]
        )
    note = (
        "samples/s = P * batch / time/step; time/step: median over measured steps of rank 0's "
        "step (forward, backward with the exchange, optimizer);\ncompute: the step minus the "
        "comm hook's time; overhead = time/step - compute (compression + communication); "
        "sent: bytes per worker per step;\ntime to target: training clock (sum of step times "
        "from step 0, evaluations left out) at the first evaluation >= the target;\n"
        "gs thr. x = gs's samples/s / method's, gs tta x = method's time to target / gs's "
        "(> 1: gs is better; '>': the method never reached it)"
    )
    if estimated:
        note += (
            "\n*: DDP's built-in all-reduce runs untimed inside backward, so its compute "
            "includes the communication; its overhead is the step minus the other methods' "
            "median compute"
        )
    return f"{_train_title(meta)}\n{_render(header, rows)}\n{note}"


def plot_train(results: Mapping[str, Any], path: str | Path) -> Path:
    """Test accuracy against training time per method (the target as a dashed line), and
    each method's time per step split into compute and overhead, with its samples/s.

    Returns:
        The path written.
    """
    names = _methods(results)
    meta = results.get("_meta", {})
    target = meta.get("target_accuracy")
    fig = _figure(12.0, 4.8)
    ax_a, ax_t = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    for i, name in enumerate(names):
        r = results[name]
        points = [(t, a) for _, t, a in r.get("evaluations") or [] if a is not None]
        color = f"C{i % 10}"
        if points:
            xs, ys = zip(*points, strict=True)
            ax_a.plot(xs, ys, marker=".", color=color, label=name)
        if r.get("seconds_to_target") is not None:
            ax_a.scatter([r["seconds_to_target"]], [target], marker="*", s=120, color=color,
                         zorder=3, edgecolors="black", linewidths=0.5)  # fmt: skip
    if target is not None:
        ax_a.axhline(target, color="gray", ls="--", lw=0.8, label=f"target {target:g}")
    ax_a.set_xlabel("training seconds (sum of step times, evaluations left out)")
    ax_a.set_ylabel("test accuracy")
    ax_a.set_ylim(0, 1.02)
    ax_a.grid(True, alpha=0.3)
    ax_a.legend(fontsize=8, loc="lower right")
    ax_a.set_title("test accuracy vs time (star: target first reached)", fontsize=9)
    xs = list(range(len(names)))
    compute = [(results[n].get("seconds_per_step") or 0.0) - (results[n].get(
        "seconds_overhead_per_step") or 0.0) for n in names]  # fmt: skip
    overhead = [results[n].get("seconds_overhead_per_step") or 0.0 for n in names]
    ax_t.bar(xs, [c * 1e3 for c in compute], color="#4c72b0", width=0.7, label="compute")
    ax_t.bar(xs, [o * 1e3 for o in overhead], bottom=[c * 1e3 for c in compute],
             color="#dd8452", width=0.7, label="overhead (compression + communication)")  # fmt: skip
    tops = [(c + o) * 1e3 for c, o in zip(compute, overhead, strict=True)]
    for x, n, top in zip(xs, names, tops, strict=True):
        sps = results[n].get("samples_per_second")
        label = "-" if sps is None else f"{sps:,.0f}/s"
        ax_t.annotate(label, (x, top), ha="center", va="bottom", fontsize=7,
                      xytext=(0, 3), textcoords="offset points")  # fmt: skip
    ax_t.set_xticks(xs, names, rotation=30, ha="right")
    ax_t.set_ylabel("ms per training step")
    ax_t.set_ylim(0, (max(tops) if tops else 1) * 1.25 or 1)
    ax_t.legend(fontsize=7, loc="upper right")
    ax_t.set_title("time per step (label: samples/s)", fontsize=9)
    fig.suptitle(_train_title(meta), fontsize=8)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    return out
