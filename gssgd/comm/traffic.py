"""The traffic of a message pattern, as a value: what every rank sends and receives.

A :class:`Traffic` is what one step of a pattern moves, per rank; patterns run one after
the other add up (``+``). The patterns themselves are formulas in :mod:`gssgd.comm.ring`,
:mod:`gssgd.comm.doubling` and :mod:`gssgd.comm.star`, each built from :func:`phase`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gssgd.comm.wire import HEADER_BYTES

__all__ = ["Traffic", "phase"]


@dataclass(frozen=True)
class Traffic:
    """What one step of a message pattern moves, for every rank.

    Attributes:
        sent, received: payload bytes per rank (index = rank), as
            :class:`~gssgd.comm.Communicator` counts them: what each rank's process puts on
            the wire and takes off it, data it forwards for others included (a ring
            all-gather's).
        rounds: sequential communication steps on the critical path.
        critical_bytes: bytes on the busiest link, summed over the sequential phases, each
            phase counted in its busier direction (links are full duplex).
        messages, messages_received: point-to-point messages each rank sends and receives.
        critical_headers: gloo preambles (:data:`~gssgd.comm.HEADER_BYTES` each) on the
            busiest link, summed over the phases like ``critical_bytes``: in a phase where a
            rank sends ``s`` messages and receives ``r``, its link carries ``2s + r``
            preambles out and ``2r + s`` in.
    """

    sent: tuple[int, ...]
    received: tuple[int, ...]
    rounds: int
    critical_bytes: int
    messages: tuple[int, ...]
    messages_received: tuple[int, ...]
    critical_headers: int

    @classmethod
    def none(cls, world_size: int) -> Traffic:
        """Nothing moved: the start of a sum of phases."""
        zero = (0,) * world_size
        return cls(zero, zero, 0, 0, zero, zero, 0)

    @property
    def header_bytes(self) -> int:
        """Bytes of gloo preambles on the busiest link: ``HEADER_BYTES * critical_headers``."""
        return HEADER_BYTES * self.critical_headers

    def __add__(self, other: Traffic) -> Traffic:
        """The two patterns one after the other."""

        def both(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(x + y for x, y in zip(a, b, strict=True))

        return Traffic(
            both(self.sent, other.sent),
            both(self.received, other.received),
            self.rounds + other.rounds,
            self.critical_bytes + other.critical_bytes,
            both(self.messages, other.messages),
            both(self.messages_received, other.messages_received),
            self.critical_headers + other.critical_headers,
        )


def phase(
    sent: Sequence[int], received: Sequence[int], rounds: int,
    messages: Sequence[int], messages_received: Sequence[int], critical_bytes: int | None = None,
) -> Traffic:
    """One phase of a pattern from its per-rank figures; its critical bytes (unless given)
    and preambles are the busiest rank's link in its busier direction."""
    if critical_bytes is None:
        critical_bytes = max(max(s, r) for s, r in zip(sent, received, strict=True))
    headers = max(
        max(2 * s + r, s + 2 * r) for s, r in zip(messages, messages_received, strict=True)
    )
    return Traffic(tuple(sent), tuple(received), rounds, critical_bytes, tuple(messages),
                   tuple(messages_received), headers)
