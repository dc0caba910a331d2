"""Collectives with exact byte, message, round and time accounting, and their formulas.

Every byte an aggregator moves goes through a :class:`Communicator`, which counts, per rank,
the payload bytes its process puts on the wire and takes off it under the algorithm's own
message pattern. The same patterns as formulas (:class:`Traffic`) predict what a step moves
without running it; each aggregator's ``traffic`` classmethod composes them into its own
message pattern, and the cost model and the training metrics read them from there. The
backend collectives count themselves with these same formulas, and the point-to-point ones
are checked against them on real processes (tests/test_methods.py), so the two cannot
disagree. This package is the one place every byte formula lives.

Modules, from the bottom up:

* :mod:`gssgd.comm.patterns`: every message pattern as a schedule and a formula
  (:class:`Traffic`): gloo's ring and all-gather, recursive doubling, recursive halving and
  doubling, the star around rank 0, the binomial tree; what gloo adds on the wire
  (:data:`HEADER_BYTES`, :func:`wire_overhead`) and the control message of every step
  (:data:`CONTROL_BYTES`).
* :mod:`gssgd.comm.communicator`: :class:`Communicator`, the collectives that run these
  patterns and count them in :class:`CommStats`.

Every name is importable from ``gssgd.comm`` itself.
"""

from __future__ import annotations

from gssgd.comm.communicator import (
    CommStats,
    Communicator,
    Payload,
    world_size_of,
)
from gssgd.comm.patterns import (
    CONTROL_BYTES,
    GLOO_MAX_SEGMENT_BYTES,
    HEADER_BYTES,
    RecursiveDoublingPlan,
    Traffic,
    TreePlan,
    allgather,
    gloo_ring_segments,
    halving_doubling,
    recursive_doubling,
    recursive_doubling_plan,
    ring_allreduce,
    ring_allreduce_bytes,
    star_broadcast,
    star_gather,
    tree_plan,
    tree_reduce_broadcast,
    wire_overhead,
)
from gssgd.transport import chain, completed_future, new_future

__all__ = [
    "CONTROL_BYTES",
    "GLOO_MAX_SEGMENT_BYTES",
    "HEADER_BYTES",
    "CommStats",
    "Communicator",
    "Payload",
    "RecursiveDoublingPlan",
    "Traffic",
    "TreePlan",
    "allgather",
    "chain",
    "completed_future",
    "gloo_ring_segments",
    "halving_doubling",
    "new_future",
    "recursive_doubling",
    "recursive_doubling_plan",
    "ring_allreduce",
    "ring_allreduce_bytes",
    "star_broadcast",
    "star_gather",
    "tree_plan",
    "tree_reduce_broadcast",
    "wire_overhead",
    "world_size_of",
]
