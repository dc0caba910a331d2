"""One trial of a study: a training run in its own directory, and what it reached.

A study's directory holds one folder per run, ``runs/<label>/t<NNN>`` for the search's
trials (seed ``seeds[0]``) and ``runs/<label>/best-s<seed>`` for its best setting's other
seeds. Each folder has ``trial.json`` (the setting, written before training) and the run's
own ``summary.json`` and ``metrics.jsonl`` (:mod:`gssgd.train.metrics`). A folder whose run
completed is never trained again, so a killed study continues where it stopped; a run
that was cut short is trained again from its start (its outcome must not depend on where
the kill fell).
"""

from __future__ import annotations

import json
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gssgd.study.curves import Evaluation, Metric, curve_of, end_value, reach_and_stay
from gssgd.study.spec import MethodSpace, StudySpec
from gssgd.train.config import TrainConfig
from gssgd.train.method_settings import OPTION_FLAGS
from gssgd.train.metrics import (
    METRICS_FILE,
    STATUS_COLLAPSED,
    STATUS_COMPLETED,
    STATUS_NONFINITE,
    read_run,
    write_json,
)

__all__ = ["Outcome", "check_spec", "finished", "read_outcome", "run_trial", "trial_config"]

#: How a run may end and still be a trial's outcome: a setting that diverges or collapses
#: the sketch is a result (the worst), not a reason to stop the study.
FINISHED = (STATUS_COMPLETED, STATUS_NONFINITE, STATUS_COLLAPSED)
#: What the search minimises for a run that stopped early (worse than any finished run).
FAILED_OBJECTIVE = 1e9
TRIAL_FILE = "trial.json"
LOG_FILE = "train.log"


def trial_config(spec: StudySpec, row: MethodSpace, params: dict[str, Any], seed: int,
                 out: Path) -> TrainConfig:
    """The run of ``row`` at the setting ``params`` and ``seed``, into ``out``.

    Raises:
        ValueError: a setting the method does not take or a bad value (the config's own
            message, which names the flag and the fix).
        TypeError: a knob that is neither a setting nor an option.
    """
    settings = {**spec.run, **row.fixed, **params}
    names = TrainConfig.__dataclass_fields__
    options = {k: settings.pop(k) for k in list(settings)
               if k not in names and k not in OPTION_FLAGS}
    settings.update(seed=seed, out=str(out), overwrite=True, progress=False)
    return TrainConfig.build(row.method, options=options or None, **settings)


def check_spec(spec: StudySpec, root: Path) -> None:
    """Build every method's config at a setting from its space (each knob's first choice
    or low end) so a knob the method does not take fails before anything trains.

    Raises:
        ValueError: naming the method's label and the config's message.
    """
    for row in spec.methods:
        probe = {k.name: k.choices[0] if k.choices else k.low for k in row.knobs}
        try:
            trial_config(spec, row, probe, spec.seeds[0], root / "check")
        except (ValueError, TypeError) as err:
            raise ValueError(f"study spec, methods.{row.label}: {err}") from err


def finished(out: Path, meta: dict[str, Any]) -> bool:
    """Whether ``out`` holds a run of the setting ``meta`` that ended as a trial's outcome
    (:data:`FINISHED`).

    Raises:
        ValueError: ``out`` holds a run of another setting (the spec, or the sampler that
            planned it, changed since the study started: the message says to start it in a
            new directory).
    """
    return _finished_summary(out, meta) is not None


def _finished_summary(out: Path, meta: dict[str, Any]) -> dict[str, Any] | None:
    """The summary of ``out``'s finished run of ``meta`` (see :func:`finished`), or None."""
    written = out / TRIAL_FILE
    if not written.is_file():
        return None
    before = json.loads(written.read_text())
    if before != meta:
        raise ValueError(f"{out} was trained with {before}, not {meta}: the spec changed "
                         "since this study started; give the study a new directory")
    done = read_run(out)
    return done[0] if done is not None and done[0].get("status") in FINISHED else None


def run_trial(cfg: TrainConfig, out: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Train ``cfg`` into ``out`` unless a completed run of the same setting is there.

    Returns:
        The run's summary: completed, or stopped by a non-finite loss or a collapsed
        sketch (:data:`FINISHED`: the setting's outcome, the worst one).

    Raises:
        ValueError: ``out`` holds a run of another setting (the spec changed under a
            study that had started: the message says to start it in a new directory).
        RuntimeError: the run ended in any other way (a worker crashed, a timeout).
    """
    from gssgd.train.loop import run_training

    if (summary := _finished_summary(out, meta)) is not None:
        return summary
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / TRIAL_FILE, meta)  # atomic: a kill never leaves half a setting
    with open(out / LOG_FILE, "w") as log, redirect_stdout(log), redirect_stderr(log):
        summary = run_training(cfg)  # its lines go to the trial's log, not the study's bar
    if summary is None or summary.get("status") not in FINISHED:
        raise RuntimeError(f"the trial in {out} did not complete: "
                           f"{(summary or {}).get('message', 'no summary')}")
    return summary


@dataclass(frozen=True)
class Outcome:
    """What one run reached: its final value (None: it stopped early, ``status`` says
    why), its curve, the model's size, (given dense's value) the steps and busiest-link
    bytes until it reached the target and stayed (None: never;
    :func:`~gssgd.study.curves.reach_and_stay`), and its end value (the mean of its last
    ``metric.window`` evaluations, what a verdict judges)."""

    final: float | None
    curve: list[Evaluation]
    d: int  # the model's parameters (the run's gradient length)
    steps_to_target: int | None
    bytes_to_target: float | None
    status: str = STATUS_COMPLETED
    end: float | None = None  # the mean of the last ``metric.window`` evaluations

    @property
    def failed(self) -> bool:
        """Whether the run stopped before its last step (diverged, or the sketch collapsed)."""
        return self.status != STATUS_COMPLETED

    def objective(self, metric: Metric, reference: float | None) -> float:
        """What the search minimises. The reference method: its final value (negated for
        accuracy; its end value). Any other: ``log10`` of the bytes to the target when it
        is reached and kept, else ``20 + the shortfall`` of its end value (points of accuracy, or % of the loss), so that every
        run that reaches the target ranks before every run that does not, and those that
        do not by how far they end from it."""
        import math

        value = self.final if self.end is None else self.end
        if self.failed or value is None:
            return FAILED_OBJECTIVE
        if reference is None:
            return -value if metric.higher_is_better else value
        if self.bytes_to_target is not None:
            return math.log10(max(self.bytes_to_target, 1.0))
        return 20.0 + abs(metric.gap(value, metric.target(reference)))


def read_outcome(out: Path, metric: Metric, reference: float | None) -> Outcome:
    """The :class:`Outcome` of the completed run in ``out`` (reference: dense's final
    value, None before it is known)."""
    got = read_run(out)
    if got is None:
        raise FileNotFoundError(f"no completed run in {out} ({METRICS_FILE} or summary missing)")
    summary, records = got
    curve = curve_of(records, metric)
    status = summary.get("status", STATUS_COMPLETED)
    final = summary[f"final_test_{metric.key}"] if status == STATUS_COMPLETED else None
    steps, sent = (None, None) if reference is None or final is None else reach_and_stay(
        [curve], metric, reference)
    end = None if final is None else end_value(curve, metric.window)
    return Outcome(final, curve, int(summary["d"]), steps, sent, status, end)
