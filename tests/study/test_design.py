"""The designs of gssgd.study.design: a Latin hypercube (every knob spread over the budget)
and a grid (distinct combinations in a seeded order)."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from gssgd.study.design import grid_design, latin_hypercube
from gssgd.study.spec import Knob

LR = Knob("lr", low=0.002, high=0.02, log=True)
DENSITY = Knob("density", choices=(0.001, 0.003, 0.01))
CHUNK = Knob("chunk", choices=(0, 4096))


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_each_choice_and_each_stratum_is_tried(seed: int) -> None:
    """Budget 3 over a log range, three densities and two chunks: the three log-thirds of
    the range once each, every density once, both chunks."""
    design = latin_hypercube((LR, DENSITY, CHUNK), 3, seed)
    assert len(design) == 3
    assert sorted(s["density"] for s in design) == [0.001, 0.003, 0.01]
    assert set(s["chunk"] for s in design) == {0, 4096}
    strata = sorted(int(3 * (math.log(s["lr"]) - math.log(0.002)) / math.log(10))
                    for s in design)
    assert strata == [0, 1, 2]
    # the centres of the strata, on the log scale
    assert min(s["lr"] for s in design) == pytest.approx(0.002 * 10 ** (1 / 6))


def test_a_budget_above_the_choices_tries_them_evenly() -> None:
    design = latin_hypercube((Knob("rank", choices=(1, 2, 4, 8)), LR), 6, 7)
    assert sorted(Counter(s["rank"] for s in design).values()) == [1, 1, 2, 2]


def test_a_budget_below_the_choices_tries_distinct_ones() -> None:
    design = latin_hypercube((Knob("rank", choices=(1, 2, 4, 8)),), 3, 7)
    assert len({s["rank"] for s in design}) == 3


def test_the_design_is_a_function_of_its_seed() -> None:
    assert latin_hypercube((LR, DENSITY), 4, 3) == latin_hypercube((LR, DENSITY), 4, 3)
    assert latin_hypercube((LR, DENSITY), 4, 3) != latin_hypercube((LR, DENSITY), 4, 4)


def test_an_integer_range_gives_whole_numbers_in_it() -> None:
    design = latin_hypercube((Knob("local_steps", low=10, high=100, integer=True),), 4, 0)
    assert sorted(s["local_steps"] for s in design) == [21, 44, 66, 89]


def test_a_space_too_small_for_the_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="too few settings"):
        latin_hypercube((CHUNK,), 3, 0)


def test_a_grid_takes_distinct_combinations_in_a_seeded_order() -> None:
    rank = Knob("rank", choices=(1, 2))
    every = grid_design((DENSITY, rank), 6, 0)  # the whole grid: every combination once
    assert sorted((s["density"], s["rank"]) for s in every) == [
        (d, r) for d in (0.001, 0.003, 0.01) for r in (1, 2)]
    assert grid_design((DENSITY, rank), 4, 0) == every[:4]
    assert grid_design((DENSITY, rank), 6, 1) != every  # another seed, another order
    steps = grid_design((Knob("local_steps", low=1, high=3, integer=True),), 3, 5)
    assert sorted(s["local_steps"] for s in steps) == [1, 2, 3]


def test_a_grid_without_a_grid_or_too_small_is_refused() -> None:
    with pytest.raises(ValueError, match="lr: a float range has no grid"):
        grid_design((LR,), 2, 0)
    with pytest.raises(ValueError, match="a grid of 2 settings cannot fill a budget of 3"):
        grid_design((CHUNK,), 3, 0)
