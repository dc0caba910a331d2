"""Write the README's two tables (and the study's first two) from the committed summaries.

    .venv/bin/python tools/readme_tables.py           # rewrite the quoted tables
    .venv/bin/python tools/readme_tables.py --check   # exit 1 if a page differs

README.md quotes measured figures in three places, docs/study.md the second of them in its
first answer, each between ``<!-- BEGIN name -->`` and ``<!-- END name -->`` markers:

- ``main-job``: what the README's first command prints, from its ``results.json`` files
  committed as studies/main_job/results/P4.json (``gssgd compare --out runs/compare``) and
  P16.json (``gssgd compare --simulate --workers 16 --global-batch 256 --steps 400
  --methods dense,gs,powersgd``).
- ``found``: the README's "What we found" paragraph, from the same equal-budget cells (a
  cell re-run with the lr-grid design, studies/lr_grid, in its place): per
  image cell the methods that reach dense − 0.5 point, fewest bytes first, and whether the
  lead is a tie; per language-model cell the methods whose seeds' mean curve reaches
  dense's loss + 3 % and every other method's final gap (:func:`found_text`).
- ``equal-budget``: ``gssgd study``'s answer per committed cell of studies/equal_budget
  (each ``results/<cell>/summary.json``): who reaches the target with the fewest bytes and
  in the least modeled time, with the summary's verdict, and gs's place.
- ``fair-frontier``: the fair comparison's answer per image set and worker count, from
  ``targets`` in studies/fair_frontier/results/{mnist,fashion-mnist}/summary.json
  (studies/fair_frontier/report.py).

So every figure in those tables is one a committed summary holds; tests/test_readme.py
checks that both pages match what this script writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from gssgd.study.curves import ACCURACY  # noqa: E402
from studies._lib.report import busier_bytes, markdown_table, splice_markdown  # noqa: E402

README = ROOT / "README.md"
#: Each page, and the tables it quotes.
PAGES = {README: ("found", "main-job", "equal-budget"),
         ROOT / "docs/study.md": ("equal-budget", "fair-frontier")}
MAIN_JOB = ROOT / "studies/main_job/results"
EQUAL = ROOT / "studies/equal_budget/results"
LR_GRID = ROOT / "studies/lr_grid/results"
FAIR = {"MNIST": ROOT / "studies/fair_frontier/results/mnist/summary.json",
        "Fashion-MNIST": ROOT / "studies/fair_frontier/results/fashion-mnist/summary.json"}

#: How the tables name gssgd's methods.
LABELS = {"dense": "dense", "dense16": "dense, 16-bit", "topk": "local Top-k", "gtopk": "gTop-k",
          "sketched": "Sketched-SGD", "gs": "gs-SGD", "powersgd": "PowerSGD"}


def megabytes(n: float) -> str:
    """``12.3 MB`` (decimal, one decimal place)."""
    return f"{n / 1e6:.1f} MB"


def main_job_cell(r: dict[str, Any], dense: dict[str, Any]) -> tuple[str, str, str]:
    """One worker count's three cells for a method: test accuracy, the busiest link's bytes
    a step, and the bytes to dense − 0.5 point with how many times fewer than dense's."""
    accuracy = f"{100 * r['final_test_accuracy']:.2f} %"
    link = f"{busier_bytes(r):,.0f}"
    reached, dense_reached = r.get("bytes_to_target"), dense.get("bytes_to_target")
    if reached is None:
        gap = 100 * (r["final_test_accuracy"] - dense["final_test_accuracy"])
        return accuracy, link, f"not reached ({gap:+.2f} pt)".replace("-", "−")
    if r is dense:
        return accuracy, link, megabytes(reached)
    return accuracy, link, f"{megabytes(reached)} ({dense_reached / reached:.1f}×)"


def main_job_table(by_workers: dict[int, dict[str, dict[str, Any]]]) -> str:
    """The main job's table: a row per method, three columns per worker count."""
    counts = sorted(by_workers)
    head = ["method"]
    for p in counts:
        head += [f"P = {p}: accuracy", "busiest link / step (B)", "bytes to dense − 0.5 pt"]
    rows = []
    for method in by_workers[counts[0]]:
        label = LABELS.get(method, method) + (", rank 2" if method == "powersgd" else "")
        cells = [label]
        for p in counts:
            results = by_workers[p]
            if method not in results:  # the P = 16 part runs a subset
                cells += ["not run", "", ""]
                continue
            cells += main_job_cell(results[method], results["dense"])
        rows.append(cells)
    return markdown_table(head, rows)


def level_label(name: str) -> str:
    """A fair-frontier run's name in words: ``powersgd-lr0.05-r1`` -> ``PowerSGD rank 1 at
    lr 0.05``, ``topk-nowu-d0.003`` -> ``local Top-k, d 0.003, no warm-up``,
    ``gs-wu0.02-d0.001`` -> ``gs-SGD, d 0.001, warm-up from 0.02``."""
    parts = name.split("-")
    method, density, warmup, lr = LABELS.get(parts[0], parts[0]), [], [], ""
    for part in parts[1:]:
        if part.startswith("r") and parts[0] == "powersgd":
            method += f" rank {part[1:]}"
        elif part.startswith("lr"):
            lr = f" at lr {part[2:]}"
        elif part.startswith("d"):
            density.append(f"d {part[1:]}")
        elif part == "nowu":
            warmup.append("no warm-up")
        elif part.startswith("wu"):
            warmup.append(f"warm-up from {part[2:]}")
    return ", ".join([method + lr, *density, *warmup])


def fair_rows(dataset: str, summary: dict[str, Any]) -> list[list[str]]:
    """The fair comparison's rows for one image set: per worker count, the fewest bytes to
    dense − 0.5 point (method and level), gs's best and the ratio, and the seeds."""
    rows = []
    for p in sorted(summary["targets"], key=int):
        t, table = summary["targets"][p], summary["by_P"][p]
        dense_name, dense_bytes = t["best_to_target"]["dense"]
        best, gs = t.get("best_rival"), t.get("gs_best")
        if best is None:
            closest = max((n for n in table if not n.startswith("dense")),
                          key=lambda n: table[n]["accuracy"])
            target = ACCURACY.target(table[dense_name]["accuracy"])
            winner = (f"none reached {100 * target:.2f} % in 400 steps (closest: "
                      f"{level_label(closest)}, {100 * table[closest]['accuracy']:.2f} %)")
            gs_cell = "not reached"
        else:
            best_bytes = table[best]["bytes_to_dense_minus_half_point"]
            winner = f"**{level_label(best)}, {megabytes(best_bytes)}**"
            gs_cell = "not reached" if gs is None else (
                f"{megabytes(table[gs]['bytes_to_dense_minus_half_point'])} "
                f"({t['gs_over_best_rival_bytes']:.2f}×)")
        seeds = table[dense_name]["seeds"]
        rows.append([dataset, p, winner, gs_cell, megabytes(dense_bytes), str(seeds)])
    return rows


def fair_table(summaries: dict[str, dict[str, Any]]) -> str:
    """The fair comparison's table over every image set."""
    head = ["image set", "workers", "fewest bytes to dense − 0.5 pt", "gs-SGD (× the fewest)",
            "dense", "seeds"]
    return markdown_table(head, [row for dataset, summary in summaries.items()
                                 for row in fair_rows(dataset, summary)])


def _leader(summary: dict[str, Any], ranking: str) -> str:
    """A ranking's leader in words: the method, its figure, and the verdict."""
    r = summary["rankings"][ranking]
    if r["leader"] is None:
        return "none reached the target"
    row = next(m for m in summary["methods"] if m["label"] == r["leader"])
    figure = (megabytes(row["to_target"]["bytes"]) if ranking == "bytes"
              else f"{row['modeled_s'][ranking.removeprefix('time_')]:.2f} s")
    verdict = "alone" if r["margin"] is None else (
        f"{r['margin']:.2f}× ahead of {r['runner_up']}"
        + ("" if r["verdict"] == "wins" else ", **tie**"))
    return f"**{r['leader']}** {figure} ({verdict})"


def equal_rows(cell: str, summary: dict[str, Any]) -> list[str]:
    """One equal-budget cell: who needs the fewest bytes and the least modeled time to the
    target (and whether it is a tie), gs's place and bytes."""
    ref = summary["reference"]
    order = summary["rankings"]["bytes"]["order"]
    gs = [m for m in summary["methods"] if m["method"] == "gs" and m["label"] in order]
    lead = summary["rankings"]["bytes"]["leader"]
    lead_bytes = next((m["to_target"]["bytes"] for m in summary["methods"]
                       if m["label"] == lead), None)
    gs_cell = "not reached" if not gs else (
        f"#{order.index(gs[0]['label']) + 1} of {len(order)}, "
        f"{megabytes(gs[0]['to_target']['bytes'])} ({gs[0]['to_target']['bytes'] / lead_bytes:.2f}×)")
    run = summary["run"]
    unit = " %" if summary["metric"] == "accuracy" else ""
    scale = 100 if summary["metric"] == "accuracy" else 1
    return [cell, str(run["workers"]), f"{scale * ref['target']:.2f}{unit}",
            _leader(summary, "bytes"), _leader(summary, "time_1gbit"),
            _leader(summary, "time_10gbit"), gs_cell,
            f"{summary['budget_per_method']} / {len(summary['seeds'])} ({summary['sampler']})"]


def equal_table(summaries: dict[str, dict[str, Any]]) -> str:
    """The equal-budget study's table over its committed cells."""
    head = ["cell", "workers", "target", "fewest bytes to the target", "least time, 1 Gbit/s",
            "least time, 10 Gbit/s", "gs-SGD (place, bytes)",
            "trials / seeds per method (search)"]
    return markdown_table(head, [equal_rows(c, s) for c, s in summaries.items()])


#: How "What we found" names a cell's data set and a method.
DATASETS = {"mnist": "MNIST", "fashion-mnist": "Fashion-MNIST", "shakespeare": "text"}
MODELS = {"lm": "the character LSTM", "gpt": "the small GPT", "gpt-s": "the small GPT"}
SHORT = {"dense16": "dense16", "topk": "local Top-k", "gtopk": "gTop-k",
         "sketched": "Sketched-SGD", "gs": "gs", "powersgd": "PowerSGD"}


def _reaching(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The methods (the reference left out) whose mean curve reaches the target, fewest
    bytes first."""
    ref = summary["reference"]["label"]
    return sorted((m for m in summary["methods"]
                   if m["label"] != ref and m["to_target"]["bytes"] is not None),
                  key=lambda m: m["to_target"]["bytes"])


def _gap(summary: dict[str, Any], m: dict[str, Any]) -> str:
    """A method's final gap to dense: points of accuracy, or % of the loss."""
    dense, final = summary["reference"]["final_mean"], m["final"]["mean"]
    if final is None:
        return "stopped"
    if summary["metric"] == "accuracy":
        return f"{100 * (final - dense):+.2f} pt"
    return f"{100 * (final / dense - 1):+.1f} %"


def _image_clause(summary: dict[str, Any]) -> str:
    reach, lead = _reaching(summary), summary["rankings"]["bytes"]
    if not reach:
        closest = max((m for m in summary["methods"]
                       if m["label"] != summary["reference"]["label"]),
                      key=lambda m: m["final"]["mean"] or 0)
        return f"none (closest {SHORT.get(closest['label'], closest['label'])}, " \
               f"{_gap(summary, closest)})"
    shown = ", ".join(f"{SHORT.get(m['label'], m['label'])} "
                      f"{megabytes(m['to_target']['bytes'])}" for m in reach[:4])
    verdict = "a tie" if str(lead["verdict"]).startswith("tie") else lead["verdict"]
    return f"{shown} ({verdict})"


def _text_clause(summary: dict[str, Any]) -> str:
    reach = _reaching(summary)
    within = ", ".join(f"{SHORT.get(m['label'], m['label'])} ({_gap(summary, m)})"
                       for m in reach) or "none"
    others = [m for m in summary["methods"] if m not in reach
              and m["label"] != summary["reference"]["label"]]
    rest = ", ".join(f"{SHORT.get(m['label'], m['label'])} {_gap(summary, m)}"
                     for m in sorted(others, key=lambda m: m["final"]["mean"] or 1e9))
    return f"{within}; short: {rest}" if rest else within


def found_text(summaries: dict[str, dict[str, Any]]) -> str:
    """The README's "What we found" paragraph from the equal-budget cells."""
    images, texts = [], []
    for summary in summaries.values():
        run = summary["run"]
        where = f"{run['workers']} workers"
        if "design" in summary:
            where += " (every learning rate on one grid, no best on its edge)" if not \
                summary["design"]["on_edge"] else " (one learning-rate grid)"
        if summary["metric"] == "accuracy":
            images.append(f"{DATASETS.get(run['dataset'], run['dataset'])} at {where}: "
                          + _image_clause(summary))
        else:
            texts.append(f"{MODELS.get(run.get('model'), run.get('model'))} at {where}: "
                         + _text_clause(summary))
    ties = sum(str(s["rankings"]["bytes"]["verdict"]).startswith("tie")
               for s in summaries.values())
    edges = [_on_lr_edge(m) for s in summaries.values() for m in s["methods"]]
    return (f"**What we found, honestly:** with every method tuned on the same budget (three "
            f"seeds), {ties} of the {len(summaries)} cells' leads in bytes are ties. Images, the methods that reach dense − 0.5 point, "
            "fewest bytes first: " + "; ".join(images) + ". Language models (AdamW, 600 "
            "steps), the methods that reach dense's loss + 3 % (their final gap), then the "
            "others: " + "; ".join(texts) + f". A caveat on all of it: {sum(edges)} of the "
            f"{len(edges)} methods' bests sit on the lowest or highest learning rate their "
            "search tried, so these rankings show where each search ended more than each "
            "method's optimum.")


def _on_lr_edge(method: dict[str, Any]) -> bool:
    """Whether a method's best learning rate is the lowest or highest its search tried."""
    rates = [t["setting"]["lr"] for t in method["trials"] if "lr" in t["setting"]]
    return bool(rates) and method["best_setting"].get("lr") in (min(rates), max(rates))


def blocks() -> dict[str, str]:
    """The README's quoted tables, from the committed summaries."""
    by_workers = {int(f.stem[1:]): json.loads(f.read_text())
                  for f in sorted(MAIN_JOB.glob("P*.json"))}
    summaries = {name: json.loads(path.read_text()) for name, path in FAIR.items()}
    equal = {f.parent.name: json.loads(f.read_text())
             for f in sorted(EQUAL.glob("*/summary.json"))}
    # a cell re-run with the lr-grid design supersedes its equal-budget run in the prose
    latest = {**equal, **{f.parent.name: json.loads(f.read_text())
                          for f in sorted(LR_GRID.glob("*/summary.json"))}}
    return {"main-job": main_job_table(by_workers), "fair-frontier": fair_table(summaries),
            "equal-budget": equal_table(equal), "found": found_text(latest)}


def main(argv: list[str]) -> int:
    tables = blocks()
    stale, missing = [], []
    for page, names in PAGES.items():
        before = page.read_text()
        copy = page.with_suffix(".quoted.md")
        copy.write_text(before)
        try:
            missing += [f"{page.name}: {n}" for n in
                        splice_markdown(copy, {n: tables[n] for n in names})]
            after = copy.read_text()
        finally:
            copy.unlink()
        if after != before:
            stale.append(page.name)
            if "--check" not in argv:
                page.write_text(after)
    if missing:
        print(f"missing markers: {', '.join(missing)}", file=sys.stderr)
        return 1
    if "--check" in argv:
        print(f"stale tables in {', '.join(stale)}" if stale else "the quoted tables match")
        return 1 if stale else 0
    print(f"rewrote the tables in {', '.join(stale)}" if stale else "nothing to rewrite")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
