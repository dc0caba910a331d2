"""The new user's AdamW script, measured: examples/adamw_ddp.py on 2 gloo processes.

Runs dense AdamW (DDP's all-reduce) and compressed_adamw at each setting of GRID, for each
seed, then writes OUT/summary.json and OUT/summary.md: the final training loss (the whole
60,000-image training set) as mean, lowest and highest over seeds, its gap to dense AdamW's
mean, and the bytes rank 0 sent over the run (warm-up included).

    .venv/bin/python studies/adamw_user/run.py                       # 300 steps, 3 seeds
    .venv/bin/python studies/adamw_user/run.py --steps 1500 --seeds 0 --out studies/adamw_user/results-1500

Raw runs go to runs/adamw-user (git-ignored); a run whose JSON exists is not run again.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: (method, density, freeze_step as a fraction of the run); dense has neither.
GRID = [
    ("dense", None, None),
    ("gs", 0.01, 0.1), ("topk", 0.01, 0.1),
    ("gs", 0.1, 0.1), ("topk", 0.1, 0.1),
    ("gs", 0.1, 1 / 3), ("topk", 0.1, 1 / 3),
]


def name_of(method: str, density: float | None, freeze: int | None) -> str:
    return "dense" if density is None else f"{method}-d{density}-f{freeze}"


def run_one(method: str, density: float | None, freeze: int | None, steps: int, seed: int,
            raw: Path) -> dict:
    out = raw / f"s{seed}" / f"{name_of(method, density, freeze)}.json"
    if not out.exists():
        cmd = [str(ROOT / ".venv/bin/torchrun"), "--nproc_per_node", "2",
               str(ROOT / "examples/adamw_ddp.py"), "--method", method, "--steps", str(steps),
               "--seed", str(seed), "--out", str(out)]
        if density is not None:
            cmd += ["--density", str(density), "--freeze-step", str(freeze)]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default=str(ROOT / "studies/adamw_user/results"))
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    raw = ROOT / "runs" / f"adamw-user-{args.steps}"
    rows = {}
    for method, density, fraction in GRID:
        freeze = None if fraction is None else max(1, round(fraction * args.steps))
        runs = [run_one(method, density, freeze, args.steps, s, raw) for s in seeds]
        losses = [r["train_loss"] for r in runs]
        rows[name_of(method, density, freeze)] = {
            "method": method, "density": density, "freeze_step": freeze,
            "train_loss": statistics.mean(losses), "lowest": min(losses),
            "highest": max(losses), "by_seed": dict(zip(map(str, seeds), losses, strict=True)),
            "bytes_sent": statistics.mean(r["bytes_sent"] for r in runs),
        }
    dense = rows["dense"]["train_loss"]
    for row in rows.values():
        row["gap"] = row["train_loss"] / dense - 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python studies/adamw_user/run.py " + " ".join(sys.argv[1:])
    summary = {"command": command.strip(), "steps": args.steps, "seeds": seeds, "rows": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    text = markdown(summary)
    (out / "summary.md").write_text(text)
    print(text, end="")


def markdown(summary: dict) -> str:
    """summary.md: the command, the setting and one table row per run of ``summary``."""
    lines = [f"`{summary['command']}`: MNIST, an MLP of 76,330 parameters, 2 gloo processes, "
             f"32 samples a worker, AdamW lr 0.001, weight decay 0.01, {summary['steps']} steps, "
             f"seeds {', '.join(map(str, summary['seeds']))}.", "",
             "| run | density | dense steps | train loss (mean; lowest-highest) | vs dense | "
             "bytes rank 0 sent |", "|---|---|---|---|---|---|"]
    for name, r in summary["rows"].items():
        dense_bytes = "DDP's all-reduce" if r["density"] is None else f"{r['bytes_sent']:,.0f}"
        lines.append(
            f"| {name} | {r['density'] or '-'} | {r['freeze_step'] or '-'} | "
            f"{r['train_loss']:.4f} ({r['lowest']:.4f}-{r['highest']:.4f}) | "
            f"{r['gap']:+.1%} | {dense_bytes} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
