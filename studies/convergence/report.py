#!/usr/bin/env python3
"""Tables and plots of the convergence study (studies/convergence/run.sh, docs/study.md).

Reads the raw runs, kept out of git under ``runs/study/`` (``--raw``): every run's
``runs/<name>/`` (summary.json, metrics.jsonl, config.json), its log ``logs/<name>.log`` and
``logs/status.tsv``; and writes the summaries that are committed (``--out``, default
``studies/convergence/results``):

* ``OUT/results.json``          one record per run (the numbers the tables show);
* ``OUT/*.png``                 the plots (matplotlib, Agg; sized for the web by
                                ``studies._lib.report.shrink_png``);
* ``docs/study.md``             the tables, one per part, spliced into it between
                                ``<!-- BEGIN name -->`` / ``<!-- END name -->`` markers
                                (the prose around them is kept); without that page
                                (``--doc``), ``OUT/tables.md`` instead.

Remake everything docs/study.md shows:

    studies/convergence/run.sh                  # the runs missing under runs/study/
    .venv/bin/python studies/convergence/report.py --clean-checkpoints

    .venv/bin/python studies/convergence/report.py [--raw runs/study] [--out studies/convergence/results]
                                             [--doc docs/study.md] [--clean-checkpoints]

Run names (set by the shell script): ``A-common-<method>-<density>``, ``A-common-dense``,
``A-local-<method>-<density>``, ``A-published-<method>-0.001``, ``B-p8-dense``,
``B-p8-<method>-<density>``, ``C-lr-dense-<lr>``, ``C-<method>-<density>``,
``D-gs-r<rows>-c<cols>-m<m>``, ``E-p8-dense``, ``E-p8-<method>-0.001``. A method named
``gs5row`` / ``sketched5row`` in a run name: that method with the sketch default of the study's first
pass (5 rows; see OLD_DEFAULT_RUNS).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for studies._lib
from gssgd.aggregators.sketching import DEFAULT_ROWS, default_candidates, default_sketch_cols  # noqa: E402
from gssgd.costmodel import MethodSpec, traffic  # noqa: E402
from gssgd.train.config import TrainConfig  # noqa: E402
from gssgd.train.method_settings import OPTION_FLAGS  # noqa: E402
from studies._lib.report import (  # noqa: E402
    Run,
    figure,
    markdown_table,
    read_runs,
    save_png,
    seed_band,
    splice_markdown,
)

METHODS = ["dense", "topk", "gtopk", "sketched", "gs"]
COLORS = {"dense": "k", "topk": "tab:blue", "gtopk": "tab:green", "sketched": "tab:orange",
          "gs": "tab:red"}  # fmt: skip
GROW = "growing the sketch"

# The team's earlier baseline (straightforward implementation, 800 steps, P = 4,
# optimizer momentum), MNIST CNN: final test accuracy in %, None = diverged.
BASELINE = {
    ("dense", None): 98.4,
    ("topk", "0.01"): 98.1, ("topk", "0.001"): 97.2,
    ("gtopk", "0.01"): 98.1, ("gtopk", "0.001"): 94.2,
    ("sketched", "0.01"): 97.6, ("sketched", "0.001"): None,
    ("gs", "0.01"): 98.3, ("gs", "0.001"): None,
}  # fmt: skip


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _method(name: str | None) -> str | None:
    """The method as the tables show it: the dense reference is DDP's built-in all-reduce,
    ``ddp-allreduce`` (recorded as ``dense`` by runs made before the method names were split)."""
    return "dense" if name == "ddp-allreduce" else name


#: What a run's record copies from its config and from its summary.
CONFIG_KEYS = ("density", "rows", "cols", "candidates", "table_dtype", "exact", "allreduce", "lr",
               "momentum", "local_momentum", "batch_size", "seed")  # fmt: skip
SUMMARY_KEYS = ("steps", "final_test_accuracy", "final_test_loss", "final_train_loss",
                "bytes_sent_per_step", "bytes_sent_max_per_step", "seconds_wall")  # fmt: skip


def load_run(run: Run, logs: Path) -> dict[str, Any]:
    """One run's numbers: its summary, config (summary.json's, updated by config.json),
    metrics and the collapse guard's lines of its log ``logs/<name>.log``."""
    s, lines = run.summary, run.records
    cfg = s.get("config") or {}
    cfg_path = run.path / "config.json"
    if cfg_path.exists():
        cfg = {**cfg, **json.loads(cfg_path.read_text())}
    saved = TrainConfig.from_saved(cfg)  # an earlier version's too
    name = run.name
    log_path = logs / f"{name}.log"
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    grows = [ln.strip() for ln in log.splitlines() if GROW in ln]
    start = int(s.get("measured_from_step") or 0)
    measured = [r for r in lines if r["step"] >= start]

    comp = [
        (r.get("seconds_compress") or 0) + (r.get("seconds_decompress") or 0)
        for r in measured
        if _finite(r.get("seconds_compress"))
    ]
    fracs = [r["delivered_fraction"] for r in lines if _finite(r.get("delivered_fraction"))]
    evals = [
        (r["step"] + 1, r.get("test_accuracy"), r.get("test_loss"))
        for r in lines
        if r.get("test_loss") is not None
    ]
    # The sketch width can change (guard growth); the typical bytes of a step show it.
    byte_levels = sorted({round(r["bytes_sent"]) for r in measured if _finite(r.get("bytes_sent"))})
    spp = s.get("seconds_per_step")
    comm = s.get("seconds_communicate_per_step")
    return {
        "name": name,
        "status": s.get("status"),
        "message": s.get("message"),
        "method": _method(s.get("method") or cfg.get("method")),
        "dataset": s.get("dataset"),
        "workers": s.get("world_size"),
        "d": s.get("d"),
        "k": next((r.get("k") for r in reversed(lines) if r.get("k")), None),
        **{key: saved.option(OPTION_FLAGS[key]) if key in OPTION_FLAGS else getattr(saved, key)
           for key in CONFIG_KEYS},
        **{key: s.get(key) for key in SUMMARY_KEYS},
        "seconds_per_step": spp,
        "seconds_communicate_per_step": comm,
        "seconds_other_per_step": (spp - comm) if _finite(spp) and _finite(comm) else None,
        "seconds_compress_decompress_per_step": (sum(comp) / len(comp)) if comp else None,
        "guard_grows": len(grows),
        "guard_messages": grows,
        "final_cols": (
            int(re.findall(r"growing the sketch to cols=(\d+)", log)[-1]) if grows else None
        ),
        "delivered_fraction_final": fracs[-1] if fracs else None,
        "delivered_fraction_mean_last50": (sum(fracs[-50:]) / len(fracs[-50:])) if fracs else None,
        "nonfinite_skips": sum(1 for r in lines if r.get("skipped")),
        "bytes_levels": byte_levels[:6] if len(byte_levels) <= 6 else None,
        "bytes_plain_step": byte_levels[0] if byte_levels else None,
        "evals": evals,
        "_curve": [(r["step"], r.get("loss"), r.get("bytes_sent_total")) for r in lines],
    }


# ----------------------------------------------------------------------------- formatting


def f_acc(r: dict) -> str:
    a = r.get("final_test_accuracy")
    if r.get("status") != "completed":
        return f"failed ({r.get('status')})"
    if not _finite(a):
        return "diverged"
    return f"{100 * a:.2f}%"


def f_loss(x: Any) -> str:
    return f"{x:.3f}" if _finite(x) else "diverged"


def f_bytes(x: Any) -> str:
    if not _finite(x):
        return "—"
    if x >= 1e6:
        return f"{x / 1e6:.2f} MB"
    if x >= 1e3:
        return f"{x / 1e3:.1f} kB"
    return f"{x:.0f} B"


def f_ms(x: Any) -> str:
    return f"{1e3 * x:.0f}" if _finite(x) else "—"


def f_frac(x: Any) -> str:
    return f"{x:.2f}" if _finite(x) else "—"


def f_evals(r: dict, text: bool = False) -> str:
    if text:
        return " / ".join(f_loss(loss) for _, _, loss in r["evals"])
    return " / ".join(f"{100 * a:.1f}" if _finite(a) else "nan" for _, a, _ in r["evals"])


#: Runs made before the sketch default changed (commit 6db8d63, 02:05 UTC): their sketches
#: used the old default. Every later run (the editable install picked the change up at
#: once) used the new one. Bytes alone cannot tell them apart at density 0.01, where
#: 5 x 4030 and 1 x 20150 send the same number of floats.
OLD_DEFAULT_RUNS = frozenset([
    "A-common-sketched5row-0.01", "A-common-gs5row-0.01", "A-common-sketched5row-0.001",
    "A-common-gs5row-0.001", "A-local-sketched5row-0.001", "A-local-gs5row-0.001",
    "A-published-sketched-0.001", "A-published-gs-0.001", "D-gs-r5-c810-m4",
    "D-gs-r3-c810-m16", "D-gs-r1-c3240-m16", "D-gs-r5-c3240-m16", "D-gs-r1-c810-m16",
    "B-p8-sketched5row-0.001", "B-p8-gs5row-0.001",
])  # fmt: skip


def _default_shapes(d: int, k: int, rows: int | None) -> list[tuple[int, int, int]]:
    """(rows, cols, m) of the library default now, and of the default before the study
    changed it (5 rows, 10·k columns capped at d/(4 rows), m = 16 capped at m*k <= d/8)."""
    new_rows = rows or DEFAULT_ROWS
    old_rows = rows or 5
    return [
        (new_rows, default_sketch_cols(d, k, new_rows), default_candidates(d, k)),
        (
            old_rows,
            max(1, min(10 * k, max(256, d // (4 * old_rows)))),
            max(1, min(16, d // (8 * k))),
        ),
    ]


def run_shape(r: dict) -> tuple[int, int, int] | None:
    """The (rows, cols, m) a sketching run started with.

    Flags given on the command line are taken as they are; the defaults are the old ones for
    :data:`OLD_DEFAULT_RUNS` and the current ones otherwise. The byte count that shape
    implies (:func:`gssgd.costmodel.traffic`) is checked against the run's plainest
    step, so a wrong guess stops the report instead of mislabelling a row.
    """
    k, d, p = r.get("k"), r.get("d"), r.get("workers")
    if r["method"] not in ("sketched", "gs") or not (k and d and p):
        return None
    new, old = _default_shapes(d, k, r.get("rows"))
    rows, cols, m = old if r["name"] in OLD_DEFAULT_RUNS else new
    shape = (rows, r.get("cols") or cols, r.get("candidates") or m)
    spec = MethodSpec(
        r["method"],
        r["method"],
        d,
        k,
        rows=shape[0],
        cols=shape[1],
        candidates=shape[2],
        table_bytes=2 if r.get("table_dtype") in ("float16", "bfloat16") else 4,
        exact=r.get("exact") is not False,
        allreduce=r.get("allreduce") or "recursive_doubling",
    )
    sent = traffic(spec, p).sent
    want, got = sum(sent) / len(sent), r.get("bytes_plain_step")
    if got is not None and abs(got - want) > 0.02 * want:
        raise SystemExit(
            f"{r['name']}: shape {shape} implies {want:.0f} B/step, the run sent "
            f"{got:.0f}: fix OLD_DEFAULT_RUNS"
        )
    return shape


def sketch_shape(r: dict) -> str:
    shape = run_shape(r)
    if shape is None:
        return "—"
    rows, cols, m = shape
    label = f"{rows}×{cols}, m={m}"
    if r.get("rows") is None and r.get("cols") is None and r.get("candidates") is None:
        label += " (default)"
    if r.get("final_cols"):
        label += f" → grown to cols={r['final_cols']}"
    return label


def table(rows: list[dict], text: bool = False, dense_bytes: float | None = None) -> str:
    """A part's table: one row per run, bytes also as a multiple of ``dense_bytes``;
    ``text``: a language model's run (judged on the test loss)."""
    head = (
        "run | method | density | k | sketch rows×cols, m | "
        + ("final test loss | test loss" if text else "final test acc | test acc %")
        + " at evals | bytes sent / worker / step | vs dense | ms / step | ms comm / step | "
        "guard grows | delivered frac (last)"
    )
    cells = []
    for r in rows:
        b, dense = r["bytes_sent_per_step"], r["method"] == "dense"
        ratio = f"{b / dense_bytes:.4f}×" if _finite(b) and dense_bytes else "—"
        server = r.get("bytes_sent_max_per_step")
        sent = f_bytes(b)
        if _finite(server) and _finite(b) and server > 1.05 * b:
            sent += f" (server {f_bytes(server)})"
        cells.append(
            f"`{r['name']}` | {r['method']} | {'—' if dense else r['density']} | "
            f"{'—' if dense else r['k']} | {sketch_shape(r)} | "
            f"{f_loss(r['final_test_loss']) if text else f_acc(r)} | {f_evals(r, text)} | "
            f"{sent} | {ratio} | {f_ms(r['seconds_per_step'])} | "
            f"{f_ms(r['seconds_communicate_per_step'])} | "
            f"{r['guard_grows'] if r['method'] == 'gs' else '—'} | "
            f"{f_frac(r['delivered_fraction_final'])}"
        )
    return markdown_table(head, cells)


# ----------------------------------------------------------------------------- plots


def _smooth(xs: list[float], w: int = 20) -> list[float]:
    out, acc = [], []
    for x in xs:
        acc.append(x if _finite(x) else float("nan"))
        if len(acc) > w:
            acc.pop(0)
        good = [a for a in acc if math.isfinite(a)]
        out.append(sum(good) / len(good) if good else float("nan"))
    return out


def plot_group(rows: list[dict], path: Path, title: str, text: bool = False) -> None:
    if not rows:
        return
    fig, axes = figure(3, figsize=(16, 4.5))
    styles = ["-", "--", ":", "-."]
    seen: dict[str, int] = {}
    for r in rows:
        m = r["method"]
        i = seen.get(m, 0)
        seen[m] = i + 1
        style = dict(color=COLORS.get(m), linestyle=styles[i % len(styles)])
        label = r["name"]
        steps = [c[0] for c in r["_curve"]]
        loss = _smooth([c[1] for c in r["_curve"]])
        axes[0].plot(steps, loss, label=label, **style)
        ev = r["evals"]
        y = [(e[2] if text else e[1]) for e in ev]
        axes[1].plot([e[0] for e in ev], y, marker="o", label=label, **style)
        bt = [c[2] for c in r["_curve"]]
        if all(_finite(b) and b > 0 for b in bt):
            axes[2].plot(bt, loss, label=label, **style)
    axes[0].set(xlabel="step", ylabel="training loss (20-step mean)", title=title)
    axes[0].set_yscale("log")
    axes[1].set(xlabel="step", ylabel="test loss" if text else "test accuracy", title="evaluations")
    if not text:
        axes[1].set_ylim(0, 1)
    axes[2].set(
        xlabel="bytes sent per worker (cumulative)",
        ylabel="training loss",
        title="loss vs communication",
    )
    axes[2].set_xscale("log")
    axes[2].set_yscale("log")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)


def plot_sweep(rows: list[dict], path: Path) -> None:
    if not rows:
        return
    fig, axes = figure(2, figsize=(12, 4.5))
    for r in rows:
        acc = r["final_test_accuracy"]
        b = r["bytes_sent_per_step"]
        if not (_finite(acc) and _finite(b)):
            continue
        lab = sketch_shape(r).replace(" (default)", "*").replace(" → grown to cols=", "→")
        axes[0].scatter(b / 1e3, 100 * acc, color="tab:red")
        axes[0].annotate(
            lab, (b / 1e3, 100 * acc), fontsize=8, xytext=(4, 4), textcoords="offset points"
        )
        t = r["seconds_compress_decompress_per_step"]
        if _finite(t):
            axes[1].scatter(1e3 * t, 100 * acc, color="tab:purple")
            axes[1].annotate(
                lab, (1e3 * t, 100 * acc), fontsize=8, xytext=(4, 4), textcoords="offset points"
            )
    axes[0].set(
        xlabel="bytes sent per worker per step (kB)",
        ylabel="final test accuracy (%)",
        title="gs-SGD sketch sweep, MNIST, P=4, density 0.001",
    )
    axes[1].set(
        xlabel="sketch + recovery time per step (ms, rank 0)",
        ylabel="final test accuracy (%)",
        title="accuracy vs compression compute",
    )
    fig.tight_layout()
    save_png(fig, path)


# ----------------------------------------------------------------------------- parts


def by_prefix(runs: dict[str, dict], prefix: str) -> list[dict]:
    def key(r: dict) -> tuple:
        dens = r["density"] if r["method"] != "dense" else 1.0
        return (-(dens or 0), METHODS.index(r["method"]) if r["method"] in METHODS else 9)

    return sorted((r for n, r in runs.items() if n.startswith(prefix)), key=key)


def sweep_best(rows: list[dict]) -> tuple[str, list[str]]:
    """The operating point: the fewest bytes within 1 point of the best accuracy."""
    ok = [
        r for r in rows if _finite(r["final_test_accuracy"]) and _finite(r["bytes_sent_per_step"])
    ]
    if not ok:
        return "no completed sweep run", []
    top = max(r["final_test_accuracy"] for r in ok)
    near = [r for r in ok if r["final_test_accuracy"] >= top - 0.01]
    best = min(near, key=lambda r: r["bytes_sent_per_step"])
    pareto = []
    for r in sorted(ok, key=lambda r: r["bytes_sent_per_step"]):
        if not pareto or r["final_test_accuracy"] > pareto[-1]["final_test_accuracy"]:
            pareto.append(r)
    lines = [
        f"{sketch_shape(r)}: {f_acc(r)} at {f_bytes(r['bytes_sent_per_step'])}/step, "
        f"{100 * r['final_test_accuracy'] / (r['bytes_sent_per_step'] / 1e3):.2f} %-points per kB"
        for r in pareto
    ]
    return (
        f"{sketch_shape(best)} — {f_acc(best)} at {f_bytes(best['bytes_sent_per_step'])} "
        f"per worker per step, {f_ms(best['seconds_compress_decompress_per_step'])} ms "
        f"sketch+recovery, {f_ms(best['seconds_per_step'])} ms per step",
        lines,
    )


def sweep_table(rows: list[dict]) -> str:
    """Part D: one row per sketch shape, by increasing bytes."""
    head = (
        "rows×cols, m | numbers per round | final test acc | test acc % at evals | "
        "bytes sent / worker / step | acc %-pts per kB | ms sketch+recovery / step | "
        "ms / step | guard grows | delivered frac (last)"
    )
    cells = []
    for r in sorted(rows, key=lambda r: r["bytes_sent_per_step"] or 0):
        shape = sketch_shape(r)
        m = re.match(r"(\d+)×(\d+), m=(\d+)", shape)
        nums = f"{int(m[1]) * int(m[2]) + int(m[3]) * r['k']:,}" if m and r["k"] else "—"
        acc, b = r["final_test_accuracy"], r["bytes_sent_per_step"]
        per_kb = f"{100 * acc / (b / 1e3):.2f}" if _finite(acc) and _finite(b) else "—"
        cells.append(
            f"{shape} | {nums} | {f_acc(r)} | {f_evals(r)} | {f_bytes(b)} | {per_kb} | "
            f"{f_ms(r['seconds_compress_decompress_per_step'])} | "
            f"{f_ms(r['seconds_per_step'])} | {r['guard_grows']} | "
            f"{f_frac(r['delivered_fraction_final'])}"
        )
    return markdown_table(head, cells)


def seeds_table(runs: dict[str, dict]) -> str:
    """Part S: final test accuracy of part A's headline cell over seeds 0, 1 and 2, their
    mean and min–max band (of the seeds that did not diverge)."""
    rows = []
    for m in ("topk", "gtopk", "sketched", "gs"):
        rs = [runs.get(f"A-common-{m}-0.001")] + [runs.get(f"S-{m}-0.001-seed{s}") for s in (1, 2)]
        accs = [r["final_test_accuracy"] if r else None for r in rs]
        got = [a for a in accs if _finite(a)]
        cells = [
            f"{100 * a:.2f}%" if _finite(a) else ("diverged" if r else "not run")
            for a, r in zip(accs, rs, strict=True)
        ]
        band = seed_band(got) if got else None
        mean = f"{100 * band.mean:.2f}%" if band else "—"
        spread = f"{100 * band.low:.1f}–{100 * band.high:.1f}%" if band else "—"
        rows.append([m, *cells, mean, spread])
    return markdown_table("method | seed 0 | seed 1 | seed 2 | mean | range", rows)


def baseline_table(runs: dict[str, dict]) -> str:
    """The team's earlier baseline (:data:`BASELINE`) beside part A's common runs."""
    steps = next(iter(runs.values()))["steps"] if runs else "?"
    rows = []
    for (m, dens), base in BASELINE.items():
        r = runs.get("A-common-dense" if m == "dense" else f"A-common-{m}-{dens}")
        base_text = "diverged" if base is None else f"{base:.1f}%"
        rows.append(f"{m} | {dens or '—'} | {base_text} | {f_acc(r) if r else 'not run'}")
    head = (
        f"method | density | earlier baseline (800 steps) | this study (A, common, {steps} steps)"
    )
    return markdown_table(head, rows)


def _failures(logs: Path) -> str:
    """The runs that exited non-zero (``logs/status.tsv``), as a markdown list."""
    missing = []
    status = logs / "status.tsv"
    if status.exists():
        for line in status.read_text().splitlines()[1:]:
            name, rc, *_ = line.split("\t")
            if rc != "0":
                missing.append(
                    f"`{name}` exited {rc} (log: `{logs / name}.log`, written by "
                    "`studies/convergence/run.sh`, not committed)"
                )
    return "\n".join(f"- {m}" for m in missing) if missing else "No run failed."


def _dense_c(runs: dict[str, dict], logs: Path) -> dict:
    """Part C's dense reference: dense at the learning rate ``logs/C-lr.txt`` names ({}:
    none)."""
    lr = logs / "C-lr.txt"
    return runs.get(f"C-lr-dense-{lr.read_text().strip()}", {}) if lr.exists() else {}


def _parts(runs: dict[str, dict], logs: Path) -> dict[str, list[dict]]:
    """Each part's runs, by the run names' prefixes; part C starts with its dense
    reference (:func:`_dense_c`), part D with part A's gs runs."""
    dense_c = _dense_c(runs, logs)
    return {
        "A-common": by_prefix(runs, "A-common-"),
        "A-local": by_prefix(runs, "A-local-"),
        "A-published": by_prefix(runs, "A-published-"),
        "B": by_prefix(runs, "B-"),
        "C-lr": by_prefix(runs, "C-lr-"),
        "C": ([dense_c] if dense_c else [])
        + [r for r in by_prefix(runs, "C-") if not r["name"].startswith("C-lr-")],
        "D": [r for r in [runs.get("A-common-gs-0.001"), runs.get("A-common-gs5row-0.001")] if r]
        + by_prefix(runs, "D-gs-r"),
        "D2": [r for r in [runs.get("A-common-gs-0.001")] if r]
        + [r for r in by_prefix(runs, "D-gs-") if not r["name"].startswith("D-gs-r")],
        "E": by_prefix(runs, "E-"),
    }


def _blocks(runs: dict[str, dict], parts: dict[str, list[dict]], logs: Path) -> dict[str, str]:
    """The markdown of every part, by the name of its block in docs/study.md."""

    def dense(name: str) -> float | None:
        return runs.get(name, {}).get("bytes_sent_per_step")

    dense_a = dense("A-common-dense")
    blocks = {
        "A-common": table(parts["A-common"], dense_bytes=dense_a),
        "A-local": table(parts["A-local"], dense_bytes=dense_a),
        "A-published": table(
            parts["A-published"]
            + [r for r in [runs.get("A-local-gs-0.001"), runs.get("A-local-sketched-0.001")] if r],
            dense_bytes=dense_a,
        ),
        # no dense run at P = 8: the ring all-reduce figure comm.py would count for it
        "B": table(parts["B"], dense_bytes=dense("B-p8-dense")),
        "C-lr": table(parts["C-lr"], text=True),
        "C": table(
            parts["C"], text=True, dense_bytes=_dense_c(runs, logs).get("bytes_sent_per_step")
        ),
        "D": sweep_table(parts["D"]),
        "D2": table(parts["D2"], dense_bytes=dense_a),
        "E": table(parts["E"], text=True, dense_bytes=dense("E-p8-dense")),
        "S": seeds_table(runs),
        "baseline": baseline_table(runs),
    }
    best, pareto = sweep_best(parts["D"])
    blocks["D-best"] = (
        "**Best operating point** (fewest bytes within 1 point of the best "
        f"sweep accuracy): {best}.\n\nPareto front (bytes ↑, accuracy ↑):\n\n"
        + "\n".join(f"- {p}" for p in pareto)
    )
    grows = [
        f"- `{r['name']}`: {r['guard_grows']} × " + "; ".join(r["guard_messages"][:3])
        for r in runs.values()
        if r["guard_grows"]
    ]
    blocks["guard"] = (
        "\n".join(grows)
        if grows
        else 'No run logged "growing the sketch" (the guard never grew a sketch).'
    )
    blocks["failures"] = _failures(logs)
    return blocks


def _plots(runs: dict[str, dict], parts: dict[str, list[dict]], sd: Path) -> None:
    """The parts' plots, into ``sd``."""
    plot_group(parts["A-common"], sd / "A_common.png", "A: MNIST P=4, optimizer momentum")
    plot_group(parts["A-local"], sd / "A_local.png", "A: MNIST P=4, local momentum")
    plot_group(
        parts["A-published"] + [r for r in [runs.get("A-local-gs-0.001")] if r],
        sd / "A_published.png",
        "A: published 5x10k, m=4 (local momentum)",
    )
    plot_group(parts["B"], sd / "B_p8.png", "B: MNIST P=8")
    plot_group(parts["C"], sd / "C_shakespeare.png", "C: Shakespeare LSTM, P=4", text=True)
    plot_group(parts["E"], sd / "E_shakespeare_p8.png", "E: Shakespeare LSTM, P=8", text=True)
    plot_sweep(parts["D"], sd / "D_sweep.png")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--raw",
        default="runs/study",
        type=Path,
        help="the study's raw runs: <raw>/runs/<name>/ and <raw>/logs/ "
        "(default runs/study, what studies/convergence/run.sh writes)",
    )
    ap.add_argument(
        "--out",
        default="studies/convergence/results",
        type=Path,
        help="where results.json, tables.md and the plots go (default studies/convergence/results)",
    )
    ap.add_argument("--doc", default="docs/study.md", type=Path)
    ap.add_argument(
        "--clean-checkpoints",
        action="store_true",
        help="delete <raw>/runs/*/checkpoints afterwards (saves disk space)",
    )
    args = ap.parse_args()
    raw: Path = args.raw
    sd: Path = args.out
    if not (raw / "runs").is_dir():
        raise SystemExit(
            f"no runs under {raw / 'runs'}: run studies/convergence/run.sh first (or pass --raw)"
        )
    sd.mkdir(parents=True, exist_ok=True)
    logs = raw / "logs"
    runs = {run.name: load_run(run, logs) for run in read_runs(raw / "runs")}
    parts = _parts(runs, logs)
    blocks = _blocks(runs, parts, logs)
    _plots(runs, parts, sd)
    public = {n: {k: v for k, v in r.items() if not k.startswith("_")} for n, r in runs.items()}
    (sd / "results.json").write_text(json.dumps(public, indent=1, sort_keys=True) + "\n")
    md = "\n\n".join(f"## {name}\n\n{body}" for name, body in blocks.items())
    if args.doc.exists():
        splice_markdown(args.doc, blocks)
    else:  # no page to splice into: keep the tables beside the results
        (sd / "tables.md").write_text(md + "\n")
    print(md)
    if args.clean_checkpoints:
        for ck in (raw / "runs").glob("*/checkpoints"):
            shutil.rmtree(ck)
        print(f"\ndeleted checkpoints under {raw / 'runs'}")


if __name__ == "__main__":
    main()
