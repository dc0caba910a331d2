"""gssgd.validate: the one message every setting check writes, and the type tests."""

from __future__ import annotations

import math

import pytest

from gssgd.validate import bad_value, check_int, check_number, is_int, is_number


def test_the_message_names_the_value_the_range_and_the_fix() -> None:
    err = bad_value("density", 2.0, "it must be a number in (0, 1]", "For example density=0.01.")
    assert str(err) == "density=2.0 is invalid: it must be a number in (0, 1]. For example density=0.01."
    assert str(bad_value("rows", 2, "it must be odd")) == "rows=2 is invalid: it must be odd."


@pytest.mark.parametrize(("value", "integer", "number"), [
    (3, True, True), (True, False, False), (2.0, False, True), (math.nan, False, False),
    (math.inf, False, False), ("3", False, False), (None, False, False),
])
def test_a_bool_is_not_a_number_and_nan_is_not_finite(value, integer, number) -> None:
    assert is_int(value) is integer and is_number(value) is number


@pytest.mark.parametrize(("value", "low", "high", "message"), [
    (0, 1, None, "n=0 is invalid: it must be an integer >= 1. Fix it."),
    (True, 0, None, "n=True is invalid: it must be an integer >= 0. Fix it."),
    (2.0, 1, None, "n=2.0 is invalid: it must be an integer >= 1. Fix it."),
    (6, 1, 5, r"n=6 is invalid: it must be an integer in [1, 5]. Fix it."),
])
def test_check_int_names_the_value_and_the_range(value, low, high, message) -> None:
    with pytest.raises(ValueError) as info:
        check_int("n", value, low, high, "Fix it.")
    assert str(info.value) == message
    check_int("n", 5, 1, 5)  # the bounds are inside


@pytest.mark.parametrize("value", [0.0, math.nan, math.inf, True, "0.5"])
def test_check_number_refuses_what_is_not_a_finite_number_in_range(value) -> None:
    with pytest.raises(ValueError, match=r"lr=.* is invalid: it must be a number > 0"):
        check_number("lr", value, "> 0", lambda v: v > 0)
    check_number("lr", 0.5, "> 0", lambda v: v > 0)
