"""Worker functions for tests/test_ddp_stream.py (importable by spawned gloo processes).

Streaming gs (``HookState("gs", whole_model=True, overlap="stream")``) trains the small MLP
of ``tests/ddp_scenarios.py`` in DDP next to a plain copy whose local gradients go through
:class:`PartitionedReference`: the partitioned layout written out again from its
definition (column split, per-region hashing, global top m*k, exact round, error
feedback), independent of ``gssgd.ddp_stream`` and ``gssgd.partitioned_sketch``. Only the
sums over ranks are collectives, the same ones the hook makes (the backend's all-reduce of
each region, in bucket order; the exact round's recursive doubling), so the result must
agree bit for bit.
"""

from __future__ import annotations

import dataclasses
import io

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gssgd.comm import Communicator
from gssgd.ddp import HookState, comm_hook
from gssgd.hashing import signed_buckets, sketch_hash_params
from tests.ddp_scenarios import batch, flat_grads, local_grads, make_model, mean_over_ranks, sgd

#: DDP bucket caps (MB) and the layouts they give the MLP's 4010 parameters (8 tensors)
#: after DDP's rebuild: many small buckets, uneven buckets, and a single bucket.
LAYOUTS = {"many": 0.0005, "uneven": 0.004, "one": 25.0}
#: Two dense iterations (DDP's first, then the first on the rebuilt layout), then streaming.
START = 2
ITERS = 7
#: density 0.02 of d = 4010: k = 80; 3 rows of 160 columns in all; m = 2.
SETTINGS = {
    "rows3": {"density": 0.02, "rows": 3, "cols": 160, "candidates": 2},
    "rows1-momentum": {"density": 0.02, "rows": 1, "cols": 400, "candidates": 3,
                       "momentum": 0.9},
}


def split_columns(sizes: list[int], cols: int) -> list[int]:
    """One column each, the rest by largest remainder of ``(cols - B) * d_b / d``, ties to
    the lower bucket (the documented rule, computed with exact fractions)."""
    from fractions import Fraction

    spare, d = cols - len(sizes), sum(sizes)
    quotas = [Fraction(spare * n, d) for n in sizes]
    out = [1 + int(q) for q in quotas]
    order = sorted(range(len(sizes)), key=lambda b: (-(quotas[b] - int(quotas[b])), b))
    for b in order[: cols - sum(out)]:
        out[b] += 1
    return out


class PartitionedReference:
    """Streaming gs's math on one rank: feed it the local gradient in bucket order."""

    def __init__(self, sizes: list[int], opts: dict) -> None:
        self.sizes, self.d = sizes, sum(sizes)
        self.k = max(1, round(opts["density"] * self.d))
        self.rows, self.m = opts["rows"], opts["candidates"]
        self.cols = split_columns(sizes, opts["cols"])
        self.rho = opts.get("momentum", 0.0)
        self.params = sketch_hash_params(0, self.rows)
        self.residual = torch.zeros(self.d)
        self.momentum = torch.zeros(self.d)

    def _region(self, x: torch.Tensor, cols: int) -> torch.Tensor:
        """Count Sketch of ``x`` into ``rows x cols``: each row's positive and negative
        contributions summed apart (a scatter-add into a doubled row), then subtracted."""
        signed = signed_buckets(torch.arange(x.numel()), self.params, cols)
        table = torch.zeros(self.rows, 2 * cols)
        for r in range(self.rows):
            table[r].scatter_add_(0, signed[r], x)
        return table[:, :cols] - table[:, cols:]

    def _estimates(self, table: torch.Tensor, n: int, cols: int) -> torch.Tensor:
        signed = signed_buckets(torch.arange(n), self.params, cols)
        doubled = torch.cat([table, -table], dim=1)
        values = torch.stack([doubled[r][signed[r]] for r in range(self.rows)])
        return values.median(dim=0).values

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        world = dist.get_world_size()
        if self.rho > 0:
            self.momentum = self.momentum * self.rho + grad
            acc = self.residual + self.momentum
        else:
            acc = self.residual + grad
        estimates, start = [], 0
        for n, c in zip(self.sizes, self.cols, strict=True):
            table = self._region(acc[start : start + n], c)
            dist.all_reduce(table)  # the hook's region sum: same size, same backend
            estimates.append(self._estimates(table, n, c))
            start += n
        est = torch.cat(estimates)
        mk = min(self.m * self.k, self.d)
        order = torch.sort(est.abs(), descending=True, stable=True).indices
        candidates = torch.sort(order[:mk]).values
        exact = Communicator().allreduce_recursive_doubling(acc[candidates])
        keep = torch.sort(exact.abs(), descending=True, stable=True).indices[: self.k]
        chosen = candidates[keep]
        update = torch.zeros(self.d)
        update[chosen] = exact[keep] / world
        acc[chosen] = 0
        self.residual = acc
        self.momentum[chosen] = 0
        return update


def recording(layouts: dict[int, list[int]], model: torch.nn.Module):
    ids = {id(p): i for i, p in enumerate(model.parameters())}

    def hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        layouts[bucket.index()] = [ids[id(p)] for p in bucket.parameters()]
        return comm_hook(state, bucket)

    hook.__annotations__ = {}
    return hook


def _bucket_order(flat: list[torch.Tensor], layout: dict[int, list[int]]) -> torch.Tensor:
    return torch.cat([flat[i] for b in sorted(layout) for i in layout[b]])


def _model_order(vec: torch.Tensor, layout: dict[int, list[int]], numels: list[int]):
    out = [torch.empty(0)] * len(numels)
    order = [i for b in sorted(layout) for i in layout[b]]
    for i, piece in zip(order, vec.split([numels[i] for i in order]), strict=True):
        out[i] = piece
    return torch.cat(out)


def stream_against_reference(rank: int, cap: float, opts: dict, iters: int = ITERS) -> dict:
    """``iters`` iterations of DDP + streaming hook and of the plain model + reference."""
    model, plain = make_model(), make_model()
    numels = [p.numel() for p in model.parameters()]
    ddp = DDP(model, bucket_cap_mb=cap)
    state = HookState("gs", start_iter=START, whole_model=True, overlap="stream", **opts)
    layouts: dict[int, list[int]] = {}
    ddp.register_comm_hook(state, recording(layouts, model))
    ref: PartitionedReference | None = None
    out: dict = {"got": [], "want": [], "stats": [], "layouts": [], "overlap": []}
    for t in range(iters):
        layouts.clear()
        x = batch(rank, t)
        ddp.zero_grad()
        ddp(x).square().mean().backward()
        grads = [g.reshape(-1) for g in local_grads(plain, x)]
        if t < START:
            want = mean_over_ranks(torch.cat(grads))
        else:
            if ref is None:
                sizes = [sum(numels[i] for i in layouts[b]) for b in sorted(layouts)]
                ref = PartitionedReference(sizes, opts)
            want = _model_order(ref.step(_bucket_order(grads, layouts)), layouts, numels)
        out["got"].append(flat_grads(model))
        out["want"].append(want)
        out["stats"].append(dataclasses.asdict(state.last_stats))
        out["layouts"].append(dict(layouts))
        sgd(model, plain)
    agg = state._aggregators[0]
    out["overlap"] = dataclasses.asdict(agg.last_overlap)
    out["residual"] = state.state_dict()["buckets"][0]["residual"]
    out["ref_residual"] = ref.residual if ref is not None else None
    out["region_cols"] = agg.sketch.region_cols
    out["sizes"] = agg.sizes
    out["k"], out["options"] = agg.k, agg.options
    return {k: torch.stack(v) if k in ("got", "want") else v for k, v in out.items()}


def one_bucket_equals_whole_model(rank: int) -> dict:
    """With a single bucket the partitioned layout is the unpartitioned sketch: streaming
    gs and whole-model gs agree (tables summed the same way: allreduce='backend'; the
    sketch's own estimates, exact=False, so no candidate order enters the comparison)."""
    opts = {**SETTINGS["rows3"], "allreduce": "backend", "exact": False}
    got = {}
    for overlap in ("none", "stream"):
        model = make_model()
        ddp = DDP(model, bucket_cap_mb=LAYOUTS["one"])
        state = HookState("gs", start_iter=START, whole_model=True, overlap=overlap, **opts)
        ddp.register_comm_hook(state, comm_hook)
        grads = []
        for t in range(ITERS):
            ddp.zero_grad()
            ddp(batch(rank, t)).square().mean().backward()
            grads.append(flat_grads(model))
            sgd(model)
        got[overlap] = torch.stack(grads)
    return got


def resume(rank: int) -> dict:
    """Save after 4 iterations (2 streamed), load with weights_only into a fresh DDP: two
    dense iterations keep the residual, then streaming goes on from it like the reference."""
    opts, cap = SETTINGS["rows3"], LAYOUTS["uneven"]
    model, plain = make_model(), make_model()
    numels = [p.numel() for p in model.parameters()]
    ddp = DDP(model, bucket_cap_mb=cap)
    state = HookState("gs", start_iter=START, whole_model=True, overlap="stream", **opts)
    layouts: dict[int, list[int]] = {}
    ddp.register_comm_hook(state, recording(layouts, model))
    ref = None
    for t in range(4):
        layouts.clear()
        x = batch(rank, t)
        ddp.zero_grad()
        ddp(x).square().mean().backward()
        grads = [g.reshape(-1) for g in local_grads(plain, x)]
        if t >= START:
            if ref is None:
                sizes = [sum(numels[i] for i in layouts[b]) for b in sorted(layouts)]
                ref = PartitionedReference(sizes, opts)
            ref.step(_bucket_order(grads, layouts))
        sgd(model, plain)
    buf = io.BytesIO()
    torch.save({"hook": state.state_dict(),
                "params": [p.detach().clone() for p in model.parameters()]}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    model = make_model()
    with torch.no_grad():
        for p, saved in zip(model.parameters(), ckpt["params"], strict=True):
            p.copy_(saved)
    ddp = DDP(model, bucket_cap_mb=cap)
    resumed = HookState("gs", start_iter=START, whole_model=True, overlap="stream", **opts)
    resumed.load_state_dict(ckpt["hook"])
    ddp.register_comm_hook(resumed, recording(layouts, model))
    out: dict = {"got": [], "want": [], "saved": ckpt["hook"]}
    for t in range(4, 8):
        layouts.clear()
        x = batch(rank, t)
        ddp.zero_grad()
        ddp(x).square().mean().backward()
        grads = [g.reshape(-1) for g in local_grads(plain, x)]
        if t < 6:  # this process's two dense iterations
            want = mean_over_ranks(torch.cat(grads))
            out["residual_after_dense"] = resumed.state_dict()["buckets"][0]["residual"]
        else:
            want = _model_order(ref.step(_bucket_order(grads, layouts)), layouts, numels)
        out["got"].append(flat_grads(model))
        out["want"].append(want)
        sgd(model, plain)
    out["iter"] = resumed.iter
    return out


def run_all(rank: int, world_size: int) -> dict:
    torch.manual_seed(1234)
    out = {}
    for layout, cap in LAYOUTS.items():
        for name, opts in SETTINGS.items():
            out[f"{layout}-{name}"] = stream_against_reference(rank, cap, opts)
    out["one-bucket"] = one_bucket_equals_whole_model(rank)
    out["resume"] = resume(rank)
    return out
