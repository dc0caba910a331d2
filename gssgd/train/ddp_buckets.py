"""DDP's gradient buckets, laid out for the simulated trainer as DDP lays them out.

Why it matters: DDP does not hand a comm hook the model's gradient as one vector in model
order. It copies each parameter's gradient into a flat *bucket* buffer and calls the hook
once per bucket, and what the hook does with that buffer can depend on its layout. The
hook's dense warm-up (:meth:`~gssgd.ddp.hook.HookCore._allreduce_mean`) all-reduces the
buffer as it is, and gloo's ring cuts it into P chunks that each sum the ranks in another
order (:func:`~gssgd.simulated.gloo_ring_reduce`): which weights fall into which chunk
decides the last bits of their sums. So ``gssgd train --simulate`` replays real processes
bitwise only if each simulated rank's hook sees the buckets real DDP would build, with the
same parameters in the same order. (Once the hook compresses over the whole model, it
concatenates the buckets' gradients in model order itself, and the layout stops mattering.)

What DDP does (``torch/nn/parallel/distributed.py`` and the C++ ``Reducer``, read in torch
2.13; ``find_unused_parameters=False`` and no ``static_graph``, as ``gssgd train`` builds
it):

1. At construction, it assigns the parameters (those that require a gradient, in model
   order) to buckets with ``_compute_bucket_assignment_by_size`` and the single limit
   ``sys.maxsize``: one bucket per dtype and device, in model order. The list of buckets
   is reversed (the last layers' gradients are expected first).
2. In the first backward, hooks on the parameters' gradient accumulators record the order
   in which the gradients became ready (the Reducer's ``rebuilt_params_``): roughly the
   model backwards, in whatever order autograd runs the accumulators (the MNIST CNN:
   ``classifier.3.bias, classifier.3.weight, classifier.1.bias, ...``).
3. At the start of the second forward (``_pre_forward`` calls
   ``reducer._rebuild_buckets()``), it lays the buckets out anew, once and for all:
   ``compute_bucket_assignment_by_size`` over the gradients in that ready order with the
   limits ``[first_bucket_bytes_cap, bucket_bytes_cap]``. Walking the gradients in ready
   order, a bucket is closed as soon as it holds at least its limit in bytes: 1 MiB for
   the first (``dist._DEFAULT_FIRST_BUCKET_BYTES``), then 25 MiB (``bucket_cap_mb``'s
   default); with an explicit ``bucket_cap_mb`` every limit is that. What is left forms
   the last bucket. The buckets are not sorted again: bucket 0 holds the gradients ready
   first, each bucket lists its parameters in ready order. Rank 0's layout is broadcast,
   so every rank uses it.
4. Every iteration, each gradient is copied into its place in its bucket's buffer and the
   hook is called once per bucket, in bucket order; each bucket's result goes back into
   its parameters' gradients.

How it is mirrored: :class:`DDPBuckets` calls the same C++ assignment function
(``torch.distributed._compute_bucket_assignment_by_size``) with the same arguments, at
construction and again after the first iteration (:meth:`DDPBuckets.start_iteration`);
the ready order is read the way the Reducer reads it, from hooks that run when each
gradient accumulator has run (:func:`gradient_ready_order`, on rank 0's loss of the first
step, as DDP keeps rank 0's); :meth:`DDPBuckets.split` cuts each rank's gradient into
:class:`SimulatedBucket` buffers for :func:`~gssgd.ddp.comm_hook` and
:meth:`DDPBuckets.join` puts the hook's results back in model order. Not mirrored:
``find_unused_parameters``, ``static_graph`` and sparse gradients (``gssgd train`` uses
none of them), and ``DDP_SET_LAST_BUCKET_CAP=1`` (which puts the small bucket last).
``tests/train/test_ddp_buckets.py`` checks the layouts against real DDP's.

Example::

    buckets = DDPBuckets(params, bucket_cap_mb=None)  # one bucket, model order
    buckets.watch_backward(loss)                      # first step, rank 0: the ready order
    buckets.start_iteration()                         # second step: DDP's rebuilt layout
    futures = [comm_hook(state, b) for b in buckets.split(flat_grad)]
    update = buckets.join([f.wait() for f in futures])
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DDPBuckets", "SimulatedBucket", "bucket_size_limits", "gradient_ready_order"]

#: ``bucket_cap_mb``'s unit in DDP: a MiB (``_MB_TO_BYTES``), and its default.
_MB = 1024 * 1024
_DEFAULT_BUCKET_CAP_MB = 25


def bucket_size_limits(bucket_cap_mb: float | None = None) -> list[int]:
    """The byte limits DDP rebuilds its buckets with: ``[first bucket, every later one]``.

    With the default ``bucket_cap_mb`` (None: 25 MiB) the first bucket is closed at 1 MiB
    (``dist._DEFAULT_FIRST_BUCKET_BYTES``), so the all-reduce of the last layers can start
    early; with an explicit ``bucket_cap_mb`` every bucket has that limit
    (``int(bucket_cap_mb * 2**20)`` bytes).
    """
    if bucket_cap_mb is None:
        return [dist._DEFAULT_FIRST_BUCKET_BYTES, _DEFAULT_BUCKET_CAP_MB * _MB]
    cap = int(bucket_cap_mb * _MB)
    return [cap, cap]


def gradient_ready_order(loss: torch.Tensor, params: list[nn.Parameter]) -> list[int]:
    """The order (indices into ``params``) in which a backward of ``loss`` makes the
    gradients ready: the order DDP's Reducer records in its first backward.

    The Reducer hooks each parameter's gradient accumulator and notes the parameter when
    the accumulator has run; a post-accumulate-grad hook runs at that same moment. So this
    runs one backward of ``loss`` with such hooks (``retain_graph=True``: the caller can
    still differentiate ``loss``) and puts every ``.grad`` back as it was. A parameter that
    gets no gradient (where real DDP would stop with an error) is put last, in model order.
    """
    order: list[int] = []
    saved = [p.grad for p in params]
    handles = [
        p.register_post_accumulate_grad_hook(lambda _p, i=i: order.append(i))
        for i, p in enumerate(params)
    ]
    try:
        for p in params:
            p.grad = None
        loss.backward(retain_graph=True)
    finally:
        for handle in handles:
            handle.remove()
        for p, grad in zip(params, saved, strict=True):
            p.grad = grad
    seen = set(order)
    return order + [i for i in range(len(params)) if i not in seen]


class SimulatedBucket:
    """One rank's bucket in one iteration, shaped like DDP's ``dist.GradBucket`` for
    :func:`~gssgd.ddp.comm_hook`: its index, whether it is the iteration's last, its flat
    buffer, its parameters and their gradients (views into the buffer), in bucket order."""

    def __init__(
        self, index: int, last: bool, buffer: torch.Tensor, params: list[nn.Parameter]
    ) -> None:
        self._index, self._last, self._buffer, self._params = index, last, buffer, params
        pieces = buffer.split([p.numel() for p in params])
        self._views = [piece.view_as(p) for piece, p in zip(pieces, params, strict=True)]

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def parameters(self) -> list[nn.Parameter]:
        return self._params

    def gradients(self) -> list[torch.Tensor]:
        return self._views


class DDPBuckets:
    """DDP's bucket layout over a model's parameters, iteration by iteration.

    Args:
        params: the parameters DDP buckets (those that require a gradient), in model order.
        bucket_cap_mb: DDP's ``bucket_cap_mb`` (None: its default, 25 MiB, with a 1 MiB
            first bucket).

    Attributes:
        buckets: each bucket's parameters (indices into ``params``) in buffer order, bucket
            0 first: DDP's layout for the coming iteration.
        rebuilt: whether the layout is the one DDP rebuilds after its first iteration.
    """

    def __init__(self, params: list[nn.Parameter], bucket_cap_mb: float | None = None) -> None:
        self._params = params
        self._limits = bucket_size_limits(bucket_cap_mb)
        self._starts = [0]
        for p in params:
            self._starts.append(self._starts[-1] + p.numel())
        groups, _ = dist._compute_bucket_assignment_by_size(
            params, [sys.maxsize], [False] * len(params)
        )
        self.buckets: list[list[int]] = [list(g) for g in reversed(groups)]
        self.rebuilt = False
        self._ready: list[int] | None = None

    def watch_backward(self, loss: torch.Tensor) -> None:
        """Rank 0's loss of the first iteration: record the order its gradients become
        ready (:func:`gradient_ready_order`); later calls do nothing, as in DDP."""
        if self._ready is None and not self.rebuilt:
            self._ready = gradient_ready_order(loss, self._params)

    def start_iteration(self) -> None:
        """DDP's ``_pre_forward``: once a backward's ready order is recorded, rebuild the
        buckets in it (step 3 of the module's description), once."""
        if self.rebuilt or self._ready is None:
            return
        ready = self._ready
        groups, _ = dist._compute_bucket_assignment_by_size(
            [self._params[i] for i in ready], self._limits, [False] * len(ready), ready
        )
        self.buckets, self.rebuilt, self._ready = [list(g) for g in groups], True, None

    def split(self, flat: torch.Tensor) -> list[SimulatedBucket]:
        """One rank's gradient, flat in model order, as DDP's buckets for this iteration
        (new buffers: the hook may write into them)."""
        last = len(self.buckets) - 1
        return [
            SimulatedBucket(
                b,
                b == last,
                torch.cat([flat[self._starts[i] : self._starts[i + 1]] for i in bucket]),
                [self._params[i] for i in bucket],
            )
            for b, bucket in enumerate(self.buckets)
        ]

    def join(self, results: list[torch.Tensor]) -> torch.Tensor:
        """The hook's result for each bucket (bucket order), as one vector in model order:
        what DDP writes back into the parameters' gradients."""
        out = torch.empty(self._starts[-1], dtype=results[0].dtype, device=results[0].device)
        for bucket, result in zip(self.buckets, results, strict=True):
            offset = 0
            for i in bucket:
                n = self._starts[i + 1] - self._starts[i]
                out[self._starts[i] : self._starts[i] + n] = result[offset : offset + n]
                offset += n
        return out
