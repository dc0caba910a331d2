"""A study's summary: each method's best setting over its seeds, who reaches the target
with the fewest bytes and in the least modeled time, and whether that ranking holds.

For each method (its best setting, every seed):

- ``final``: the final test value's seed band (mean, min, max; a seed that stopped early,
  diverged or collapsed, is counted in ``failed`` and the method does not reach the target);
- ``end`` and ``gap``: each seed's end value (the mean of its last ``target.window``
  evaluations) and its gap to dense (points of accuracy, or % of the loss), as seed bands;
  the method **reaches** the target when its mean end value does;
- ``to_target``: steps and busiest-link bytes until the **seeds' mean curve** reaches the
  target **and stays** there (:func:`~gssgd.study.curves.reach_and_stay`: a first touch
  that falls back does not count; the crossing interpolated between evaluations), and each
  seed's own;
- ``modeled_s``: the modeled seconds to the target at 1 and 10 Gbit/s
  (:mod:`gssgd.study.modeled_time`);
- ``budget``: the trials its search ran (the same for every method), and its best setting;
- with an lr grid (``sampler = "lr-grid"``): ``lr_extensions``, the rates its search added
  past an edge of the grid, and ``best_on_edge``, whether its best still sits on an edge of
  the rates tried for its setting (the extension cap reached); the summary's ``design``
  gives the grid, the cap, the runs trained and the methods still on an edge;
- ``run_bytes``: the busiest link's bytes over the whole run (the seeds' mean), and
  ``reduction``: the reference's over this method's (how many times fewer bytes it sent
  for the same steps, DeMo's and SparseLoCo's measure).

``largest_reduction``: of the methods whose mean end value reaches the target, the one
with the largest ``reduction`` (None: none but the reference).

``reference`` also holds dense's ``seed_spread`` (its seeds' end values, highest less
lowest, in the gap's unit) and ``margin_inside_noise``: the target's margin is smaller
than that spread, so reaching or missing it is inside dense's own noise.

**Ranking** (by bytes, and by modeled time at each link): methods whose mean curve reaches
the target, fewest first. The leader's lead is a **tie** when either

1. the seed bands of the leader's and the runner-up's bytes to the target overlap (or a
   seed of either misses the target), or
2. the leader's second-best setting in its search (its neighbour: the next setting the
   search found) does not beat the runner-up's best on the search seed,

so a ranking that rests on one lucky seed or one exact setting is not called a win.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from gssgd.study.curves import Metric, reach_and_stay
from gssgd.study.modeled_time import LINKS, ModeledStep, modeled_step
from gssgd.study.spec import StudySpec
from gssgd.study.trials import Outcome

__all__ = ["summarise"]


def _band(values: list[float | None]) -> dict[str, Any]:
    """The seeds' mean, min and max, and how many seeds stopped early (left out)."""
    got = [v for v in values if v is not None]
    if not got:
        return {"mean": None, "low": None, "high": None, "failed": len(values)}
    return {"mean": statistics.mean(got), "low": min(got), "high": max(got),
            "failed": len(values) - len(got)}


def _method_row(spec: StudySpec, label: str, found: dict[str, Any], metric: Metric,
                dense: float, d: int) -> dict[str, Any]:
    """One method's summary row (see the module doc)."""
    row = spec.method(label)
    params, _ = found["trials"][found["best"]]
    seeds: dict[int, Outcome] = found["seeds"]
    steps, sent = (None, None) if any(o.failed for o in seeds.values()) else \
        reach_and_stay([o.curve for o in seeds.values()], metric, dense)
    ends = [o.end for o in seeds.values()]
    model = modeled_step(row.method, d, spec.run["workers"], {**spec.run, **row.fixed, **params})
    return {
        "label": label,
        "method": row.method,
        "budget": len(found["trials"]),
        "best_setting": params,
        "fixed": row.fixed,
        "final": _band([o.final for o in seeds.values()]),
        "end": _band(ends),
        "gap": _band([None if e is None else metric.gap(e, dense) for e in ends]),
        "seeds": sorted(seeds),
        "to_target": {"steps": steps, "bytes": sent,
                      "by_seed": [_reach(o) for _, o in sorted(seeds.items())]},
        "modeled_step": {"fixed_s": model.fixed, "s_per_byte": model.per_byte},
        "modeled_s": None if steps is None else model.seconds(steps, sent),
        "run_bytes": _band([o.curve[-1][2] if o.curve else None for o in seeds.values()]
                           )["mean"],
        "trials": [{"setting": p, "final": o.final, "status": o.status, **_reach(o)}
                   for p, o in found["trials"]],
        **({"lr_extensions": [e["lr"] for e in found["extensions"]],
            "best_on_edge": found["on_edge"]} if "extensions" in found else {}),
    }


def _reach(o: Outcome) -> dict[str, Any]:
    return {"steps": o.steps_to_target, "bytes": o.bytes_to_target}


Cost = Callable[[dict[str, Any], dict[str, Any]], "float | None"]


def _bytes(row: dict[str, Any], reach: dict[str, Any]) -> float | None:
    """A reach's bytes (None: missed)."""
    return reach["bytes"]


def _seconds(link: str) -> Cost:
    """A reach's modeled seconds at ``link`` (None: missed)."""
    def cost(row: dict[str, Any], reach: dict[str, Any]) -> float | None:
        if reach["steps"] is None:
            return None
        step = ModeledStep(row["modeled_step"]["fixed_s"], row["modeled_step"]["s_per_byte"])
        return step.seconds(reach["steps"], reach["bytes"])[link]
    return cost


def _second_best(row: dict[str, Any], cost: Cost) -> tuple[float | None, float | None]:
    """The best and second-best cost over the row's search trials (None: missed)."""
    got = sorted(c for c in (cost(row, t) for t in row["trials"]) if c is not None)
    return (got[0] if got else None), (got[1] if len(got) > 1 else None)


def _ranking(rows: list[dict[str, Any]], cost: Cost) -> dict[str, Any]:
    """Rank ``rows`` by ``cost`` on the mean curve's reach and judge the lead (module doc)."""
    mean = {r["label"]: cost(r, r["to_target"]) for r in rows}
    reached = sorted((r for r in rows if mean[r["label"]] is not None),
                     key=lambda r: (mean[r["label"]], r["label"]))
    order = [r["label"] for r in reached]
    if len(reached) < 2:
        return {"order": order, "leader": order[0] if order else None, "margin": None,
                "verdict": "only one reaches" if order else "none reaches"}
    first, second = reached[0], reached[1]
    reasons = []
    a = [cost(first, s) for s in first["to_target"]["by_seed"]]
    b = [cost(second, s) for s in second["to_target"]["by_seed"]]
    if None in a or None in b or max(a) >= min(b):
        reasons.append("seed bands overlap")
    neighbour, runner_best = _second_best(first, cost)[1], _second_best(second, cost)[0]
    if neighbour is None or (runner_best is not None and neighbour >= runner_best):
        reasons.append("the leader's neighbouring setting does not beat the runner-up's best")
    return {"order": order, "leader": first["label"], "runner_up": second["label"],
            "margin": mean[second["label"]] / mean[first["label"]],
            "verdict": "tie: " + "; ".join(reasons) if reasons else "wins",
            "seed_ranges": {r["label"]: _range(c) for r, c in ((first, a), (second, b))}}


def _range(costs: list[float | None]) -> list[float] | None:
    """A method's seeds' costs as [lowest, highest] (None: a seed missed)."""
    return None if None in costs else [min(costs), max(costs)]  # type: ignore[type-var]


def summarise(spec: StudySpec, found: dict[str, dict[str, Any]], metric: Metric,
              dense: float, d: int) -> dict[str, Any]:
    """The study's summary (JSON-ready; see the module doc).

    Args:
        spec: the study.
        found: each method's search (:func:`gssgd.study.search.search_method`), with the
            reference's outcomes judged against ``dense``.
        metric: what is judged. dense: the reference's mean final value. d: the model's
            parameter count.
    """
    rows = [_method_row(spec, label, f, metric, dense, d) for label, f in found.items()]
    reference = next(r for r in rows if r["label"] == spec.reference)
    for r in rows:
        r["reduction"] = (reference["run_bytes"] / r["run_bytes"]
                          if r["run_bytes"] and reference["run_bytes"] else None)
    rankings = {"bytes": _ranking(rows, _bytes)}
    for link in LINKS:
        rankings[f"time_{link}"] = _ranking(rows, _seconds(link))
    design = {} if spec.lr_grid is None else {"design": {
        "lr_grid": list(spec.lr_grid.values), "extend": spec.lr_grid.extend,
        "runs": sum(len(f["trials"]) + len(f["seeds"]) - 1 for f in found.values()),
        "on_edge": [r["label"] for r in rows if r["best_on_edge"]]}}
    return {
        "study": spec.name,
        "run": spec.run,
        "d": d,
        "recipe": _recipe(spec),
        "budget_per_method": None if design else spec.budget,
        **design,
        "seeds": list(spec.seeds),
        "sampler": spec.sampler,
        "metric": metric.key,
        "reference": {"label": spec.reference, "final_mean": dense,
                      "target": metric.target(dense), "margin": metric.margin,
                      **_noise(reference, metric)},
        "methods": rows,
        "rankings": rankings,
        "largest_reduction": _largest_reduction(rows, spec.reference, metric, dense),
    }


def _largest_reduction(rows: list[dict[str, Any]], reference: str, metric: Metric,
                       dense: float) -> dict[str, Any] | None:
    """The method with the most bytes saved over the run among those whose mean final value
    reaches the target (the reference itself left out); None: no other reaches it."""
    within = [r for r in rows if r["label"] != reference and r["reduction"] is not None
              and r["end"]["mean"] is not None
              and not r["end"]["failed"] and metric.reaches(r["end"]["mean"], dense)]
    if not within:
        return None
    best = max(within, key=lambda r: (r["reduction"], r["label"]))
    return {"label": best["label"], "reduction": best["reduction"],
            "final": best["end"]["mean"]}


def _recipe(spec: StudySpec) -> dict[str, dict[str, Any]]:
    """Each recipe knob (every setting a method fixes or searches, the learning rate aside)
    and how each method that has it sets it: its fixed value, or ``"searched"`` with the
    values. A knob set differently across the methods it applies to is what the markdown
    flags (issue 61: the same recipe for every method, or a stated difference)."""
    knobs: dict[str, dict[str, Any]] = {}
    for row in spec.methods:
        for name, value in row.fixed.items():
            knobs.setdefault(name, {})[row.label] = value
        for knob in row.knobs:
            if knob.name != "lr":
                values = list(knob.choices) if knob.choices else [knob.low, knob.high]
                knobs.setdefault(knob.name, {})[row.label] = {"searched": values}
    return knobs


def _noise(reference: dict[str, Any], metric: Metric) -> dict[str, Any]:
    """The reference's own seed spread (its seeds' end values, highest less lowest, in the
    gap's unit: points of accuracy or % of the loss), the window, and whether the target's
    margin is smaller than that spread (then a method "reaches" or misses inside dense's
    own noise: the summary flags it)."""
    gap = reference["gap"]
    spread = None if gap["low"] is None else gap["high"] - gap["low"]
    return {"window": metric.window, "seed_spread": spread,
            "margin_inside_noise": spread is not None and 100 * metric.margin < spread}
