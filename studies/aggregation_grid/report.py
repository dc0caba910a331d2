#!/usr/bin/env python3
"""Tables and a plot of the aggregation grid (studies/aggregation_grid/run.sh) for docs/benchmarks.md.

Reads ``<grid>/comm_P<P>_d<d>M_<link>/results.json`` (written by ``gssgd bench comm``; the
grid script keeps each raw run under ``runs/grid/`` and copies its results.json to
``studies/aggregation_grid/results/``) and prints three markdown tables, every figure
taken from one run (one cell):

* gs-SGD's speed-up against every baseline (the other method's time / gs's time);
* each lever's effect: the time of a gs variant relative to gs's default (< 1: faster);
* milliseconds per step and bytes per worker of every method.

It also writes ``--plot`` (default ``<grid>/grid.png``: gs's speed-up against d, one panel
per baseline; sized for the web by studies._lib.report.shrink_png) and, with
``--doc``, splices the tables into that markdown file between ``<!-- BEGIN grid -->`` and
``<!-- END grid -->`` (the prose around them is kept).

Remake the committed tables and plot of docs/benchmarks.md:

    sudo studies/aggregation_grid/run.sh        # measures the cells that have no summary yet
    .venv/bin/python studies/aggregation_grid/report.py --doc docs/benchmarks.md

The summaries in studies/aggregation_grid/results/ are enough; the raw runs under runs/grid/ hold the same
results.json files (``--grid runs/grid --plot studies/aggregation_grid/results/grid.png``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for studies._lib
from studies._lib.report import (  # noqa: E402
    figure,
    fmt_bytes,
    group,
    markdown_table,
    save_png,
    splice_markdown,
)

BASELINES = ["dense", "dense16", "topk", "gtopk", "sketched"]
LEVERS = {
    "gs-backend": "backend (ring) all-reduce of the tables",
    "gs-half": "16-bit tables",
    "gs-small": "a quarter of the columns",
    "gs-estimate": "one round (estimates, no exact round)",
}
CELL = re.compile(r"comm_P(\d+)_d(\d+)M_(\w+)$")


def load(grid: Path) -> list[dict]:
    """One record per cell: P, d (millions), link, load average and the per-method results."""
    cells = []
    for path in sorted(grid.glob("comm_P*_d*M_*/results.json")):
        m = CELL.match(path.parent.name)
        if not m:
            continue
        res = json.loads(path.read_text())
        meta = res.pop("_meta")
        cells.append({"P": int(m[1]), "d": int(m[2]), "link": m[3], "meta": meta, "res": res})
    link_order = {"100mbit": 0, "1gbit": 1, "10gbit": 2, "none": 3}
    return sorted(cells, key=lambda c: (link_order.get(c["link"], 9), c["P"], c["d"]))


def _ms(s: float) -> str:
    return f"{1000 * s:.0f}" if s >= 0.1 else f"{1000 * s:.1f}"


def _cell(c: dict) -> list[str]:
    """A row's first cells: the link, P and d."""
    return [c["link"], str(c["P"]), f"{c['d']}M"]


def speedup_table(cells: list[dict]) -> str:
    """gs's speed-up against each baseline (bold where gs is faster), per cell."""
    rows = []
    for c in cells:
        gs = c["res"]["gs"]["seconds_per_step"]
        ratios = []
        for b in BASELINES:
            r = c["res"][b]["seconds_per_step"] / gs
            ratios.append(f"**{r:.2f}×**" if r > 1 else f"{r:.2f}×")
        load = c["meta"].get("load_average_1min_before")
        rows.append([*_cell(c), *ratios, f"{load:.1f}" if load is not None else "?"])
    return markdown_table(["link", "P", "d", *(f"vs {b}" for b in BASELINES), "load avg"], rows)


def lever_table(cells: list[dict]) -> str:
    """Each lever's time relative to gs's default, per cell, and the fastest gs."""
    rows = []
    for c in cells:
        gs = c["res"]["gs"]["seconds_per_step"]
        rel = {v: c["res"][v]["seconds_per_step"] / gs for v in LEVERS if v in c["res"]}
        best = min(rel, key=rel.get) if rel and min(rel.values()) < 1 else "gs"
        rows.append(
            [*_cell(c), _ms(gs), *(f"{rel[v]:.2f}" if v in rel else "—" for v in LEVERS), best]
        )
    return markdown_table(["link", "P", "d", "gs default (ms)", *LEVERS, "fastest gs"], rows)


def _bytes(result: dict | None, method: str) -> str:
    """A method's bytes per worker per step in one cell (Sketched-SGD's server's too)."""
    if result is None:
        return "—"
    text = fmt_bytes(result["bytes_sent_per_step"])
    if method == "sketched":
        text += f" ({fmt_bytes(result['bytes_sent_max_per_step'])})"
    return text


def time_table(cells: list[dict]) -> str:
    """Milliseconds per step of every method per cell, then bytes per worker per (P, d)."""
    methods = [m for m in [*BASELINES, "gs", *LEVERS] if any(m in c["res"] for c in cells)]
    times = [
        [
            *_cell(c),
            *(_ms(c["res"][m]["seconds_per_step"]) if m in c["res"] else "—" for m in methods),
        ]
        for c in cells
    ]
    # one row per (P, d), its first cell's: the bytes do not depend on the link
    first = [same[0] for same in group(cells, lambda c: (c["P"], c["d"])).values()]
    sizes = [
        [str(c["P"]), f"{c['d']}M", *(_bytes(c["res"].get(m), m) for m in methods)] for c in first
    ]
    return "\n".join(
        [
            markdown_table(["link", "P", "d", *methods], times),
            "",
            "Bytes sent per worker per step (mean over ranks; Sketched-SGD's server in parentheses):",
            "",
            markdown_table(["P", "d", *methods], sizes),
        ]
    )


def plot(cells: list[dict], path: Path) -> None:
    """gs's speed-up against d, one panel per baseline, a line per link and P."""
    fig, axes = figure(len(BASELINES), figsize=(4 * len(BASELINES), 3.6), sharey=True)
    for ax, b in zip(axes, BASELINES, strict=True):
        for link, style in (("100mbit", "-"), ("1gbit", "--")):
            for p, color in ((4, "tab:blue"), (8, "tab:red")):
                pts = [
                    (c["d"], c["res"][b]["seconds_per_step"] / c["res"]["gs"]["seconds_per_step"])
                    for c in cells
                    if c["link"] == link and c["P"] == p
                ]
                if pts:
                    ax.plot(
                        *zip(*pts, strict=True),
                        style,
                        color=color,
                        marker="o",
                        label=f"P={p}, {link}",
                    )
        ax.axhline(1, color="k", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="d (millions)", title=f"gs vs {b}")
    axes[0].set_ylabel("speed-up of gs (>1: gs faster)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", type=Path, default=Path("studies/aggregation_grid/results"))
    ap.add_argument("--plot", type=Path, help="where to write the plot (default: <grid>/grid.png)")
    ap.add_argument("--doc", type=Path, help="markdown file to splice the tables into")
    args = ap.parse_args()
    plot_path = args.plot or args.grid / "grid.png"
    cells = load(args.grid)
    if not cells:
        raise SystemExit(f"no results under {args.grid}: run studies/aggregation_grid/run.sh first")
    md = "\n".join(
        [
            "**gs-SGD's speed-up** (the other method's time / gs's time, same run; > 1: gs is "
            "faster):",
            "",
            speedup_table(cells),
            "",
            "**Levers** (time of the gs variant / gs default's time, same run; < 1: the lever "
            "helps):",
            "",
            lever_table(cells),
            "",
            "**Milliseconds per step** (median over steps of the slowest rank):",
            "",
            time_table(cells),
        ]
    )
    print(md)
    plot(cells, plot_path)
    print(f"\nwrote {plot_path}")
    if args.doc:
        if splice_markdown(args.doc, {"grid": md}):
            raise SystemExit(f"{args.doc} has no <!-- BEGIN grid --> ... <!-- END grid --> markers")
        print(f"spliced the tables into {args.doc}")


if __name__ == "__main__":
    main()
