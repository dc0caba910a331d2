"""DistributedDataParallel communication hooks built on the gssgd aggregators.

Any aggregator of :data:`gssgd.AGGREGATORS` (every built-in method, and any method
registered with :func:`gssgd.register_method`) becomes a DDP communication hook with one
line, the way PyTorch's ``powerSGD_hook`` does::

    from gssgd.ddp import HookState, comm_hook
    ddp_model.register_comm_hook(HookState("gs", density=0.01, model=ddp_model), comm_hook)

DDP hands the hook its gradients bucket by bucket during ``loss.backward()``; the hook
returns a future holding the averaged gradient of the bucket, which DDP writes into
``param.grad``. The optimizer then runs unchanged.

Algorithm of :func:`comm_hook`, per bucket (steps 1-2 of every iteration are collectives
that every rank runs in the same order, since DDP launches buckets in index order):

1. Warm-up (``state.iter < start_iter``): all-reduce the bucket and divide by the world
   size, exactly like DDP without a hook. DDP rebuilds its buckets after its first
   iteration, so the layout the compressors see is only fixed from then on.
2. Compression, per-bucket mode (``whole_model=False``): bucket ``i`` has its own
   aggregator with ``d = bucket.numel()`` (k is resolved per bucket from ``density``),
   created the first time the bucket is compressed. ``update = agg.step(bucket.buffer())``
   is the averaged update, the same on every rank; the residual of the bucket stays in
   its aggregator.
3. Compression, whole-model mode (``whole_model=True``): the whole gradient is one vector,
   so top-k is global over all layers, as in the papers. Buckets before the last get a
   not-yet-completed future and their gradients are stashed; at the last bucket the
   stashed gradients are concatenated in model order (see below), one
   ``agg.step(flat)`` runs, the update is split back into the buckets' gradients, and
   every pending future is completed. DDP waits for all of a backward's futures
   before it writes ``param.grad``, so deferring is safe; it just gives up overlapping
   communication with the backward pass.
4. After the last bucket, ``state.iter`` grows by one and ``state.last_stats`` holds the
   summed :class:`~gssgd.StepStats` of the iteration.

Model order. DDP's bucket layout changes when it rebuilds its buckets, and differs between
processes with other ``bucket_cap_mb``. In whole-model mode the flat vector (and therefore
the residual a checkpoint saves) follows the parameters' order in the model, given by
``HookState(..., model=m)`` or ``state.bind(m)``, so a resumed run lines up with the saved
residual whatever the layout. Without a bound model it follows the bucket order (bucket
index, then DDP's order inside each bucket), and a resumed run must rebuild the same
layout (same model, same ``bucket_cap_mb``). In per-bucket mode the residuals belong to
buckets, so a resume always needs the same layout; a changed layout is a ``ValueError``.

Mixed precision. Give the hook the run's ``torch.amp.GradScaler`` (``scaler=``): an
overflowing step then returns all-NaN buckets on every rank with the residuals untouched
(``nonfinite="propagate"``; in per-bucket mode the buckets wait for the last one, so no
bucket's state moves on a step the scaler skips), the scaler skips and backs off as with
DDP's all-reduce, and the residuals follow the scaler's scale. See :mod:`gssgd.amp`.
Without ``scaler=`` the hook's ``nonfinite="skip"`` turns every overflow into a zero update
the scaler never sees: the first such step warns once, and the error after
``max_consecutive_skips`` of them says to pass ``scaler=`` (or call ``state.use_scaler``).

Resuming. A state that was loaded (:meth:`HookState.load_state_dict`, or unpickled) and is
already past ``start_iter`` runs one dense iteration in its first DDP iteration in this
process (while DDP's buckets still have their construction-time layout), then compresses
with the saved residuals. Whole-model mode with a bound model does not need that iteration
and compresses at once, so its resumed run is bitwise the uninterrupted one.

Modules (each imports only those above it in this list):

* :mod:`~gssgd.ddp.settings`: :class:`HookSettings`, validated; the ``overlap=`` values.
* :mod:`~gssgd.ddp.streaming_gs`: streaming gs (``overlap="stream"``): its algorithm, its
  aggregator and its overlap record.
* :mod:`~gssgd.ddp.hook`: the hook itself, in PyTorch's ``powerSGD_hook.py`` shape: what an
  iteration cost, the futures, :class:`~gssgd.ddp.hook.HookCore` (the runtime every mode
  shares and the modes: per bucket, over the whole model, streaming gs), the optimizer step
  pre-hook that pairs a hand-built :class:`~gssgd.optim.FrozenVarianceAdamW` and warns about
  bad recipes, :class:`HookState` and :func:`comm_hook`.
* :mod:`~gssgd.ddp.paired`: an optimizer and its hook built together:
  :class:`PairedRun`, :func:`compressed_sgd` (the momentum where the method needs it),
  :func:`compressed_adamw` (1-bit Adam's recipe, its values matched), and
  :class:`EveryRankHookState` (every rank's state in one, for tools that save once).
"""

from gssgd.ddp.hook import HookState, RunningTotals, comm_hook
from gssgd.ddp.paired import (
    CompressedAdamW,
    CompressedSGD,
    EveryRankHookState,
    PairedRun,
    compressed_adamw,
    compressed_sgd,
)
from gssgd.ddp.settings import OVERLAP_MODES, STREAMING_METHODS, HookSettings, check_overlap
from gssgd.ddp.streaming_gs import OVERLAP_LOG_ENV, OverlapStats, StreamingGS, stream_traffic
from gssgd.recipes import momentum_placement

__all__ = [
    "OVERLAP_LOG_ENV",
    "OVERLAP_MODES",
    "STREAMING_METHODS",
    "CompressedAdamW",
    "CompressedSGD",
    "EveryRankHookState",
    "HookSettings",
    "HookState",
    "OverlapStats",
    "PairedRun",
    "RunningTotals",
    "StreamingGS",
    "check_overlap",
    "comm_hook",
    "compressed_adamw",
    "compressed_sgd",
    "momentum_placement",
    "stream_traffic",
]
