"""How many steps each method needs to reach dense's accuracy: the convergence half of
``gssgd advise``, measured by two studies of the MNIST CNN.

A method's step time (:mod:`gssgd.costmodel.cluster`) says how fast it steps, not how far
each step gets. ``advise`` multiplies a candidate's predicted step by its **steps to come
within 0.5 point of dense's final accuracy, as a multiple of dense's own**, and ranks the
candidates that reached it by that time; those measured short of it come after them, with
their final gap. Two tables answer, the first that has the candidate:

1. :data:`WEAK_REACH`, the fair frontier (``scripts/fair_frontier.sh``, docs/study.md, "The
   fair frontier"): weak scaling (16 samples a worker), every method at several levels
   (densities 0.001-0.01), dense's learning rate chosen by a sweep at each P. Rows of
   :data:`MIN_SEEDS` seeds only. It also holds PowerSGD's ranks, which ``advise`` cannot
   model (its message depends on the layer shapes) and names beside its advice
   (:func:`powersgd_reach`).
2. :data:`FRONTIER_REACH`, the many-workers frontier (``scripts/frontier_study.sh``, "Many
   workers"): strong scaling (global batch 128, 256 at P = 256), density 0.001 only, gs's
   shapes by name, P = 4 to 256.

Each table is a copy, rounded, of a committed ``summary.json`` (the results are not
installed with the package); ``tests/costmodel/test_reach.py`` rebuilds both
(:func:`weak_reach_table`, :func:`reach_table`) and fails when they differ. To refresh one
after a new study, run its report script and paste what the function returns.

What it is and is not: one model (the MNIST CNN), evaluated every 100 of 400 steps, so two
ratios 10-20 % apart are within what the studies resolve. Any P takes the nearest measured
P that ran the same row (on a log scale), which the report names.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from gssgd.costmodel.method_specs import MethodSpec, method_spec

__all__ = [
    "FRONTIER_REACH",
    "REACH_DENSITY",
    "WEAK_REACH",
    "Reach",
    "frontier_row",
    "powersgd_reach",
    "reach",
    "reach_table",
    "weak_reach_table",
]

#: The density the strong-scaling frontier study measured at: :data:`FRONTIER_REACH`
#: answers only there.
REACH_DENSITY = 0.001
#: What the ratio is measured on, for the reports.
REACH_WHERE = (
    "MNIST CNN, within 0.5 point of dense: the fair frontier (16 samples a worker, densities "
    "0.001-0.01) where it ran the method, else the many-workers frontier (global batch 128, "
    "density 0.001)"
)
#: :attr:`Reach.study` of each table's rows.
WEAK, STRONG = "weak scaling", "strong scaling"

#: P -> frontier row -> (seeds, final accuracy minus dense's in points, steps to the target
#: over dense's or None: not reached). Rebuilt by :func:`reach_table` from
#: docs/results/frontier/summary.json (a test checks the copy).
FRONTIER_REACH: dict[int, dict[str, tuple[int, float, float | None]]] = {
    4: {
        "dense": (3, 0.0, 1.0),
        "gs-c40-m32": (3, -0.27, 1.16),
        "gs-c40-m32-pf8": (3, -0.32, 1.07),
        "gtopk": (3, -0.68, None),
        "topk": (3, -0.19, 1.16),
    },
    16: {
        "dense": (3, 0.0, 1.0),
        "gs-c16-m4-h-pf8": (3, -0.59, None),
        "gs-c16-m8-h-pf8": (3, -0.17, 1.44),
        "gs-c4-m8-h-pf8": (3, -0.34, 1.49),
        "gs-c40-m32": (3, -0.12, 1.31),
        "gs-c8-m8-h-pf8": (3, -0.21, 1.44),
        "gtopk": (3, -1.43, None),
        "topk": (3, 0.03, 1.26),
    },
    64: {
        "dense": (3, 0.0, 1.0),
        "gs-c16-m4-h-pf8": (3, -0.2, 1.28),
        "gs-c16-m8-h-pf8": (3, -0.2, 1.18),
        "gs-c4-m8-h-pf8": (3, -0.62, None),
        "gs-c40-m32": (3, -0.13, 1.17),
        "gs-c8-m8-h-pf8": (3, -0.35, 1.36),
        "gtopk": (3, -2.19, None),
        "topk": (3, -0.07, 1.11),
    },
    256: {
        "dense": (3, 0.0, 1.0),
        "gs-c16-m8-h-pf8": (3, -0.24, 1.74),
        "gtopk": (3, -2.91, None),
        "topk": (3, -0.27, 1.54),
    },
}


#: P -> fair-frontier row -> (seeds, final accuracy minus dense's in points, steps to the
#: target over dense's or None). Rows: ``dense`` (dense's best learning rate at that P),
#: ``dense16``, ``<row>@<density>`` for each sparse method with its default recipe
#: (:func:`frontier_row`: gs under its shape's name) and ``powersgd-r<rank>``. Rebuilt by
#: :func:`weak_reach_table` from docs/results/fair-frontier-mnist/summary.json (a test
#: checks the copy).
WEAK_REACH: dict[int, dict[str, tuple[int, float, float | None]]] = {
    16: {
        "dense": (3, 0.0, 1.0),
        "gs-c16-m8-h-pf8@0.001": (3, -0.35, 1.6),
        "gs-c16-m8-h-pf8@0.003": (3, -0.07, 1.28),
        "gtopk@0.01": (3, -0.46, 1.67),
        "powersgd-r1": (3, -0.57, None),
        "powersgd-r2": (3, 0.01, 1.31),
        "powersgd-r4": (3, -0.3, 1.6),
        "sketched@0.001": (3, -0.22, 1.42),
        "topk@0.001": (3, -0.46, 1.71),
    },
    64: {
        "dense": (3, 0.0, 1.0),
        "gs-c16-m8-h-pf8@0.001": (3, 0.02, 0.97),
        "gs-c16-m8-h-pf8@0.003": (3, 0.14, 0.86),
        "gtopk@0.003": (3, -0.76, None),
        "powersgd-r1": (3, 0.06, 0.98),
        "powersgd-r2": (3, 0.39, 0.66),
    },
}

@dataclass(frozen=True)
class Reach:
    """One candidate's measured convergence.

    Attributes:
        row: the frontier study's name for the method and shape it ran.
        workers: the P it was measured at (the nearest to the asked P).
        seeds: seeds behind it.
        gap_points: its final accuracy minus dense's, in points (negative: below).
        steps_ratio: steps to dense's accuracy target over dense's own steps to it; None
            when the study's run ended short of the target.
        study: which table answered: ``"weak scaling"`` (:data:`WEAK_REACH`) or
            ``"strong scaling"`` (:data:`FRONTIER_REACH`).
    """

    row: str
    workers: int
    seeds: int
    gap_points: float
    steps_ratio: float | None
    study: str = STRONG

    @property
    def reached(self) -> bool:
        return self.steps_ratio is not None

    def describe(self) -> str:
        """A few words for the report: ``1.33x dense's steps, P=64, 3 seeds, weak
        scaling``."""
        where = (f"P={self.workers}, {self.seeds} seed{'s' if self.seeds > 1 else ''}, "
                 f"{self.study}")
        if self.steps_ratio is None:
            return f"not reached, {self.gap_points:+.2f} pt, {where}"
        return f"{self.steps_ratio:.2f}x dense's steps, {where}"


#: A row counts with at least this many seeds (one seed's final accuracy moves by up to half
#: a point here: docs/study.md, "Many workers").
MIN_SEEDS = 3
#: The frontier study's model: the MNIST CNN's d, and its k at density 0.001.
STUDY_D, STUDY_K = 80_602, 81
_GS_ROW = re.compile(r"^gs-c\d+-m\d+(-h)?(-pf\d+)?$")


def reach_table(summary: dict[str, Any]) -> dict[int, dict[str, tuple[int, float, float | None]]]:
    """:data:`FRONTIER_REACH` from a frontier summary (``scripts/frontier_report.py``'s
    ``summary.json``, accuracy metric): every P that has a dense row (of
    :data:`MIN_SEEDS` seeds); the rows of the
    methods as they come (dense, dense16, topk, gtopk, sketched) and of gs's shapes
    (``gs``, the default of its day, under its shape's name: :func:`frontier_row`), each
    with its default warm-up and guard, and :data:`MIN_SEEDS` seeds or more; rounded to two
    decimals."""
    out: dict[int, dict[str, tuple[int, float, float | None]]] = {}
    for p, table in summary["by_P"].items():
        dense = table.get("dense")
        if dense is None or dense.get("steps_to_target") is None or dense["seeds"] < MIN_SEEDS:
            continue
        rows: dict[str, tuple[int, float, float | None]] = {}
        for name, row in sorted(table.items(), key=lambda kv: kv[0] == "gs"):
            if name == "gs":
                name = frontier_row(method_spec("gs", STUDY_D, k=STUDY_K, world_size=int(p)))
                if name in rows:  # the same shape ran under its own name too
                    continue
            elif name not in (
                "dense",
                "dense16",
                "topk",
                "gtopk",
                "sketched",
            ) and not _GS_ROW.match(name):
                continue  # without the warm-up or the guard: not what advise runs
            if row["seeds"] < MIN_SEEDS:
                continue
            rows[name] = _measured(row, dense)
        out[int(p)] = dict(sorted(rows.items()))
    return out


def weak_reach_table(
    summary: dict[str, Any],
) -> dict[int, dict[str, tuple[int, float, float | None]]]:
    """:data:`WEAK_REACH` from the fair frontier's summary (``scripts/fair_frontier_report.py``'s
    ``summary.json``): every P whose best dense learning rate (the ``dense-lr*`` row the
    others are measured against, ratio 1) has :data:`MIN_SEEDS` seeds; its rows of as many
    seeds, named as :func:`reach` looks them up; the variants without the default warm-up
    (``-nowu``, ``-wu<W>``) left out, as ``advise`` runs the default; rounded to two
    decimals."""
    out: dict[int, dict[str, tuple[int, float, float | None]]] = {}
    for p, table in summary["by_P"].items():
        dense = next((r for n, r in sorted(table.items()) if n.startswith("dense-lr")
                      and r.get("steps_to_target_over_dense") == 1.0), None)
        if dense is None or dense["seeds"] < MIN_SEEDS:
            continue
        rows: dict[str, tuple[int, float, float | None]] = {}
        for name, row in sorted(table.items()):
            key = _weak_row(name, int(p), dense is row)
            if key is None or row["seeds"] < MIN_SEEDS:
                continue
            measured = _measured(row, dense)
            if key not in rows or _sooner(measured, rows[key]):  # PowerSGD: its best lr
                rows[key] = measured
        out[int(p)] = dict(sorted(rows.items()))
    return out


def _measured(row: dict[str, Any], dense: dict[str, Any]) -> tuple[int, float, float | None]:
    """A summary row as a table entry: seeds, final accuracy minus dense's in points, steps
    to the target over dense's (None: not reached), rounded to two decimals."""
    ratio = row["steps_to_target_over_dense"]
    return (row["seeds"], round(100 * (row["accuracy"] - dense["accuracy"]), 2),
            None if ratio is None else round(ratio, 2))


def _sooner(a: tuple[int, float, float | None], b: tuple[int, float, float | None]) -> bool:
    """Whether measurement ``a`` reached the target in fewer steps than ``b`` (reached
    beats not reached; between two short of it, the smaller gap)."""
    if (a[2] is None) != (b[2] is None):
        return a[2] is not None
    return a[2] < b[2] if a[2] is not None and b[2] is not None else a[1] > b[1]


def _weak_row(name: str, workers: int, best_dense: bool) -> str | None:
    """A fair-frontier run name's row in :data:`WEAK_REACH`, or None: not one advise runs
    (a variant warm-up, dense at a learning rate other than its best). PowerSGD's runs at
    a learning rate of their own (``powersgd-lr0.05-r1``) share their rank's row, which
    keeps the better (:func:`_sooner`)."""
    family, _, level = name.rpartition("-")
    if family == "dense":
        return "dense" if best_dense else None
    if family.startswith("powersgd"):
        return f"powersgd-{level}"
    if family == "dense16":
        return family
    if "-" in family or not level.startswith("d"):
        return None  # gs-nowu, topk-wu0.02, ...
    density = float(level[1:])
    spec = method_spec(family, STUDY_D, density, world_size=workers)
    return f"{frontier_row(spec)}@{density:g}"


def frontier_row(spec: MethodSpec, *, streamed: bool = False) -> str:
    """The frontier study's name for what ``spec`` runs: the method (``dense16`` for a
    16-bit payload), or gs's shape as ``scripts/frontier_study.sh`` names its sizes,
    ``gs-c<cols/k>-m<m>[-h][-pf<f>]`` (the all-reduce's order does not change what is
    chosen, so it is not in the name).

    Args:
        streamed: the DDP hook streams gs, which sketches every coordinate (no pre-filter).
    """
    if spec.aggregator == "dense":
        return "dense16" if spec.value_bytes == 2 else "dense"
    if spec.aggregator != "gs" or not spec.exact:
        return spec.aggregator if spec.exact else f"{spec.aggregator}-estimate"
    prefilter = 0 if streamed else spec.prefilter
    return (
        f"gs-c{round(spec.cols / spec.k)}-m{spec.candidates}"
        + ("-h" if spec.table_bytes == 2 else "")
        + (f"-pf{prefilter}" if prefilter else "")
    )


def reach(
    spec: MethodSpec,
    workers: int,
    density: float,
    *,
    streamed: bool = False,
    table: dict[int, dict[str, tuple[int, float, float | None]]] | None = None,
    weak: dict[int, dict[str, tuple[int, float, float | None]]] | None = None,
) -> Reach | None:
    """The measured convergence of ``spec`` nearest to ``workers`` ranks, or None where no
    study has it: the fair frontier's row for this method at this density first, else the
    strong-scaling frontier's at density 0.001.

    The nearest measured P on a log scale that ran this row (ties: the larger P).

    Args:
        spec: the candidate.
        workers: the P asked about.
        density: the candidate's density.
        streamed: see :func:`frontier_row`.
        table: the strong-scaling measurements (default :data:`FRONTIER_REACH`).
        weak: the weak-scaling measurements (default :data:`WEAK_REACH`).
    """
    row = frontier_row(spec, streamed=streamed)
    measured = WEAK_REACH if weak is None else weak
    at = f"@{density:g}"
    if spec.aggregator != "dense" or any(n.endswith(at) for rows in measured.values()
                                         for n in rows):
        # dense is the reference at a density the study ran, not at others
        key = row if spec.aggregator == "dense" else row + at
        found = _nearest(measured, key, workers, WEAK)
        if found is not None:
            return found
    if not math.isclose(density, REACH_DENSITY, rel_tol=1e-6):
        return None
    return _nearest(FRONTIER_REACH if table is None else table, row, workers, STRONG)


def powersgd_reach(
    workers: int, weak: dict[int, dict[str, tuple[int, float, float | None]]] | None = None,
) -> Reach | None:
    """PowerSGD's lowest rank (its smallest message) that reached dense's accuracy at the
    nearest P of the fair frontier (None where no rank reached it or none ran): ``advise``
    cannot model its
    step (the message is ``rank·(n + m)`` per n x m matrix, which needs the layer shapes),
    so it names it beside its advice."""
    measured = WEAK_REACH if weak is None else weak
    ps = [p for p, rows in measured.items() if any(n.startswith("powersgd-r") for n in rows)]
    if not ps:
        return None
    p = min(ps, key=lambda q: (abs(math.log2(q / workers)), -q))
    reached = [(int(n.removeprefix("powersgd-r")), n) for n, r in measured[p].items()
               if n.startswith("powersgd-r") and r[2] is not None]
    if not reached:
        return None
    name = min(reached)[1]
    return Reach(name, p, *measured[p][name], study=WEAK)


def _nearest(
    measured: dict[int, dict[str, tuple[int, float, float | None]]], row: str, workers: int,
    study: str,
) -> Reach | None:
    ps = [p for p, rows in measured.items() if row in rows]
    if not ps:
        return None
    p = min(ps, key=lambda q: (abs(math.log2(q / workers)), -q))
    seeds, gap, ratio = measured[p][row]
    return Reach(row, p, seeds, gap, ratio, study)
