"""The one-call SGD study's tables, from its summary (``run.py --out``).

    python studies/one_call_sgd/report.py studies/one_call_sgd/summary.json

Prints, per model: dense's learning rate (its best of the sweep); at the short horizon the
final training loss of the hand-built pair and of compressed_sgd (mean over seeds, as a
multiple of dense's mean, and in how many seeds each came within 2x dense's loss of the
same seed); at the long horizon compressed_sgd's alone. Each compressed_sgd cell says
whether it *holds* (mean within 2x dense's loss, PowerSGD within 1.5x) and whether the one
call *warns* at construction for that setting, by the package's own rule
(:func:`gssgd.recipes.one_call_horizon`, :func:`gssgd.recipes.sparse_needs_normalisation`).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from gssgd.recipes import one_call_horizon, sparse, sparse_needs_normalisation  # noqa: E402
from studies.one_call_sgd.run import LEVEL, MODELS, make_model  # noqa: E402

METHODS = ("dense", "topk", "gs", "powersgd")


def _loss(value: float) -> str:
    """A final loss, or "diverged" (a run the hook stopped after non-finite steps)."""
    return f"{value:.3f}" if math.isfinite(value) else "diverged"


def warns(model: str, method: str, steps: int) -> bool:
    """Whether compressed_sgd warns at construction for ``method`` on ``model`` over a run
    of ``steps`` (given as ``total_steps``), by the package's rule."""
    density = LEVEL[method].get("density", 0.01)
    needed = one_call_horizon(method, density)
    return steps < needed or sparse_needs_normalisation(method, make_model(MODELS[model]))


def cells(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Every compressed_sgd setting (model, method, steps): its mean loss ratio to dense,
    the seeds within 2x, whether it holds and whether the one call warns."""
    out = []
    runs = [r for r in summary["runs"] if r.get("role") != "lr sweep"]
    for model in dict.fromkeys(r["model"] for r in runs):
        for steps in summary["settings"]["steps"]:
            mine = [r for r in runs if r["model"] == model and r["steps"] == steps
                    and r["how"] == "compressed_sgd"]
            dense = {r["seed"]: r["final_loss"] for r in mine if r["method"] == "dense"}
            for method in METHODS[1:]:
                seeds = {r["seed"]: r["final_loss"] for r in mine if r["method"] == method}
                ratio = statistics.mean(seeds.values()) / statistics.mean(dense.values())
                limit = 2.0 if sparse(method) else 1.5
                out.append({"model": model, "method": method, "steps": steps, "ratio": ratio,
                            "within": sum(seeds[s] <= limit * dense[s] for s in seeds),
                            "seeds": len(seeds), "holds": ratio <= limit,
                            "warns": warns(model, method, steps)})
    return out


def _short_table(summary: dict[str, Any], model: str, steps: int) -> list[str]:
    runs = [r for r in summary["runs"] if r.get("role") != "lr sweep"
            and r["model"] == model and r["steps"] == steps]
    dense = {r["seed"]: r["final_loss"] for r in runs
             if r["method"] == "dense" and r["how"] == "hand-built"}
    dense_mean = statistics.mean(dense.values())
    out = [f"{steps} steps:", "",
           "| method | by hand (optimizer momentum) | within 2x | compressed_sgd | "
           "momentum in | within 2x | one call warns |", "|---|---|---|---|---|---|---|"]
    for method in METHODS:
        row = [method]
        for how in ("hand-built", "compressed_sgd"):
            by_seed = {r["seed"]: r for r in runs if r["method"] == method and r["how"] == how}
            mean = statistics.mean(r["final_loss"] for r in by_seed.values())
            within = sum(r["final_loss"] <= 2 * dense[s] for s, r in by_seed.items())
            row.append(f"{mean:.3f} ({mean / dense_mean:.2f}x)")
            if how == "compressed_sgd":
                row.append(next(iter(by_seed.values()))["placement"])
            row.append(f"{within}/{len(by_seed)}")
        row.append("-" if method == "dense" else "yes" if warns(model, method, steps) else "no")
        out.append("| " + " | ".join(row) + " |")
    return out


def _long_table(summary: dict[str, Any], model: str, steps: int) -> list[str]:
    out = [f"{steps} steps, compressed_sgd:", "",
           "| method | final loss (x dense) | seeds within 2x (PowerSGD 1.5x) | holds | "
           "one call warns |", "|---|---|---|---|---|"]
    for cell in cells(summary):
        if cell["model"] == model and cell["steps"] == steps:
            out.append(f"| {cell['method']} | {cell['ratio']:.2f}x | {cell['within']}/"
                       f"{cell['seeds']} | {'yes' if cell['holds'] else 'no'} | "
                       f"{'yes' if cell['warns'] else 'no'} |")
    return out


def table(summary: dict[str, Any]) -> str:
    """The markdown tables of every model in ``summary``, and the verdict."""
    runs = [r for r in summary["runs"] if r.get("role") != "lr sweep"]
    short, *longer = summary["settings"]["steps"]
    out = []
    for model in dict.fromkeys(r["model"] for r in runs):
        sweep = {r["lr"]: r["final_loss"] for r in summary["runs"]
                 if r.get("role") == "lr sweep" and r["model"] == model}
        lr = next(r["lr"] for r in runs if r["model"] == model)
        seeds = len({r["seed"] for r in runs if r["model"] == model})
        out += [f"**{model}** CNN: dense's lr sweep (seed 0) "
                + ", ".join(f"{lr_:g}: {_loss(loss)}" for lr_, loss in sweep.items())
                + f"; every run at lr {lr:g}, momentum 0.9, {seeds} seeds.", ""]
        out += _short_table(summary, model, short) + [""]
        for steps in longer:
            out += _long_table(summary, model, steps) + [""]
    every = cells(summary)
    fails = [c for c in every if not c["holds"] and not c["warns"]]
    out.append(f"Every compressed_sgd setting holds or is warned: "
               f"{'yes' if not fails else 'no'} ({sum(c['holds'] for c in every)} of "
               f"{len(every)} hold, {sum(c['warns'] for c in every)} warned"
               + "".join(f"; {c['model']} {c['method']} {c['steps']} steps neither"
                         for c in fails) + ").")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("summary", type=Path)
    args = p.parse_args(argv)
    print(table(json.loads(args.summary.read_text())), end="")


if __name__ == "__main__":
    main()
