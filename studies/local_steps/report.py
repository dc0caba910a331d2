"""Summarise studies/local_steps/run.sh: each run's final metric against the bytes its
busiest link carried over the whole run, and issue #37's targets.

    .venv/bin/python studies/local_steps/report.py [RUNS_DIR] [OUT_DIR]
    .venv/bin/python studies/local_steps/report.py runs/local-steps/lm studies/local_steps/results/lm

Reads RUNS_DIR/P<P>/s<seed>/<name>/ (the study's names: ``dense`` or ``dense-lr*``,
per-step ``METHOD-dD``, ``diloco-HH``, outer steps ``METHOD-HH-dD``) and writes OUT_DIR:
summary.json, summary.md (a table per P) and local_steps_P<P>.png (the final metric against
the busiest link's bytes over the run, log scale, the seeds' min–max as a bar).

The metric is the test loss for the character models (shakespeare) and the test accuracy
otherwise. The targets (issue #37), judged per P on the seeds' means:

- **gs outer vs DiLoCo**: at some H, a gs outer level ends within 2 % of DiLoCo's loss at
  that H (0.5 point of accuracy for an image model) with at most a tenth of its bytes;
- **gs outer vs local Top-k outer**: at some H, a gs outer level ends at or below the best
  local-Top-k outer level's metric there with at most half that level's bytes (once local
  Top-k has run SparseLoCo's rule, ``-slc``, only at the H where it has);
- **local steps vs dense**: some local-steps run ends within 5 % of dense DDP's loss (2
  points of accuracy) with at least 300× fewer bytes through the busiest link.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for studies._lib
from studies._lib.report import (  # noqa: E402
    ACCURACY,
    LOSS,
    Metric,
    busier_totals,
    figure,
    fmt_bytes,
    group,
    markdown_table,
    read_runs,
    save_png,
    seed_band,
    worker_dirs,
    write_summary,
)

#: ``diloco-H30``, ``gs-H30-d0.05``, ``topk-H30-d0.05-slc`` (an outer recipe),
#: ``topk-d0.01``, ``dense``, ``dense-lr0.05``.
NAME = re.compile(
    r"^(?P<method>[a-z0-9]+)(?:-H(?P<h>\d+))?(?:-d(?P<d>[0-9.]+[0-9]))?(?:-lr[0-9.]+)?"
    r"(?:-(?P<recipe>[a-z]+))?$"
)


def parse(name: str) -> dict[str, Any]:
    """A run's setting from its name: method, H (None: every step), density and the outer
    recipe (``nesterov`` unless the name ends in another, ``slc``)."""
    m = NAME.match(name)
    if m is None:
        raise ValueError(f"run name {name!r} is not one of the study's (see the module doc)")
    h = m["h"]
    return {
        "method": m["method"],
        "h": int(h) if h else None,
        "density": float(m["d"]) if m["d"] else None,
        "recipe": m["recipe"] or "nesterov",
    }


def metric_for(summary: dict[str, Any]) -> Metric:
    """Test loss for the character models, test accuracy for the image ones."""
    return LOSS if summary["dataset"] == "shakespeare" else ACCURACY


def rows_of(runs: list[Any], metric: Metric) -> list[dict[str, Any]]:
    """One row per setting: its seeds' band and the busiest link's bytes over the run."""
    rows = []
    for name, seeds in group(runs, lambda r: r.name).items():
        band = seed_band([r.summary[f"final_test_{metric.key}"] for r in seeds])
        total = seed_band([busier_totals(r.records)[-1] for r in seeds]).mean
        rows.append(
            {
                "name": name,
                **parse(name),
                "seeds": len(seeds),
                "mean": band.mean,
                "low": band.low,
                "high": band.high,
                "bytes_total": total,
                "steps": seeds[0].summary["steps"],
            }
        )
    return rows


def _dense(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Per-step dense's row (the reference), or None."""
    return next((r for r in rows if r["method"] == "dense" and not r["h"]), None)


def _best(rows: list[dict[str, Any]], metric: Metric) -> dict[str, Any]:
    """The row with the best mean."""
    return min(rows, key=lambda r: r["mean"] * (-1 if metric.higher_is_better else 1))


def targets(rows: list[dict[str, Any]], metric: Metric) -> dict[str, Any]:
    """Issue #37's three targets on one P's rows (module doc). Each lists the comparisons
    that decide it, ``[run, reference, gap to it (% of loss or points), bytes over its
    bytes, met]``, and ``met`` (any of them); a target whose runs are missing is left out."""
    by = {r["name"]: r for r in rows}
    loss = not metric.higher_is_better
    gs_outer = [r for r in rows if r["method"] == "gs" and r["h"]]
    out: dict[str, Any] = {}

    def judge(key: str, pairs: list[tuple[dict, dict]], margin: float, ratio: float) -> None:
        """Each run against its reference: within ``margin`` of it (the metric's own
        measure: a fraction of a loss, points of accuracy; 0: at least as good) with at
        most ``ratio`` of its bytes."""
        close = dataclasses.replace(metric, margin=margin)
        found = []
        for run, ref in pairs:
            share = run["bytes_total"] / ref["bytes_total"]
            found.append(
                [
                    run["name"],
                    ref["name"],
                    round(metric.gap(run["mean"], ref["mean"]), 3),
                    round(share, 5),
                    close.reaches(run["mean"], ref["mean"]) and share <= ratio,
                ]
            )
        if found:
            out[key] = {"met": any(f[4] for f in found), "pairs": found}

    judge(
        "gs_outer_vs_diloco",
        [(g, by[f"diloco-H{g['h']}"]) for g in gs_outer if f"diloco-H{g['h']}" in by],
        0.02 if loss else 0.005,
        1 / 10,
    )
    topks = [r for r in rows if r["method"] == "topk" and r["h"]]
    if any(r["recipe"] == "slc" for r in topks):
        # judge gs only at the H where local Top-k ran its authors' rule (SparseLoCo's):
        # under DiLoCo's outer momentum it trained far worse, a rival not at its best
        ran = {r["h"] for r in topks if r["recipe"] == "slc"}
        topks = [r for r in topks if r["h"] in ran]
    topk_best = {h: _best(at_h, metric) for h, at_h in group(topks, lambda r: r["h"]).items()}
    judge(
        "gs_outer_vs_topk_outer",
        [(g, topk_best[g["h"]]) for g in gs_outer if g["h"] in topk_best],
        0.0,
        1 / 2,
    )
    dense = _dense(rows)
    if dense:
        judge(
            "local_vs_dense", [(r, dense) for r in rows if r["h"]], 0.05 if loss else 0.02, 1 / 300
        )
    return out


def _gap(metric: Metric, run: dict[str, Any], other: dict[str, Any] | None) -> str:
    """``run``'s gap to ``other`` as a table shows it (``–`` without one)."""
    if other is None or other is run:
        return "–"
    unit = " pt" if metric.higher_is_better else " %"
    return f"{metric.gap(run['mean'], other['mean']):+.1f}{unit}"


def table(rows: list[dict[str, Any]], metric: Metric) -> str:
    """The P's markdown table: every setting, its gap to dense and to DiLoCo at its H."""
    by = {r["name"]: r for r in rows}
    dense = _dense(rows)
    body = []
    for r in sorted(rows, key=lambda r: (r["h"] or 0, r["method"] != "dense", r["name"])):
        ref = by.get(f"diloco-H{r['h']}") if r["h"] else None
        body.append(
            [
                r["name"],
                str(r["h"] or 1),
                str(r["seeds"]),
                f"{metric.show(r['mean'])} ({metric.number(r['low'])}–{metric.number(r['high'])})",
                _gap(metric, r, dense),
                _gap(metric, r, ref),
                fmt_bytes(r["bytes_total"]),
                f"{dense['bytes_total'] / r['bytes_total']:,.0f}×" if dense else "–",
            ]
        )
    return markdown_table(
        [
            "run",
            "H",
            "seeds",
            f"test {metric.key} (min–max)",
            "vs dense",
            "vs DiLoCo, same H",
            "busiest link, whole run",
            "fewer bytes than dense",
        ],
        body,
    )


#: How far from dense the plot's axis reaches (a fraction of dense's loss, or points of
#: accuracy); runs beyond it are drawn on the edge with their value.
PLOT_REACH = 0.3


def plot(rows: list[dict[str, Any]], metric: Metric, p: int, path: Path) -> None:
    """The final metric against the busiest link's bytes over the run, one mark a setting:
    squares train every step, circles take local steps (filled: SparseLoCo's outer rule,
    hollow: DiLoCo's), labelled ``H<H> d<density>``; the seeds' min–max as a bar."""
    fig, ax = figure(figsize=(8, 5))
    colours = {"dense": "black", "diloco": "tab:green", "gs": "tab:blue",
               "topk": "tab:orange", "gtopk": "tab:red", "powersgd": "tab:purple"}  # fmt: skip
    scale = 100 if metric.higher_is_better else 1
    dense = _dense(rows)
    edge = None
    if dense is not None:
        edge = scale * (dense["mean"] - PLOT_REACH if metric.higher_is_better
                        else dense["mean"] * (1 + PLOT_REACH))  # fmt: skip
    seen = set()
    for r in rows:
        colour = colours.get(r["method"], "grey")
        y = scale * r["mean"]
        beyond = edge is not None and not metric.at_least_as_good(y / scale, edge / scale)
        seen.add(r["method"])
        hollow = r["h"] and r["method"] != "diloco" and r["recipe"] != "slc"
        ax.errorbar([r["bytes_total"]], [edge if beyond else y],
                    yerr=None if beyond else [[y - scale * r["low"]], [scale * r["high"] - y]],
                    fmt=("^" if beyond else "o") if r["h"] else "s", color=colour, capsize=2,
                    mfc="white" if hollow else colour)  # fmt: skip
        name = "every step" if not r["h"] else f"H{r['h']}"
        name += f" d{r['density']:g}" if r["density"] else ""
        name += f" ({metric.number(r['mean'])})" if beyond else ""
        ax.annotate(name, (r["bytes_total"], edge if beyond else y), fontsize=6.5,
                    xytext=(4, -3), textcoords="offset points")  # fmt: skip
    ax.set_xscale("log")
    if edge is not None:
        low = min(scale * r["low"] for r in rows)
        ax.set_ylim(*sorted((low - 0.02 * abs(low), edge + 0.01 * abs(edge))))
    ax.set_xlabel("bytes through the busiest worker's link, whole run")
    ax.set_ylabel(f"final test {metric.key}" + (" (%)" if metric.higher_is_better else ""))
    ax.set_title(
        f"P = {p}: squares every step; circles local steps (hollow: DiLoCo's outer "
        "rule, filled: SparseLoCo's); triangles off the scale",
        fontsize=9,
    )
    from matplotlib.lines import Line2D

    ax.legend(
        handles=[
            Line2D([], [], marker="o", ls="", color=colours.get(m, "grey"), label=m)
            for m in colours
            if m in seen
        ],
        fontsize=8,
        loc="upper right",
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, path)


def main(runs_dir: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {}
    parts = []
    for p, folder in worker_dirs(runs_dir):
        runs = read_runs(folder, "s*/*")
        if not runs:
            continue
        metric = metric_for(runs[0].summary)
        rows = rows_of(runs, metric)
        summary[f"P{p}"] = {"metric": metric.key, "rows": rows, "targets": targets(rows, metric)}
        parts.append(f"### P = {p}\n\n{table(rows, metric)}\n")
        plot(rows, metric, p, out / f"local_steps_P{p}.png")
    write_summary(out, summary, "\n".join(parts))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        Path(args[0]) if args else Path("runs/local-steps/lm"),
        Path(args[1]) if len(args) > 1 else Path("studies/local_steps/results/lm"),
    )
