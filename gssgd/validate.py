"""The one way gssgd checks a setting: a ValueError that names the value, the valid range
and the fix, and the type tests every check needs (a ``bool`` is not a number here, though
Python's ``bool`` is an ``int``).

Every options dataclass, the sketch, the batching and the trainer's config use these, so
every message reads the same:
``density=2.0 is invalid: it must be a number in (0, 1]. For example density=0.01.``
:func:`check_int` and :func:`check_number` are the two checks most settings need.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["bad_value", "check_int", "check_number", "is_int", "is_number"]


def bad_value(name: str, value: object, valid: str, fix: str = "") -> ValueError:
    """The error for ``name=value``: what a valid value is, and how to fix it.

    Args:
        name: the setting's name as the user wrote it (``density``, ``--lr``, ...).
        value: the value given.
        valid: what the value must be (``"it must be a number in (0, 1]"``).
        fix: one sentence that fixes it (``"For example density=0.01."``); may be empty.

    Returns:
        The ValueError to raise.
    """
    return ValueError(f"{name}={value!r} is invalid: {valid}. {fix}".rstrip())


def is_int(value: object) -> bool:
    """Whether ``value`` is an integer (``True``/``False`` are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """Whether ``value`` is a finite int or float (``True``/``False``, NaN and inf are not)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def check_int(name: str, value: object, low: int, high: int | None = None, fix: str = "") -> None:
    """Raise :func:`bad_value` unless ``value`` is an integer in ``[low, high]`` (``>= low``
    when ``high`` is None; ``True``/``False`` are not integers here)."""
    if is_int(value) and value >= low and (high is None or value <= high):  # type: ignore[operator]
        return
    span = f"in [{low}, {high}]" if high is not None else f">= {low}"
    raise bad_value(name, value, f"it must be an integer {span}", fix)


def check_number(name: str, value: object, valid: str, ok: Callable[[float], bool],
                 fix: str = "") -> None:
    """Raise :func:`bad_value` unless ``value`` is a finite number for which ``ok`` holds;
    ``valid`` says which (``"in (0, 1]"``)."""
    if not is_number(value) or not ok(value):  # type: ignore[arg-type]
        raise bad_value(name, value, f"it must be a number {valid}", fix)
