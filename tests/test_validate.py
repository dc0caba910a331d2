"""gssgd._validate: the one message every setting check writes, and the type tests."""

from __future__ import annotations

import math

import pytest

from gssgd._validate import bad_value, is_int, is_number


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
