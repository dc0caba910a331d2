"""How a network carries a method's traffic: the collective pattern and rounds read from the
method's own traffic formula, and :class:`Network`, the constants of one network.

The cost model (:func:`gssgd.costmodel.cluster.predict_step`) charges a step's rounds and
bytes through a :class:`Network`:

* ``efficiency[pattern]``: the fraction of the nominal link rate a pattern's payload
  reaches (``ring``, ``recursive_doubling``, ``allgather``, ``star``; :func:`pattern_of`);
* ``round_s``: software seconds per round beyond the link's own latency (what gloo, Python
  and the scheduler add to each message on this machine);
* ``driven_round_s``: the further wait of a round a Python loop drives (each exchange of
  recursive doubling, each send of the star), per worker sharing a core: the partner has
  to be scheduled again before the next message moves (:func:`rounds_of`);
* ``burst_credit``: the share of a ``tc tbf`` bucket each round sends at memory speed
  after an idle moment (emulated links only);
* ``software_s_per_byte``: seconds per byte the software stack needs (the wire is
  ``8 / (efficiency * rate)``; the slower of the two counts), per worker sharing a core;
* ``headers``: whether each message carries gloo's 48-byte preambles (this machine's gloo;
  NCCL's messages on a GPU cluster have none).

A GPU cluster is predicted with :meth:`Network.for_cluster`: no gloo preambles, no token
bucket, and one link efficiency for every pattern (the ring's fitted one) unless a cluster
measurement says otherwise: the lower efficiencies fitted here for recursive doubling and
the all-gather have no established cause and are not carried to NCCL.

:func:`gssgd.costmodel.advice.fitted_network` is the network fitted on this machine's
emulated links (:mod:`gssgd.costmodel.fit`, stored in ``gssgd/costmodel/data/fit.json``):
its pattern efficiencies and nothing else, the one its held-out error is measured for; its
:meth:`~Network.for_cluster` is what ``gssgd advise`` predicts a GPU cluster with. The other
terms stay for a network that has them (tests).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gssgd.comm import Traffic
from gssgd.costmodel.method_specs import MethodSpec, traffic
from gssgd.methods import get_method

__all__ = [
    "DRIVEN_PATTERNS",
    "PATTERNS",
    "Network",
    "Rounds",
    "pattern_of",
    "rounds_of",
    "step_traffic",
]

#: The collectives :func:`pattern_of` tells apart ("mixed": none of them alone).
PATTERNS: tuple[str, ...] = ("ring", "recursive_doubling", "allgather", "star", "mixed")
#: The patterns whose bulk rounds a Python loop drives (one send/receive per round, a
#: combine between rounds), rather than one gloo collective call.
DRIVEN_PATTERNS: tuple[str, ...] = ("recursive_doubling", "star")


@functools.lru_cache(maxsize=8192)
def step_traffic(spec: MethodSpec, world_size: int) -> Traffic:
    """``traffic`` of a spec's steady step (cached: a fit asks for the same points many
    times)."""
    return traffic(spec, world_size)


@functools.lru_cache(maxsize=8192)
def pattern_of(spec: MethodSpec) -> str:
    """The collective of ``spec``'s bulk traffic, read from its own traffic formula.

    Steps: take the method's :class:`~gssgd.comm.Traffic` at P = 8 and P = 16 and remove its
    control all-gather (the aggregator's ``control_traffic``); then the rounds left tell the
    pattern by how they grow: unchanged (a star: one round a phase), by 4/3 (recursive
    doubling: log2 P), by 30/14 (a ring all-reduce, 2(P-1), or an all-gather, P-1). The last
    two differ in their bytes: a ring all-reduce sends about ``2n`` whatever P, an all-gather
    ``(P-1) * n``, which more than doubles from P = 8 to 16 (15/7).

    Returns:
        One of :data:`PATTERNS`.
    """
    cls = get_method(spec.aggregator).aggregator
    assert cls is not None
    bulk = {}
    for p in (8, 16):
        t, c = step_traffic(spec, p), cls.control_traffic(p)
        bulk[p] = (t.rounds - c.rounds, max(t.sent) - max(c.sent))
    (r8, sent8), (r16, sent16) = bulk[8], bulk[16]
    if r8 <= 0:
        return "mixed"
    if r16 == r8:
        return "star"
    if 3 * r16 == 4 * r8:
        return "recursive_doubling"
    if 14 * r16 == 30 * r8:
        return "allgather" if sent16 > 2 * sent8 else "ring"
    return "mixed"


@dataclass(frozen=True)
class Rounds:
    """A method's rounds at one P, split by what drives them.

    Attributes:
        collective: rounds inside one collective call (ring all-reduce, all-gather, the
            control all-gather).
        driven: rounds a Python loop drives (recursive-doubling exchanges, the star's sends
            and receives).
    """

    collective: int
    driven: int

    @property
    def total(self) -> int:
        return self.collective + self.driven


@functools.lru_cache(maxsize=8192)
def rounds_of(spec: MethodSpec, world_size: int) -> Rounds:
    """Split ``spec``'s rounds at ``world_size`` into collective and driven ones.

    Steps: the method's :class:`~gssgd.comm.Traffic` rounds, less its control all-gather's
    (the aggregator's ``control_traffic``), are its bulk rounds; they are driven when its
    pattern (:func:`pattern_of`) is one of :data:`DRIVEN_PATTERNS`, else collective.

    Returns:
        The split; ``total`` equals the traffic's rounds.
    """
    total = step_traffic(spec, world_size).rounds
    if pattern_of(spec) not in DRIVEN_PATTERNS:
        return Rounds(collective=total, driven=0)
    cls = get_method(spec.aggregator).aggregator
    assert cls is not None
    control = cls.control_traffic(world_size).rounds
    return Rounds(collective=control, driven=max(0, total - control))


@dataclass(frozen=True)
class Network:
    """The constants of one network (see the module doc).

    Attributes:
        efficiency: fraction of the nominal rate each pattern's payload reaches (a pattern
            missing here takes ``default_efficiency``).
        default_efficiency: for a pattern without a fitted efficiency.
        round_s: software seconds per round beyond the link's latency.
        driven_round_s: extra seconds per driven round and worker sharing a core.
        burst_credit: share of a tbf bucket each round sends free.
        software_s_per_byte: software seconds per byte and worker sharing a core.
        headers: charge gloo's 48-byte preambles (``Traffic.header_bytes``) on the wire.
        source: where the constants come from.
    """

    efficiency: Mapping[str, float] = field(default_factory=dict)
    default_efficiency: float = 0.9
    round_s: float = 0.0
    driven_round_s: float = 0.0
    burst_credit: float = 0.0
    software_s_per_byte: float = 0.0
    headers: bool = True
    source: str = ""

    def eta(self, pattern: str) -> float:
        """The efficiency of ``pattern``."""
        return self.efficiency.get(pattern, self.default_efficiency)

    def for_cluster(self) -> Network:
        """These constants as a GPU cluster's (NCCL): every pattern at the ring's efficiency,
        no gloo preambles, no token bucket credit (see the module doc)."""
        ring = self.eta("ring")
        return replace(self, efficiency={}, default_efficiency=ring, headers=False,
                       burst_credit=0.0,
                       source=f"{self.source}; as a GPU cluster: one efficiency ({ring:g}, the "
                              "ring's) for every pattern, no gloo headers")

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record (what ``fit.json`` stores under ``network``)."""
        return {"efficiency": dict(self.efficiency),
                "default_efficiency": self.default_efficiency, "round_s": self.round_s,
                "driven_round_s": self.driven_round_s, "burst_credit": self.burst_credit,
                "software_s_per_byte": self.software_s_per_byte, "headers": self.headers,
                "source": self.source}

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> Network:
        """The inverse of :meth:`as_dict`."""
        return cls(**{k: v for k, v in record.items()})

