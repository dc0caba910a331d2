"""A Latin-hypercube design: a small trial budget that covers every knob.

With a budget of 3–4 trials, Optuna's TPE draws its first ``budget // 2`` settings at
random and then samples near its best so far; a categorical knob (a density, a rank, a
chunk) then keeps its first draw in every trial, so the search tunes the learning rate of
one random shape (issue #50's first language-model cells did exactly that). A Latin
hypercube spreads the budget instead (McKay, Beckman and Conover, 1979): each knob's range
is cut into ``budget`` strata and every stratum is tried once, each knob in its own seeded
order, so

* a range (``lr = { low, high, log }``) is tried at the centres of ``budget`` equal strata
  (on the log scale when ``log``), once each;
* a list of ``c`` choices is tried ``budget // c`` or ``budget // c + 1`` times each (every
  choice once when ``budget >= c``; a seeded subset of ``budget`` distinct ones otherwise).

The design is a pure function of the knobs, the budget and the seed, so a resumed study asks
for the same trials. Settings that repeat (possible when every knob is a short list) are
re-paired with the next seed.

A grid (:func:`grid_design`) is the other design known ahead: every combination of the
knobs' lists, in a seeded order, the first ``budget`` of them.

A learning-rate grid (:func:`lr_grid_design`, the ``lr-grid`` sampler) tries every rate of
a shared log grid with every combination of the method's other knobs, and where the best
sits on the lowest or highest rate tried for its setting, :func:`lr_extension` names the
next rate past it, up to the grid's cap: the search finds each method's optimum instead of
reporting where its range happened to end. (Optuna's own
``GridSampler`` ends its study when the grid is used up, which its ask-and-tell interface,
the one a resumable study needs, refuses.)
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

from gssgd.study.spec import Knob, LrGrid

__all__ = ["grid_design", "latin_hypercube", "lr_extension", "lr_grid_design", "on_edge"]

#: How many seeded pairings are tried before a design with a repeated setting is refused.
MAX_PAIRINGS = 1000


def _column(knob: Knob, budget: int, rng: random.Random) -> list[Any]:
    """``budget`` values of one knob: its strata (or choices) in a seeded order."""
    if knob.choices is not None:
        choices = list(knob.choices)
        rng.shuffle(choices)
        values = [choices[i % len(choices)] for i in range(budget)]
    else:
        assert knob.low is not None and knob.high is not None
        lo, hi = (math.log(knob.low), math.log(knob.high)) if knob.log else (knob.low, knob.high)
        values = [lo + (i + 0.5) / budget * (hi - lo) for i in range(budget)]
        if knob.log:
            values = [math.exp(v) for v in values]
        if knob.integer:
            values = [min(int(knob.high), max(int(knob.low), round(v))) for v in values]
    rng.shuffle(values)
    return values


def latin_hypercube(knobs: tuple[Knob, ...], budget: int, seed: int) -> list[dict[str, Any]]:
    """``budget`` settings, one per trial, that spread each knob over its range.

    Args:
        knobs: the method's searched knobs.
        budget: the number of trials (>= 1).
        seed: the design's seed (a study seeds it from its name and the method's label).

    Returns:
        ``[{knob name: value}, ...]``, ``budget`` distinct settings in trial order.

    Raises:
        ValueError: the knobs have fewer distinct settings than ``budget``, so any design
            repeats one (a spec's check refuses such a space first).
    """
    for attempt in range(MAX_PAIRINGS):
        rng = random.Random(seed + attempt)
        columns = {knob.name: _column(knob, budget, rng) for knob in knobs}
        design = [{name: values[i] for name, values in columns.items()} for i in range(budget)]
        if len({repr(sorted(s.items())) for s in design}) == budget:
            return design
    raise ValueError(f"no Latin-hypercube design of {budget} distinct settings over "
                     f"{[k.name for k in knobs]} in {MAX_PAIRINGS} pairings: the space has "
                     "too few settings; lower the budget or widen a knob")


def grid_design(knobs: tuple[Knob, ...], budget: int, seed: int) -> list[dict[str, Any]]:
    """``budget`` distinct settings of a grid: every combination of the knobs' values
    (lists, or every integer of an integer range) in a seeded order, the first ``budget``.

    Raises:
        ValueError: a knob without a grid (a float range), or fewer combinations than
            ``budget`` (a spec's check refuses both first).
    """
    values = []
    for knob in knobs:
        if knob.choices is not None:
            values.append(list(knob.choices))
        elif knob.integer:
            values.append(list(range(int(knob.low), int(knob.high) + 1)))  # type: ignore[arg-type]
        else:
            raise ValueError(f"{knob.name}: a float range has no grid; give a list of values")
    points = [dict(zip([k.name for k in knobs], combo, strict=True))
              for combo in itertools.product(*values)]
    if len(points) < budget:
        raise ValueError(f"a grid of {len(points)} settings cannot fill a budget of {budget}")
    random.Random(seed).shuffle(points)
    return points[:budget]


def lr_grid_design(grid: LrGrid, knobs: tuple[Knob, ...]) -> list[dict[str, Any]]:
    """Every rate of ``grid`` with every combination of ``knobs``' lists: the
    combinations in the spec's order, each with the rates lowest first."""
    names = [k.name for k in knobs]
    combos = itertools.product(*(k.choices or () for k in knobs))
    return [{"lr": lr, **dict(zip(names, combo, strict=True))}
            for combo in combos for lr in grid.values]


def lr_extension(grid: LrGrid, tried: list[dict[str, Any]], best: dict[str, Any]
                 ) -> dict[str, Any] | None:
    """The setting to try next where ``best`` sits on an edge of the rates tried for its
    other knobs: ``best`` at the next rate past that edge, unless the grid's ``extend``
    cap is reached on that side; None where ``best`` is interior (or at the cap)."""
    rates = _rates_of(tried, best)
    if len(rates) < 2:
        return None
    low, high = grid.values[0], grid.values[-1]
    if best["lr"] == rates[0] and sum(r < low for r in rates) < grid.extend:
        return {**best, "lr": grid.beyond(best["lr"], -1)}
    if best["lr"] == rates[-1] and sum(r > high for r in rates) < grid.extend:
        return {**best, "lr": grid.beyond(best["lr"], 1)}
    return None


def on_edge(tried: list[dict[str, Any]], best: dict[str, Any]) -> bool:
    """Whether ``best``'s rate is the lowest or highest tried for its other knobs."""
    rates = _rates_of(tried, best)
    return best["lr"] in (rates[0], rates[-1])


def _rates_of(tried: list[dict[str, Any]], setting: dict[str, Any]) -> list[float]:
    """The rates tried with ``setting``'s other knobs, lowest first."""
    def rest(s: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in s.items() if k != "lr"}

    return sorted(t["lr"] for t in tried if rest(t) == rest(setting))
