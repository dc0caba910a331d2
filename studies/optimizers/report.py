"""Summarise studies/optimizers/run.sh: sparse methods' final test loss against dense's,
by optimizer recipe, on the language models.

    .venv/bin/python studies/optimizers/report.py [RUNS_DIR] [OUT_DIR]

Reads RUNS_DIR/<model>/s<seed>/dense-lr<lr>/ and RUNS_DIR/<model>/s<seed>/d<density>/
<method>-<recipe>/ (their summary.json and metrics.jsonl; default runs/optimizer) and
writes OUT_DIR (default studies/optimizers/results/main): summary.json, summary.md (per model and
density, every method and recipe as its mean final test loss over seeds and its gap to
dense with dense's best learning rate, the targets judged on each method's best recipe
among those run on the most seeds)
and <model>_d<density>.png (test loss against steps and against the busiest worker's
cumulative bytes, the first seed, dense and each method's default recipe where the model
has one (PLOTTED), else its best).

A run that did not complete (a collapsed sketch the guard stopped, a divergence) counts
as missing the target; its status is in the table.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for studies._lib
from studies._lib.report import (  # noqa: E402
    Run,
    busier_totals,
    figure,
    group,
    markdown_table,
    read_runs,
    save_png,
    write_summary,
)

#: The issue's targets: the largest gap to dense's loss, by density.
TARGETS = {"0.01": 0.03, "0.001": 0.08}
#: Seeds a target is judged on; fewer are marked in the table.
SEEDS = 3
#: The recipe each model's plots show (the default one); other models: each method's best.
PLOTTED = {"lstm": "dgc-lr1.6", "lstm-adamw": "frozen-lr0.01"}


def _read(run: Run, model_dir: Path) -> dict[str, Any]:
    """A run of ``model_dir/s<seed>/``: its status, final test loss, seed, test-loss curve
    against the busiest worker's cumulative bytes, and those bytes per step over the run."""
    totals = busier_totals(run.records)
    curve = [
        (r["step"], r["test_loss"], total)
        for r, total in zip(run.records, totals, strict=True)
        if r.get("test_loss") is not None
    ]
    return {
        "status": run.summary["status"],
        "loss": run.summary.get("final_test_loss"),
        "curve": curve,
        "seed": int(run.path.relative_to(model_dir).parts[0].removeprefix("s")),
        "bytes_per_step": (totals[-1] if totals else 0.0) / max(len(totals), 1),
    }


def _collect(root: Path) -> dict[str, Any]:
    """{model: {"dense": {lr: [runs]}, "sparse": {density: {(method, recipe): [runs]}}}}."""
    out: dict[str, Any] = {}
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "logs"):
        dense = group(
            read_runs(model_dir, "s*/dense-lr*"), lambda r: r.name.removeprefix("dense-lr")
        )
        sparse: dict[str, dict[tuple[str, ...], list[dict[str, Any]]]] = {}
        for run in read_runs(model_dir, "s*/d*/*"):  # s<seed>/d<density>/<method>-<recipe>
            cell = sparse.setdefault(run.path.parent.name.removeprefix("d"), {})
            cell.setdefault(tuple(run.name.split("-", 1)), []).append(_read(run, model_dir))
        out[model_dir.name] = {
            "dense": {lr: [_read(r, model_dir) for r in runs] for lr, runs in dense.items()},
            "sparse": sparse,
        }
    return out


def _mean_loss(runs: list[dict[str, Any]]) -> float | None:
    """Mean final loss over seeds, None if any run did not complete."""
    if any(r["status"] != "completed" or r["loss"] is None for r in runs):
        return None
    return statistics.fmean(r["loss"] for r in runs)


def _paired_gap(runs: list[dict[str, Any]], dense: dict[int, float]) -> float | None:
    """Mean over seeds of ``loss / dense loss of the same seed - 1`` (None: a run did not
    complete, or a seed has no dense run at the reference learning rate)."""
    if _mean_loss(runs) is None or any(r["seed"] not in dense for r in runs):
        return None
    return statistics.fmean(r["loss"] / dense[r["seed"]] - 1 for r in runs)


def _best_lr(runs_by_lr: dict[str, list[dict[str, Any]]], completed: Iterable[str]) -> str:
    """Dense's best lr among the ``completed`` ones, by mean loss over the seeds they all
    ran (each lr's own seeds if they share none): a sweep compares its lrs on the same
    seeds, not one seed's luck against a mean over three."""
    lrs = list(completed)
    shared = set.intersection(*({r["seed"] for r in runs_by_lr[lr]} for lr in lrs))

    def loss(lr: str) -> float:
        runs = [r for r in runs_by_lr[lr] if r["seed"] in shared] or runs_by_lr[lr]
        return statistics.fmean(r["loss"] for r in runs)

    return min(lrs, key=loss)


def _summarise(data: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for model, parts in data.items():
        dense = {lr: _mean_loss(runs) for lr, runs in parts["dense"].items()}
        ok = {lr: v for lr, v in dense.items() if v is not None}
        if not ok:
            continue
        best_lr = _best_lr(parts["dense"], ok)
        ref = ok[best_lr]
        by_seed = {r["seed"]: r["loss"] for r in parts["dense"][best_lr]}
        entry: dict[str, Any] = {
            "dense": {
                "lr": best_lr,
                "loss": ref,
                "sweep": dense,
                "seeds": len(parts["dense"][best_lr]),
                "by_seed": by_seed,
                "bytes_per_step": statistics.fmean(
                    r["bytes_per_step"] for r in parts["dense"][best_lr]
                ),
            },
            "densities": {},
        }
        for density, cells in sorted(parts["sparse"].items(), key=lambda x: -float(x[0])):
            rows: dict[str, Any] = {}
            for (method, recipe), runs in sorted(cells.items()):
                loss = _mean_loss(runs)
                rows.setdefault(method, {})[recipe] = {
                    "loss": loss,
                    "gap": _paired_gap(runs, by_seed),
                    "seeds": len(runs),
                    "status": sorted({r["status"] for r in runs}),
                    "bytes_per_step": statistics.fmean(r["bytes_per_step"] for r in runs),
                }
            target = TARGETS.get(density)
            for recipes in rows.values():
                done = {r: v for r, v in recipes.items() if v["gap"] is not None}
                # among the recipes with the most seeds: a one-seed gap is no match for
                # a mean over three (seeds scatter by about a point here)
                most = max((v["seeds"] for v in done.values()), default=0)
                done = {r: v for r, v in done.items() if v["seeds"] == most}
                best = min(done, key=lambda r: done[r]["gap"]) if done else None
                recipes["_best"] = best
                recipes["_met"] = (
                    None if target is None else (best is not None and done[best]["gap"] <= target)
                )  # None: no target
            entry["densities"][density] = {"target": target, "methods": rows}
        summary[model] = entry
    return summary


def _markdown(summary: dict[str, Any]) -> str:
    out = [
        "# Keep your optimizer: sparse methods' final test loss against dense's",
        "",
        "Made by `studies/optimizers/report.py` from `studies/optimizers/run.sh`'s runs. "
        "Each cell: mean final test loss over the seeds, its gap to dense with dense's "
        "best learning rate (each seed against dense's run of the same seed, averaged), "
        "(seeds; the busiest worker's bytes per step over the whole run, in the busier "
        "direction of its link, dense starts and warm-ups included). A run that did not "
        "complete shows its status.",
        "",
    ]
    for model, entry in summary.items():
        dense = entry["dense"]
        sweep = ", ".join(
            f"lr {lr}: {v:.4f}" if v is not None else f"lr {lr}: failed"
            for lr, v in sorted(dense["sweep"].items(), key=lambda x: float(x[0]))
        )
        out += [
            f"## {model}",
            "",
            f"Dense (sweep, {dense['seeds']} seed(s) at the best): "
            f"{sweep}. Reference: lr {dense['lr']}, loss {dense['loss']:.4f}, "
            f"{dense['bytes_per_step'] / 1e3:,.0f} kB per step.",
            "",
        ]
        for density, cell in entry["densities"].items():
            recipes = sorted({r for m in cell["methods"].values() for r in m if r[0] != "_"})
            target = cell["target"]
            out += [
                f"### density {density} (target: within {target:.0%} of dense)"
                if target is not None
                else f"### density {density}",
                "",
            ]
            rows = []
            for method, row in cell["methods"].items():
                cells = []
                for recipe in recipes:
                    v = row.get(recipe)
                    if v is None:
                        cells.append("")
                    elif v["loss"] is None or v["gap"] is None:
                        cells.append(f"{'/'.join(v['status'])} ({v['seeds']})")
                    else:
                        cells.append(
                            f"{v['loss']:.4f} ({v['gap']:+.1%}, {v['seeds']}; "
                            f"{v['bytes_per_step'] / 1e3:,.0f} kB)"
                        )
                met = "-" if row["_met"] is None else "met" if row["_met"] else "missed"
                seeds = row[row["_best"]]["seeds"] if row["_best"] else 0
                if seeds < SEEDS and row["_met"] is not None:
                    met += f" ({seeds} seed{'s' if seeds > 1 else ''})"
                rows.append([method, *cells, str(row["_best"]), met])
            out += [markdown_table(["method", *recipes, "best", "target"], rows), ""]
    return "\n".join(out) + "\n"


def _plot(data: dict[str, Any], summary: dict[str, Any], out_dir: Path) -> list[Path]:
    """<model>_d<density>.png: test loss against steps and against the busiest worker's
    cumulative bytes; the first seed of dense and of each method's plotted recipe."""
    written = []
    for model, entry in summary.items():
        dense_runs = data[model]["dense"][entry["dense"]["lr"]]
        for density, cell in entry["densities"].items():
            fig, (by_step, by_bytes) = figure(2, figsize=(11, 4))
            curves = [(f"dense (lr {entry['dense']['lr']})", dense_runs[0]["curve"])]
            for method, row in cell["methods"].items():
                recipe = PLOTTED.get(model) if PLOTTED.get(model) in row else row["_best"]
                if recipe is not None:
                    runs = data[model]["sparse"][density][(method, recipe)]
                    curves.append((f"{method} ({recipe})", runs[0]["curve"]))
            for label, curve in curves:
                steps, losses, sent = zip(*curve, strict=True) if curve else ((), (), ())
                by_step.plot(steps, losses, marker="o", label=label)
                by_bytes.plot(sent, losses, marker="o", label=label)
            by_step.set(xlabel="step", ylabel="test loss", title=f"{model}, density {density}")
            by_bytes.set(
                xlabel="bytes (busiest worker, cumulative)", xscale="log", ylabel="test loss"
            )
            by_step.legend(fontsize=8)
            fig.tight_layout()
            written.append(save_png(fig, out_dir / f"{model}_d{density}.png"))
    return written


def main(argv: list[str]) -> None:
    root = Path(argv[1]) if len(argv) > 1 else Path("runs/optimizer")
    out_dir = Path(argv[2]) if len(argv) > 2 else Path("studies/optimizers/results/main")
    data = _collect(root)
    summary = _summarise(data)
    written = write_summary(out_dir, summary, _markdown(summary), indent=2)
    for path in [*written, *_plot(data, summary, out_dir)]:
        print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv)
