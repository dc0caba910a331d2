"""The ``gssgd bench train`` progress lines, table and plot, from its ``results.json``."""

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

__all__ = ["plot_train", "train_progress_line", "train_table"]

_NOTE = (
    "samples/s = P * batch / time/step; time/step: median over measured steps of rank 0's "
    "step (forward, backward with the exchange, optimizer);\ncompute: the step minus the "
    "comm hook's time; overhead = time/step - compute (compression + communication); "
    "sent: bytes per worker per step;\ntime to target: training clock (sum of step times "
    "from step 0, evaluations left out) at the first evaluation >= the target;\n"
    "gs thr. x = gs's samples/s / method's, gs tta x = method's time to target / gs's "
    "(> 1: gs is better; '>': the method never reached it)"
)
_ESTIMATED_NOTE = (
    "\n*: DDP's built-in all-reduce runs untimed inside backward, so its compute "
    "includes the communication; its overhead is the step minus the other methods' "
    "median compute"
)


def _train_title(meta: Mapping[str, Any]) -> str:
    """One line of the run's settings: P, data, model, batch, steps, link, CPUs, load."""
    k = meta.get("k")
    return (
        f"P={meta.get('workers')}  {meta.get('dataset')} {meta.get('model')} "
        f"(d={meta.get('d', 0):,}{f', k={k:,}' if k else ''}, density {meta.get('density')})  "
        f"batch {meta.get('batch_size')}/worker  {meta.get('steps')} steps  "
        f"link {link_label(meta)}  {meta.get('cpu_count')} CPUs, load {meta.get('load_average_1min_before')}"
    )


def _fmt_speedup(row: Mapping[str, Any], key: str) -> str:
    """``1.23x``; ``>1.23x`` when only a lower bound is known; ``-`` when neither."""
    value = row.get(key)
    if value is not None:
        return f"{value:.2f}x"
    at_least = row.get(f"{key}_at_least")
    return f">{at_least:.2f}x" if at_least is not None else "-"


def _fmt_to_target(row: Mapping[str, Any]) -> str:
    """``1.23 s (step 45)``, or ``not reached``."""
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


def _table_row(name: str, r: Mapping[str, Any]) -> list[str]:
    """One method's cells of :func:`train_table`; compute and overhead carry a ``*`` when
    DDP's built-in all-reduce hid the communication inside compute."""
    sps = r.get("samples_per_second")
    acc = r.get("final_test_accuracy")
    compute = fmt_seconds(r.get("seconds_compute_per_step"))
    overhead = fmt_seconds(r.get("seconds_overhead_per_step"))
    if r.get("compute_includes_communication"):
        compute += "*"
        overhead += "*" if r.get("overhead_estimated") else ""
    return [
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
    names = method_names(results)
    rows = [_table_row(name, results[name]) for name in names]
    estimated = any(results[name].get("compute_includes_communication") for name in names)
    note = _NOTE + (_ESTIMATED_NOTE if estimated else "")
    return f"{_train_title(meta)}\n{render_table(header, rows)}\n{note}"


def _plot_accuracy(ax: Any, results: Mapping[str, Any], names: list[str],
                   target: float | None) -> None:
    """Test accuracy against training time per method; a star where it reached the
    target, the target as a dashed line."""
    for i, name in enumerate(names):
        r = results[name]
        points = [(t, a) for _, t, a in r.get("evaluations") or [] if a is not None]
        color = f"C{i % 10}"
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker=".", color=color, label=name)
        if r.get("seconds_to_target") is not None:
            ax.scatter([r["seconds_to_target"]], [target], marker="*", s=120, color=color,
                       zorder=3, edgecolors="black", linewidths=0.5)  # fmt: skip
    if target is not None:
        ax.axhline(target, color="gray", ls="--", lw=0.8, label=f"target {target:g}")
    ax.set_xlabel("training seconds (sum of step times, evaluations left out)")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("test accuracy vs time (star: target first reached)", fontsize=9)


def _plot_step_split(ax: Any, results: Mapping[str, Any], names: list[str]) -> None:
    """Each method's time per step as compute and overhead bars, labelled with samples/s."""
    xs = list(range(len(names)))
    compute = [(results[n].get("seconds_per_step") or 0.0) - (results[n].get(
        "seconds_overhead_per_step") or 0.0) for n in names]  # fmt: skip
    overhead = [results[n].get("seconds_overhead_per_step") or 0.0 for n in names]
    ax.bar(xs, [c * 1e3 for c in compute], color="#4c72b0", width=0.7, label="compute")
    ax.bar(xs, [o * 1e3 for o in overhead], bottom=[c * 1e3 for c in compute],
           color="#dd8452", width=0.7, label="overhead (compression + communication)")  # fmt: skip
    tops = [(c + o) * 1e3 for c, o in zip(compute, overhead, strict=True)]
    for x, n, top in zip(xs, names, tops, strict=True):
        sps = results[n].get("samples_per_second")
        label = "-" if sps is None else f"{sps:,.0f}/s"
        ax.annotate(label, (x, top), ha="center", va="bottom", fontsize=7,
                    xytext=(0, 3), textcoords="offset points")  # fmt: skip
    ax.set_xticks(xs, names, rotation=30, ha="right")
    ax.set_ylabel("ms per training step")
    ax.set_ylim(0, (max(tops) if tops else 1) * 1.25 or 1)
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title("time per step (label: samples/s)", fontsize=9)


def plot_train(results: Mapping[str, Any], path: str | Path) -> Path:
    """Test accuracy against training time per method (the target as a dashed line), and
    each method's time per step split into compute and overhead, with its samples/s.

    Returns:
        The path written.
    """
    names = method_names(results)
    meta = results.get("_meta", {})
    fig = new_figure(12.0, 4.8)
    ax_a, ax_t = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    _plot_accuracy(ax_a, results, names, meta.get("target_accuracy"))
    _plot_step_split(ax_t, results, names)
    fig.suptitle(_train_title(meta), fontsize=8)
    return save_figure(fig, path)
