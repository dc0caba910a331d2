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

* :mod:`gssgd.comm.wire`: what gloo adds on the wire (:data:`HEADER_BYTES` per message and
  direction, :func:`wire_overhead`) and the control message of every step
  (:data:`CONTROL_BYTES`).
* :mod:`gssgd.comm.traffic`: :class:`Traffic`, what a pattern moves per rank; patterns add.
* :mod:`gssgd.comm.ring`: gloo's ring all-reduce (:func:`ring_allreduce`, segment by
  segment) and all-gather (:func:`allgather`).
* :mod:`gssgd.comm.doubling`: recursive doubling's schedule
  (:func:`recursive_doubling_plan`) and formula (:func:`recursive_doubling`), and the
  all-reduce by recursive halving and doubling's (:func:`halving_doubling`).
* :mod:`gssgd.comm.star`: every rank to rank 0 and back (:func:`star_gather`,
  :func:`star_broadcast`).
* :mod:`gssgd.comm.tree`: a binomial tree to rank 0 and back (:func:`tree_plan`,
  :func:`tree_reduce_broadcast`).
* :mod:`gssgd.comm.communicator`: :class:`Communicator`, the collectives that run these
  patterns and count them in :class:`CommStats`.
* :mod:`gssgd.comm.futures`: futures for DDP communication hooks.

Every name is importable from ``gssgd.comm`` itself.
"""

from __future__ import annotations

from gssgd.comm.communicator import CommStats, Communicator, Payload, world_size_of
from gssgd.comm.doubling import (
    RecursiveDoublingPlan,
    halving_doubling,
    recursive_doubling,
    recursive_doubling_plan,
)
from gssgd.comm.futures import completed_future, new_future
from gssgd.comm.ring import allgather, gloo_ring_segments, ring_allreduce, ring_allreduce_bytes
from gssgd.comm.star import star_broadcast, star_gather
from gssgd.comm.traffic import Traffic
from gssgd.comm.tree import TreePlan, tree_plan, tree_reduce_broadcast
from gssgd.comm.wire import CONTROL_BYTES, GLOO_MAX_SEGMENT_BYTES, HEADER_BYTES, wire_overhead

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
