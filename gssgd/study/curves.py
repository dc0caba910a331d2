"""Judging runs against a target: where a run's curve reaches dense's target by the one
rule (:class:`~gssgd.target.Metric`, re-exported here), and the bytes its busiest
link carried until then.

A run's *curve* is its evaluations ``(step, value, bytes so far)``: the test accuracy or
loss at each evaluation and the busiest rank's cumulative bytes (in its busier direction,
:func:`~gssgd.train.metrics.busier_bytes`) up to that step. ``gssgd study`` and the studies'
report scripts (``studies/_lib/report.py`` re-exports these) judge with the same code.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from itertools import accumulate
from typing import Any

from gssgd.target import ACCURACY, LOSS, Metric
from gssgd.train.metrics import busier_bytes

__all__ = ["ACCURACY", "LOSS", "Evaluation", "Metric", "busier_totals", "curve_of",
           "end_value", "first_reaching", "reach_and_stay", "reach_on_mean_curve",
           "seed_points"]

#: An evaluation of a run: (step, metric value, bytes so far).
Evaluation = tuple[int, float, float]


def first_reaching(evals: Iterable[Evaluation], metric: Metric, dense: float) -> Evaluation | None:
    """The first evaluation (step, value, bytes) that reaches dense's target
    (:meth:`Metric.reaches`), or None when none does."""
    return next((e for e in evals if metric.reaches(e[1], dense)), None)


def reach_on_mean_curve(
    seeds: Sequence[Sequence[Evaluation]], metric: Metric, dense: float
) -> tuple[int, float] | tuple[None, None]:
    """Steps and bytes until the seeds' mean curve reaches dense's target.

    1. The mean curve: at every evaluation step all seeds have, the mean value and mean
       bytes over seeds (so one seed ending a hair short does not decide); steps counted
       from 1 (an evaluation after step index ``s`` has taken ``s + 1`` steps).
    2. The first point that :meth:`Metric.reaches` dense's value.
    3. Between it and the point before (short of the target), the crossing is interpolated
       linearly, steps and bytes alike, so that evaluations every 100 steps do not round
       every method to a multiple of 100.

    Args:
        seeds: each seed's evaluations (step index, value, bytes so far).
        metric: what is judged.
        dense: dense's value (the mean over its seeds).

    Returns:
        (steps, bytes) to the target, or (None, None) when the mean curve never reaches it.
    """
    curve = [(s + 1, statistics.mean(values), sent) for s, values, sent in seed_points(seeds)]
    goal = metric.target(dense)
    for i, (step, value, sent) in enumerate(curve):
        if not metric.reaches(value, dense):
            continue
        if i == 0:
            return step, sent
        step0, value0, sent0 = curve[i - 1]
        share = (goal - value0) / (value - value0)  # value0 is short of goal, value is not
        return round(step0 + share * (step - step0)), sent0 + share * (sent - sent0)
    return None, None


def end_value(evals: Sequence[Evaluation], window: int) -> float | None:
    """A run's end value: the mean of its last ``window`` evaluations (None: none)."""
    tail = [v for _, v, _ in evals[-window:]]
    return statistics.mean(tail) if tail else None


def reach_and_stay(seeds: Sequence[Sequence[Evaluation]], metric: Metric, dense: float
                   ) -> tuple[int, float] | tuple[None, None]:
    """Steps and bytes until the seeds' mean curve reaches dense's target **and stays**
    there: what a study's verdicts count (a first touch that falls back does not).

    1. The seeds' mean curve (:func:`reach_on_mean_curve`'s step 1), each point then
       averaged with the ``metric.window - 1`` before it (a trailing mean: one noisy
       evaluation neither makes nor breaks a reach).
    2. A method reaches the target when the smoothed curve's last point does (the mean
       of its last ``window`` evaluations); else (None, None).
    3. The reach is the first point from which every later smoothed point reaches, the
       crossing interpolated from the point before it (as :func:`reach_on_mean_curve`).
    """
    curve = [(s + 1, statistics.mean(values), sent) for s, values, sent in seed_points(seeds)]
    w = max(1, metric.window)
    smooth = [(step, statistics.mean(v for _, v, _ in curve[max(0, i - w + 1):i + 1]), sent)
              for i, (step, _, sent) in enumerate(curve)]
    if not smooth or not metric.reaches(smooth[-1][1], dense):
        return None, None
    i = max((j + 1 for j, (_, v, _) in enumerate(smooth) if not metric.reaches(v, dense)),
            default=0)
    step, value, sent = smooth[i]
    if i == 0:
        return step, sent
    step0, value0, sent0 = smooth[i - 1]
    share = (metric.target(dense) - value0) / (value - value0)
    return round(step0 + share * (step - step0)), sent0 + share * (sent - sent0)


def seed_points(seeds: Sequence[Sequence[Evaluation]]) -> list[tuple[int, list[float], float]]:
    """The seeds' curves side by side: at every evaluation step all seeds have (step index,
    in order), each seed's value and the mean bytes so far over the seeds."""
    steps = sorted(set.intersection(*({s for s, _, _ in evals} for evals in seeds)))
    at = [{s: (v, b) for s, v, b in evals} for evals in seeds]
    return [(s, [a[s][0] for a in at], statistics.mean(a[s][1] for a in at)) for s in steps]


def busier_totals(records: Iterable[dict[str, Any]]) -> list[float]:
    """The busiest rank's bytes so far after each metrics record (cumulative
    :func:`busier_bytes`): what its link had carried, in its busier direction."""
    return list(accumulate(busier_bytes(r) for r in records))


def curve_of(records: Sequence[dict[str, Any]], metric: Metric) -> list[Evaluation]:
    """A run's evaluations from its ``metrics.jsonl`` records: at each record with a
    ``test_<metric>``, (step, value, the busiest link's bytes so far)."""
    key = f"test_{metric.key}"
    return [(r["step"], r[key], sent) for r, sent in zip(records, busier_totals(records), strict=True)
            if r.get(key) is not None]
