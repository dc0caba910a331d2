"""Summarise scripts/overlap_study.sh into docs/results/overlap/summary.json and summary.md.

Per bench run (``runs/overlap/<model>-<variant>/results.json``): seconds per step, compute,
overhead, the hook's communication seconds, bytes sent, final accuracy; per streamed run,
from ``runs/overlap/overlap_logs/<name>.rank0.jsonl`` (the iterations after the first five):
the median span of the region all-reduces, the median exposed wait of the last bucket, and
the hidden fraction ``1 - sum(exposed) / sum(span)``. Per MNIST run: the test accuracy at
each evaluation and the mean delivered fraction.

    .venv/bin/python scripts/overlap_report.py [--dir runs/overlap] [--out docs/results/overlap]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def _bench(run: Path) -> dict | None:
    path = run / "results.json"
    if not path.exists():
        return None
    row = json.loads(path.read_text())["gs"]
    keys = ("status", "seconds_per_step", "seconds_compute_per_step",
            "seconds_overhead_per_step", "seconds_communicate_per_step",
            "bytes_sent_per_step", "final_test_accuracy", "d", "k")
    return {k: row.get(k) for k in keys}


def _overlap(log: Path, skip: int = 5) -> dict | None:
    if not log.exists():
        return None
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()][skip:]
    if not lines:
        return None
    span = sum(x["seconds_span"] for x in lines)
    exposed = sum(x["seconds_exposed"] for x in lines)
    return {
        "iterations": len(lines),
        "regions": lines[-1]["regions"],
        "median_region_span_s": statistics.median(x["seconds_span"] for x in lines),
        "median_exposed_s": statistics.median(x["seconds_exposed"] for x in lines),
        "hidden_fraction": 1 - exposed / span if span > 0 else None,
    }


def _mnist(run: Path) -> dict | None:
    if not (run / "summary.json").exists():
        return None
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    evals = {r["step"]: r["test_accuracy"] for r in records if "test_accuracy" in r}
    fractions = [r["delivered_fraction"] for r in records
                 if isinstance(r.get("delivered_fraction"), (int, float))]
    summary = json.loads((run / "summary.json").read_text())
    return {
        "final_test_accuracy": summary.get("final_test_accuracy"),
        "accuracy_by_step": evals,
        "mean_delivered_fraction": statistics.mean(fractions) if fractions else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("runs/overlap"))
    parser.add_argument("--out", type=Path, default=Path("docs/results/overlap"))
    args = parser.parse_args()
    out: dict = {"bench": {}, "mnist": {}}
    for model in ("lm", "gpt"):
        for variant in ("none", "backend", "stream"):
            name = f"{model}-{variant}"
            row = _bench(args.dir / name)
            if row is not None:
                row["overlap"] = _overlap(args.dir / "overlap_logs" / f"{name}.rank0.jsonl")
                out["bench"][name] = row
    for run in sorted(args.dir.glob("mnist-*")):
        row = _mnist(run)
        if row is not None:
            out["mnist"][run.name] = row
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
    md = ["| run | s/step | compute | overhead | hook comm | sent/step | accuracy | "
          "regions | region span | exposed | hidden |", "|" + "---|" * 11]
    for name, r in out["bench"].items():
        o = r["overlap"] or {}

        def f(v: float | None, fmt: str = "{:.3f}") -> str:
            return "-" if v is None else fmt.format(v)

        md.append(
            f"| {name} | {f(r['seconds_per_step'])} | {f(r['seconds_compute_per_step'])} | "
            f"{f(r['seconds_overhead_per_step'])} | {f(r['seconds_communicate_per_step'])} | "
            f"{f(r['bytes_sent_per_step'], '{:,.0f}')} | {f(r['final_test_accuracy'], '{:.4f}')}"
            f" | {o.get('regions', '-')} | {f(o.get('median_region_span_s'))} | "
            f"{f(o.get('median_exposed_s'))} | {f(o.get('hidden_fraction'), '{:.0%}')} |"
        )
    md += ["", "| MNIST run | accuracy by step | final | mean delivered fraction |",
           "|---|---|---|---|"]
    for name, r in out["mnist"].items():
        steps = ", ".join(f"{s}: {a:.4f}" for s, a in r["accuracy_by_step"].items())
        frac = r["mean_delivered_fraction"]
        md.append(f"| {name} | {steps} | {r['final_test_accuracy']:.4f} | "
                  f"{'-' if frac is None else f'{frac:.3f}'} |")
    (args.out / "summary.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
