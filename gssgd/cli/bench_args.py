"""Argument types of the ``gssgd bench`` subcommands: each parses one flag's text or raises
:class:`argparse.ArgumentTypeError` with the valid range, which argparse prints (exit 2)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable, Mapping

from gssgd.costmodel.method_specs import VARIANTS
from gssgd.methods import parse_methods

__all__ = [
    "accuracy",
    "benchmark_methods",
    "check_methods",
    "count",
    "density",
    "link",
    "listing",
    "method_list",
    "seconds",
]


def count(text: str) -> int:
    """An integer >= 1 that may be written 1000000, 1_000_000 or 1e6."""
    cleaned = text.strip().replace("_", "")
    try:
        value = float(cleaned) if "e" in cleaned.lower() else int(cleaned)
        whole = value == int(value)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number; write e.g. 1000000, 1_000_000 or 1e6"
        ) from None
    if not whole or value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 1")
    return int(value)


def _fraction(text: str, what: str, example: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} {text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{what} {text!r} must lie in (0, 1], {example}")
    return value


def density(text: str) -> float:
    """A fraction of the coordinates in (0, 1]."""
    return _fraction(text, "density", "e.g. 0.001 (k = round(density * d))")


def accuracy(text: str) -> float:
    """A target accuracy in (0, 1]."""
    return _fraction(text, "target accuracy", "e.g. 0.9 for 90%")


def seconds(text: str) -> float:
    """A finite number of seconds > 0."""
    return positive(text, "seconds")


def positive(text: str, unit: str = "") -> float:
    """A finite number > 0 (``unit`` names what it counts, for the message)."""
    what = f"a number of {unit}" if unit else "a number"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: it must be {what} > 0 and "
                                         "finite")
    return value


def link(text: str) -> str:
    """A link rate (``100mbit``, ``1gbit``, ...) or ``none``, lower-cased."""
    from gssgd.costmodel.link_rate import parse_link_rate

    try:
        parse_link_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip().lower()


def check_methods(text: str | Iterable[str], valid: Iterable[str]) -> tuple[str, ...]:
    """A method list checked by :func:`gssgd.methods.parse_methods` against ``valid``; a
    name given twice is refused, not merged (a benchmark runs each method once).

    Raises:
        ValueError: an empty list, an unknown name or a repeated one (the message says which
            and lists the valid names).
    """
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text)]
    names = [n for n in names if n]
    if len(set(names)) != len(names):
        raise ValueError(f"{','.join(names)!r} names a method twice; list each once")
    return parse_methods(names, valid)


def method_list(valid: Callable[[], Iterable[str]]) -> Callable[[str], tuple[str, ...]]:
    """The type of a ``--methods`` flag: :func:`check_methods` against the names ``valid()``
    returns when the flag is parsed (so a method registered after the parser was built is
    accepted).

    Args:
        valid: returns the names allowed here.
    """

    def methods(text: str) -> tuple[str, ...]:
        try:
            return check_methods(text, valid())
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return methods


def benchmark_methods() -> Callable[[str], tuple[str, ...]]:
    """``--methods`` of ``bench comm``: registered benchmark methods
    (aggregator methods and their variants, :data:`gssgd.costmodel.VARIANTS`)."""
    return method_list(lambda: VARIANTS)


def listing(summaries: Mapping[str, str]) -> str:
    """``name  summary`` lines for a help epilog (names never wrapped at their hyphens)."""
    width = max(map(len, summaries), default=0) + 2
    return "\n".join(f"  {name:<{width}}{text}" for name, text in summaries.items())
