"""What each method needed to reach dense's target, as one study measured it: the
convergence half of ``gssgd advise``, kept apart from the step model's half.

A method's step time (:mod:`gssgd.costmodel.cluster`) says how fast it steps, not how far
each step gets. Each study file (``gssgd/costmodel/data/evidence/*.json``, written from the
study's committed summaries by ``studies/cost_model/write_evidence.py`` with
:func:`study_from_summaries`, which also reads a user's own ``gssgd study`` for ``advise
--evidence``) holds, per worker count and method row, the seeds, the final gap to dense and
the steps to dense's target over dense's own, with the model's size at each P and the
study's caveats. ``advise`` takes **one study** for the model's family, of the model's
architecture where one was measured (:func:`study_for`), and looks each candidate up in it
(:func:`evidence_for`):

* another model family than the study's: not measured;
* a row the study did not run: not measured, with what the study measured of the same
  method at the nearest P (how many of its settings reached the target, the best of them);
* a row it ran: **reached** only where it reached the target at *every* P the study ran it
  at, so that the verdict does not change between neighbouring worker counts; its steps
  ratio interpolated in ``log P`` between the measured P's around the one asked about
  (the nearest one's outside them);
* the **distance** of the evidence: how far (a factor) the nearest measured P and the
  study's model size are from the job's, and the penalty it adds to the tie margin
  (:data:`PENALTY_PER_DOUBLING` per doubling of workers, :data:`PENALTY_PER_DECADE` per
  tenfold in size; a judgement, not a fit), which grows continuously with the distance.

Rows are named as the studies name them: ``dense``, ``dense16``, ``powersgd-r<rank>``,
``diloco-h<H>`` and ``<row>@<density>`` for the sparse methods, where ``<row>`` is the
method, or gs's shape (:func:`frontier_row`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gssgd.costmodel import store
from gssgd.costmodel.method_specs import MethodSpec, method_spec
from gssgd.methods import REFERENCE_METHOD, SUBJECT_METHOD, get_method
from gssgd.target import LOSS

__all__ = ["FAMILIES", "PENALTY_PER_DECADE", "PENALTY_PER_DOUBLING", "Evidence", "Study",
           "evidence_for", "frontier_row", "method_of", "row_key", "studies",
           "study_for", "study_from_summaries"]

#: Model families: what a study's model and ``advise``'s model are compared by.
FAMILIES: tuple[str, ...] = ("image", "language")
#: The tie margin's evidence penalty per doubling of workers between the job and the
#: nearest measured P, and per tenfold between the job's size and the study model's.
PENALTY_PER_DOUBLING = 0.05
PENALTY_PER_DECADE = 0.05


@dataclass(frozen=True)
class Study:
    """One study's evidence.

    Attributes:
        name: the file's name (without ``.json``), or the user's study's.
        title: what was measured, in a few words (model, protocol).
        family: the model family (:data:`FAMILIES`).
        metric: ``"steps"`` (steps to the target over dense's) or ``"final_gap"`` (final
            loss above dense's, in %; the crossing was not measured).
        target: the target in words ("dense - 0.5 point", "dense's loss + 3 %").
        rows: P -> row -> ``{"seeds", "gap", "steps_ratio"}`` and ``"trial": true`` for
            a setting only one trial of a search ran (``gap``: accuracy points
            against dense for an image family, loss % above dense for the language family).
        target_gap: for ``final_gap``: the largest gap that reaches the target (%).
        source: the summary it was written from.
        supersedes: the studies this one replaces (advise reads this one instead).
        architecture: the model's architecture (``"lstm"``, ``"transformer"``, ``"cnn"``;
            :data:`gssgd.train.models.MODEL_ARCHITECTURES`; "" where unsaid).
        d: P -> the study model's parameter count there.
        caveats: what weakens the study's evidence, in words (printed with it).
    """

    name: str
    title: str
    family: str
    metric: str
    target: str
    rows: dict[int, dict[str, dict[str, Any]]]
    target_gap: float | None = None
    source: str = ""
    supersedes: tuple[str, ...] = ()
    architecture: str = ""
    d: dict[int, int] = dataclasses.field(default_factory=dict)
    caveats: tuple[str, ...] = ()

    @classmethod
    def from_record(cls, name: str, data: dict[str, Any]) -> Study:
        """A study from its JSON record (an evidence file's content)."""
        return cls(name, data["title"], data["family"], data["metric"], data["target"],
                   {int(p): dict(r) for p, r in data["rows"].items()},
                   data.get("target_gap"), data.get("source", ""),
                   tuple(data.get("supersedes", ())), data.get("architecture", ""),
                   {int(p): int(v) for p, v in data.get("d", {}).items()},
                   tuple(data.get("caveats", ())))

    @classmethod
    def load(cls, name: str) -> Study:
        """The package's evidence file ``name``."""
        return cls.from_record(name.removeprefix("evidence/").removesuffix(".json"),
                               store.load(name))

    def reached(self, row: dict[str, Any]) -> bool:
        """Whether a measured row reached the target: the study found its crossing, or (a
        final-gap study, a language family's: its gaps are % of dense's loss) the studies' rule
        (:data:`gssgd.target.LOSS`) at the study's margin holds for its final loss."""
        if self.metric == "steps":
            return row["steps_ratio"] is not None
        rule = dataclasses.replace(LOSS, margin=(self.target_gap or 0.0) / 100)
        return rule.reaches(1 + row["gap"] / 100, 1.0)  # dense's loss as the unit


@dataclass(frozen=True)
class Evidence:
    """One candidate's measured convergence, or why there is none.

    Attributes:
        study: the study asked (None: none of the model's family).
        row: the row looked up.
        workers: the measured P nearest the one asked about (None: not measured).
        seeds, gap: the measurement there (see :class:`Study`).
        steps_ratio: steps to the target over dense's, interpolated in ``log P`` between
            the measured P's (None: not measured, not reached, or a final-gap study).
        reached: reached the target at every P the study ran the row at (None: not
            measured).
        missed_at: the P's where it was measured short of the target.
        why: why not measured ("" when measured).
        trial: the row is one trial of a study's search, not a best re-run at every seed.
        kin: for a row the study did not run: what it measured of the same method.
        p_factor, d_factor: how far the job is from the measurement (>= 1; 1: the same).
    """

    study: Study | None
    row: str
    workers: int | None = None
    seeds: int = 0
    gap: float | None = None
    steps_ratio: float | None = None
    reached: bool | None = None
    missed_at: tuple[int, ...] = ()
    why: str = ""
    trial: bool = False
    kin: str = ""
    p_factor: float = 1.0
    d_factor: float = 1.0

    @property
    def measured(self) -> bool:
        return self.workers is not None

    @property
    def penalty(self) -> float:
        """The tie margin this evidence's distance adds (see the module doc; 0 for the
        reference, dense, whose steps define the target)."""
        if self.row == REFERENCE_METHOD:
            return 0.0
        return (PENALTY_PER_DOUBLING * math.log2(self.p_factor)
                + PENALTY_PER_DECADE * math.log10(self.d_factor))

    @property
    def confidence(self) -> str:
        """``close``, ``fair`` or ``far``, by :attr:`penalty` (at most 5 %, 15 %, more)."""
        return "close" if self.penalty <= 0.05 else "fair" if self.penalty <= 0.15 else "far"

    def distance(self) -> str:
        """The distance in words: ``P=16 (2.0x the workers), d 317x`` or ``same P and d``."""
        parts = []
        if self.p_factor > 1:
            parts.append(f"{self.p_factor:.3g}x the workers")
        if self.d_factor > 1.01:
            parts.append(f"{self.d_factor:.3g}x the size")
        return ", ".join(parts) or "same P and size"

    def describe(self) -> str:
        """A few words for the report."""
        if not self.measured:
            return f"quality not measured: {self.why}" + (f"; {self.kin}" if self.kin else "")
        assert self.study is not None and self.gap is not None
        where = (f"P={self.workers}, " + ("one trial (one seed)" if self.trial
                                          else f"{self.seeds} seed{'s' * (self.seeds > 1)}")
                 + ("; the reference" if self.row == REFERENCE_METHOD
                    else f"; {self.confidence}: {self.distance()}"))
        if not self.reached:
            unit = " %" if self.study.family == "language" else " pt"
            at = ", ".join(f"P={p}" for p in self.missed_at)
            return f"missed the target at {at} ({self.gap:+.2f}{unit} at P={self.workers}); {where}"
        if self.steps_ratio is None:
            return f"final loss {self.gap:+.1f} % (within the target), steps not measured; {where}"
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
    payload, ``gtopk-tree`` for gTop-k as its authors' code runs it), or gs's shape
    ``gs-c<cols/k>-m<m>[-h][-pf<f>]`` (the all-reduce's order does not change what is
    chosen, so it is not in the name).

    Args:
        streamed: the DDP hook streams gs, which sketches every coordinate (no pre-filter).
    """
    if get_method(spec.aggregator).uncompressed:  # dense, or dense16 with a 16-bit payload
        return f"{spec.aggregator}16" if spec.value_bytes == 2 else spec.aggregator
    if spec.exchange == "tree":  # the authors' gTop-k keeps another residual: its own row
        return f"{spec.aggregator}-tree"
    if spec.aggregator != SUBJECT_METHOD or not spec.exact:  # the studies searched gs's shape
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
    method = get_method(spec.aggregator)
    if method.by_shape:
        return f"{spec.aggregator}-r{spec.rank}"
    row = frontier_row(spec, streamed=streamed)
    return row if method.uncompressed else f"{row}@{density:g}"


def method_of(row: str) -> str:
    """The method a study row runs: ``gs`` for every gs shape, ``powersgd`` for every rank,
    ``diloco`` for every H, ``topk`` for ``topk@0.01``; an estimate without the exact
    second round (``topk-estimate``) is a method of its own (see the module doc)."""
    name = row.split("@")[0]
    return name if name.endswith("-estimate") else name.split("-")[0]


def _nearest(ps: Sequence[int], workers: int) -> int:
    """The P of ``ps`` nearest ``workers`` on a log scale (the larger on a tie)."""
    return min(ps, key=lambda q: (abs(math.log2(q / workers)), -q))


def measured_kin(study: Study, row: str, workers: int) -> str:
    """What ``study`` measured of ``row``'s method at the P nearest ``workers``, in words:
    how many of its settings reached the target and the best of them (the fewest steps;
    where none reached, the smallest gap). "" where it measured none.

    Example: ``"its measured powersgd settings at P=16: none of 3 reached the target
    (closest: powersgd-r8, +8.30 %)"``.
    """
    method = method_of(row)
    ps = [p for p, rows in study.rows.items() if any(method_of(r) == method for r in rows)]
    if not ps:
        return ""
    p = _nearest(ps, workers)
    kin = {r: v for r, v in study.rows[p].items() if method_of(r) == method}
    reached = {r: v for r, v in kin.items() if study.reached(v)}
    head = f"its measured {method} settings at P={p}:"
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


def _interpolated_ratio(at: dict[int, dict[str, Any]], workers: int) -> float | None:
    """The steps ratio at ``workers``, linear in ``log P`` between the measured P's around
    it, the nearest one's outside them (None where a P's is missing)."""
    ratios = {p: r["steps_ratio"] for p, r in at.items()}
    if any(v is None for v in ratios.values()):
        return None
    below = [p for p in ratios if p <= workers]
    above = [p for p in ratios if p >= workers]
    if not below or not above:
        return ratios[_nearest(list(ratios), workers)]
    lo, hi = max(below), min(above)
    if lo == hi:
        return ratios[lo]
    t = math.log(workers / lo) / math.log(hi / lo)
    return round(ratios[lo] + t * (ratios[hi] - ratios[lo]), 4)


def evidence_for(study: Study | None, row: str, workers: int, family: str,
                 params: int | None = None) -> Evidence:
    """The measurement of ``row`` for a job of ``workers`` workers and ``params``
    parameters in ``study`` (see the module doc).

    Args:
        study: the family's study (:func:`study_for`), or None.
        row: the candidate's row (:func:`row_key`).
        workers: the P asked about.
        family: the model's family.
        params: the job's model size (None: the distance in size is not counted).
    """
    if study is None or study.family != family:
        return Evidence(study, row, why=f"no study of a {family} model")
    at = {p: rows[row] for p, rows in sorted(study.rows.items()) if row in rows}
    if not at:
        return Evidence(study, row, why=f"{row} was not run in {study.name}",
                        kin=measured_kin(study, row, workers))
    p = _nearest(list(at), workers)
    missed = tuple(q for q, r in at.items() if not study.reached(r))
    d = study.d.get(p)
    r = at[p]
    return Evidence(
        study, row, p, r["seeds"], r["gap"],
        None if missed else _interpolated_ratio(at, workers), not missed, missed,
        trial=bool(r.get("trial")),
        p_factor=max(p / workers, workers / p),
        d_factor=1.0 if not (d and params) else max(d / params, params / d))


# --------------------------------------------------------------------------- from summaries


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _study_row(m: dict[str, Any], setting: dict[str, Any], d: int, workers: int) -> str:
    """A study's method ``m`` at ``setting`` (its best, or one of its trials) as advise
    names it (:func:`row_key`)."""
    setting, method = {**m["fixed"], **setting}, get_method(m["method"])
    if method.uncompressed:
        if setting.get("local_steps"):
            return f"diloco-h{setting['local_steps']}"
        return method.name + ("16" if setting.get("payload_dtype") == "float16" else "")
    if method.by_shape:
        return f"{method.name}-r{setting.get('powersgd_rank', 2)}"
    density = setting["density"]
    spec = method_spec(m["method"], d, density, world_size=workers,
                       cols=setting.get("cols"), candidates=setting.get("candidates"))
    if "prefilter" in setting:  # a searched shape is named as it ran, not as the default
        spec = dataclasses.replace(spec, prefilter=setting["prefilter"])
    chunk = setting.get("chunk")
    return row_key(spec, density) + (f"-chunk{chunk}" if chunk else "")


def _trial_rank(trial: dict[str, Any], metric: str) -> tuple[bool, int, float]:
    """A search's trials best first: reached the target (in fewer steps), then the better
    final value."""
    final = -trial["final"] if metric == "accuracy" else trial["final"]
    return (trial["steps"] is None, trial["steps"] or 0, final)


def _ratio(steps: int | None, ref_steps: int | None) -> float | None:
    """Steps to the target over the reference's (None: never reached)."""
    return None if steps is None or not ref_steps else _round(steps / ref_steps)


def _gap(final: float, ref: dict[str, Any], metric: str) -> float | None:
    """A final value against the reference's mean: accuracy points, or loss % above."""
    if metric == "accuracy":
        return _round(100 * (final - ref["final"]["mean"]))
    return round(100 * (final / ref["final"]["mean"] - 1), 1)


def _caveats(summary: dict[str, Any]) -> list[str]:
    """What weakens one summary's evidence: a small search, and bests at an edge of the
    learning rates tried (their optimum may lie outside the range)."""
    p = summary["run"]["workers"]
    out = []
    budget = summary.get("budget_per_method")
    if budget is not None and budget <= 3:
        out.append(f"P={p}: {budget} trials per method")
    edge = []
    for m in summary["methods"]:
        rates = {t["setting"].get("lr") for t in m["trials"]} - {None}
        best = m["best_setting"].get("lr")
        if len(rates) > 1 and best in (min(rates), max(rates)):
            edge.append(f"{m['label']} ({'lowest' if best == min(rates) else 'highest'})")
    if edge:
        out.append(f"P={p}: {len(edge)} of {len(summary['methods'])} methods' best learning "
                   f"rate is an edge of those tried, their optimum may lie beyond: "
                   + ", ".join(edge))
    return out


def study_from_summaries(title: str, summaries: Sequence[dict[str, Any]], family: str,
                         *, architecture: str = "", source: str = "",
                         supersedes: Sequence[str] = ()) -> dict[str, Any]:
    """A study's evidence record from ``gssgd study``'s summaries of one model (one per P):
    each method's best setting (its seeds' mean curve), steps to the target over the
    reference's, and its final gap (accuracy points; for a loss, % above the reference's);
    then each other setting its search tried, as a one-seed row (where it names a row the
    best did not: a DiLoCo H or a density that lost is evidence too); the model's size at
    each P; the caveats. Compressed outer steps (local steps with a sparse method) are not
    advise candidates and are left out.

    Raises:
        ValueError: no summaries, or a summary without its reference method.
    """
    if not summaries:
        raise ValueError("no study summaries to read: give a gssgd study --out folder")
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    sizes: dict[str, int] = {}
    caveats: list[str] = []
    metric = summaries[0]["metric"]
    for summary in summaries:
        p, d = summary["run"]["workers"], summary["d"]
        label = summary["reference"]["label"]
        ref = next((m for m in summary["methods"] if m["label"] == label), None)
        if ref is None:
            raise ValueError(f"the study {summary.get('study')!r} has no row of its "
                             f"reference method {label!r}")
        out: dict[str, dict[str, Any]] = {}
        ref_steps = ref["to_target"]["steps"]
        for m in summary["methods"]:
            if ({**m["fixed"], **m["best_setting"]}.get("local_steps")
                    and not get_method(m["method"]).uncompressed):
                continue  # a compressed outer step
            if m["final"]["mean"] is not None:
                out[_study_row(m, m["best_setting"], d, p)] = {
                    "seeds": len(m["seeds"]), "gap": _gap(m["final"]["mean"], ref, metric),
                    "steps_ratio": _ratio(m["to_target"]["steps"], ref_steps)}
            finished = [t for t in m["trials"] if t["final"] is not None]
            for trial in sorted(finished, key=lambda t: _trial_rank(t, metric)):
                row = _study_row(m, trial["setting"], d, p)  # one seed each, the best
                if row not in out:                          # trial where a row repeats
                    out[row] = {"seeds": 1, "gap": _gap(trial["final"], ref, metric),
                                "steps_ratio": _ratio(trial["steps"], ref_steps), "trial": True}
        rows[str(p)] = dict(sorted(out.items()))
        sizes[str(p)] = d
        caveats += _caveats(summary)
    margin = 100 * summaries[0]["reference"]["margin"]
    target = (f"dense's mean accuracy - {margin:g} point" if metric == "accuracy"
              else f"dense's mean loss + {margin:g} %")
    return {"title": title, "family": family, "metric": "steps", "target": target,
            "source": source, "rows": rows, "supersedes": list(supersedes),
            "architecture": architecture, "d": sizes, "caveats": caveats}
