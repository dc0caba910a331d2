"""What a training run measures, and where it writes it.

(The bytes of DDP's built-in hooks are counted by :func:`gssgd.train.sync.builtin_hook_bytes`
with :mod:`gssgd.comm`'s ring figure, so every method is measured with the same yardstick.)

* :class:`RunTotals`: running sums over the run (resumable: they live in the checkpoint).
* :class:`MetricsLog`: one JSON object per step in ``OUT/metrics.jsonl`` (rank 0 only).
* :func:`write_json`: ``OUT/summary.json`` and friends, written atomically.

Fields of a ``metrics.jsonl`` line (``None`` where a method cannot measure a field):

==========================  ===========================================================
``step``                    the step just completed, counted from 0
``loss``                    training loss, averaged over all workers' samples
``train_accuracy``          accuracy on this step's training batches (all workers)
``test_loss``               test loss, on steps with an evaluation only
``test_accuracy``           test accuracy, on steps with an evaluation only
``bytes_sent``              payload bytes a worker sent this step (mean over workers)
``bytes_sent_max``          the busiest worker's bytes sent (Sketched-SGD's server)
``bytes_received``          payload bytes a worker received this step (mean)
``bytes_received_max``      the busiest worker's bytes received
``bytes_sent_total``        cumulative ``bytes_sent`` since step 0 (mean worker)
``seconds_compute``         forward + backward, minus the time the comm hook held the
                            backward (its calls' wall time; else the time it reported)
``seconds_compress``        hook time spent selecting / sketching
``seconds_communicate``     hook time inside collectives
``seconds_decompress``      hook time spent recovering the update and residuals
``seconds_step``            the whole step: batch, forward, backward, optimizer
``delivered_fraction``      share of the accumulated gradient mass delivered (sparse)
``audited_recall``          gs on a step its collapse guard audited: the delivered share of
                            exact global top-k's mass (a collapse is below 0.1); else null
``skipped``                 the aggregator skipped the step (non-finite gradient)
==========================  ===========================================================

All ``seconds_*`` are rank 0's; byte counts are averaged over ranks.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

from gssgd.train.checkpoint import atomic_write

__all__ = [
    "METRICS_FILE",
    "SUMMARY_FILE",
    "MetricsLog",
    "RunTotals",
    "STATUS_COLLAPSED",
    "STATUS_COMPLETED",
    "STATUS_NONFINITE",
    "StepBytes",
    "StepLoss",
    "read_metrics",
    "read_run",
    "run_summary",
    "step_record",
    "summary_line",
    "write_json",
]

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
#: ``summary["status"]`` of a finished run, and of runs that stopped early on every rank.
STATUS_COMPLETED, STATUS_NONFINITE = "completed", "stopped: non-finite loss"
STATUS_COLLAPSED = "stopped: sketch collapsed"


@dataclass(frozen=True)
class StepBytes:
    """One step's payload bytes over the ranks: the mean and the busiest rank's."""

    sent_mean: float
    sent_max: float
    received_mean: float
    received_max: float

    @classmethod
    def of(cls, per_rank: list[tuple[float, float]]) -> StepBytes:
        """From every rank's ``(bytes sent, bytes received)``."""
        sent = [s for s, _ in per_rank]
        received = [r for _, r in per_rank]
        n = len(per_rank)
        return cls(sum(sent) / n, max(sent), sum(received) / n, max(received))


class StepLoss(NamedTuple):
    """One step's training loss over the ranks, as the workers' all-reduce sums it.

    Attributes:
        loss_sum: the loss times the examples, summed; correct: the right predictions;
            count: the examples (the step's mean loss is ``loss_sum / count``).
        nonfinite: the ranks whose loss was NaN or infinite (nothing was updated then).
        seconds: the step's time on this process (forward, backward, averaging, update).
    """

    loss_sum: float
    correct: float
    count: float
    nonfinite: int
    seconds: float


def busier_bytes(record: dict[str, Any]) -> float:
    """A step's bytes on the busiest worker's link, in its busier direction: local Top-k's
    workers send 2k numbers but receive 2k(P-1), Sketched-SGD's server receives P sketches.
    (A summary's ``*_per_step`` fields work too.)"""
    sent = record.get("bytes_sent_max", record.get("bytes_sent_max_per_step")) or 0
    received = record.get("bytes_received_max", record.get("bytes_received_max_per_step")) or 0
    return float(max(sent, received))


def step_record(
    step: int,
    loss: float,
    train_accuracy: float,
    stats: dict[str, Any],
    moved: StepBytes,
    bytes_sent_before: float,
    seconds_step: float,
) -> dict[str, Any]:
    """A step's ``metrics.jsonl`` line (the fields in this module's doc).

    Args:
        step: the step just completed.
        loss, train_accuracy: over all workers' samples.
        stats: rank 0's hook statistics (``seconds_*``, ``delivered_fraction``,
            ``audited_recall``, ``skipped``, ``k``; see :meth:`gssgd.train.sync.GradientSync.step_stats`).
        moved: the step's bytes over the ranks.
        bytes_sent_before: the mean worker's bytes sent in the steps before this one.
        seconds_step: the whole step on rank 0.
    """
    hook_seconds = stats.get("seconds_blocked")  # what the backward waited for the hook
    if hook_seconds is None:  # (its phases also count what it overlapped with backward)
        hook_seconds = sum(stats[k] or 0.0 for k in (
            "seconds_compress", "seconds_communicate", "seconds_decompress"))
    return {
        "step": step,
        "loss": loss,
        "train_accuracy": train_accuracy,
        "bytes_sent": moved.sent_mean,
        "bytes_sent_max": moved.sent_max,
        "bytes_received": moved.received_mean,
        "bytes_received_max": moved.received_max,
        "bytes_sent_total": bytes_sent_before + moved.sent_mean,
        "seconds_compute": seconds_step - hook_seconds,
        "seconds_compress": stats["seconds_compress"],
        "seconds_communicate": stats["seconds_communicate"],
        "seconds_decompress": stats["seconds_decompress"],
        "seconds_step": seconds_step,
        "delivered_fraction": stats["delivered_fraction"],
        "audited_recall": stats.get("audited_recall"),
        "skipped": stats["skipped"],
        "k": stats["k"],
    }


@dataclass
class RunTotals:
    """Running sums over a run; saved in checkpoints so a resumed run continues them.

    The per-step averages leave out the first ``warmup`` steps (DDP's bucket rebuild,
    and the dense all-reduce a comm hook does before its start iteration).
    """

    steps: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    measured_steps: int = 0
    measured_bytes_sent: int = 0
    measured_bytes_sent_max: int = 0
    measured_bytes_received: int = 0
    measured_bytes_received_max: int = 0
    measured_seconds_step: float = 0.0
    measured_seconds_communicate: float = 0.0
    skipped_steps: int = 0

    def add(self, record: dict[str, Any], measured: bool) -> None:
        """Add one step's record (a ``metrics.jsonl`` line)."""
        self.steps += 1
        self.bytes_sent += int(record["bytes_sent"])
        self.bytes_received += int(record["bytes_received"])
        self.skipped_steps += int(bool(record.get("skipped")))
        if measured:
            self.measured_steps += 1
            self.measured_bytes_sent += int(record["bytes_sent"])
            self.measured_bytes_sent_max += int(record["bytes_sent_max"])
            self.measured_bytes_received += int(record["bytes_received"])
            self.measured_bytes_received_max += int(record.get("bytes_received_max") or 0)
            self.measured_seconds_step += float(record["seconds_step"])
            self.measured_seconds_communicate += float(record["seconds_communicate"] or 0.0)

    def per_step(self) -> dict[str, float | None]:
        """Averages over the measured steps (None before any)."""
        n = self.measured_steps
        if n == 0:
            return dict.fromkeys(
                (
                    "bytes_sent_per_step",
                    "bytes_sent_max_per_step",
                    "bytes_received_per_step",
                    "bytes_received_max_per_step",
                    "seconds_per_step",
                    "seconds_communicate_per_step",
                )
            )
        return {
            "bytes_sent_per_step": self.measured_bytes_sent / n,
            "bytes_sent_max_per_step": self.measured_bytes_sent_max / n,
            "bytes_received_per_step": self.measured_bytes_received / n,
            "bytes_received_max_per_step": self.measured_bytes_received_max / n,
            "seconds_per_step": self.measured_seconds_step / n,
            "seconds_communicate_per_step": self.measured_seconds_communicate / n,
        }

    def state_dict(self) -> dict[str, int | float]:
        """Plain numbers, for the checkpoint."""
        return asdict(self)

    def load_state_dict(self, sd: dict[str, int | float]) -> None:
        """Restore :meth:`state_dict` output (unknown keys are ignored)."""
        for f in fields(self):
            if f.name in sd:
                setattr(self, f.name, type(getattr(self, f.name))(sd[f.name]))


def _clean(value: Any) -> Any:
    """JSON has no NaN/Inf: write them as strings so the file stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsLog:
    """Append one JSON line per step to ``OUT/metrics.jsonl``.

    Args:
        run_dir: the run directory.
        start_step: the first step this process will log. Lines of steps ``>= start_step``
            (left by an interrupted run that is now resumed) are dropped first, so the
            file holds each step once.
    """

    def __init__(self, run_dir: Path | str, start_step: int) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        kept = [r for r in read_metrics(self.path) if r["step"] < start_step] if start_step else []
        atomic_write(self.path, lambda f: f.writelines(_line(r) for r in kept))
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` as one line and flush it (a crash loses at most this line)."""
        self._file.write(_line(record).decode())
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def _line(record: dict[str, Any]) -> bytes:
    return (json.dumps(_sanitise(record)) + "\n").encode()


def read_metrics(path: Path | str) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (a torn last line, from a crash, is skipped)."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def read_run(run_dir: Path | str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """A finished run directory's ``summary.json`` and ``metrics.jsonl`` records, or None
    while it has no summary (not finished, or not a run). Study reports read runs with it."""
    run_dir = Path(run_dir)
    summary_file = run_dir / SUMMARY_FILE
    if not summary_file.is_file():
        return None
    summary = json.loads(summary_file.read_text(encoding="utf-8"))
    return summary, read_metrics(run_dir / METRICS_FILE)


def write_json(path: Path | str, content: dict[str, Any]) -> None:
    """Write ``content`` as indented JSON, atomically (non-finite floats as strings)."""
    text = json.dumps(_sanitise(content), indent=2, default=str)
    atomic_write(Path(path), lambda f: f.write((text + "\n").encode()))


def _sanitise(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sanitise(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_sanitise(v) for v in value]
    return _clean(value)


def run_summary(
    cfg: Any,
    *,
    status: str,
    message: str,
    world_size: int,
    d: int,
    totals: RunTotals,
    last_loss: float | None,
    last_eval: tuple[float | None, float | None],
    measured_from_step: int,
    seconds_wall: float,
    checkpoint: str | None,
    **extra: Any,
) -> dict[str, Any]:
    """The run's ``summary.json``: how it ended, its final figures and per-step averages.

    Args:
        cfg: the run's :class:`~gssgd.train.config.TrainConfig`.
        status, message: how the run ended (``"completed"`` or why it stopped).
        world_size, d: workers and gradient length.
        totals: the run's sums; last_loss: the last training loss; last_eval: the last
            ``(test loss, test accuracy)``.
        measured_from_step: the first step counted in the per-step averages.
        seconds_wall: the run's wall time; checkpoint: the final checkpoint, or None.
        **extra: more fields (a simulated run says so).
    """
    return {
        "status": status,
        "message": message,
        "method": cfg.method,
        "dataset": cfg.dataset,
        "model": cfg.model,
        "world_size": world_size,
        "d": d,
        "steps": totals.steps,
        "final_train_loss": last_loss,
        "final_test_loss": last_eval[0],
        "final_test_accuracy": last_eval[1],
        **totals.per_step(),
        "bytes_sent_total": totals.bytes_sent,
        "measured_from_step": measured_from_step,
        "seconds_wall": seconds_wall,
        "checkpoint": checkpoint,
        **extra,
        "config": asdict(cfg),
    }


def summary_line(summary: dict[str, Any]) -> str:
    """One line saying how a finished run ended: its test figures, bytes and step time (a
    simulated run's wall time per step is not a step time, so it is left out)."""
    acc = summary["final_test_accuracy"]
    bytes_ = summary["bytes_sent_per_step"]
    seconds = None if summary.get("simulated") else summary["seconds_per_step"]
    return (
        f"gssgd train: done after {summary['steps']} steps: test loss "
        f"{summary['final_test_loss']:.4f}, test accuracy {acc:.4f}, "
        + (f"{bytes_:,.0f} bytes sent per worker per step, " if bytes_ is not None else "")
        + (f"{seconds * 1e3:.1f} ms per step" if seconds is not None else "")
    )
