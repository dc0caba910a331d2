"""Summarise scripts/frontier_study.sh: accuracy against bytes per worker per step, by P.

    .venv/bin/python scripts/frontier_report.py [RUNS_DIR] [OUT_DIR]

Reads RUNS_DIR/P<P>/s<seed>/<name>/{summary.json,metrics.jsonl} (default runs/frontier) and
writes OUT_DIR (default docs/results/frontier): summary.json (every method's mean over seeds
at every P), summary.md (one table per P, with which methods are on the frontier) and
frontier_P<P>.png (accuracy against the busiest rank's bytes per step).

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
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from gssgd.cli.compare import busier_bytes
from gssgd.train.metrics import read_run

#: Within this many points of dense's final accuracy counts as reaching it.
MARGIN = 0.005


def _read_run(run: Path) -> dict[str, Any] | None:
    got = read_run(run)
    if got is None:
        return None
    summary, lines = got
    busier = [busier_bytes(r) for r in lines]
    final_k = lines[-1].get("k")
    steady = [b for b, r in zip(busier, lines, strict=True)
              if r["step"] >= summary["measured_from_step"] and r.get("k") == final_k]
    return {
        "status": summary["status"],
        "accuracy": summary["final_test_accuracy"],
        "steady": sum(steady) / len(steady),
        "message": statistics.median(steady),
        "run": sum(busier) / len(busier),
        "k": round(0.001 * summary["d"]),
        "evals": [(r["step"], r["test_accuracy"], sum(busier[: r["step"] + 1]))
                  for r in lines if r.get("test_accuracy") is not None],
    }


def _bytes_to(evals: list[tuple[int, float, float]], target: float) -> float | None:
    """Bytes sent by the busiest rank until the first evaluation at or above ``target``."""
    return next((b for _, acc, b in evals if acc >= target), None)


def summarise(runs_dir: Path) -> dict[str, dict[str, Any]]:
    """By P, by method: mean accuracy, its spread, bytes and bytes to dense - 0.5 point."""
    out: dict[str, dict[str, Any]] = {}
    for pdir in sorted(runs_dir.glob("P*"), key=lambda p: int(p.name[1:])):
        runs: dict[str, list[dict[str, Any]]] = {}
        for run in sorted(pdir.glob("s*/*")):
            got = _read_run(run)
            if got is not None:
                runs.setdefault(run.name, []).append(got)
        if not runs:
            continue
        dense = statistics.mean(r["accuracy"] for r in runs["dense"]) if "dense" in runs else None
        table = {}
        for name, seeds in sorted(runs.items()):
            accs = [r["accuracy"] for r in seeds]
            to_target = [_bytes_to(r["evals"], dense - MARGIN) for r in seeds] if dense else []
            table[name] = {
                "seeds": len(seeds),
                "completed": sum(r["status"] == "completed" for r in seeds),
                "accuracy": statistics.mean(accs),
                "accuracy_min": min(accs),
                "accuracy_max": max(accs),
                "bytes_steady": statistics.mean(r["steady"] for r in seeds),
                "bytes_message": statistics.mean(r["message"] for r in seeds),
                "bytes_run": statistics.mean(r["run"] for r in seeds),
                "floats_per_k": statistics.mean(r["steady"] for r in seeds) / 4 / seeds[0]["k"],
                "bytes_to_dense_minus_half_point": (
                    statistics.mean(b for b in to_target) if to_target and None not in to_target
                    else None
                ),
            }
        for name, row in table.items():
            row["on_frontier"] = not any(
                other["accuracy"] >= row["accuracy"]
                and other["bytes_steady"] < row["bytes_steady"]
                for o, other in table.items() if o != name
            )
        out[pdir.name[1:]] = table
    return out


def markdown(summary: dict[str, dict[str, Any]]) -> str:
    lines = []
    for p, table in summary.items():
        lines += [f"### P = {p}", "",
                  "| method | seeds | test accuracy (min–max) | bytes / step, steady "
                  "| in floats per k | message / step | bytes / step, whole run "
                  "| to dense − 0.5 pt | on the frontier |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, r in sorted(table.items(), key=lambda kv: kv[1]["bytes_steady"]):
            to = r["bytes_to_dense_minus_half_point"]
            lines.append(
                f"| {name} | {r['seeds']} | {100 * r['accuracy']:.2f} % "
                f"({100 * r['accuracy_min']:.2f}–{100 * r['accuracy_max']:.2f}) "
                f"| {r['bytes_steady']:,.0f} | {r['floats_per_k']:.1f} "
                f"| {r['bytes_message']:,.0f} | {r['bytes_run']:,.0f} "
                f"| {'not reached' if to is None else f'{to / 1e6:,.1f} MB'} "
                f"| {'yes' if r['on_frontier'] else ''} |"
            )
        lines.append("")
    return "\n".join(lines)


def _best(table: dict[str, Any], method: str) -> dict[str, Any] | None:
    """A rival's best version at this P: of the method with and without the density
    warm-up (the same steady bytes), the one with the higher mean accuracy."""
    rows = [table[n] for n in (method, f"{method}-nowu") if n in table]
    return max(rows, key=lambda r: r["accuracy"]) if rows else None


def targets(summary: dict[str, dict[str, Any]], gs: str = "gs",
            basis: str = "bytes_steady") -> dict[str, Any]:
    """The many-workers targets (gs = its default), each met or missed, with the figures;
    bytes on ``basis`` ("bytes_steady" or "bytes_message")."""
    out: dict[str, Any] = {"basis": basis}
    crossover = None
    for p, table in summary.items():
        g, top, gtop = table.get(gs), _best(table, "topk"), _best(table, "gtopk")
        if g is None:
            continue
        frontier = not any(o["accuracy"] >= g["accuracy"] and o[basis] < g[basis]
                           for n, o in table.items() if not n.startswith("gs"))  # rivals
        row: dict[str, Any] = {"gs_accuracy": g["accuracy"], "gs_bytes": g[basis],
                               "gs_on_frontier": frontier}
        if top is not None:
            row["topk_accuracy"], row["topk_bytes"] = top["accuracy"], top[basis]
            row["gs_over_topk_bytes"] = g[basis] / top[basis]
            row["gs_minus_topk_points"] = 100 * (g["accuracy"] - top["accuracy"])
            if crossover is None and g[basis] < top[basis]:
                crossover = int(p)
        if gtop is not None:
            row["gtopk_accuracy"], row["gtopk_bytes"] = gtop["accuracy"], gtop[basis]
            row["gs_over_gtopk_bytes"] = g[basis] / gtop[basis]
            row["gs_minus_gtopk_points"] = 100 * (g["accuracy"] - gtop["accuracy"])
            if int(p) >= 16:
                row["target_at_or_above_gtopk_within_3x_bytes"] = (
                    g["accuracy"] >= gtop["accuracy"] and row["gs_over_gtopk_bytes"] <= 3)
        if int(p) == 64 and top is not None:
            row["target_frontier_and_half_point_of_topk_at_0.4x"] = (
                frontier and row["gs_minus_topk_points"] >= -0.5
                and row["gs_over_topk_bytes"] <= 0.4)
        out[p] = row
    out["crossover_P_gs_below_topk_bytes"] = crossover
    out["target_crossover_at_most_16"] = crossover is not None and crossover <= 16
    return out


def plot(summary: dict[str, dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for p, table in summary.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, r in table.items():
            ax.errorbar(r["bytes_steady"], 100 * r["accuracy"],
                        yerr=[[100 * (r["accuracy"] - r["accuracy_min"])],
                              [100 * (r["accuracy_max"] - r["accuracy"])]],
                        fmt="o" if r["on_frontier"] else "x", capsize=3)
            ax.annotate(name, (r["bytes_steady"], 100 * r["accuracy"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_xlabel("busiest rank's bytes per step after the warm-up (busier direction)")
        ax.set_ylabel("final test accuracy (%)")
        ax.set_title(f"MNIST CNN, density 0.001, P = {p} (simulated; o: on the frontier)")
        fig.tight_layout()
        path = out / f"frontier_P{p}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def main() -> None:
    runs_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/frontier")
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("docs/results/frontier")
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(runs_dir)
    goals = {basis: targets(summary, basis=basis) for basis in ("bytes_steady", "bytes_message")}
    (out / "summary.json").write_text(json.dumps({"by_P": summary, "targets": goals}, indent=1)
                                      + "\n")
    text = markdown(summary) + "\n### Targets (gs = its default)\n\n```\n" + json.dumps(
        goals, indent=1) + "\n```\n"
    (out / "summary.md").write_text(text)
    print(text)
    print("wrote", out / "summary.json", *plot(summary, out))


if __name__ == "__main__":
    main()
