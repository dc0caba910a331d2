"""Optional TensorBoard logging of ``gssgd train`` (``--tensorboard DIR``).

Rank 0 writes the same step scalars as ``metrics.jsonl`` (loss, accuracy, bytes, step
time), plus the learning rate and, under ``--amp fp16``, the loss scale, through
``torch.utils.tensorboard``. The JSONL stays the record of the run; this is for users who
already watch their runs in TensorBoard (``tensorboard --logdir DIR``).

``tensorboard`` is an optional package (``pip install tensorboard``, or the
``gssgd[tensorboard]`` extra): :func:`require_tensorboard` checks for it before any worker
starts, so a run never ends in a missing import.

Example::

    writer = TensorBoardLog("runs/tb", start_step=0)
    writer.write({"step": 0, "loss": 2.3, "train_accuracy": 0.1, ...}, lr=0.2)
    writer.close()
"""

from __future__ import annotations

from typing import Any

from gssgd.validate import is_int

__all__ = ["INSTALL", "TAGS", "TensorBoardLog", "require_tensorboard"]

#: How to install what ``--tensorboard`` needs.
INSTALL = "pip install tensorboard (or pip install 'gssgd[tensorboard]')"

#: ``metrics.jsonl`` field -> TensorBoard tag (fields that are None on a step are left out).
TAGS: dict[str, str] = {
    "loss": "train/loss",
    "train_accuracy": "train/accuracy",
    "test_loss": "test/loss",
    "test_accuracy": "test/accuracy",
    "bytes_sent": "comm/bytes_sent",
    "bytes_sent_max": "comm/bytes_sent_max",
    "bytes_received": "comm/bytes_received",
    "bytes_sent_total": "comm/bytes_sent_total",
    "seconds_step": "time/seconds_step",
    "seconds_compute": "time/seconds_compute",
    "seconds_communicate": "time/seconds_communicate",
    "delivered_fraction": "comm/delivered_fraction",
    "audited_recall": "comm/audited_recall",
}


def require_tensorboard() -> None:
    """Raise a ValueError naming the install command unless TensorBoard's writer imports.

    Raises:
        ValueError: the ``tensorboard`` package is missing (``gssgd train`` exits 2).
    """
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError as err:
        raise ValueError(
            f"--tensorboard needs the tensorboard package, which is not installed ({err}); "
            f"install it with {INSTALL}, or leave --tensorboard out (metrics.jsonl has the "
            "same numbers)."
        ) from None


class TensorBoardLog:
    """Rank 0's TensorBoard event writer, one scalar per field and step.

    Args:
        logdir: the directory TensorBoard reads (``--tensorboard DIR``).
        start_step: the first step this process logs (a resumed run appends; TensorBoard
            shows the later events of a step it already has).
    """

    def __init__(self, logdir: str, start_step: int = 0) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=logdir, purge_step=start_step or None)

    def write(
        self, record: dict[str, Any], lr: float | None = None, loss_scale: float | None = None
    ) -> None:
        """Write a ``metrics.jsonl`` record's scalars at ``record["step"]``.

        Args:
            record: the step's metrics (see :mod:`gssgd.train.metrics`).
            lr: the optimizer's learning rate at this step (``train/lr``).
            loss_scale: the GradScaler's scale after this step (``amp/loss_scale``).
        """
        step = int(record["step"])
        for field, tag in TAGS.items():
            value = record.get(field)
            if isinstance(value, float) or is_int(value):  # NaN too: a diverged loss shows
                self.writer.add_scalar(tag, value, step)
        if lr is not None:
            self.writer.add_scalar("train/lr", lr, step)
        if loss_scale is not None:
            self.writer.add_scalar("amp/loss_scale", loss_scale, step)

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()
