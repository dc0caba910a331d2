"""Plain-text formatting shared by the benchmarks' tables: readable units (bytes as the
studies write them, :func:`gssgd.study.report.fmt_bytes`) and aligned columns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gssgd.study.report import fmt_bytes

__all__ = ["fmt_bytes", "fmt_seconds", "link_label", "method_names",
           "render_table"]


def fmt_seconds(seconds: float | None) -> str:
    """``123 us``, ``12.3 ms``, ``1.23 s``: three significant digits in a readable unit."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 1000:
        return f"{seconds:.3g} s"
    return f"{seconds:.0f} s"


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """A header, a rule and the rows, columns padded to their widest cell; the first
    ``left`` columns left-aligned, the others right-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).ljust(w) if i < left else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "-" * len(line(header))
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def method_names(results: Mapping[str, Any]) -> list[str]:
    """The method keys of a ``results.json`` mapping (those not starting with ``_``)."""
    return [name for name in results if not name.startswith("_")]


def link_label(meta: Mapping[str, Any]) -> str:
    """``100mbit (namespaces)``: the link a run used, and how (and what was asked for)."""
    link = meta.get("link", "?")
    where = "namespaces" if meta.get("mode") == "namespaces" else "loopback"
    requested = meta.get("link_requested")
    if requested and requested != link:
        where += f", {requested} requested"
    return f"{link} ({where})"
