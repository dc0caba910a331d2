"""Summarise studies/frontier/run.sh: accuracy against bytes per worker per step, by P.

    .venv/bin/python studies/frontier/report.py [RUNS_DIR] [OUT_DIR]
    .venv/bin/python studies/frontier/report.py runs/frontier-lm studies/frontier/results/lm

Reads RUNS_DIR/P<P>/s<seed>/<name>/{summary.json,metrics.jsonl} (default runs/frontier) and
writes OUT_DIR (default studies/frontier/results/cnn): summary.json (every method's mean over seeds
at every P), summary.md (one table per P, with which methods are on the frontier) and
frontier_P<P>.png (accuracy against the busiest rank's bytes per step). Runs of a language
model (the study's MODEL=lm) are judged on the final test loss instead, lower being better,
and "reaching dense" means a loss within 3 % of dense's (the optimizer study's target).

Bytes are the busiest rank's, in the busier direction of its link (sent or received: local
Top-k's workers send 2k numbers but receive 2k(P-1); Sketched-SGD's server receives P
sketches), per step: "steady" averages the steps after the density warm-up (where k has
reached its final value), "run" every step of the run (the dense start and the density
warm-up included, which dominate a 400-step run's total). A method is on the frontier at a
P when no other method reaches at least its mean accuracy with fewer steady bytes.
"message" is the median step after the warm-up: the per-step message without the rare
steps that carry an audit of gs's collapse guard (a dense all-reduce; the first one falls
inside a 400-step run, later ones are spaced to add at most 5 % in a long run). The
targets are judged on both.

"To dense" is judged on the mean curve over seeds (the curve the plots show): the first
evaluation at which the seeds' mean accuracy (loss) reaches dense's target. The steps to
it, also as a multiple of dense's own steps to it, are what ``gssgd advise`` multiplies a
method's predicted step by (``studies/cost_model/write_evidence.py`` writes them, from the fair
frontier's summary, into gssgd/costmodel/data/evidence/).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for studies._lib
from studies._lib.report import (  # noqa: E402
    ACCURACY,
    LOSS,
    Metric,
    Run,
    busier_totals,
    figure,
    group,
    markdown_table,
    reach_on_mean_curve,
    read_runs,
    save_png,
    seed_band,
    steady_bytes,
    worker_dirs,
    write_summary,
)

#: What studies/fair_frontier/report.py imports from here (the metrics are the toolkit's).
__all__ = ["ACCURACY", "LOSS", "Metric", "metric_of", "summarise"]


def _seed(run: Run, m: Metric) -> dict[str, Any]:
    """One seed's numbers: final value, steady / message / whole-run bytes, evaluations."""
    summary, lines = run.summary, run.records
    final = summary[f"final_test_{m.key}"]
    totals = busier_totals(lines)
    steady = steady_bytes(summary, lines)
    return {
        "status": summary["status"],
        m.key: final if final is not None else float("nan"),
        "steady": sum(steady) / len(steady),
        "message": statistics.median(steady),
        "run": totals[-1] / len(totals),
        "k": round(0.001 * summary["d"]),
        "evals": [
            (r["step"], r[f"test_{m.key}"], totals[r["step"]])
            for r in lines
            if r.get(f"test_{m.key}") is not None
        ],
    }


def metric_of(runs_dir: Path) -> Metric:
    """LOSS for a study of a language model (its runs' summaries have no accuracy to judge
    on: the model is ``lm`` or ``gpt``), else ACCURACY."""
    for path in runs_dir.glob("P*/s*/*/config.json"):
        return LOSS if json.loads(path.read_text()).get("model") in ("lm", "gpt") else ACCURACY
    return ACCURACY


def plain_dense(runs: dict[str, list[dict[str, Any]]], m: Metric) -> str | None:
    """The dense reference of a P: the run named ``dense``."""
    return "dense" if "dense" in runs else None


def summarise(
    runs_dir: Path,
    m: Metric = ACCURACY,
    dense_of: Callable[[dict[str, list[dict[str, Any]]], Metric], str | None] = plain_dense,
) -> dict[str, dict[str, Any]]:
    """By P, by method: mean accuracy (or loss), its seed band, bytes, and the steps and
    bytes to reach dense (:meth:`Metric.reaches`, on the mean curve over seeds:
    :func:`studies._lib.report.reach_on_mean_curve`), the steps also as a multiple of dense's own.
    ``dense_of`` names the dense reference among a P's runs (default: ``dense``;
    studies/fair_frontier/report.py: dense's best learning rate)."""
    out: dict[str, dict[str, Any]] = {}
    for workers, pdir in worker_dirs(runs_dir):
        runs = {
            name: [_seed(r, m) for r in seeds]
            for name, seeds in group(read_runs(pdir, "s*/*"), lambda r: r.name).items()
        }
        if runs:
            out[str(workers)] = _table(runs, dense_of(runs, m), m)
    return out


def _table(
    runs: dict[str, list[dict[str, Any]]], ref: str | None, m: Metric
) -> dict[str, dict[str, Any]]:
    """One P's row per method (``runs``: its seeds, :func:`_seed`) against dense's ``ref``."""
    dense = statistics.mean(r[m.key] for r in runs[ref]) if ref else None
    table = {}
    for name, seeds in sorted(runs.items()):
        band = seed_band([r[m.key] for r in seeds])
        steps_to, bytes_to = (
            reach_on_mean_curve([r["evals"] for r in seeds], m, dense) if dense else (None, None)
        )
        table[name] = {
            "seeds": len(seeds),
            "completed": sum(r["status"] == "completed" for r in seeds),
            m.key: band.mean,
            f"{m.key}_min": band.low,
            f"{m.key}_max": band.high,
            "bytes_steady": statistics.mean(r["steady"] for r in seeds),
            "bytes_message": statistics.mean(r["message"] for r in seeds),
            "bytes_run": statistics.mean(r["run"] for r in seeds),
            "floats_per_k": statistics.mean(r["steady"] for r in seeds) / 4 / seeds[0]["k"],
            (
                "bytes_to_dense_minus_half_point"
                if m.higher_is_better
                else "bytes_to_dense_plus_3_percent"
            ): bytes_to,
            "steps_to_target": steps_to,
        }
    dense_steps = table.get(ref, {}).get("steps_to_target") if ref else None
    for row in table.values():
        row["steps_to_target_over_dense"] = (
            row["steps_to_target"] / dense_steps if dense_steps and row["steps_to_target"] else None
        )
    for name, row in table.items():
        row["on_frontier"] = not any(
            m.at_least_as_good(other[m.key], row[m.key])
            and other["bytes_steady"] < row["bytes_steady"]
            for o, other in table.items()
            if o != name
        )
    return table


def markdown(summary: dict[str, dict[str, Any]], m: Metric = ACCURACY) -> str:
    """One table per P, methods by increasing steady bytes."""
    lines = []
    reach = "to dense − 0.5 pt" if m.higher_is_better else "to dense + 3 %"
    head = (
        f"method | seeds | test {m.key} (min–max) | bytes / step, steady | in floats per k "
        f"| message / step | bytes / step, whole run | {reach} | steps there (× dense's) "
        "| on the frontier"
    )
    for p, table in summary.items():
        rows = []
        for name, r in sorted(table.items(), key=lambda kv: kv[1]["bytes_steady"]):
            to = r.get("bytes_to_dense_minus_half_point", r.get("bytes_to_dense_plus_3_percent"))
            rows.append(
                f"{name} | {r['seeds']} | {m.show(r[m.key])} "
                f"({m.number(r[f'{m.key}_min'])}–{m.number(r[f'{m.key}_max'])}) "
                f"| {r['bytes_steady']:,.0f} | {r['floats_per_k']:.1f} "
                f"| {r['bytes_message']:,.0f} | {r['bytes_run']:,.0f} "
                f"| {'not reached' if to is None else f'{to / 1e6:,.1f} MB'} "
                f"| {_steps(r)} | {'yes' if r['on_frontier'] else ''}"
            )
        lines += [f"### P = {p}", "", markdown_table(head, rows), ""]
    return "\n".join(lines)


def _steps(row: dict[str, Any]) -> str:
    if row["steps_to_target"] is None:
        return "–"
    ratio = row["steps_to_target_over_dense"]
    return f"{row['steps_to_target']}" + ("" if ratio is None else f" ({ratio:.2f}×)")


def _best(table: dict[str, Any], method: str) -> dict[str, Any] | None:
    """A rival's best version at this P: of the method with and without the density
    warm-up (the same steady bytes), the one with the higher mean accuracy."""
    rows = [table[n] for n in (method, f"{method}-nowu") if n in table]
    return (
        max(rows, key=lambda r: r["accuracy"] if "accuracy" in r else -r["loss"]) if rows else None
    )


def targets(
    summary: dict[str, dict[str, Any]],
    gs: str = "gs",
    basis: str = "bytes_steady",
    m: Metric = ACCURACY,
) -> dict[str, Any]:
    """The many-workers targets (gs = its default), each met or missed, with the figures;
    bytes on ``basis`` ("bytes_steady" or "bytes_message")."""
    out: dict[str, Any] = {"basis": basis}
    crossover = None
    for p, table in summary.items():
        g, top, gtop = table.get(gs), _best(table, "topk"), _best(table, "gtopk")
        if g is None:
            continue
        key, unit = m.key, "points" if m.higher_is_better else "percent"
        frontier = not any(
            m.at_least_as_good(o[key], g[key]) and o[basis] < g[basis]
            for n, o in table.items()
            if not n.startswith("gs")
        )  # rivals
        row: dict[str, Any] = {
            f"gs_{key}": g[key],
            "gs_bytes": g[basis],
            "gs_on_frontier": frontier,
        }
        if top is not None:
            row[f"topk_{key}"], row["topk_bytes"] = top[key], top[basis]
            row["gs_over_topk_bytes"] = g[basis] / top[basis]
            row[f"gs_minus_topk_{unit}"] = m.gap(g[key], top[key])
            if crossover is None and g[basis] < top[basis]:
                crossover = int(p)
        if gtop is not None:
            row[f"gtopk_{key}"], row["gtopk_bytes"] = gtop[key], gtop[basis]
            row["gs_over_gtopk_bytes"] = g[basis] / gtop[basis]
            row[f"gs_minus_gtopk_{unit}"] = m.gap(g[key], gtop[key])
            if int(p) >= 16:
                row["target_at_or_above_gtopk_within_3x_bytes"] = (
                    m.at_least_as_good(g[key], gtop[key]) and row["gs_over_gtopk_bytes"] <= 3
                )
        if int(p) == 64 and top is not None and m.higher_is_better:
            row["target_frontier_and_half_point_of_topk_at_0.4x"] = (
                frontier
                and row["gs_minus_topk_points"] >= -0.5
                and row["gs_over_topk_bytes"] <= 0.4
            )
        out[p] = row
    out["crossover_P_gs_below_topk_bytes"] = crossover
    out["target_crossover_at_most_16"] = crossover is not None and crossover <= 16
    return out


def plot(summary: dict[str, dict[str, Any]], out: Path, m: Metric = ACCURACY) -> list[Path]:
    """frontier_P<P>.png: each method's mean over seeds against its steady bytes, with the
    seeds' min–max as error bars; o: on the frontier, x: not."""
    paths = []
    for p, table in summary.items():
        fig, ax = figure(figsize=(6, 4))
        scale = 100 if m.higher_is_better else 1
        for name, r in table.items():
            y = scale * r[m.key]
            ax.errorbar(
                r["bytes_steady"],
                y,
                yerr=[[y - scale * r[f"{m.key}_min"]], [scale * r[f"{m.key}_max"] - y]],
                fmt="o" if r["on_frontier"] else "x",
                capsize=3,
            )
            ax.annotate(
                name, (r["bytes_steady"], y), fontsize=7, xytext=(3, 3), textcoords="offset points"
            )
        ax.set_xscale("log")
        ax.set_xlabel("busiest rank's bytes per step after the warm-up (busier direction)")
        ax.set_ylabel("final test accuracy (%)" if m.higher_is_better else "final test loss")
        model = "MNIST CNN" if m.higher_is_better else "Shakespeare character LSTM"
        ax.set_title(f"{model}, density 0.001, P = {p} (simulated; o: on the frontier)")
        fig.tight_layout()
        paths.append(save_png(fig, out / f"frontier_P{p}.png"))
    return paths


def main() -> None:
    runs_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/frontier")
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("studies/frontier/results/cnn")
    m = metric_of(runs_dir)
    summary = summarise(runs_dir, m)
    goals = {
        basis: targets(summary, basis=basis, m=m) for basis in ("bytes_steady", "bytes_message")
    }
    goals_md = "\n### Targets (gs = its default)\n\n```\n" + json.dumps(goals, indent=1) + "\n```\n"
    text = markdown(summary, m) + goals_md
    summary_json, _ = write_summary(out, {"by_P": summary, "targets": goals}, text)
    print(text)
    print("wrote", summary_json, *plot(summary, out, m))


if __name__ == "__main__":
    main()
