"""Streaming gs-SGD in the DDP hook: each bucket's sketch is all-reduced during backward.

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

The aggregator (:class:`~gssgd.ddp.streaming_gs.StreamingGS`, steps 1-2, in
:mod:`gssgd.ddp.streaming_gs`) knows nothing of DDP; :func:`stream_hook` (here) feeds it DDP's
buckets on the runtime trunk of the hook state
(:class:`~gssgd.ddp.core.HookCore`). ``overlap=`` is validated with the other settings
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
(:class:`~gssgd.ddp.overlap.OverlapStats`), with when each bucket arrived and each region's
all-reduce started.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gssgd.aggregators import build_options
from gssgd.aggregators.options import resolve_k
from gssgd.aggregators.sizing import streaming_options
from gssgd.comm import completed_future, new_future
from gssgd.ddp.core import HookCore, Layout
from gssgd.ddp.streaming_gs import StreamingGS

__all__ = ["StreamSession", "stream_hook"]


class StreamSession:
    """What :func:`stream_hook` keeps on a :class:`~gssgd.ddp.HookState` between calls:
    the bucket layout recorded in the last dense iteration and the buckets in flight."""

    def __init__(self) -> None:
        self.recording: dict[int, Layout] = {}
        self.recorded: list[Layout] | None = None
        self.pending: list[tuple[torch.Tensor, torch.futures.Future[torch.Tensor]]] = []

    def fail_pending(self, exc: BaseException) -> None:
        for _, fut in self.pending:
            if not fut.done():
                fut.set_exception(exc)
        self.pending = []


def _session(state: HookCore) -> StreamSession:
    session = getattr(state, "_stream", None)
    if session is None:
        session = state._stream = StreamSession()
    return session


def _aggregator(state: HookCore, layouts: list[Layout]) -> StreamingGS:
    """The streaming aggregator (created on first use, with any loaded state)."""
    agg = state._aggregators.get(0)
    flat = [entry for layout in layouts for entry in layout]
    if isinstance(agg, StreamingGS):
        if state._layouts.get(0) != flat:
            raise ValueError(
                "DDP's bucket layout changed after streaming gs had started; keep the model "
                "and bucket_cap_mb fixed, or use overlap='none'."
            )
        return agg
    sizes = [sum(n for _, n in layout) for layout in layouts]
    d = sum(sizes)
    known = state._layouts.get(0)
    if known is not None and known != flat:
        raise ValueError(
            "the saved streaming residual is for another bucket layout (parameters "
            f"{[p for p, _ in known][:8]}...), DDP now has {[p for p, _ in flat][:8]}...; "
            "resume with the same model and bucket_cap_mb."
        )
    state.settings.check_k(d, "the whole model")
    # every coordinate is sketched: a pre-filter needs the whole gradient before bucket 0;
    # the regions go by the backend's ring, and so, unless asked otherwise, does the exact round
    # (streaming's own shape at every P: the default's was measured with the pre-filter)
    given = streaming_options(d, resolve_k(d, state.density, None), state.settings.options)
    _, k, options = build_options("gs", d, state.density, **given)
    agg = StreamingGS(sizes, d, k, options, state.group)
    if 0 in state._saved:
        agg.load_state_dict(state._saved.pop(0))
    state._aggregators[0] = agg
    state._layouts[0] = flat
    return agg


def stream_hook(state: HookCore, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """:func:`gssgd.ddp.comm_hook` for ``overlap="stream"`` (see the module docstring).

    Dense iterations (``iter < start_iter``, and a process's first two iterations) average
    the bucket with the backend's all-reduce and record the bucket layout; compressed ones
    stream the bucket's sketch region and complete every bucket's future at the last one.
    """
    session = _session(state)
    index, buffer = bucket.index(), bucket.buffer()
    layout = state._layout(bucket.parameters())
    streaming = state.iter >= state.start_iter and session.recorded is not None
    if not streaming:
        session.recording[index] = layout
        fut = state._allreduce_mean(buffer)
        if bucket.is_last():
            if state._session_iters >= 1:  # DDP's own first iteration has a provisional layout
                session.recorded = [session.recording[i] for i in sorted(session.recording)]
            session.recording = {}
            state._end_iteration(compressed=False)
        return fut
    try:
        assert session.recorded is not None
        if index == 0 and session.pending:  # a backward was abandoned half way
            session.fail_pending(RuntimeError("an earlier backward pass did not finish"))
            agg = state._aggregators.get(0)
            if isinstance(agg, StreamingGS):
                agg.abandon()
            state._stats = None
        if index >= len(session.recorded) or session.recorded[index] != layout:
            raise ValueError(
                f"bucket {index} holds {layout} but the recorded layout has "
                f"{session.recorded[index] if index < len(session.recorded) else 'no such bucket'}"
                "; DDP's buckets changed after they were recorded. Keep the model and "
                "bucket_cap_mb fixed, or use overlap='none'."
            )
        agg = _aggregator(state, session.recorded)
        if index == 0:
            state._follow_loss_scale()  # a GradScaler's units for the residual (gssgd.amp)
        agg.add_bucket(index, buffer)
        if not bucket.is_last():
            fut = new_future(buffer.device)
            session.pending.append((buffer, fut))
            return fut
        update = agg.finish()
        state._add_step(agg.last_stats)
        pieces = update.split(agg.sizes)
        buffers = [b for b, _ in session.pending] + [buffer]
        for buf, piece in zip(buffers, pieces, strict=True):
            buf.copy_(piece)
    except BaseException as exc:
        session.fail_pending(exc)  # never leave DDP waiting on a future forever
        agg = state._aggregators.get(0)
        if isinstance(agg, StreamingGS):
            agg.abandon()
        raise
    for buf, fut in session.pending:
        fut.set_result(buf)
    session.pending = []
    state._end_iteration(compressed=True)
    return completed_future(buffer)
