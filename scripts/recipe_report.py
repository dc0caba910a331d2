"""Summarise the recipe study's runs (scripts/recipe_study.sh) into docs/study/.

    .venv/bin/python scripts/recipe_report.py [--raw runs/recipe] [--out docs/study]

Reads every ``RAW/runs/<name>/summary.json`` and ``metrics.jsonl`` and writes
``OUT/recipe.json`` (one record per run) and ``OUT/recipe.md`` (the tables that
docs/study.md shows). Run names are ``METHOD-m<momentum>-lr<lr>[-wu<steps>]-d<density>-s<seed>``
(``lm0.9`` for local momentum; dense runs have no density).

Per cell (method, recipe, density) the tables give the mean and spread of the final test
accuracy over seeds, the gap to dense's mean, the bytes each worker sent per step, and the
bytes it had sent when it first came within 0.5 point of dense's final accuracy (at the
evaluations, every 100 steps), as a fraction of what dense sent by the same step.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

NAME = re.compile(
    r"^(?P<method>[a-z]+)-(?P<mom>l?m[0-9.]+)-lr(?P<lr>[0-9.]+)(?:-wu(?P<wu>\d+))?"
    r"(?:-d(?P<density>[0-9.]+))?-s(?P<seed>\d+)$"
)


def load(raw: Path) -> list[dict[str, Any]]:
    """One record per finished run."""
    records = []
    for run in sorted((raw / "runs").iterdir()):
        m = NAME.match(run.name)
        summary_path = run / "summary.json"
        if not m or not summary_path.is_file():
            continue
        summary = json.loads(summary_path.read_text())
        evals = [
            (r["step"], r["test_accuracy"], r["bytes_sent_total"])
            for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "test_accuracy" in r
        ]
        records.append({
            "name": run.name,
            "method": m["method"],
            "recipe": m["mom"] + f"-lr{m['lr']}" + (f"-wu{m['wu']}" if m["wu"] else ""),
            "density": float(m["density"]) if m["density"] else None,
            "seed": int(m["seed"]),
            "status": summary["status"],
            "final_test_accuracy": summary["final_test_accuracy"],
            "bytes_sent_per_step": summary["bytes_sent_per_step"],
            "bytes_sent_total": summary["bytes_sent_total"],
            "evals": evals,
        })
    return records


def _bytes_to_reach(evals: list[tuple[int, float, float]], target: float) -> float | None:
    for _, acc, sent in evals:
        if acc >= target:
            return sent
    return None


def table(records: list[dict[str, Any]]) -> str:
    """The markdown table of every (method, recipe, density) cell."""
    dense = [r for r in records if r["method"] == "dense" and r["recipe"] == "m0.9-lr0.05"]
    dense_acc = statistics.mean(r["final_test_accuracy"] for r in dense) if dense else None
    dense_bytes = statistics.mean(r["bytes_sent_per_step"] for r in dense) if dense else None
    cells: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        cells.setdefault((r["density"] or 1.0, r["method"], r["recipe"]), []).append(r)
    lines = [
        "| density | method | recipe | seeds | test acc (mean) | spread | vs dense | "
        "bytes/worker/step | x fewer than dense | bytes to dense - 0.5 pt |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (density, method, recipe), runs in sorted(cells.items(), key=lambda kv: (-kv[0][0], kv[0][1], kv[0][2])):
        failed = [r for r in runs if r["final_test_accuracy"] is None]
        if failed:
            lines.append(f"| {density:g} | {method} | {recipe} | {len(runs)} | "
                         f"{len(failed)} run(s) {failed[0]['status']} | | | | | |")
            continue
        accs = [r["final_test_accuracy"] for r in runs]
        mean = statistics.mean(accs)
        spread = max(accs) - min(accs)
        gap = "" if dense_acc is None else f"{100 * (mean - dense_acc):+.2f}"
        per_step = statistics.mean(r["bytes_sent_per_step"] for r in runs)
        fewer = f"{dense_bytes / per_step:,.0f}x" if dense_bytes else ""
        reach = ""
        if dense_acc is not None:
            got = [_bytes_to_reach(r["evals"], dense_acc - 0.005) for r in runs]
            reach = ", ".join("not reached" if g is None else f"{g / 1e6:.1f} MB" for g in got)
        lines.append(
            f"| {density:g} | {method} | {recipe} | {len(runs)} | {100 * mean:.2f} | "
            f"{100 * spread:.2f} | {gap} | {per_step:,.0f} | {fewer} | {reach} |"
        )
    if dense_acc is not None:
        lines.append("")
        lines.append(f"Dense reference: {100 * dense_acc:.2f} % (mean of {len(dense)} seeds, "
                     "SGD momentum 0.9, lr 0.05).")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", type=Path, default=Path("runs/recipe"))
    ap.add_argument("--out", type=Path, default=Path("docs/study"))
    args = ap.parse_args()
    records = load(args.raw)
    args.out.mkdir(parents=True, exist_ok=True)
    slim = [{k: v for k, v in r.items() if k != "evals"} | {"evals": r["evals"]} for r in records]
    (args.out / "recipe.json").write_text(json.dumps(slim, indent=1) + "\n")
    (args.out / "recipe.md").write_text(table(records) + "\n")
    print(table(records))


if __name__ == "__main__":
    main()
