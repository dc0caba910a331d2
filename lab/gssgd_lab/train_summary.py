"""What ``gssgd bench train`` makes of each run's records: its clock, its time to a target
accuracy, and the summary of one run and of the whole benchmark.

Pure functions of the records (``metrics.jsonl`` lines) and summaries, apart from the
runners in :mod:`gssgd_lab.train_bench` that produce them. A method's row
(:func:`summarize_run`, completed by :func:`summarize`):

* ``seconds_per_step``: median over the measured steps (those after the trainer's
  warm-up, ``summary.measured_from_step``) of rank 0's ``seconds_step`` (batch,
  forward, backward with the gradient exchange, optimizer step);
* ``samples_per_second`` = P * batch / ``seconds_per_step``;
* ``seconds_compute_per_step``: median of ``seconds_compute`` (the step minus the
  time the comm hook reported: forward, backward, optimizer), and
  ``seconds_overhead_per_step`` = step - compute (compression and communication).
  DDP's built-in all-reduce (``ddp-allreduce``, ``ddp-fp16``, ``powersgd``) runs inside the
  backward pass untimed, so their ``seconds_compute`` includes the communication;
  their overhead is estimated with the median compute of the methods that do
  separate it (``overhead_estimated``);
* ``bytes_sent_per_step``: mean over the measured steps of the bytes a worker sent;
* ``final_test_accuracy``; ``seconds_to_target`` (:func:`time_to_target`): the
  training clock from the start of step 0 to the end of the first step whose
  evaluation reached the target, null when none did;
* ``gs_throughput_speedup`` = gs's samples/s / this method's, and
  ``gs_time_to_target_speedup`` = this method's seconds to target / gs's (both > 1:
  gs is better), from the same run; when gs reached the target and a method did
  not, ``gs_time_to_target_speedup_at_least`` = that method's whole training time
  / gs's time to target.

The training clock (:func:`training_clock`): metrics.jsonl carries each step's
``seconds_step``, not a wall clock, so the clock is their running sum. It leaves out the
evaluations (whose cost depends on ``--eval-every``, not on the method), start-up, and the
trainer's two small bookkeeping collectives per step (the loss check and the byte count).
Should the trainer log a per-step ``seconds_elapsed`` (:data:`ELAPSED_FIELD`: seconds since
the start of step 0 at the end of the step, evaluations excluded), that is used instead.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from gssgd.study.curves import ACCURACY

__all__ = ["ELAPSED_FIELD", "NO_SUMMARY", "summarize", "summarize_run", "time_to_target",
           "training_clock"]

#: A per-step wall clock the trainer may log; used for the time to target when present.
ELAPSED_FIELD = "seconds_elapsed"
#: The status of a run that left no summary.json.
NO_SUMMARY = "failed: no summary.json"


def _number(value: Any) -> float | None:
    """A finite number, or None (metrics.jsonl writes NaN and Inf as strings)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def training_clock(records: Sequence[Mapping[str, Any]]) -> list[float]:
    """Seconds from the start of the first step to the end of each record's step.

    The trainer's :data:`ELAPSED_FIELD` when every record has it, else the running sum
    of ``seconds_step`` (evaluations and bookkeeping left out; see the module docstring).
    """
    if records and all(_number(r.get(ELAPSED_FIELD)) is not None for r in records):
        return [float(r[ELAPSED_FIELD]) for r in records]
    clock, total = [], 0.0
    for r in records:
        total += _number(r.get("seconds_step")) or 0.0
        clock.append(total)
    return clock


def time_to_target(records: Sequence[Mapping[str, Any]], target: float) -> tuple[float, int] | None:
    """When the test accuracy first reached ``target``.

    Args:
        records: a run's ``metrics.jsonl`` lines (any order; sorted by step here).
        target: the test accuracy to reach, e.g. 0.9.

    Returns:
        ``(seconds, step)``: the training clock (:func:`training_clock`) at the end of the
        first step whose evaluation reached ``target`` (the studies' rule,
        :meth:`gssgd.study.curves.Metric.reaches`, with no margin: ``>= target``), and that
        step; None if no evaluation did.
    """
    rule = dataclasses.replace(ACCURACY, margin=0.0)
    records = sorted(records, key=lambda r: r["step"])
    for rec, seconds in zip(records, training_clock(records), strict=True):
        acc = _number(rec.get("test_accuracy"))
        if acc is not None and rule.reaches(acc, target):
            return seconds, int(rec["step"])
    return None


def summarize_run(
    records: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any] | None,
    *,
    workers: int,
    batch_size: int,
    target: float,
) -> dict[str, Any]:
    """One method's row of ``results.json`` from its run's metrics and summary.

    Args:
        records: the run's ``metrics.jsonl`` lines.
        summary: its ``summary.json`` (None if it wrote none).
        workers, batch_size: P and the per-worker batch.
        target: the target test accuracy.

    Returns:
        The row (see the module docstring); the ``gs_*`` ratios are filled in by
        :func:`summarize`. Time fields are None when no step was logged.
    """
    records = sorted(records, key=lambda r: r["step"])
    summary = summary or {}
    warm = summary.get("measured_from_step")
    warm = int(warm) if isinstance(warm, int) else 1
    timed = [r for r in records if r["step"] >= warm] or list(records)
    clock = training_clock(records)
    evaluations = [
        [int(r["step"]), round(t, 4), _number(r.get("test_accuracy"))]
        for r, t in zip(records, clock, strict=True)
        if "test_accuracy" in r
    ]
    final_acc = _number(summary.get("final_test_accuracy"))
    if final_acc is None and evaluations:
        final_acc = evaluations[-1][2]
    reached = time_to_target(records, target)
    ks = [r.get("k") for r in timed if isinstance(r.get("k"), int)]
    return {
        "status": summary.get("status", NO_SUMMARY),
        **_step_times(timed, workers * batch_size),
        "final_test_accuracy": final_acc,
        "seconds_to_target": reached[0] if reached else None,
        "step_to_target": reached[1] if reached else None,
        "seconds_training": clock[-1] if clock else None,
        "gs_throughput_speedup": None,
        "gs_time_to_target_speedup": None,
        "gs_time_to_target_speedup_at_least": None,
        "steps": len(records),
        "measured_from_step": warm,
        "k": ks[-1] if ks else None,
        "d": summary.get("d"),
        "evaluations": evaluations,
    }


def _step_times(timed: Sequence[Mapping[str, Any]], samples_per_step: int) -> dict[str, Any]:
    """The row's throughput, time and byte fields from the measured steps' records:
    medians of the times, means of the bytes (see the module docstring)."""

    def median(name: str) -> float | None:
        values = [v for v in (_number(r.get(name)) for r in timed) if v is not None]
        return statistics.median(values) if values else None

    def mean(name: str) -> float | None:
        values = [v for v in (_number(r.get(name)) for r in timed) if v is not None]
        return statistics.mean(values) if values else None

    step_s, compute_s = median("seconds_step"), median("seconds_compute")
    hook_timed = any(_number(r.get("seconds_communicate")) is not None for r in timed)
    return {
        "seconds_per_step": step_s,
        "samples_per_second": samples_per_step / step_s if step_s else None,
        "seconds_compute_per_step": compute_s,
        "seconds_overhead_per_step": (
            max(0.0, step_s - compute_s) if step_s is not None and compute_s is not None else None
        ),
        "compute_includes_communication": not hook_timed,
        "overhead_estimated": False,
        "seconds_communicate_per_step": median("seconds_communicate"),
        "seconds_compress_per_step": median("seconds_compress"),
        "bytes_sent_per_step": mean("bytes_sent"),
        "bytes_sent_max_per_step": mean("bytes_sent_max"),
    }


def summarize(rows: Mapping[str, dict[str, Any]], meta: Mapping[str, Any]) -> dict[str, Any]:
    """``results.json``: the rows, with dense's overhead estimate and gs's ratios, and _meta.

    Args:
        rows: method -> :func:`summarize_run` row, in run order.
        meta: the ``_meta`` entry.
    """
    results: dict[str, Any] = {m: dict(r) for m, r in rows.items()}
    separated = [
        r["seconds_compute_per_step"]
        for r in results.values()
        if not r["compute_includes_communication"] and r["seconds_compute_per_step"] is not None
    ]
    if separated:
        compute = statistics.median(separated)
        for r in results.values():
            if r["compute_includes_communication"] and r["seconds_per_step"] is not None:
                r["seconds_overhead_per_step"] = max(0.0, r["seconds_per_step"] - compute)
                r["overhead_estimated"] = True
    gs = results.get("gs")
    if gs is not None:
        for r in results.values():
            if gs["samples_per_second"] and r["samples_per_second"]:
                r["gs_throughput_speedup"] = gs["samples_per_second"] / r["samples_per_second"]
            gs_t, t = gs["seconds_to_target"], r["seconds_to_target"]
            if gs_t and t is not None:
                r["gs_time_to_target_speedup"] = t / gs_t
            elif gs_t and r["seconds_training"]:
                r["gs_time_to_target_speedup_at_least"] = r["seconds_training"] / gs_t
    results["_meta"] = dict(meta)
    return results
