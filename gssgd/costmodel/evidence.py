"""What each method needed to reach dense's target, as one study measured it: the
convergence half of ``gssgd advise``.

A method's step time (:mod:`gssgd.costmodel.cluster`) says how fast it steps, not how far
each step gets. Each study file (``gssgd/costmodel/data/evidence/*.json``, written from the
study's committed summary by ``studies/cost_model/write_evidence.py``) holds, per worker count and
method row, the seeds, the final gap to dense and, where the study measured the crossing,
the steps to dense's target over dense's own. ``advise`` takes **one study** for the
model's family, of the model's architecture where one was measured (:func:`study_for`),
and looks each candidate up in it
(:func:`evidence_for`); it never mixes studies and never stretches one:

* another model family than the study's: "steps not measured";
* a worker count more than twice (or less than half) the nearest measured one that ran the
  row: "steps not measured";
* a density (or rank, or H) the study did not run at any P: "steps not measured", and
  what the study measured of the same method at the nearest P (how many of its settings
  reached the target, the best of them): a faster step of an unmeasured setting is no
  promise when every measured setting of its method fell short.

A candidate without evidence is ranked by its time per step alone (the run of dense's
steps), marked so; one measured short of the target is ranked after all others, and so is
one the study did not run whose method's every measured setting at the nearest P fell
short (``Evidence.kin_missed``).

Rows are named as the studies name them: ``dense``, ``dense16``, ``powersgd-r<rank>``,
``diloco-h<H>`` and ``<row>@<density>`` for the sparse methods, where ``<row>`` is the
method, or gs's shape (:func:`frontier_row`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gssgd.costmodel import store
from gssgd.costmodel.method_specs import MethodSpec

__all__ = ["FAMILIES", "Evidence", "Study", "evidence_for", "frontier_row", "row_key",
           "studies", "study_for"]

#: Model families: what a study's model and ``advise``'s model are compared by.
FAMILIES: tuple[str, ...] = ("image", "language")
#: The nearest measured P counts within this factor of the P asked about.
MAX_P_FACTOR = 2.0


@dataclass(frozen=True)
class Study:
    """One study's evidence file.

    Attributes:
        name: the file's name (without ``.json``).
        title: what was measured, in a few words (model, protocol).
        family: the model family (:data:`FAMILIES`).
        metric: ``"steps"`` (steps to the target over dense's) or ``"final_gap"`` (final
            loss above dense's, in %; the crossing was not measured).
        target: the target in words ("dense - 0.5 point", "dense's loss + 3 %").
        target_gap: for ``final_gap``: the largest gap that reaches the target (%).
        rows: P -> row -> ``{"seeds", "gap", "steps_ratio"}`` and ``"trial": true`` for
            a setting only one trial of a search ran (``gap``: accuracy points
            against dense for an image family, loss % above dense for the language family).
        source: the summary it was written from.
        architecture: the model's architecture (``"lstm"``, ``"transformer"``, ``"cnn"``;
            :data:`gssgd.costmodel.architectures.MODEL_ARCHITECTURES`; "" where unsaid).
    """

    name: str
    title: str
    family: str
    metric: str
    target: str
    rows: dict[int, dict[str, dict[str, Any]]]
    target_gap: float | None = None
    source: str = ""
    #: the studies this one replaces (advise reads this one instead; they stay for history)
    supersedes: tuple[str, ...] = ()
    architecture: str = ""

    @classmethod
    def load(cls, name: str) -> Study:
        data = store.load(name)
        rows = {int(p): dict(r) for p, r in data["rows"].items()}
        return cls(name.removeprefix("evidence/").removesuffix(".json"), data["title"],
                   data["family"], data["metric"], data["target"], rows,
                   data.get("target_gap"), data.get("source", ""),
                   tuple(data.get("supersedes", ())), data.get("architecture", ""))


@dataclass(frozen=True)
class Evidence:
    """One candidate's measured convergence, or why there is none.

    Attributes:
        study: the study asked (None: none of the model's family).
        row: the row looked up.
        workers: the P it was measured at (None: not measured).
        seeds, gap: the measurement (see :class:`Study`).
        steps_ratio: steps to the target over dense's (None: not measured, or not reached).
        reached: whether it reached the target (None: not measured).
        why: why not measured ("" when measured).
        trial: the row is one trial of a study's search, not a best re-run at every seed
            (one seed, at the learning rate that trial drew: weaker evidence, said so).
        kin: for a row the study did not run: what it measured of the same method
            (:func:`measured_kin`; "" where nothing).
        kin_missed: for a row the study did not run: its method's every measured setting
            at the nearest P missed the target (ranked with the misses).
    """

    study: Study | None
    row: str
    workers: int | None = None
    seeds: int = 0
    gap: float | None = None
    steps_ratio: float | None = None
    reached: bool | None = None
    why: str = ""
    trial: bool = False
    kin: str = ""
    kin_missed: bool = False

    @property
    def measured(self) -> bool:
        return self.workers is not None

    def describe(self) -> str:
        """A few words for the report."""
        if not self.measured:
            return f"steps not measured: {self.why}" + (f"; {self.kin}" if self.kin else "")
        assert self.study is not None and self.gap is not None
        where = f"{self.study.title}, P={self.workers}, " + (
            "one trial of its search (one seed and learning rate)" if self.trial
            else f"{self.seeds} seed{'s' * (self.seeds > 1)}")
        if self.study.metric == "final_gap" and self.steps_ratio is None:
            verdict = "within" if self.reached else "beyond"
            return (f"final loss {self.gap:+.1f} % ({verdict} the target), steps not "
                    f"measured; {where}")
        if not self.reached:
            unit = " %" if self.study.family == "language" else " pt"
            return f"not reached, {self.gap:+.2f}{unit}; {where}"
        return f"{self.steps_ratio:.2f}x dense's steps; {where}"


def studies() -> list[Study]:
    """Every evidence file of the package."""
    return [Study.load(name) for name in store.evidence_names()]


def study_for(family: str, architecture: str | None = None) -> Study | None:
    """The one study ``advise`` reads for a model of ``family``: of those no other study
    supersedes, the first by name of the model's ``architecture`` where one measured it,
    else the family's first by name; None where no study measured that family."""
    every = studies()
    superseded = {name for s in every for name in s.supersedes}
    found = [s for s in every if s.family == family and s.name not in superseded]
    same = [s for s in found if architecture and s.architecture == architecture]
    return (same or found or [None])[0]


def frontier_row(spec: MethodSpec, *, streamed: bool = False) -> str:
    """The studies' name for what ``spec`` runs: the method (``dense16`` for a 16-bit
    payload), or gs's shape ``gs-c<cols/k>-m<m>[-h][-pf<f>]`` (the all-reduce's order does
    not change what is chosen, so it is not in the name).

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


def row_key(spec: MethodSpec, density: float, *, streamed: bool = False,
            local_steps: int | None = None) -> str:
    """The study row of ``spec`` at ``density`` (see the module doc)."""
    if local_steps:
        return f"diloco-h{local_steps}"
    if spec.aggregator == "powersgd":
        return f"powersgd-r{spec.rank}"
    row = frontier_row(spec, streamed=streamed)
    return row if spec.aggregator == "dense" else f"{row}@{density:g}"


def method_of(row: str) -> str:
    """The method a study row runs: ``gs`` for every gs shape, ``powersgd`` for every rank,
    ``diloco`` for every H, ``topk`` for ``topk@0.01``; an estimate without the exact
    second round (``topk-estimate``) is a method of its own (see the module doc)."""
    name = row.split("@")[0]
    return name if name.endswith("-estimate") else name.split("-")[0]


#: :func:`_kin`'s answer: the P, the method's rows there, those that reached the target.
_Kin = tuple[int, dict[str, dict[str, Any]], dict[str, dict[str, Any]]]


def _kin(study: Study, row: str, workers: int) -> _Kin | None:
    """``row``'s method's rows at the measured P nearest ``workers`` (within 2x): (that P,
    its rows, those that reached the target); None where the study measured none."""
    method = method_of(row)
    ps = [p for p, rows in study.rows.items()
          if any(method_of(r) == method for r in rows)
          and max(p / workers, workers / p) <= MAX_P_FACTOR]
    if not ps:
        return None
    p = min(ps, key=lambda q: (abs(math.log2(q / workers)), -q))
    kin = {r: v for r, v in study.rows[p].items() if method_of(r) == method}
    reached = {r: v for r, v in kin.items() if evidence_for(study, r, p, study.family).reached}
    return p, kin, reached


def measured_kin(study: Study, row: str, found: _Kin | None) -> str:
    """What ``study`` measured of ``row``'s method (:func:`_kin`'s answer ``found``, at the
    P nearest the one asked about), in words: how many of its settings reached the target
    and the best of them (the fewest steps; where none reached, the smallest gap). ""
    where it measured none.

    Example: ``"its measured powersgd settings at P=16: none of 3 reached the target
    (closest: powersgd-r8, +8.30 %)"``.
    """
    if found is None:
        return ""
    p, kin, reached = found
    head = f"its measured {method_of(row)} settings at P={p}:"
    # a loss gap is better smaller, an accuracy gap (points against dense) larger
    sign = 1 if study.family == "language" else -1
    if reached:  # the fewest steps; where a study measured none (final gaps), the best gap
        best = min(reached, key=lambda r: (reached[r]["steps_ratio"] is None,
                                           reached[r]["steps_ratio"] or 0.0,
                                           sign * reached[r]["gap"], r))
        ratio = reached[best]["steps_ratio"]
        how = "" if ratio is None else f", {ratio:.2f}x dense's steps"
        return f"{head} {len(reached)} of {len(kin)} reached the target (best: {best}{how})"
    closest = min(kin, key=lambda r: (sign * kin[r]["gap"], r))
    unit = " %" if study.family == "language" else " pt"
    return (f"{head} none of {len(kin)} reached the target (closest: {closest}, "
            f"{kin[closest]['gap']:+.2f}{unit})")


def evidence_for(study: Study | None, row: str, workers: int, family: str) -> Evidence:
    """The measurement of ``row`` nearest to ``workers`` in ``study`` (see the module doc).

    Args:
        study: the family's study (:func:`study_for`), or None.
        row: the candidate's row (:func:`row_key`).
        workers: the P asked about.
        family: the model's family.
    """
    if study is None or study.family != family:
        return Evidence(study, row, why=f"no study of a {family} model")
    ps = [p for p, rows in study.rows.items() if row in rows]
    if not ps:
        found = _kin(study, row, workers)
        return Evidence(study, row, why=f"{row} was not run in {study.name}",
                        kin=measured_kin(study, row, found),
                        kin_missed=found is not None and not found[2])
    p = min(ps, key=lambda q: (abs(math.log2(q / workers)), -q))
    if max(p / workers, workers / p) > MAX_P_FACTOR:
        return Evidence(study, row, why=f"P={workers} is beyond 2x the nearest measured P={p}")
    r = study.rows[p][row]
    reached = (r["steps_ratio"] is not None if study.metric == "steps"
               else r["gap"] <= (study.target_gap or 0.0))
    return Evidence(study, row, p, r["seeds"], r["gap"], r["steps_ratio"], reached,
                    trial=bool(r.get("trial")))
