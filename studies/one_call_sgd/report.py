"""The one-call SGD study's table, from its summary (``run.py --out``).

    python studies/one_call_sgd/report.py studies/one_call_sgd/summary.json

Prints, per model: dense's learning rate (its best of the sweep), then per method the
final training loss of the hand-built pair and of compressed_sgd (mean over seeds, as a
multiple of dense's mean, and in how many seeds each came within 2x dense's loss of the
same seed).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

METHODS = ("dense", "topk", "gs", "powersgd")


def _loss(value: float) -> str:
    """A final loss, or "diverged" (a run the hook stopped after non-finite steps)."""
    return f"{value:.3f}" if math.isfinite(value) else "diverged"


def table(summary: dict[str, Any]) -> str:
    """The markdown tables of every model in ``summary``."""
    runs = [r for r in summary["runs"] if r.get("role") != "lr sweep"]
    out = []
    for model in dict.fromkeys(r["model"] for r in runs):
        mine = [r for r in runs if r["model"] == model]
        sweep = {r["lr"]: r["final_loss"] for r in summary["runs"]
                 if r.get("role") == "lr sweep" and r["model"] == model}
        lr = mine[0]["lr"]
        dense = {r["seed"]: r["final_loss"] for r in mine
                 if r["method"] == "dense" and r["how"] == "hand-built"}
        dense_mean = statistics.mean(dense.values())
        out += [f"**{model}** CNN: dense's lr sweep (seed 0) "
                + ", ".join(f"{lr_:g}: {_loss(loss)}" for lr_, loss in sweep.items())
                + f"; every run at lr {lr:g}, momentum 0.9, {len(dense)} seeds.", "",
                "| method | by hand (optimizer momentum) | within 2x | compressed_sgd | "
                "momentum in | within 2x |", "|---|---|---|---|---|---|"]
        for method in METHODS:
            cells = [method]
            for how in ("hand-built", "compressed_sgd"):
                by_seed = {r["seed"]: r for r in mine
                           if r["method"] == method and r["how"] == how}
                mean = statistics.mean(r["final_loss"] for r in by_seed.values())
                within = sum(r["final_loss"] <= 2 * dense[s] for s, r in by_seed.items())
                cells.append(f"{mean:.3f} ({mean / dense_mean:.2f}x)")
                if how == "compressed_sgd":
                    cells.append(next(iter(by_seed.values()))["placement"])
                cells.append(f"{within}/{len(by_seed)}")
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("summary", type=Path)
    args = p.parse_args(argv)
    print(table(json.loads(args.summary.read_text())), end="")


if __name__ == "__main__":
    main()
