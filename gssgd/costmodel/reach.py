"""How many steps each method needs to reach dense's accuracy: the convergence half of
``gssgd advise``, measured by the many-workers frontier study.

A method's step time (:mod:`gssgd.costmodel.cluster`) says how fast it steps, not how far
each step gets. The frontier study (``scripts/frontier_study.sh``, docs/study.md, "Many
workers") trained the MNIST CNN at density 0.001 with every method at P = 4, 16, 64 and
256 (a simulated world, global batch fixed) and recorded when the mean curve over seeds
came within 0.5 point of dense's final accuracy (interpolated between evaluations).
``advise`` multiplies a candidate's predicted step by its **steps to that target as a
multiple of dense's own**, and ranks the candidates that reached it by that time; those
the study measured short of it (gTop-k at every P) come after them, with their final gap.

The table is a copy, rounded, of ``docs/results/frontier/summary.json`` (the results are
not installed with the package): ``tests/costmodel/test_reach.py`` rebuilds it from that
file with :func:`reach_table` and fails when they differ. To refresh it after a new study,
run ``scripts/frontier_report.py`` and paste what :func:`reach_table` returns.

What it is and is not: one model (the MNIST CNN) at one density (0.001), rows of
:data:`MIN_SEEDS` seeds (P = 4, 16, 64 and 256), evaluated every 100
of 400 steps, so two ratios 10-20 % apart are within what the study resolves; at other
densities :func:`reach` returns None and ``advise`` ranks by the step alone. Any P takes the
nearest measured P that ran the same method and shape (on a log scale), which the report
names.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from gssgd.costmodel.method_specs import MethodSpec, method_spec

__all__ = ["FRONTIER_REACH", "REACH_DENSITY", "Reach", "frontier_row", "reach", "reach_table"]

#: The density the frontier study measured at; :func:`reach` answers only there.
REACH_DENSITY = 0.001
#: What the ratio is measured on, for the reports.
REACH_WHERE = "MNIST CNN, density 0.001, within 0.5 point of dense (frontier study)"

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
    """

    row: str
    workers: int
    seeds: int
    gap_points: float
    steps_ratio: float | None

    @property
    def reached(self) -> bool:
        return self.steps_ratio is not None

    def describe(self) -> str:
        """A few words for the report: ``1.33x dense's steps, P=64, 3 seeds``."""
        where = f"P={self.workers}, {self.seeds} seed{'s' if self.seeds > 1 else ''}"
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
            ratio = row["steps_to_target_over_dense"]
            rows[name] = (
                row["seeds"],
                round(100 * (row["accuracy"] - dense["accuracy"]), 2),
                None if ratio is None else round(ratio, 2),
            )
        out[int(p)] = dict(sorted(rows.items()))
    return out


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
) -> Reach | None:
    """The measured convergence of ``spec`` nearest to ``workers`` ranks, or None where the
    study has none (another density, or a shape it did not run).

    The nearest measured P on a log scale that ran this row (ties: the larger P).

    Args:
        spec: the candidate.
        workers: the P asked about.
        density: the candidate's density; only :data:`REACH_DENSITY` is measured.
        streamed: see :func:`frontier_row`.
        table: the measurements (default :data:`FRONTIER_REACH`).
    """
    if not math.isclose(density, REACH_DENSITY, rel_tol=1e-6):
        return None
    measured = FRONTIER_REACH if table is None else table
    row = frontier_row(spec, streamed=streamed)
    ps = [p for p, rows in measured.items() if row in rows]
    if not ps:
        return None
    p = min(ps, key=lambda q: (abs(math.log2(q / workers)), -q))
    seeds, gap, ratio = measured[p][row]
    return Reach(row, p, seeds, gap, ratio)
