"""Remake the cluster cost model's held-out check and its win map (docs/benchmarks.md,
"Where each method wins on a GPU cluster").

Usage (from the repository root; about 1-2 minutes):

    .venv/bin/python scripts/cost_map.py [--out docs/results/cost_cluster]

Writes to ``--out``:

* ``check.json``: the leave-one-run-out check of :mod:`gssgd.costmodel.check` over the
  ``gssgd bench comm`` runs made with the current default sketch (docs/results/grid and
  docs/results/comm_*_default): every point's measured and predicted step, the summary, the
  recommendation per run, and the model fitted on all runs;
* ``predictions.json``: every method's predicted step (compute, communication, hidden) and
  time to dense's accuracy (:mod:`gssgd.costmodel.reach`) for ResNet-50, GPT-2 124M and a
  1.3B model on H200s, P = 8..1024, 1/10/25/100 Gbit/s links with 20 us latency, density
  0.001;
* ``win_map.md`` (the tables) and ``win_map.png`` (the plot).

The check's summary is what ``gssgd advise`` prints as the model's error
(:data:`gssgd.costmodel.advice.MEASURED_ERROR`); update it there when this changes (a test
recomputes it from the runs, :func:`gssgd.costmodel.check.measured_error`, and fails until
it is).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lib.report import figure, markdown_table, save_png  # this script's folder, scripts/

from gssgd.costmodel.advice import advise
from gssgd.costmodel.anchors import H200_ANCHOR
from gssgd.costmodel.check import (
    ADVISE_EXCLUDES,
    check_runs,
    fit_cells,
    held_out_errors,
    recommendation_check,
)
from gssgd.costmodel.cluster import Link, StepTime
from gssgd.costmodel.devices import get_device
from gssgd.costmodel.fit import error_summary, load_measurements

RESULTS = Path("docs/results")
#: The models of the map: name -> (parameters, measured fwd+bwd seconds or None: estimated).
MODELS: dict[str, tuple[int, float | None]] = {
    "ResNet-50 (25.6M)": (25_557_032, H200_ANCHOR["resnet50_b64_fp32_fwdbwd_ms"] * 1e-3),
    "GPT-2 (124M)": (124_439_808, None),
    "1.3B": (1_300_000_000, None),
}
WORKERS = (8, 16, 32, 64, 128, 256, 512, 1024)
RATES = {"1gbit": 10**9, "10gbit": 10**10, "25gbit": 25 * 10**9, "100gbit": 10**11}
LATENCY_S = 20e-6
DENSITY = 0.001


def run_check(out: Path) -> dict:
    runs = check_runs(RESULTS)
    ms = [m for r in runs for m in load_measurements(r)]
    rows = held_out_errors(ms)
    recs = recommendation_check(rows)
    fitted = fit_cells(ms)
    summary = error_summary(rows)
    advised = [r for r in rows if r.measurement.spec.name not in ADVISE_EXCLUDES]
    record = {
        "what": "leave one run out: each run predicted by the model fitted on the others",
        "runs": [str(r) for r in runs],
        "summary": summary,
        "summary_advise_methods": error_summary(advised),
        "recommended_within_10pct": sum(r.within() for r in recs),
        "recommendations": [
            {**vars(r), "ratio": r.ratio, "within_10pct": r.within()} for r in recs
        ],
        "points": [
            {
                "run": r.measurement.source,
                "method": r.measurement.spec.name,
                "workers": r.measurement.world_size,
                "d": r.measurement.spec.d,
                "link_bps": r.measurement.rate_bps,
                "measured": r.measurement.seconds_per_step,
                "predicted": r.predicted,
                "rel_error": r.rel_error,
            }
            for r in rows
        ],
        "fitted_on_all": {
            "alpha": fitted.base.alpha,
            "beta0": fitted.base.beta0,
            "gamma": fitted.base.gamma,
            "efficiency": fitted.efficiency,
            "burst_credit": fitted.burst_credit,
            "driven_alpha": fitted.driven_alpha,
            "compute_laws": {
                name: {"gamma_at_1M": law.gamma, "slope": law.slope}
                for name, law in fitted.compute.items()
            },
        },
    }
    (out / "check.json").write_text(json.dumps(record, indent=1) + "\n")
    print(
        f"held out: n = {summary['n']}, median {summary['median_abs_rel_error']:.1%}, "
        f"max {summary['max_abs_rel_error']:.1%}; recommended within 10 %: "
        f"{record['recommended_within_10pct']} of {len(recs)} runs"
    )
    for r in recs:
        if not r.within():
            print(f"  miss: {r.run}: ranked {r.recommended} first, {r.ratio:.2f}x {r.fastest}")
    print(
        f"fitted on all: efficiency {fitted.efficiency}, burst credit {fitted.burst_credit}, "
        f"driven round {(fitted.driven_alpha or 0.0) * 1e3:.2f} ms"
    )
    return record


def run_map(out: Path) -> dict:
    device = get_device("h200")
    preds: dict = {}
    for model, (params, fwdbwd) in MODELS.items():
        for rate_name, rate in RATES.items():
            for p in WORKERS:
                a = advise(
                    params=params,
                    workers=p,
                    link=Link(rate, LATENCY_S),
                    device=device,
                    density=DENSITY,
                    fwdbwd_s=fwdbwd,
                )
                n = a.run_steps
                dense = next(c for c in a.candidates if c.name == "dense")
                preds.setdefault(model, {}).setdefault(rate_name, {})[str(p)] = {
                    "winner": a.recommended.name,
                    "fastest_step": a.fastest_step.name,
                    "run_steps": n,
                    "speedup_over_dense": _ratio(
                        dense.target_seconds(n), a.recommended.target_seconds(n)
                    ),
                    "methods": {
                        c.name: {
                            **_split(c.step),
                            "to_target": _sig(c.target_seconds(n)),
                            "reached": None if c.reach is None else c.reach.reached,
                        }
                        for c in a.candidates
                    },
                }
    (out / "predictions.json").write_text(json.dumps(preds, separators=(",", ":")) + "\n")
    (out / "win_map.md").write_text(win_tables(preds))
    plot(preds, out / "win_map.png")
    return preds


def _split(step: StepTime) -> dict[str, float | None]:
    """A step's total and its parts, in seconds to 4 significant digits."""
    parts = ("total", "fwdbwd", "compression", "communication", "hidden")
    return {k: _sig(getattr(step, k)) for k in parts}


def _sig(value: float | None) -> float | None:
    """``value`` to 4 significant digits (None stays None)."""
    return None if value is None else float(f"{value:.4g}")


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def _best_gs(cell: dict) -> tuple[str, float]:
    """The gs variant fastest to dense's accuracy, of those measured to reach it."""
    gs = {
        n: m["to_target"]
        for n, m in cell["methods"].items()
        if n.startswith("gs") and m["to_target"] is not None
    }
    name = min(gs, key=gs.__getitem__)
    return name, gs[name]


def win_tables(preds: dict) -> str:
    """Markdown: per model, the winner (and its speedup over dense) at each rate and P, and
    the best gs variant's step over the winner's."""
    lines = [
        f"H200 workers, links with {LATENCY_S * 1e6:g} us latency, density {DENSITY}; cell: the "
        "method fastest to dense's accuracy (`gssgd advise`'s recommendation: predicted step "
        "times the steps to dense's accuracy the frontier study measured; dense's time over "
        "its in brackets) / the best gs variant's time to that accuracy over the winner's; "
        "a * when the fastest step was another method's (gTop-k's: measured short of dense).",
        "",
    ]
    for model, by_rate in preds.items():
        rows = []
        for rate_name, by_p in by_rate.items():
            cells = []
            for p in WORKERS:
                cell = by_p[str(p)]
                win = cell["methods"][cell["winner"]]["to_target"]
                _, gs = _best_gs(cell)
                star = "*" if cell["fastest_step"] != cell["winner"] else ""
                cells.append(
                    f"{cell['winner']}{star} ({cell['speedup_over_dense']:.1f}x) / {gs / win:.2f}"
                )
            rows.append([rate_name, *cells])
        head = ["link", *(f"P = {p}" for p in WORKERS)]
        lines += [f"**{model}**", "", markdown_table(head, rows), ""]
    return "\n".join(lines)


def plot(preds: dict, path: Path) -> None:
    """One panel per model: P across, link rate up, each cell coloured by its winner."""
    winners = sorted({c["winner"] for m in preds.values() for r in m.values() for c in r.values()})
    palette = [
        "#4c72b0",
        "#dd8452",
        "#55a868",
        "#c44e52",
        "#8172b3",
        "#937860",
        "#da8bc3",
        "#8c8c8c",
        "#ccb974",
        "#64b5cd",
    ]
    colour = {w: palette[i % len(palette)] for i, w in enumerate(winners)}
    fig, axes = figure(len(preds), figsize=(4.2 * len(preds), 3.4), squeeze=False)
    for ax, (model, by_rate) in zip(axes[0], preds.items(), strict=True):
        for y, by_p in enumerate(by_rate.values()):
            for x, p in enumerate(WORKERS):
                cell = by_p[str(p)]
                ax.add_patch(_rect(x, y, colour[cell["winner"]]))
                ax.text(
                    x + 0.5,
                    y + 0.5,
                    f"{cell['speedup_over_dense']:.1f}x",
                    ha="center",
                    va="center",
                    fontsize=7,
                )
        ax.set_xlim(0, len(WORKERS))
        ax.set_ylim(0, len(by_rate))
        ax.set_xticks([x + 0.5 for x in range(len(WORKERS))], [str(p) for p in WORKERS], fontsize=7)
        ax.set_yticks([y + 0.5 for y in range(len(by_rate))], list(by_rate), fontsize=8)
        ax.set_xlabel("workers P")
        ax.set_title(model, fontsize=10)
    handles = [_rect(0, 0, colour[w]) for w in winners]
    fig.legend(
        handles,
        winners,
        loc="lower center",
        ncol=len(winners),
        fontsize=8,
        bbox_to_anchor=(0.5, 0.0),
    )
    fig.suptitle(
        "Fastest to dense's accuracy (predicted step x measured steps; H200, 20 us links, "
        "density 0.001); cell: speedup over dense",
        fontsize=10,
    )
    fig.subplots_adjust(bottom=0.24, top=0.84, wspace=0.3)
    save_png(fig, path)


def _rect(x: float, y: float, colour: str):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), 1, 1, facecolor=colour, edgecolor="white")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "cost_cluster")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    run_check(args.out)
    run_map(args.out)
    print(f"wrote {args.out}/check.json, predictions.json, win_map.md, win_map.png")


if __name__ == "__main__":
    main()
