"""The argument check the sketch's constructors and queries share."""

from __future__ import annotations

from gssgd._validate import is_int

__all__ = ["check_int"]


def check_int(name: str, value: object, low: int, high: int | None, hint: str) -> None:
    """Raise a ValueError naming ``name``, its value and the valid range unless it fits."""
    if is_int(value) and value >= low and (high is None or value <= high):
        return
    rng = f"[{low}, {high}]" if high is not None else f">= {low}"
    raise ValueError(f"{name}={value!r} is invalid: it must be an integer {rng} ({hint}).")

