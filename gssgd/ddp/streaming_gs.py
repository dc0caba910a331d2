"""Streaming gs-SGD: a table partitioned by DDP bucket, each bucket's region all-reduced during
backward, started as the bucket arrives.

Whole-model gs (``HookState("gs", whole_model=True)``) waits for DDP's last bucket before it
sketches anything, because one hash spreads every bucket over the whole table. A Count
Sketch is linear, so the table can instead be **partitioned by bucket**
(:class:`~gssgd.sketch.partitioned.PartitionedSketch`): bucket ``b`` hashes only into its
own region, which is final as soon as DDP hands the bucket over and can be sent while
backward still computes the earlier layers' gradients. Selected with
``HookState("gs", whole_model=True, overlap="stream")`` or ``gssgd train --overlap stream``.

Algorithm, per compressed iteration (every rank runs the collectives in the same order,
as DDP hands the buckets over in index order):

1. Bucket ``b`` arrives (``comm_hook``): ``a_b = e_b + g_b`` (with momentum
   ``u_b = rho * u_b + g_b``, ``a_b = e_b + u_b``; under ``feedback="onebit"``, 1-bit
   Adam's ``a_b = e_b + rho * m_b + (1 - rho) * g_b`` with ``m`` the last update), sketch ``a_b`` into region ``b``, and
   start the region's all-reduce with ``async_op=True``, chained on its future
   (``get_future().then(...)``). The bucket gets a pending future.
   The last bucket's region also carries every rank's non-finite flag (``P`` slots, this
   rank's set to 1 when any of its gradient is NaN/Inf), so no flag all-gather waits after
   backward.
2. The last bucket: wait for every region's sum, then, as whole-model gs does: the
   ``nonfinite`` policy on the summed flags, the ``m * k``
   candidates over the whole table (one global selection, ties to the lower index), the
   exact round, the top ``k``, the update ``/ P`` and error feedback ``e = a`` with the
   ``k`` coordinates zeroed.
3. Every bucket's buffer receives its slice of the update and every pending future
   completes; DDP then writes ``param.grad``.

The aggregator (:class:`StreamingGS`, steps 1-2, here) knows nothing of DDP:
:meth:`StreamingGS.add_bucket` sketches each bucket into its own region of a
:class:`~gssgd.sketch.partitioned.PartitionedSketch` and starts that region's all-reduce;
:meth:`StreamingGS.finish` waits for them, recovers the top ``k`` over the whole table and
returns the update. :meth:`~gssgd.ddp.hook.HookCore.stream_step` feeds it DDP's buckets on
the runtime trunk of the hook state. :func:`stream_traffic` is its message pattern as
:mod:`gssgd.comm` formulas. ``overlap=`` is validated with the other settings
(:func:`gssgd.ddp.settings.check_overlap`).

Differences from whole-model gs, by design:

* The regions are summed with the backend's all-reduce (ring, counted ``2(P-1)/P`` of
  the region's bytes), the only one that runs asynchronously, and by default so is the
  exact round (``allreduce=`` still chooses it).
* The sketch takes :func:`~gssgd.aggregators.sizing.streaming_options` (40·k float32
  columns, m = 32) at every ``P`` and sketches every coordinate: the pre-filter needs the
  whole gradient before bucket 0, and the default shape's float16 table and (from 16
  workers) narrow table were measured with it.
* The residual is kept in bucket order (bucket index, then DDP's order inside it), like
  per-bucket mode: a resume needs the same bucket layout (same model and
  ``bucket_cap_mb``). The layout is recorded in a dense iteration, so each process runs
  two dense iterations before it streams (DDP's first, whose layout DDP rebuilds, and the
  first on the rebuilt layout), also when resuming.
* ``local_clip`` needs the whole gradient's norm before the first bucket is sketched and
  is refused with ``overlap="stream"``.

The time the last bucket waits for the regions is the communication backward did not
hide; :attr:`StreamingGS.last_overlap` reports it per iteration
(:class:`OverlapStats`, at the end of this module), with when each bucket arrived and each
region's all-reduce started; with :data:`OVERLAP_LOG_ENV` set, :func:`log_overlap` appends
each iteration's record to a JSON-lines file per rank.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from gssgd.aggregators.base import all_finite, state_dtype
from gssgd.aggregators.gs import GlobalSketchSGD, GSOptions
from gssgd.comm import Traffic, recursive_doubling, ring_allreduce
from gssgd.sketch.partitioned import PartitionedSketch, region_columns

__all__ = [
    "OVERLAP_LOG_ENV",
    "OverlapStats",
    "StreamingGS",
    "log_overlap",
    "stream_traffic",
]


def stream_traffic(
    region_cols: list[int], k: int, d: int, options: GSOptions, world_size: int
) -> Traffic:
    """What one streaming step moves: one ring all-reduce per region (``rows * c_b``
    entries of ``table_dtype``, the last region ``P`` more: the ranks' non-finite flags,
    which whole-model gs sends after its table) and, with ``exact``, the candidates' round
    (``allreduce=``'s pattern), as :meth:`GlobalSketchSGD.traffic` counts whole-model gs."""
    out = Traffic.none(world_size)
    size = options.table_dtype.itemsize
    for b, c in enumerate(region_cols):
        flags = world_size if b == len(region_cols) - 1 else 0
        out = out + ring_allreduce((options.rows * c + flags) * size, world_size, size)
    if options.exact:
        n = options.num_candidates(k, d) * 4
        if options.allreduce == "backend":
            out = out + ring_allreduce(n, world_size, 4)
        else:
            out = out + recursive_doubling(n, world_size)
    return out


class _Iteration:
    """One compressed iteration in flight: what the buckets have delivered so far."""

    def __init__(
        self,
        sketch: PartitionedSketch,
        candidates: int,
        d: int,
        like: torch.Tensor,
        state_dtype: torch.dtype,
        momentum: bool,
    ) -> None:
        self.sketch, self.candidates = sketch, candidates
        self.grad = torch.empty(d, dtype=like.dtype, device=like.device)
        self.accumulated = torch.empty(d, dtype=state_dtype, device=like.device)
        self.momentum = torch.empty_like(self.accumulated) if momentum else None
        self.payloads: list[torch.Tensor] = []
        self.futures: list[torch.futures.Future[torch.Tensor]] = []
        self.arrived: list[float] = []  # when each bucket reached the hook
        self.started: list[float] = []  # when each region's all-reduce started
        self.done: list[float] = []
        self.seconds_compress = 0.0
        self.next = 0  # the next region expected


class StreamingGS(GlobalSketchSGD):
    """gs-SGD over a table partitioned by DDP bucket, one region's all-reduce per bucket.

    The same options, error feedback, guard, non-finite policy and statistics as
    :class:`~gssgd.aggregators.gs.GlobalSketchSGD`; only the table's layout and the
    timing of its all-reduce differ. Driven by :meth:`~gssgd.ddp.hook.HookCore.stream_step`: :meth:`add_bucket`
    for each bucket in index order, then :meth:`finish`.

    Args:
        sizes: the buckets' lengths, in bucket order (they sum to ``d``).
        d, k, options, group: as for :class:`GlobalSketchSGD` (``d = sum(sizes)``).

    Raises:
        ValueError: fewer columns than buckets, or ``d != sum(sizes)``.
    """

    def __init__(
        self,
        sizes: list[int],
        d: int,
        k: int,
        options: GSOptions,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        if sum(sizes) != d:
            raise ValueError(f"the bucket sizes {sizes} sum to {sum(sizes)}, not d={d}")
        self.sizes = list(sizes)
        region_columns(self.sizes, options.cols)  # a clear error before any collective
        super().__init__(d, k, options, group)
        dense = [t for t in range(self.options.warmup_steps)
                 if self.sends_dense_at(d, k, self.options, self.world_size, t)]
        if dense:  # its regions go out as the buckets arrive: it cannot switch to dense's
            raise ValueError(
                f"warmup_density={self.options.warmup_density} is too high for streaming gs at "
                f"{self.world_size} workers: the first {len(dense)} warm-up steps' sketches "
                "would send more than a dense all-reduce, which whole-model gs sends instead "
                "but a stream cannot switch to. Lower warmup_density, or use overlap='none'."
            )
        self._it: _Iteration | None = None
        self.last_overlap = OverlapStats()

    def _new_sketch(self, cols: int | None = None,  # type: ignore[override]
                    cache: bool = True) -> PartitionedSketch:
        """The table cut into one region per bucket (every sketch of this aggregator:
        the steady one, the grown one and the warm-up's)."""
        return PartitionedSketch(
            self.sizes,
            self.options.cols if cols is None else cols,
            lambda n, c: self.options.make_sketch(n, self.hashes, c, cache=cache),
        )

    def agreement_fields(self) -> dict[str, Any]:
        return {**super().agreement_fields(), "regions": self.sizes, "overlap": "stream"}

    def state_dict(self) -> dict[str, Any]:
        """Adds the bucket sizes the regions were cut for."""
        return {**super().state_dict(), "regions": list(self.sizes)}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Raises:
        ValueError: the state was saved for other bucket sizes."""
        saved = [int(n) for n in sd.get("regions", self.sizes)]
        if saved != self.sizes:
            raise ValueError(
                f"the saved streaming state was cut for buckets of sizes {saved}, but DDP's "
                f"buckets now have sizes {self.sizes}; resume with the same model and "
                "bucket_cap_mb."
            )
        super().load_state_dict(sd)

    # ------------------------------------------------------------------ streaming step
    def add_bucket(self, index: int, grad: torch.Tensor) -> None:
        """Sketch bucket ``index``'s gradient into its region and start its all-reduce.

        Raises:
            ValueError: a bucket out of order or of the wrong size.
        """
        arrived = time.perf_counter()
        if self._it is None:
            self._it = self._begin_iteration(grad)
        it = self._it
        if index != it.next or grad.numel() != self.sizes[index]:
            self._it = None
            raise ValueError(
                f"streaming gs expected bucket {it.next} of {self.sizes[it.next]} elements "
                f"but got bucket {index} of {grad.numel()}: DDP's bucket layout changed "
                "since it was recorded. Keep the model and bucket_cap_mb fixed, or use "
                "overlap='none'."
            )
        it.arrived.append(arrived)
        start = time.perf_counter()
        part = it.sketch.piece(index)
        it.grad[part].copy_(grad)
        # a_b = e_b + g_b (or the rule's own), the new velocity into the step's buffer
        self.feedback.compensate_part(grad.to(it.accumulated.dtype), part, it.accumulated,
                                      it.momentum)
        it.sketch.accumulate(index, it.accumulated[part])
        region = it.sketch.region_table(index)
        payload = self._table_payload(region)
        if index == len(self.sizes) - 1:  # every bucket is in: the flags ride along
            flags = self._flag_slots(not all_finite(it.grad), payload.dtype, payload.device)
            payload = torch.cat([payload.reshape(-1), flags])
        it.seconds_compress += time.perf_counter() - start
        it.payloads.append(payload)
        it.started.append(time.perf_counter())
        it.futures.append(self.comm.allreduce_backend_async(payload).then(self._stamp(it)))
        it.next += 1

    @staticmethod
    def _stamp(it: _Iteration):
        def done(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            it.done.append(time.perf_counter())
            return fut.value()

        return done

    def _begin_iteration(self, grad: torch.Tensor) -> _Iteration:
        """The first bucket: agree on the settings (once), pick this step's sketch."""
        if not self._agreed:
            self._check_agreement(grad.device)
            self._agreed = True
        self.comm.take_stats()
        self.step_k = self._warmup.k_at(self.steps)
        dtype = state_dtype(grad.dtype)  # the residual's
        sketch, candidates = self._sketch_of_step(torch.empty(0, dtype=dtype, device=grad.device))
        velocity = self.feedback.keeps_step_velocity  # DGC's local u: a buffer of the step's
        return _Iteration(sketch, candidates, self.d, grad, dtype, velocity)  # type: ignore[arg-type]

    def finish(self) -> torch.Tensor:
        """After the last bucket: wait for the regions, select, exact round, update.

        Returns:
            The averaged update of the whole (bucket-ordered) vector, the same on every rank.

        Raises:
            RuntimeError: not every bucket was added.
            FloatingPointError: as :meth:`GlobalSketchSGD.step` (``nonfinite="raise"``).
        """
        it, self._it = self._it, None
        if it is None or it.next != len(self.sizes):
            got = 0 if it is None else it.next
            raise RuntimeError(f"streaming gs got {got} of {len(self.sizes)} buckets")
        wait_start = time.perf_counter()
        for fut in it.futures:
            fut.wait()
        exposed = time.perf_counter() - wait_start
        first = it.arrived[0]
        self.last_overlap = OverlapStats(
            len(it.futures),
            max(it.done + [wait_start]) - it.started[0],
            exposed,
            bucket_ready=[t - first for t in it.arrived],
            region_started=[t - first for t in it.started],
        )
        log_overlap(self.last_overlap, self.steps, self.rank)
        regions = self.comm.take_stats()
        regions.seconds += exposed
        bad_ranks = self._flags_of(it.payloads[-1])
        last = it.sketch.region_table(len(self.sizes) - 1)
        it.payloads[-1] = it.payloads[-1][: -self.world_size].view(last.shape)
        skipped = self._begin(it.grad, bad_ranks)  # the non-finite policy, as one step
        if skipped is not None:
            for name in ("bytes_sent", "bytes_received", "messages", "messages_received",
                         "rounds"):
                setattr(
                    self.last_stats, name, getattr(self.last_stats, name) + getattr(regions, name)
                )
            self.last_stats.seconds_communicate += regions.seconds
            return skipped
        self.comm.stats.add(regions)
        self._timings["compress"] += it.seconds_compress
        k, summed, accumulated = self.step_k, it.sketch, it.accumulated
        with self._timed("decompress"):
            for b, payload in enumerate(it.payloads):
                region = summed.region_table(b)
                if payload.dtype != accumulated.dtype:
                    region.copy_(self._widened(payload, accumulated.dtype))
                elif payload.data_ptr() != region.data_ptr():  # the last, sent with flags
                    region.copy_(payload)
        if it.momentum is not None:
            self.momentum_buffer = it.momentum

        update, delivered = self._recover_and_update(accumulated, summed, k, it.candidates)
        return self._finish(update.to(it.grad.dtype), delivered_fraction=delivered)

    def _candidates(self, summed: Any, num_candidates: int) -> torch.Tensor:
        """The partitioned sketch's heavy hitters come sorted by global index already."""
        return summed.heavy_hitters(num_candidates)[0]

    def abandon(self) -> None:
        """Drop an iteration in flight (a failed or abandoned backward)."""
        self._it = None


#: When this environment variable holds a path prefix, every streamed iteration appends its
#: :class:`OverlapStats` as a JSON line to ``PREFIX.rankR.jsonl``.
OVERLAP_LOG_ENV = "GSSGD_OVERLAP_LOG"


@dataclass
class OverlapStats:
    """How much of one iteration's region communication backward hid.

    Attributes:
        regions: region all-reduces in the iteration.
        seconds_span: from the first region's start to the last region's completion.
        seconds_exposed: how long the last bucket waited for the regions (not hidden).
        bucket_ready: per bucket, in index order, when DDP handed it to the hook (it is
            ready, and so is every bucket before it), in seconds after the first bucket.
        region_started: per bucket, when its region's all-reduce started, in seconds after
            the first bucket. Streaming overlaps when a region starts before the last
            bucket is ready: ``region_started[0] < bucket_ready[-1]``.
    """

    regions: int = 0
    seconds_span: float = 0.0
    seconds_exposed: float = 0.0
    bucket_ready: list[float] = field(default_factory=list)
    region_started: list[float] = field(default_factory=list)

    @property
    def hidden_fraction(self) -> float:
        """``1 - exposed / span`` (1.0 when nothing was sent)."""
        if self.seconds_span <= 0:
            return 1.0
        return max(0.0, 1.0 - self.seconds_exposed / self.seconds_span)


def log_overlap(stats: OverlapStats, step: int, rank: int) -> None:
    """Append ``{"step": step, **stats}`` as a JSON line to ``PREFIX.rank{rank}.jsonl``, where
    ``PREFIX`` is the value of :data:`OVERLAP_LOG_ENV`; nothing when it is unset or empty."""
    prefix = os.environ.get(OVERLAP_LOG_ENV)
    if prefix:
        with open(f"{prefix}.rank{rank}.jsonl", "a") as f:
            line = {"step": step, **asdict(stats)}
            f.write(json.dumps(line) + "\n")
