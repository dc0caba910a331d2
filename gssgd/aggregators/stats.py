"""What one aggregation step cost a rank, as named fields (:class:`StepStats`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StepStats"]


@dataclass
class StepStats:
    """What one ``step`` cost this rank.

    Attributes:
        bytes_sent, bytes_received: payload bytes this rank's process put on the wire and
            took off it, control messages and data forwarded for other ranks included
            (gloo's preambles are not payload: :func:`gssgd.comm.wire_overhead`).
        messages, messages_received: point-to-point messages this rank sent and received.
        rounds: sequential communication steps on the critical path.
        seconds_compress: time spent selecting/sketching before communication.
        seconds_communicate: time inside collectives.
        seconds_decompress: time spent after communication (recovery, update, residual).
        k, d: coordinates sent per rank, and the vector length.
        skipped: True when the step was skipped for a non-finite gradient.
        delivered_fraction: for sparse methods, the share of the global accumulated mass
            (squared l2) that this step delivered, where the method can measure it; else None.
        audited_recall: gs-SGD on a step its collapse guard audited: the delivered share
            of the mass exact global top-k would have delivered (the guard's bar is
            ``min_recall``; see :mod:`gssgd.aggregators.guard`); else None.
    """

    bytes_sent: int = 0
    bytes_received: int = 0
    messages: int = 0
    rounds: int = 0
    messages_received: int = 0
    seconds_compress: float = 0.0
    seconds_communicate: float = 0.0
    seconds_decompress: float = 0.0
    k: int = 0
    d: int = 0
    skipped: bool = False
    delivered_fraction: float | None = None
    audited_recall: float | None = None
