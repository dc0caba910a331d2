"""Summarise studies/fair_frontier/run.sh: each method's curve of accuracy against bytes.

    .venv/bin/python studies/fair_frontier/report.py [RUNS_DIR] [OUT_DIR]
    .venv/bin/python studies/fair_frontier/report.py runs/fair-frontier/fashion-mnist \
        studies/fair_frontier/results/fashion-mnist

Reads RUNS_DIR/P<P>/s<seed>/<method>-<level>/ (default runs/fair-frontier/mnist) with
studies/frontier/report.py's reader (one toolkit for the frontier studies) and writes
OUT_DIR (default studies/fair_frontier/results/mnist): summary.json, summary.md (a table per
P, levels grouped by method) and fair_P<P>.png (left: accuracy against the busiest rank's
bytes per step after the warm-up, one curve per method through its levels, the seeds'
min–max as a band; right: the bytes each level needed to reach dense − 0.5 point).

Dense's reference at a P is its best learning rate there (``dense-lr*``, the highest mean
accuracy). The targets (issue #35), judged per P on the bytes to reach dense − 0.5 point
(cumulative busiest-rank bytes, on the mean curve over seeds, each method at its best
level): gs reaches it with at most half the bytes of the best rival (PowerSGD, gTop-k,
local Top-k, Sketched-SGD); and no rival's point lies above gs's curve (a rival level as
accurate as some gs level for fewer bytes per step).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for studies._lib
from studies._lib.report import (  # noqa: E402
    Band,
    draw_band,
    figure,
    group,
    markdown_table,
    save_png,
    write_summary,
)
from studies.frontier.report import ACCURACY, Metric, metric_of, summarise  # noqa: E402

#: The rivals gs is judged against (:func:`method_of` a run's curve).
RIVALS = ("powersgd", "gtopk", "topk", "sketched")
TO_TARGET = "bytes_to_dense_minus_half_point"


def best_dense(runs: dict[str, list[dict[str, Any]]], m: Metric) -> str | None:
    """Dense's best learning rate at this P: the ``dense-lr*`` run with the best mean."""
    names = [n for n in runs if n.startswith("dense-lr")]
    if not names:
        return None
    return max(names, key=lambda n: statistics.mean(r[m.key] for r in runs[n])
               * (1 if m.higher_is_better else -1))


def family(name: str) -> str:
    """The curve a run belongs to: its name without the level, ``gs-d0.003`` -> ``gs``,
    ``topk-nowu-d0.003`` -> ``topk-nowu``, ``dense16-lr0.05`` -> ``dense16``."""
    return name.rsplit("-", 1)[0]


def method_of(curve: str) -> str:
    """The method of a curve: ``topk-nowu`` -> ``topk``."""
    return curve.split("-")[0]


def curves(table: dict[str, Any]) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Each method's levels, by increasing steady bytes."""
    out = group(table.items(), lambda nr: family(nr[0]))
    return {f: sorted(rows, key=lambda nr: nr[1]["bytes_steady"]) for f, rows in out.items()}


def best_to_target(rows: list[tuple[str, dict[str, Any]]]) -> tuple[str, float] | None:
    """The level that reached dense − 0.5 point with the fewest bytes, and those bytes."""
    reached = [(n, r[TO_TARGET]) for n, r in rows if r.get(TO_TARGET) is not None]
    return min(reached, key=lambda nb: nb[1]) if reached else None


def pareto(rows: list[tuple[str, dict[str, Any]]], m: Metric) -> list[tuple[str, dict[str, Any]]]:
    """The levels no other level beats with fewer bytes per step: a method's curve over all
    its variants (``gs``, ``gs-nowu``, ``gs-wu0.02``)."""
    return [(n, r) for n, r in rows if not any(
        m.at_least_as_good(o[m.key], r[m.key]) and o["bytes_steady"] < r["bytes_steady"]
        for _, o in rows)]


def above_gs(gs_rows: list[tuple[str, dict[str, Any]]], rival: dict[str, Any],
             m: Metric) -> bool:
    """Whether a rival level lies above gs's curve (``gs_rows``: :func:`pareto` of every gs
    level): it is at least as good as some point of that curve and sends fewer bytes per
    step."""
    return any(m.at_least_as_good(rival[m.key], r[m.key])
               and rival["bytes_steady"] < r["bytes_steady"] for _, r in gs_rows)


def targets(summary: dict[str, dict[str, Any]], m: Metric = ACCURACY) -> dict[str, Any]:
    """Per P: each method's best bytes to the target, gs's ratio to the best rival's, and
    the rival levels above gs's curve."""
    out: dict[str, Any] = {}
    for p, table in summary.items():
        by = curves(table)
        best = {f: best_to_target(rows) for f, rows in by.items()}
        row: dict[str, Any] = {"best_to_target": {f: b for f, b in best.items() if b}}
        rivals = [b for f, b in best.items() if method_of(f) in RIVALS and b]
        gs_best = [b for f, b in best.items() if method_of(f) == "gs" and b]
        gs = min(gs_best, key=lambda nb: nb[1]) if gs_best else None
        gs_curve = pareto([nr for f, rows in by.items() if method_of(f) == "gs"
                           for nr in rows], m)
        if gs and rivals:
            top = min(rivals, key=lambda nb: nb[1])
            row["best_rival"], row["gs_best"] = top[0], gs[0]
            row["gs_over_best_rival_bytes"] = gs[1] / top[1]
            row["target_gs_at_most_half_the_best_rival"] = gs[1] <= 0.5 * top[1]
        elif rivals and gs_curve:
            row["best_rival"] = min(rivals, key=lambda nb: nb[1])[0]
            row["target_gs_at_most_half_the_best_rival"] = False  # gs never reached it
        if gs_curve:
            row["gs_curve"] = [n for n, _ in gs_curve]
            row["rival_levels_above_gs"] = [
                n for f, rows in by.items() if method_of(f) in RIVALS for n, r in rows
                if above_gs(gs_curve, r, m)]
        out[p] = row
    return out


def markdown(summary: dict[str, dict[str, Any]], goals: dict[str, Any], m: Metric) -> str:
    lines = []
    for p, table in summary.items():
        cells = []
        for f, rows in sorted(curves(table).items()):
            for name, r in rows:
                to = r.get(TO_TARGET)
                cells.append(
                    f"{f} | {name[len(f) + 1:] or '–'} | {r['seeds']} | {m.show(r[m.key])} "
                    f"({m.number(r[f'{m.key}_min'])}–{m.number(r[f'{m.key}_max'])}) "
                    f"| {r['bytes_steady']:,.0f} | {r['bytes_run']:,.0f} "
                    f"| {'not reached' if to is None else f'{to / 1e6:,.2f} MB'} "
                    f"| {r['steps_to_target'] or '–'}")
        head = (f"method | level | seeds | test {m.key} (min–max) | bytes / step, steady "
                "| bytes / step, whole run | to dense − 0.5 pt | steps there")
        lines += [f"### P = {p}", "", markdown_table(head, cells),
                  "", "```", json.dumps(goals.get(p, {}), indent=1), "```", ""]
    return "\n".join(lines)


def plot(summary: dict[str, dict[str, Any]], out: Path, title: str, m: Metric) -> list[Path]:
    paths = []
    scale = 100 if m.higher_is_better else 1
    for p, table in summary.items():
        fig, (left, right) = figure(2, figsize=(11, 4))
        for f, rows in sorted(curves(table).items()):
            x = [r["bytes_steady"] for _, r in rows]
            bands = [Band(r[m.key], r[f"{m.key}_min"], r[f"{m.key}_max"]) for _, r in rows]
            line = draw_band(left, x, bands, scale, label=f)
            reached = [(n, r[TO_TARGET]) for n, r in rows if r.get(TO_TARGET) is not None]
            if reached:
                right.scatter([b / 1e6 for _, b in reached], [f] * len(reached),
                              color=line.get_color())
                for n, b in reached:
                    right.annotate(n[len(f) + 1:], (b / 1e6, f), fontsize=7,
                                   xytext=(3, 3), textcoords="offset points")
        left.set_xscale("log")
        left.set_xlabel("busiest rank's bytes per step after the warm-up")
        left.set_ylabel("final test accuracy (%)" if m.higher_is_better else "final test loss")
        left.legend(fontsize=7)
        right.set_xscale("log")
        right.set_xlabel("busiest rank's bytes until dense − 0.5 point (MB)")
        fig.suptitle(f"{title}, P = {p} (simulated; bands: seeds' min–max)")
        fig.tight_layout()
        paths.append(save_png(fig, out / f"fair_P{p}.png"))
    return paths


def main() -> None:
    runs_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/fair-frontier/mnist")
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("studies/fair_frontier/results/mnist")
    m = metric_of(runs_dir)
    summary = summarise(runs_dir, m, dense_of=best_dense)
    goals = targets(summary, m)
    text = markdown(summary, goals, m)
    write_summary(out, {"by_P": summary, "targets": goals}, text)
    print(text)
    title = f"CNN on {runs_dir.name}, weak scaling"
    print("wrote", out / "summary.json", *plot(summary, out, title, m))


if __name__ == "__main__":
    main()
