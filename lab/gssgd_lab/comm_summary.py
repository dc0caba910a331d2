"""``gssgd bench comm``'s ``results.json``: the workers' records combined, method by method.

Each worker writes, per method, one value per timed step of its wall time and of its
``last_stats`` fields (:mod:`gssgd_lab.comm_worker`). :func:`summarize` combines them:

* a step takes the slowest rank's wall time, and ``seconds_per_step`` is the median of
  that over the timed steps (``seconds_per_step_all`` keeps every step's);
* the split into ``seconds_compress`` / ``seconds_communicate`` / ``seconds_decompress``
  / ``seconds_other`` is that of the rank with the most time outside collectives in each
  step (the critical path), median over steps; ``other`` is the rest of its step (the
  non-finite guard, bookkeeping);
* ``bytes_sent_per_step`` and ``bytes_received_per_step`` are means over ranks (as
  ``gssgd compare`` reports them), the busiest rank's in ``*_max_per_step`` and every
  rank's in ``*_per_rank``; ``rounds`` and ``messages`` are the most any rank made;
* ``speedup_of_gs`` is this method's seconds / gs's (gs's speed-up over it; None when gs
  was not run); ``spec`` is the method's :class:`~gssgd.costmodel.MethodSpec` (what
  :mod:`gssgd.costmodel` needs) and ``description`` its one-line summary.

``_meta`` (:func:`run_meta`) holds the command line, P, d, k, density, link, threads,
versions, machine, date, load averages and the probes' summaries: the latency probe's time
per round (``_meta.latency_probe.alpha``, the cost model's per-message latency) and the
compute probe's ratio (``_meta.compute_probe.share``: how much sharing the cores slowed
compute).

Interpreting the numbers: on a machine with fewer cores than workers, compute times are
inflated (the workers share cores), and a rank that waits for a descheduled peer counts
the wait as communication. ``_meta`` records the core count, the load averages and the
measured compute share.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import statistics
from collections.abc import Sequence
from typing import Any

from gssgd.costmodel import VARIANTS, MethodSpec
from gssgd_lab.comm_config import CommBenchConfig

__all__ = ["run_meta", "summarize"]

#: How the figures of ``results.json`` are made, recorded in its ``_meta``.
TIMING_NOTE = (
    "seconds_per_step: median over timed steps of the slowest rank's wall time "
    "of agg.step; compress/communicate/decompress/other: median of the split of the rank "
    "with the most time outside collectives in each step; bytes: mean over ranks "
    "(*_max_per_step: the busiest rank), median over steps"
)


def run_meta(
    cfg: CommBenchConfig,
    link_requested: str,
    namespaces: bool,
    command: str,
    elapsed: float,
) -> dict[str, Any]:
    """The ``_meta`` entry of a run: its settings, where it ran, versions and timing."""
    import torch

    return {
        "command": command,
        "workers": cfg.workers,
        "d": cfg.d,
        "k": cfg.k,
        "density": cfg.density,
        "link": cfg.link,
        "link_requested": link_requested,
        "link_bps": cfg.link_bps,
        "mode": "namespaces" if namespaces else "loopback",
        "threads": cfg.threads,
        "repeats": cfg.repeats,
        "warmup": cfg.warmup,
        "rows": cfg.rows,
        "cols": cfg.cols,
        "candidates": cfg.candidates,
        "seed": cfg.seed,
        "methods": list(cfg.methods),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds_total": round(elapsed, 2),
        "load_average_1min_after": round(os.getloadavg()[0], 2),
        "timing": TIMING_NOTE,
    }


def _critical_path_split(
    recs: Sequence[dict[str, list[float]]], steps: int
) -> tuple[dict[str, list[float]], list[float]]:
    """Per step, the compress / communicate / decompress times and the rest ("other") of
    the rank with the most time outside collectives (the critical path's rank)."""
    split: dict[str, list[float]] = {p: [] for p in ("compress", "communicate", "decompress")}
    other = []
    for s in range(steps):
        rep = max(recs, key=lambda rec: rec["wall"][s] - rec["seconds_communicate"][s])
        for part in split:
            split[part].append(rep[f"seconds_{part}"][s])
        other.append(max(0.0, rep["wall"][s] - sum(rep[f"seconds_{p}"][s] for p in split)))
    return split, other


def _method_row(recs: Sequence[dict[str, list[float]]], spec: MethodSpec) -> dict[str, Any]:
    """One method's ``results.json`` entry from every rank's per-step records."""
    steps = len(recs[0]["wall"])
    wall = [max(rec["wall"][s] for rec in recs) for s in range(steps)]
    split, other = _critical_path_split(recs, steps)
    sent = [int(statistics.median(rec["bytes_sent"])) for rec in recs]
    received = [int(statistics.median(rec["bytes_received"])) for rec in recs]
    return {
        "seconds_per_step": statistics.median(wall),
        "bytes_sent_per_step": statistics.mean(sent),
        "bytes_received_per_step": statistics.mean(received),
        "bytes_sent_max_per_step": max(sent),
        "bytes_received_max_per_step": max(received),
        "seconds_compress": statistics.median(split["compress"]),
        "seconds_communicate": statistics.median(split["communicate"]),
        "seconds_decompress": statistics.median(split["decompress"]),
        "seconds_other": statistics.median(other),
        "speedup_of_gs": None,
        "rounds": max(int(statistics.median(rec["rounds"])) for rec in recs),
        "messages": max(int(statistics.median(rec["messages"])) for rec in recs),
        "bytes_sent_per_rank": sent,
        "bytes_received_per_rank": received,
        "seconds_per_step_all": wall,
        "description": VARIANTS[spec.name],
        "spec": spec.as_dict(),
    }


def _probe_summaries(ranks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The latency and compute probes' summaries, for ``_meta`` (where they ran)."""
    out: dict[str, Any] = {}
    probes = [r.get("probes") or {} for r in ranks]
    latency = [p.get("latency") or [] for p in probes]
    if len(ranks) > 1 and all(latency):
        per_step = [max(p[s] for p in latency) for s in range(min(map(len, latency)))]
        seconds = statistics.median(per_step)
        out["latency_probe"] = {
            "what": "all-gather of a 4-byte flag after a barrier, once per timed round: "
            "median over rounds of the slowest rank; alpha = seconds / rounds",
            "seconds": seconds,
            "rounds": len(ranks) - 1,
            "alpha": seconds / (len(ranks) - 1),
        }
    if all(p.get("alone") and p.get("together") for p in probes):
        alone = statistics.median(t for p in probes for t in p["alone"])
        together = statistics.median(t for p in probes for t in p["together"])
        out["compute_probe"] = {
            "what": "top-k of |grad| timed on each rank alone, then on all ranks at once, "
            "once per timed round (medians over ranks and rounds); share = together / alone",
            "seconds_alone": alone,
            "seconds_together": together,
            "share": max(1.0, together / alone) if alone > 0 else 1.0,
        }
    return out


def summarize(
    ranks: Sequence[dict[str, Any]], specs: Sequence[MethodSpec], meta: dict[str, Any]
) -> dict[str, Any]:
    """Combine the workers' records into ``results.json``'s mapping.

    Args:
        ranks: each rank's ``{"rank": r, "methods": {name: {field: [per step]}}}``.
        specs: the methods, in run order.
        meta: the ``_meta`` entry.

    Returns:
        ``{method: {...}, "_meta": meta}``; see the module docstring for the fields.
    """
    ranks = sorted(ranks, key=lambda r: r["rank"])
    results: dict[str, Any] = {
        spec.name: _method_row([r["methods"][spec.name] for r in ranks], spec) for spec in specs
    }
    if "gs" in results:
        gs_s = results["gs"]["seconds_per_step"]
        for row in results.values():
            ratio = row["seconds_per_step"] / gs_s if gs_s > 0 else math.inf
            row["speedup_of_gs"] = ratio
    meta = {**meta, **_probe_summaries(ranks)}
    results["_meta"] = meta
    return results
