"""Remake the cost model's held-out check record and its win map (docs/benchmarks.md,
"Where each method wins on a GPU cluster").

Usage (from the repository root; about a minute):

    .venv/bin/python studies/cost_map/report.py [--out studies/cost_map/results]

Writes to ``--out``:

* ``check.json``: every point of the held-out check (by run: each run predicted by the fit
  on the others) over the runs the stored fit (``gssgd/costmodel/data/fit.json``,
  ``gssgd advise --calibrate``, which also holds the checks by worker count and by size)
  was made from: its measured and predicted step; the summary and each method's; the
  recommendation per run;
* ``predictions.json``: ``gssgd advise``'s every candidate (PowerSGD at ranks 1, 2 and 4
  on the layer shapes, local steps) for ResNet-50 (resnet shapes, its measured H200
  forward + backward), GPT-2 124M and a 1.3B transformer on H200s, P = 8..1024,
  1/10/25/100 Gbit/s links with 20 us latency, density 0.001: its step, its time to the
  target and its evidence (an index into ``evidence_texts``, each text stored once);
* ``win_map.md`` (the tables) and ``win_map.png`` (the plot).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for studies._lib
from gssgd.costmodel import store  # noqa: E402
from gssgd.costmodel.advice import advise  # noqa: E402
from gssgd.costmodel.architectures import architecture_of, family_of, layer_shapes  # noqa: E402
from gssgd.costmodel.cluster import Link, StepTime  # noqa: E402
from gssgd.costmodel.devices import device_record, get_device  # noqa: E402
from gssgd.costmodel.fit import (  # noqa: E402
    ADVISE_EXCLUDES,
    error_summary,
    held_out_errors,
    load_measurements,
    rated,
    recommendation_check,
    rounded,
)
from studies._lib.report import figure, markdown_table, save_png  # noqa: E402

#: The models of the map: name -> (parameters, architecture, fwd+bwd seconds or None).
MODELS: dict[str, tuple[int, str, float | None]] = {
    "ResNet-50 (25.6M)": (25_557_032, "resnet",
                          device_record("h200")["fwdbwd_s_per_param"] * 25_557_032),
    "GPT-2 (124M)": (124_439_808, "transformer", None),
    "1.3B": (1_300_000_000, "transformer", None),
}
WORKERS = (8, 16, 32, 64, 128, 256, 512, 1024)
RATES = {"1gbit": 10**9, "10gbit": 10**10, "25gbit": 25 * 10**9, "100gbit": 10**11}
LATENCY_S = 20e-6
DENSITY = 0.001


def run_check(out: Path) -> dict:
    runs = [Path(r) for r in store.load("fit.json")["runs"]]
    rows = held_out_errors(rated(m for r in runs for m in load_measurements(r)))
    recs = recommendation_check(rows)
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
            {"run": r.measurement.source, "method": r.measurement.spec.name,
             "workers": r.measurement.world_size, "d": r.measurement.spec.d,
             "link_bps": r.measurement.rate_bps, "measured": r.measurement.seconds_per_step,
             "predicted": r.predicted, "rel_error": r.rel_error}
            for r in rows
        ],
    }
    (out / "check.json").write_text(json.dumps(rounded(record), indent=1) + "\n")
    print(
        f"held out: n = {summary['n']}, median {summary['median_abs_rel_error']:.1%}, "
        f"max {summary['max_abs_rel_error']:.1%}; recommended within 10 %: "
        f"{record['recommended_within_10pct']} of {len(recs)} runs"
    )
    for r in recs:
        if not r.within():
            print(f"  miss: {r.run}: ranked {r.recommended} first, {r.ratio:.2f}x {r.fastest}")
    return record


def run_map(out: Path) -> dict:
    device = get_device("h200")
    preds: dict = {}
    texts: dict[str, int] = {}  # each evidence text once (it repeats across links and cells)
    for model, (params, arch, fwdbwd) in MODELS.items():
        shapes = layer_shapes(arch, params)
        for rate_name, rate in RATES.items():
            for p in WORKERS:
                a = advise(params=params, workers=p, link=Link(rate, LATENCY_S), device=device,
                           density=DENSITY, fwdbwd_s=fwdbwd, shapes=shapes,
                           family=family_of(arch), architecture=architecture_of(arch))
                n = a.run_steps
                dense = next(c for c in a.candidates if c.name == "dense")
                measured = a.best_measured
                preds.setdefault(model, {}).setdefault(rate_name, {})[str(p)] = {
                    "winner": a.recommended.name,
                    "why": a.why,
                    "best_measured": None if measured is None else measured.name,
                    "fastest_step": a.fastest_step.name,
                    "run_steps": n,
                    "speedup_over_dense": _ratio(
                        dense.target_seconds(n), a.recommended.target_seconds(n)
                    ),
                    "methods": {
                        c.name: {**_split(c.step), "to_target": _sig(c.target_seconds(n)),
                                 "evidence": texts.setdefault(c.evidence.describe(), len(texts)),
                                 "quality_measured": c.evidence.measured,
                                 "eligible": c.eligible, "margin": _sig(c.margin)}
                        for c in a.candidates
                    },
                }
    record = {"evidence_texts": list(texts), "predictions": preds}
    (out / "predictions.json").write_text(json.dumps(record, separators=(",", ":")) + "\n")
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


def _best_gs(cell: dict) -> tuple[str, float] | None:
    """The gs variant fastest to the target (None where none was measured reaching it)."""
    gs = {n: m["to_target"] for n, m in cell["methods"].items()
          if n.startswith("gs") and m["eligible"]}
    if not gs:
        return None
    name = min(gs, key=gs.__getitem__)
    return name, gs[name]


def win_tables(preds: dict) -> str:
    """Markdown: per model, the winner (its speedup over dense) at each rate and P, marked
    † where its steps to the target were not measured (then the fastest measured one
    follows), and the best gs variant's time to the target over the winner's."""
    lines = [
        f"H200 workers, links with {LATENCY_S * 1e6:g} us latency, density {DENSITY}; cell: "
        "`gssgd advise`'s recommendation (among the methods one study measured reaching the "
        "target: predicted step times its measured steps, picked over dense or dense16 only "
        "beyond its margin) and dense's time over its; ≈ the simpler method within the "
        "model's error of a faster one; [the fastest step, where no study measured its "
        "quality]; / the best gs variant's time over the winner's (none where no gs variant "
        "was measured reaching the target).",
        "",
    ]
    for model, by_rate in preds.items():
        rows = []
        for rate_name, by_p in by_rate.items():
            cells = []
            for p in WORKERS:
                cell = by_p[str(p)]
                win = cell["methods"][cell["winner"]]["to_target"]
                gs = _best_gs(cell)
                text = f"{cell['winner']} ({cell['speedup_over_dense']:.1f}x)"
                if cell["why"].startswith("within the model's error"):
                    text += " ≈"
                fastest = cell["methods"][cell["fastest_step"]]
                if not fastest["eligible"] and not fastest["quality_measured"]:
                    text += f" [{cell['fastest_step']}]"
                cells.append(text + ("" if gs is None else f" / {gs[1] / win:.2f}"))
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
        "Fastest to the target (predicted step x one study's measured steps; H200, 20 us "
        "links, density 0.001); cell: speedup over dense",
        fontsize=10,
    )
    fig.subplots_adjust(bottom=0.24, top=0.84, wspace=0.3)
    save_png(fig, path)


def _rect(x: float, y: float, colour: str):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), 1, 1, facecolor=colour, edgecolor="white")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("studies/cost_map/results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    run_check(args.out)
    run_map(args.out)
    print(f"wrote {args.out}/check.json, predictions.json, win_map.md, win_map.png")


if __name__ == "__main__":
    main()
