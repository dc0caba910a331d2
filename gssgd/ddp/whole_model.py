"""Whole-model mode (``whole_model=True``): the whole gradient is one vector, so top-k is
global over all layers, as in the papers.

Buckets before the last get a not-yet-completed future and their gradients are stashed
(:meth:`~gssgd.ddp.core.HookCore._defer`); at the last bucket :func:`step` concatenates the
stashed gradients in model order, runs one ``agg.step(flat)``, splits the update back into
the buckets' gradients and completes every pending future. DDP waits for all of a
backward's futures before it writes ``param.grad``, so deferring is safe; it just gives up
overlapping communication with the backward pass (:mod:`gssgd.ddp.stream` brings it back
for gs).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gssgd.comm import completed_future
from gssgd.ddp.core import WHOLE_MODEL, HookCore, Pending

__all__ = ["step"]


def step(state: HookCore, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Whole-model mode, the last bucket: one step over every stashed gradient.

    Steps: (1) list every parameter of the pending buckets and this one with its
    gradient view; (2) order them by model position (or keep bucket order when no
    model is bound); (3) concatenate and run the aggregator once; (4) write the update
    back into the gradient views, which live in the buckets' buffers; (5) complete
    the pending futures with their buffers.
    """
    this = Pending(bucket.index(), bucket.parameters(), bucket.gradients(), bucket.buffer(), None)
    entries = sorted([*state._pending, this], key=lambda p: p.index)
    try:
        pairs = [(p, g) for e in entries for p, g in zip(e.params, e.grads, strict=True)]
        if state._positions:
            unknown = [tuple(p.shape) for p, _ in pairs if id(p) not in state._positions]
            if unknown:
                raise ValueError(
                    f"{len(unknown)} parameter(s) in DDP's buckets (shapes {unknown[:4]}) "
                    "are not in the bound model; bind the model DDP wraps: "
                    "HookState(..., model=ddp_model) or state.bind(ddp_model)."
                )
            pairs.sort(key=lambda pg: state._positions[id(pg[0])])
        layout = state._layout([p for p, _ in pairs])
        flat = torch.cat([g.reshape(-1) for _, g in pairs])
        agg = state._aggregator(WHOLE_MODEL, layout, flat.numel(), "the whole model",
                                [p for p, _ in pairs])
        update = agg.step(flat)
        state._add_step(agg.last_stats)
        pieces = update.split([g.numel() for _, g in pairs])
        for (_, g), piece in zip(pairs, pieces, strict=True):
            g.copy_(piece.view_as(g))
        state._hand_over_unused([p for p, _ in pairs], [g for _, g in pairs], update)
    except BaseException as exc:
        state._fail_pending(exc)  # never leave DDP waiting on a future forever
        raise
    state._complete_pending()
    return completed_future(this.buffer)
