"""What gloo puts on the wire besides the payload, and the sizes its collectives cut.

The byte counts of :mod:`gssgd.comm` are payload only. On the wire gloo's TCP transport adds
a fixed preamble per message and direction (:data:`HEADER_BYTES`, :func:`wire_overhead`),
and every step of an aggregator starts with a small control message
(:data:`CONTROL_BYTES`).
"""

from __future__ import annotations

__all__ = ["CONTROL_BYTES", "GLOO_MAX_SEGMENT_BYTES", "HEADER_BYTES", "wire_overhead"]

#: Bytes of the int32 non-finite flag every aggregator step all-gathers first.
CONTROL_BYTES = 4

#: The bytes gloo puts in front of every message on the wire: the 48-byte preamble of its TCP
#: transport (``Op::preamble`` in gloo/transport/tcp/pair.h: six ``size_t`` fields). A message
#: between unbound buffers (every collective and send/recv of torch.distributed's gloo) is a
#: rendezvous of three of them: the sender's send-ready note and the preamble in front of the
#: payload go with the message, the receiver's recv-ready note goes back (``Pair::send``,
#: ``Pair::recv``). So a process writes its payload plus ``2 * 48`` bytes per message it
#: sends and 48 per message it receives, however many ``writev`` calls its payload takes
#: (tests/comm/test_wire_bytes.py checks it). :func:`wire_overhead` is that sum; the cost model
#: charges it (``critical_headers``).
HEADER_BYTES = 48

#: gloo's ring all-reduce cuts its buffer into segments of at most this many bytes
#: (``AllreduceOptions::kMaxSegmentSize``), and into at least two per rank.
GLOO_MAX_SEGMENT_BYTES = 1 << 20


def wire_overhead(messages: int, messages_received: int) -> int:
    """Bytes of gloo preambles a rank writes for ``messages`` sent and ``messages_received``
    received (:data:`HEADER_BYTES`: two per message sent, one per message received)."""
    return HEADER_BYTES * (2 * messages + messages_received)
