"""Summarise studies/time_to_accuracy/run.sh into studies/time_to_accuracy/results/summary.{json,md} and ttt.png.

Per cell (P = 4 on 100 Mbit/s and 1 Gbit/s links, P = 8 on 100 Mbit/s) and method, over the
seeds that ran (``runs/ttt/{mbit,gbit,p8}-s<SEED>/results.json``, each one ``gssgd bench
train`` run of every method on the wide ResNet): the median seconds per step, the time to
90 % test accuracy of each seed (None: never reached in 160 steps), its step, the bytes a
worker sent up to it (``bytes_sent_total`` of the step in the run's metrics.jsonl), the best and
the final test accuracy. The ratios the issue's targets ask for are per seed, inside one
``bench train`` run (methods of one run share the machine's state): gs's time to target
over dense's and over the best rival's. The runs of gs alone with another recipe
(``runs/ttt/gs-*``: learning rates, the density warm-up) get a row each.

``gssgd advise`` is checked on every run: each measured method's step predicted by the
cluster model for the cpu device (``--device cpu --latency 1ms``, the run's P and link, and
its measured forward + backward: the median over the run's methods of their compute, the
step less the comm hook), gs as it ran (its all-reduce and table dtype); the relative error of each
step and whether the model's fastest of the five was the measured fastest or within 10 %.

The plot has one panel per cell: test accuracy against the training clock, one line per
method and seed.

    .venv/bin/python studies/time_to_accuracy/report.py [--dir runs/ttt] [--out studies/time_to_accuracy/results]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for studies._lib
from gssgd.costmodel.cluster import Link, predict_step  # noqa: E402
from gssgd.costmodel.devices import get_device  # noqa: E402
from gssgd.costmodel.method_specs import MethodSpec, method_spec  # noqa: E402
from studies._lib.report import figure, markdown_table, read_metrics, save_png, write_summary  # noqa: E402

#: Run-name prefix -> the cell it measured.
CELLS = {"mbit": "P = 4, 100 Mbit/s", "gbit": "P = 4, 1 Gbit/s", "p8": "P = 8, 100 Mbit/s"}
METHODS = ("dense", "topk", "gtopk", "sketched", "gs")
RIVALS = ("topk", "gtopk", "sketched")
#: The per-message latency the advise check gives the emulated links (their probes measured
#: 0.7-2.4 ms per round).
ADVISE_LATENCY_S = 1e-3


def _bytes_to(run_dir: Path, step: int | None) -> float | None:
    """Bytes a worker had sent up to and including ``step``, from the run's metrics."""
    if step is None:
        return None
    at_step = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("step") == step]
    return at_step[0].get("bytes_sent_total") if at_step else None


def _row(result: dict) -> dict:
    evals = result.get("evaluations") or []
    return {
        "seconds_per_step": result["seconds_per_step"],
        "seconds_to_target": result["seconds_to_target"],
        "step_to_target": result["step_to_target"],
        "bytes_to_target": _bytes_to(Path(result["run_dir"]), result["step_to_target"]),
        "bytes_sent_per_step": result["bytes_sent_per_step"],
        "best_test_accuracy": max((a for _, _, a in evals), default=None),
        "final_test_accuracy": result["final_test_accuracy"],
        "evaluations": evals,
    }


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None else num / den


def _seed_ratios(rows: dict[str, dict]) -> dict:
    """gs's time to target over dense's and over the fastest rival's, in one run."""
    gs = rows.get("gs", {}).get("seconds_to_target")
    rivals = [
        (rows[m]["seconds_to_target"], m)
        for m in RIVALS
        if m in rows and rows[m]["seconds_to_target"] is not None
    ]
    best = min(rivals) if rivals else (None, None)
    return {
        "gs_over_dense": _ratio(gs, rows.get("dense", {}).get("seconds_to_target")),
        "best_rival": best[1],
        "gs_over_best_rival": _ratio(gs, best[0]),
    }


def _advised_spec(method: str, meta: dict) -> MethodSpec:
    """The cost model's spec of a method as the run ran it: gs with the run's all-reduce
    (``--allreduce backend``: the ``gs-backend`` variant) and table dtype."""
    settings = meta["settings"]
    if method != "gs":
        return method_spec(method, meta["d"], meta["density"])
    variant = "gs-backend" if settings.get("allreduce") == "backend" else "gs"
    spec = method_spec(variant, meta["d"], meta["density"])
    table_dtype = settings.get("table_dtype") or "float32"
    return dataclasses.replace(spec, table_bytes=getattr(torch, table_dtype).itemsize)


def advise_check(data: dict) -> dict:
    """The cluster model's step of each measured method in one run (see the module doc)."""
    meta = data["_meta"]
    rows = {m: data[m] for m in METHODS if m in data}
    fwdbwd = statistics.median(r["seconds_compute_per_step"] for r in rows.values())
    link = Link(meta["link_bps"], ADVISE_LATENCY_S)
    cpu = get_device("cpu")
    out = {}
    for m, r in rows.items():
        spec = _advised_spec(m, meta)
        predicted = predict_step(spec, meta["workers"], link, cpu, fwdbwd_s=fwdbwd).total
        out[m] = {
            "predicted": predicted,
            "measured": r["seconds_per_step"],
            "rel_error": predicted / r["seconds_per_step"] - 1.0,
        }
    picked = min(out, key=lambda m: out[m]["predicted"])
    fastest = min(out, key=lambda m: out[m]["measured"])
    ratio = out[picked]["measured"] / out[fastest]["measured"]
    return {
        "fwdbwd_s": fwdbwd,
        "methods": out,
        "picked": picked,
        "fastest": fastest,
        "picked_over_fastest": ratio,
        "within_10pct": ratio <= 1.10,
    }


def collect(root: Path) -> dict:
    out: dict = {"cells": {}, "gs_recipes": {}}
    for key, label in CELLS.items():
        seeds = {}
        for run in sorted(root.glob(f"{key}-s*")):
            path = run / "results.json"
            if not path.exists():
                continue
            data = json.loads(path.read_text())
            rows = {m: _row(data[m]) for m in METHODS if m in data}
            seeds[run.name.split("-s")[-1]] = {
                "methods": rows,
                "ratios": _seed_ratios(rows),
                "advise": advise_check(data),
                "command": data["_meta"]["command"],
                "machine": data["_meta"]["machine"],
                "date": data["_meta"]["date"],
            }
        if seeds:
            out["cells"][label] = {"seeds": seeds, "methods": _aggregate(seeds)}
    for run in sorted(root.glob("gs-*")):
        path = run / "results.json"
        if path.exists():
            data = json.loads(path.read_text())
            out["gs_recipes"][run.name.removeprefix("gs-")] = {
                **_row(data["gs"]),
                "command": data["_meta"]["command"],
            }
    return out


def _aggregate(seeds: dict) -> dict:
    agg = {}
    for m in METHODS:
        rows = [s["methods"][m] for s in seeds.values() if m in s["methods"]]
        if not rows:
            continue
        reached = [r["seconds_to_target"] for r in rows if r["seconds_to_target"] is not None]
        agg[m] = {
            "seeds": len(rows),
            "reached": len(reached),
            "median_seconds_per_step": statistics.median(r["seconds_per_step"] for r in rows),
            "mean_seconds_to_target_of_reached": statistics.mean(reached) if reached else None,
            "mean_final_test_accuracy": statistics.mean(r["final_test_accuracy"] for r in rows),
        }
    return agg


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def _cell_tables(cell: dict) -> list[str]:
    """One cell's three tables: per method over seeds, gs's ratios per seed, and advise's
    predicted steps against the measured ones per seed."""
    seeds = sorted(cell["seeds"])
    rows = []
    for m, a in cell["methods"].items():
        runs = [cell["seeds"][s]["methods"].get(m) for s in seeds]
        times = " / ".join(_f(r and r["seconds_to_target"], "{:.0f} s") for r in runs)
        mbytes = " / ".join(
            _f(r and r["bytes_to_target"] and r["bytes_to_target"] / 1e6, "{:.1f}") for r in runs
        )
        best = " / ".join(_f(r and r["best_test_accuracy"], "{:.1%}") for r in runs)
        final = " / ".join(_f(r and r["final_test_accuracy"], "{:.1%}") for r in runs)
        rows.append(
            f"{m} | {a['median_seconds_per_step']:.3f} | {times} | "
            f"{a['reached']}/{a['seeds']} | {mbytes} | {best} | {final}"
        )
    ratios = [
        f"{s} | {_f(r['gs_over_dense'], '{:.2f}')} | {r['best_rival'] or '-'} "
        f"| {_f(r['gs_over_best_rival'], '{:.2f}')}"
        for s, r in ((s, cell["seeds"][s]["ratios"]) for s in seeds)
    ]
    advised = []
    for s in seeds:
        a = cell["seeds"][s]["advise"]
        cells = [
            f"{a['methods'][m]['predicted']:.3f} / {a['methods'][m]['measured']:.3f} "
            f"({a['methods'][m]['rel_error']:+.0%})"
            if m in a["methods"]
            else "-"
            for m in METHODS
        ]
        advised.append([s, *cells, a["picked"], a["fastest"], f"{a['picked_over_fastest']:.2f}"])
    return [
        markdown_table(
            "method | s/step (median) | time to 90 % per seed | reached | MB to 90 % per seed "
            "| best acc. per seed | final acc. per seed",
            rows,
        ),
        "",
        markdown_table("seed | gs / dense (time to 90 %) | best rival | gs / best rival", ratios),
        "",
        "`gssgd advise --device cpu` against the measured steps (predicted / measured "
        "seconds, error):",
        "",
        markdown_table(
            ["seed", *METHODS, "advise's pick", "measured fastest", "pick / fastest"], advised
        ),
        "",
    ]


def markdown(summary: dict) -> str:
    """Every cell's tables under its title, then the gs recipes' table."""
    md: list[str] = []
    for label, cell in summary["cells"].items():
        md += [f"### {label}, seeds {', '.join(sorted(cell['seeds']))}", "", *_cell_tables(cell)]
    if summary["gs_recipes"]:
        rows = []
        for name, r in summary["gs_recipes"].items():
            accs = ", ".join(f"{step + 1}: {acc:.1%}" for step, _, acc in r["evaluations"])
            clock = r["evaluations"][-1][1] if r["evaluations"] else None
            rows.append(
                f"{name} | {r['seconds_per_step']:.3f} | {_f(clock, '{:.0f} s')} | "
                f"{_f(r['seconds_to_target'], '{:.0f} s')} | {accs}"
            )
        head = (
            "run | s/step (median) | training clock at step 160 | time to 90 % "
            "| accuracy at each evaluation (step: accuracy)"
        )
        md += [
            "### gs alone with another recipe, P = 4, 100 Mbit/s, seed 0",
            "",
            markdown_table(head, rows),
        ]
    return "\n".join(md) + "\n"


def plot(summary: dict, path: Path) -> None:
    """One panel per cell: test accuracy against the training clock, a line per method and
    seed, the 90 % target dotted."""
    cells = list(summary["cells"].items())
    fig, axes = figure(len(cells), figsize=(6 * max(1, len(cells)), 4.2), squeeze=False)
    colours = dict(
        zip(METHODS, ("black", "tab:blue", "tab:orange", "tab:green", "tab:red"), strict=True)
    )
    for ax, (label, cell) in zip(axes[0], cells, strict=True):
        for seed, run in sorted(cell["seeds"].items()):
            for m, r in run["methods"].items():
                xs = [t for _, t, _ in r["evaluations"]]
                ys = [a for _, _, a in r["evaluations"]]
                ax.plot(
                    xs,
                    ys,
                    marker="o",
                    ms=3,
                    lw=1,
                    color=colours[m],
                    label=m if seed == min(cell["seeds"]) else None,
                )
        ax.axhline(0.9, color="grey", ls=":", lw=1)
        ax.set_title(f"wide ResNet, MNIST, {label}")
        ax.set_xlabel("training clock (s)")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0, 1)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    save_png(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("runs/ttt"))
    parser.add_argument("--out", type=Path, default=Path("studies/time_to_accuracy/results"))
    args = parser.parse_args()
    summary = collect(args.dir)
    if not summary["cells"] and not summary["gs_recipes"]:
        raise SystemExit(f"no finished runs under {args.dir}: run studies/time_to_accuracy/run.sh first")
    text = markdown(summary)
    write_summary(args.out, summary, text)
    if summary["cells"]:
        plot(summary, args.out / "ttt.png")
    print(text)


if __name__ == "__main__":
    main()
