"""The one way gssgd checks a setting: a ValueError that names the value, the valid range
and the fix, and the type tests every check needs (a ``bool`` is not a number here, though
Python's ``bool`` is an ``int``).

Every options dataclass and the trainer's config use these, so every message reads the same:
``density=2.0 is invalid: it must be a number in (0, 1]. For example density=0.01.``
"""

from __future__ import annotations

import math

__all__ = ["bad_value", "is_int", "is_number"]


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
