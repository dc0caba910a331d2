"""The ``gssgd bench kernels`` report as text (a table per size, with the H200 anchors and
the targets where they apply) and as JSON."""

from __future__ import annotations

import json
from pathlib import Path

from gssgd_lab.kernel_config import RESNET50_D, TARGETS_MS

__all__ = ["format_report", "write_json"]


def format_report(report: dict) -> str:
    """The report as a table: per size and operation, torch and kernel times, speed-up,
    effective GB/s and the check; then the anchors and targets where they apply."""
    lines = [
        f"gssgd bench kernels on {report['device']} (torch {report['torch']}, triton "
        f"{report['triton'] or 'absent'})",
        *(f"note: {note}" for note in report["notes"]),
    ]
    head = f"{'d':>12} {'layout':>7} {'op':>8} {'torch ms':>10} {'kernel ms':>10} " \
           f"{'speedup':>8} {'GB/s':>8}  check"
    lines.append(head)
    for size in report["sizes"]:
        rows = []
        for name, layout in size["layouts"].items():
            rows += [(name, op, layout[op]) for op in ("sketch", "recover", "query")]
        rows += [("-", op, size[op]) for op in ("gather", "select", "copy")]
        for name, op, e in rows:
            kernel = "-" if e["kernel_ms"] is None else f"{e['kernel_ms']:.4f}"
            speed = "-" if e["speedup"] is None else f"{e['speedup']:.1f}x"
            lines.append(
                f"{size['d']:>12,} {name:>7} {op:>8} {e['torch_ms']:>10.4f} {kernel:>10} "
                f"{speed:>8} {e['GBps']:>8.3g}  {e['check']}"
            )
        lines.append(
            f"{'':>12} floor: copy {size['copy_TBps']:.3g} TB/s, one read of the gradient "
            f"{size['read_floor_ms']:.4f} ms; k={size['k']:,}, m={size['m']}"
        )
        anchor = report["anchor"]["sizes"].get(size["d"])
        if anchor and report["kernels_timed"]:
            lines += _against_anchor(size, anchor, report)
    return "\n".join(lines)


def _against_anchor(size: dict, anchor: dict, report: dict) -> list[str]:
    """Lines comparing one size with the H200 anchor (and the targets at 25.6M)."""
    lines = [
        f"{'':>12} H200 anchor ({anchor['name']}, naive torch, 5x10k): sketch "
        f"{anchor['sketch_onthefly_hash_ms']:.2f} ms on the fly / "
        f"{anchor['sketch_precomputed_hash_ms']:.2f} ms cached hashes, query+top-k "
        f"{anchor['query_median_topk_ms']:.2f} ms, topk {anchor['topk_ms']:.3f} ms, read floor "
        f"{anchor['read_floor_ms']:.4f} ms"
    ]
    if size["d"] == RESNET50_D:
        for name, layout in size["layouts"].items():
            sketch = layout["sketch"]["kernel_ms"]
            recover = layout["recover"]["kernel_ms"]  # screening, query, top m·k of them
            lines.append(
                f"{'':>12} targets ({name}): sketch {sketch:.3f} ms (target <= "
                f"{TARGETS_MS['sketch']} ms), recovery+selection {recover:.3f} ms (target "
                f"<= {TARGETS_MS['recover+select']} ms)"
            )
    return lines


def write_json(report: dict, path: Path) -> None:
    """Write the report as JSON (sizes' keys stay strings; NaN never occurs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")
