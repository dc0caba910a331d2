"""Summarise studies/overlap/run.sh into studies/overlap/results/summary.json and summary.md.

Per bench run (``runs/overlap/<model>-<variant>/results.json``): seconds per step, compute,
overhead, the hook's communication seconds, bytes sent, final accuracy; per streamed run,
from ``runs/overlap/overlap_logs/<name>.rank0.jsonl`` (the iterations after the first five):
the median span of the region all-reduces, the median exposed wait of the last bucket, and
the hidden fraction ``1 - sum(exposed) / sum(span)``. Per MNIST run: the test accuracy at
each evaluation and the mean delivered fraction.

    .venv/bin/python studies/overlap/report.py [--dir runs/overlap] [--out studies/overlap/results]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for studies._lib
from studies._lib.report import Run, markdown_table, read_runs, write_summary  # noqa: E402


def _bench(run: Path) -> dict | None:
    path = run / "results.json"
    if not path.exists():
        return None
    row = json.loads(path.read_text())["gs"]
    keys = (
        "status",
        "seconds_per_step",
        "seconds_compute_per_step",
        "seconds_overhead_per_step",
        "seconds_communicate_per_step",
        "bytes_sent_per_step",
        "final_test_accuracy",
        "d",
        "k",
    )
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


def _mnist(run: Run) -> dict:
    """An MNIST run's final accuracy, its accuracy at each evaluation, and the mean
    delivered fraction."""
    evals = {r["step"]: r["test_accuracy"] for r in run.records if "test_accuracy" in r}
    fractions = [
        r["delivered_fraction"]
        for r in run.records
        if isinstance(r.get("delivered_fraction"), (int, float))
    ]
    return {
        "final_test_accuracy": run.summary.get("final_test_accuracy"),
        "accuracy_by_step": evals,
        "mean_delivered_fraction": statistics.mean(fractions) if fractions else None,
    }


def _f(v: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def markdown(out: dict) -> str:
    """The bench runs' table, then the MNIST runs' table."""
    bench = []
    for name, r in out["bench"].items():
        o = r["overlap"] or {}
        bench.append(
            f"{name} | {_f(r['seconds_per_step'])} | {_f(r['seconds_compute_per_step'])} | "
            f"{_f(r['seconds_overhead_per_step'])} | {_f(r['seconds_communicate_per_step'])} | "
            f"{_f(r['bytes_sent_per_step'], '{:,.0f}')} | "
            f"{_f(r['final_test_accuracy'], '{:.4f}')} | {o.get('regions', '-')} | "
            f"{_f(o.get('median_region_span_s'))} | {_f(o.get('median_exposed_s'))} | "
            f"{_f(o.get('hidden_fraction'), '{:.0%}')}"
        )
    mnist = [
        f"{name} | {', '.join(f'{s}: {a:.4f}' for s, a in r['accuracy_by_step'].items())} | "
        f"{r['final_test_accuracy']:.4f} | {_f(r['mean_delivered_fraction'])}"
        for name, r in out["mnist"].items()
    ]
    head = (
        "run | s/step | compute | overhead | hook comm | sent/step | accuracy | regions "
        "| region span | exposed | hidden"
    )
    return "\n".join(
        [
            markdown_table(head, bench),
            "",
            markdown_table("MNIST run | accuracy by step | final | mean delivered fraction", mnist),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("runs/overlap"))
    parser.add_argument("--out", type=Path, default=Path("studies/overlap/results"))
    args = parser.parse_args()
    out: dict = {"bench": {}, "mnist": {}}
    for model in ("lm", "gpt"):
        for variant in ("none", "backend", "stream"):
            name = f"{model}-{variant}"
            row = _bench(args.dir / name)
            if row is not None:
                row["overlap"] = _overlap(args.dir / "overlap_logs" / f"{name}.rank0.jsonl")
                out["bench"][name] = row
    out["mnist"] = {run.name: _mnist(run) for run in read_runs(args.dir, "mnist-*")}
    md = markdown(out)
    write_summary(args.out, out, md + "\n")
    print(md)


if __name__ == "__main__":
    main()
