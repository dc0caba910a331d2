"""Worker functions for tests/ddp/test_stream.py (importable by spawned gloo processes).

Streaming gs (``HookState("gs", whole_model=True, overlap="stream")``) trains the small MLP
of ``tests/ddp/scenarios.py`` in DDP next to a plain copy whose local gradients go through
:class:`PartitionedReference`: the partitioned layout written out again from its
definition (column split, per-region hashing, global top m*k, exact round, error
feedback), independent of ``gssgd.ddp.streaming_gs`` and ``gssgd.sketch.partitioned``: its hashes
are those of ``tests/aggregators/reference.py`` (re-implemented from the documented scheme,
not ``gssgd.sketch.count_sketch``), and its sums over ranks are plain ``torch.distributed`` calls, not
gssgd's ``Communicator``. They are the sums the hook makes (the backend's all-reduce of
each region, in bucket order; the exact round by the backend's all-reduce, streaming's
default, or added up in recursive doubling's order), so the result must agree bit for bit.
"""

from __future__ import annotations

import dataclasses
import io

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gssgd.ddp import HookState, comm_hook
from tests.aggregators.reference import buckets_and_signs
from tests.ddp.scenarios import batch, flat_grads, local_grads, make_model, mean_over_ranks, sgd

#: DDP bucket caps (MB) and the layouts they give the MLP's 4010 parameters (8 tensors)
#: after DDP's rebuild: many small buckets, uneven buckets, and a single bucket.
LAYOUTS = {"many": 0.0005, "uneven": 0.004, "one": 25.0}
#: Two dense iterations (DDP's first, then the first on the rebuilt layout), then streaming.
START = 2
ITERS = 7
#: density 0.02 of d = 4010: k = 80; 3 rows of 160 columns in all; m = 2.
#: float32 tables throughout (streaming's; whole-model gs's default is float16), as the
#: independent reference sums them
SETTINGS = {
    "rows3": {"density": 0.02, "rows": 3, "cols": 160, "candidates": 2,
              "table_dtype": torch.float32},
    # the exact round by recursive doubling (streaming's default is the backend's ring)
    "rows1-momentum": {"density": 0.02, "rows": 1, "cols": 400, "candidates": 3,
                       "momentum": 0.9, "allreduce": "recursive_doubling",
                       "table_dtype": torch.float32},
    # 1-bit Adam's compressed momentum (what compressed_adamw streams)
    "rows3-onebit": {"density": 0.02, "rows": 3, "cols": 160, "candidates": 2,
                     "feedback": "onebit", "momentum": 0.9, "table_dtype": torch.float32},
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


def sum_in_doubling_order(x: torch.Tensor) -> torch.Tensor:
    """The sum over ranks of ``x`` in recursive doubling's order, from one all-gather: the
    ranks past the largest power of two ``P2`` are added into rank ``r - P2``, then
    neighbours at distance 1, 2, 4, ... are added pairwise (float addition commutes, so
    every rank of a pair gets the same bits)."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    power = 1 << (len(parts).bit_length() - 1)
    for r in range(power, len(parts)):
        parts[r - power] = parts[r - power] + parts[r]
    parts = parts[:power]
    while len(parts) > 1:
        parts = [parts[i] + parts[i + 1] for i in range(0, len(parts), 2)]
    return parts[0]


def signed_indices(n: int, seed: int, rows: int, cols: int) -> torch.Tensor:
    """``h_r(i) + cols * [s_r(i) < 0]`` for coordinates ``0..n-1``: the column of a doubled
    row ``(positive half | negative half)``, from the independent hashes."""
    buckets, signs = buckets_and_signs(n, seed, rows, cols)
    return torch.from_numpy(buckets + cols * (signs < 0))


class PartitionedReference:
    """Streaming gs's math on one rank: feed it the local gradient in bucket order.

    ``opts``: HookState's options; ``exact=False`` keeps the sketch's own top k and their
    estimates; the exact round is summed with the backend's all-reduce, as streaming gs does
    by default, or with ``allreduce="recursive_doubling"`` in that pattern's order.
    ``flags_ride_along``: the last region's table is summed with ``P`` more entries behind
    it, as streaming gs sends its ranks' non-finite flags. The buffer's length sets where
    gloo's ring cuts its chunks, and so the order in which each entry's ``P`` terms are
    added: summing the table alone can differ from the hook in the last bit.
    """

    def __init__(self, sizes: list[int], opts: dict, flags_ride_along: bool = False) -> None:
        self.sizes, self.d = sizes, sum(sizes)
        self.flags_ride_along = flags_ride_along
        self.k = max(1, round(opts["density"] * self.d))
        self.rows, self.m = opts["rows"], opts["candidates"]
        self.cols = split_columns(sizes, opts["cols"])
        self.rho = opts.get("momentum", 0.0)
        self.seed = opts.get("seed", 0)
        self.exact = opts.get("exact", True)
        self.backend = opts.get("allreduce", "backend") == "backend"
        self.residual = torch.zeros(self.d)
        self.momentum = torch.zeros(self.d)
        self.onebit = opts.get("feedback", "ef") == "onebit"
        self.shared: torch.Tensor | None = None  # 1-bit Adam's m: the last update

    def _region(self, x: torch.Tensor, cols: int) -> torch.Tensor:
        """Count Sketch of ``x`` into ``rows x cols``: each row's positive and negative
        contributions summed apart (a scatter-add into a doubled row), then subtracted."""
        signed = signed_indices(x.numel(), self.seed, self.rows, cols)
        table = torch.zeros(self.rows, 2 * cols)
        for r in range(self.rows):
            table[r].scatter_add_(0, signed[r], x)
        return table[:, :cols] - table[:, cols:]

    def _sum_region(self, table: torch.Tensor, last: bool) -> torch.Tensor:
        """The hook's region sum: the same buffer (flags behind the last), same backend."""
        if not (last and self.flags_ride_along):
            dist.all_reduce(table)
            return table
        payload = torch.cat([table.reshape(-1), torch.zeros(dist.get_world_size())])
        dist.all_reduce(payload)
        return payload[: table.numel()].reshape(table.shape)

    def _estimates(self, table: torch.Tensor, n: int, cols: int) -> torch.Tensor:
        signed = signed_indices(n, self.seed, self.rows, cols)
        doubled = torch.cat([table, -table], dim=1)
        values = torch.stack([doubled[r][signed[r]] for r in range(self.rows)])
        return values.median(dim=0).values

    def _exact_sum(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend:
            x = x.clone()
            dist.all_reduce(x)
            return x
        return sum_in_doubling_order(x)

    @staticmethod
    def _top(values: torch.Tensor, k: int) -> torch.Tensor:
        """Positions of the k largest ``|values|``, ties to the lower position."""
        return torch.sort(values.abs(), descending=True, stable=True).indices[:k]

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        world = dist.get_world_size()
        if self.onebit:  # e + rho * m + (1 - rho) * g, m the last update (0 at first)
            own = grad * (1 - self.rho)
            if self.shared is not None:
                own = torch.add(own, self.shared, alpha=self.rho)
            acc = self.residual + own
        elif self.rho > 0:
            self.momentum = self.momentum * self.rho + grad
            acc = self.residual + self.momentum
        else:
            acc = self.residual + grad
        estimates, start = [], 0
        for b, (n, c) in enumerate(zip(self.sizes, self.cols, strict=True)):
            table = self._sum_region(self._region(acc[start : start + n], c),
                                     last=b == len(self.sizes) - 1)
            estimates.append(self._estimates(table, n, c))
            start += n
        est = torch.cat(estimates)
        if self.exact:
            candidates = torch.sort(self._top(est, min(self.m * self.k, self.d))).values
            exact = self._exact_sum(acc[candidates])
            keep = self._top(exact, self.k)
            chosen, values = candidates[keep], exact[keep]
        else:  # the sketch's own estimates
            chosen = self._top(est, self.k)
            values = est[chosen]
        update = torch.zeros(self.d)
        update[chosen] = values / world
        acc[chosen] = 0
        self.residual = acc
        self.momentum[chosen] = 0
        if self.onebit:
            self.shared = update
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


def _against_reference(
    rank: int, cap: float, opts: dict, overlap: str, iters: int
) -> tuple[dict, HookState, PartitionedReference | None]:
    """``iters`` iterations of DDP + whole-model gs hook (``overlap``) and of the plain
    model + reference: the lists of what each gave, the hook's state and the reference."""
    model, plain = make_model(), make_model()
    numels = [p.numel() for p in model.parameters()]
    ddp = DDP(model, bucket_cap_mb=cap)
    state = HookState("gs", start_iter=START, whole_model=True, overlap=overlap, **opts)
    layouts: dict[int, list[int]] = {}
    ddp.register_comm_hook(state, recording(layouts, model))
    ref: PartitionedReference | None = None
    out: dict = {"got": [], "want": [], "stats": [], "layouts": []}
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
                ref = PartitionedReference(sizes, opts, flags_ride_along=overlap == "stream")
            want = _model_order(ref.step(_bucket_order(grads, layouts)), layouts, numels)
        out["got"].append(flat_grads(model))
        out["want"].append(want)
        out["stats"].append(dataclasses.asdict(state.last_stats))
        out["layouts"].append(dict(layouts))
        sgd(model, plain)
    out["sizes"] = [sum(numels[i] for i in layouts[b]) for b in sorted(layouts)]
    return out, state, ref


def stream_against_reference(rank: int, cap: float, opts: dict, iters: int = ITERS) -> dict:
    """``iters`` iterations of DDP + streaming hook and of the plain model + reference."""
    out, state, ref = _against_reference(rank, cap, opts, "stream", iters)
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
    gs and whole-model gs both equal the independent reference of that one region (tables
    summed the same way: allreduce='backend'; the sketch's own estimates, exact=False;
    every coordinate sketched, prefilter=0, as streaming does).

    Returns:
        per overlap ("none", "stream"): the stacked grads ``got`` and reference ``want``,
        and the bucket ``sizes``.
    """
    opts = {**SETTINGS["rows3"], "allreduce": "backend", "exact": False, "prefilter": 0}
    out = {}
    for overlap in ("none", "stream"):
        res, _, _ = _against_reference(rank, LAYOUTS["one"], opts, overlap, ITERS)
        out[overlap] = {"got": torch.stack(res["got"]), "want": torch.stack(res["want"]),
                        "sizes": res["sizes"]}
    return out


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
                ref = PartitionedReference(sizes, opts, flags_ride_along=True)
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
