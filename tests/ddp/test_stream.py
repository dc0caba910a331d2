"""Streaming gs in the DDP hook (gssgd.ddp.hook.HookCore.stream_step) and its partitioned table.

Real gloo processes at P = 3 and 4 (a non-power of two among them) over several DDP bucket
layouts, bitwise against tests/ddp/stream_scenarios.PartitionedReference; the layout rules and
the global recovery on one process.
"""

from __future__ import annotations

import io
import time
from dataclasses import asdict
from functools import cache

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from gssgd.ddp import HookState, OverlapStats, comm_hook, stream_traffic
from gssgd.sketch import CountSketch
from gssgd.sketch.partitioned import PartitionedSketch, region_columns
from tests.ddp import stream_scenarios as scen
from tests.dist_utils import raise_worker_errors, run_workers

#: (world size, runs): every layout and setting is covered, split over the two sizes.
RUNS = {
    3: ["many-rows3", "uneven-rows1-momentum", "one-rows3", "uneven-rows3-onebit"],
    4: ["many-rows1-momentum", "uneven-rows3", "one-rows1-momentum"],
}
CASES = [(p, run) for p, runs in RUNS.items() for run in runs]


def _worker(rank: int, world_size: int) -> dict:
    torch.manual_seed(1234)
    out = {}
    for run in RUNS[world_size]:
        layout, setting = run.split("-", 1)
        out[run] = scen.stream_against_reference(
            rank, scen.LAYOUTS[layout], scen.SETTINGS[setting])
    if world_size == 3:
        out["one-bucket"] = scen.one_bucket_equals_whole_model(rank)
        out["resume"] = scen.resume(rank)
    return out


@cache
def results(world_size: int) -> list[dict]:
    out = run_workers(world_size, _worker)
    raise_worker_errors(out)
    return out


# ------------------------------------------------------------------ against the reference
@pytest.mark.parametrize(("world_size", "run"), CASES)
def test_streamed_grads_equal_the_partitioned_reference_bitwise(world_size: int, run: str) -> None:
    for r, ranks in enumerate(results(world_size)):
        res = ranks[run]
        for t in range(scen.START, scen.ITERS):
            assert torch.equal(res["got"][t], res["want"][t]), f"rank {r} iteration {t}"
        assert torch.equal(res["residual"], res["ref_residual"]), f"rank {r} residual"
        assert torch.count_nonzero(res["got"][-1]) <= 0.05 * res["got"][-1].numel()


@pytest.mark.parametrize(("world_size", "run"), CASES)
def test_dense_warm_up_is_the_plain_average(world_size: int, run: str) -> None:
    for ranks in results(world_size):
        res = ranks[run]
        for t in range(scen.START):
            torch.testing.assert_close(res["got"][t], res["want"][t], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("world_size", "run"), CASES)
def test_grads_are_bitwise_identical_on_every_rank(world_size: int, run: str) -> None:
    ranks = results(world_size)
    for r in range(1, world_size):
        assert torch.equal(ranks[r][run]["got"], ranks[0][run]["got"]), f"rank {r}"


def test_the_layouts_cover_many_uneven_and_one_bucket() -> None:
    sizes = {run: results(p)[0][run]["sizes"] for p, run in CASES}
    assert len(sizes["many-rows3"]) >= 4
    assert len(sizes["uneven-rows3"]) >= 2 and len(set(sizes["uneven-rows3"])) > 1
    assert sizes["one-rows3"] == [4010]
    for run, s in sizes.items():
        assert sum(s) == 4010, run


@pytest.mark.parametrize(("world_size", "run"), CASES)
def test_stats_count_every_regions_traffic(world_size: int, run: str) -> None:
    res = results(world_size)[0][run]
    want = stream_traffic(res["region_cols"], res["k"], 4010, res["options"], world_size)
    for t in range(scen.START, scen.ITERS):
        stats = res["stats"][t]
        assert stats["bytes_sent"] == want.sent[0], f"iteration {t}"
        assert stats["bytes_received"] == want.received[0]
        assert stats["rounds"] == want.rounds
        assert stats["k"] == res["k"] and stats["d"] == 4010
        assert stats["delivered_fraction"] is not None and stats["seconds_communicate"] > 0
    overlap = OverlapStats(**res["overlap"])
    assert overlap.regions == len(res["sizes"])
    ready, started = overlap.bucket_ready, overlap.region_started
    assert len(ready) == len(started) == overlap.regions and ready[0] == 0.0
    for b in range(overlap.regions):  # each region is sent before the next bucket arrives
        assert ready[b] <= started[b], (b, ready, started)
        if b + 1 < overlap.regions:
            assert started[b] <= ready[b + 1], (b, ready, started)


def test_one_bucket_stream_is_whole_model_gs() -> None:
    for r, ranks in enumerate(results(3)):
        for overlap, res in ranks["one-bucket"].items():  # both against the reference
            assert res["sizes"] == [4010], overlap
            for t in range(scen.START, scen.ITERS):
                assert torch.equal(res["got"][t], res["want"][t]), f"{overlap} rank {r} it {t}"


# ------------------------------------------------------------------ overlap with backward
#: Seconds the slow layer's backward sleeps: DDP's last bucket is ready at least this long
#: after its first.
SLEEP = 0.5
MEASURED = 2  # streamed iterations measured, after one that builds the aggregator


class _SlowBackward(torch.autograd.Function):
    """The identity; while ``on``, its backward sleeps SLEEP seconds, then notes the time."""

    on = False
    woke: list[float] = []

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        if _SlowBackward.on:
            time.sleep(SLEEP)
            _SlowBackward.woke.append(time.perf_counter())
        return grad


class _SlowNet(torch.nn.Module):
    """Two layers with the slow backward between them: the last layer's gradients (DDP's
    first buckets) are ready SLEEP seconds before the first layer's (its last bucket)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(16, 64)
        self.last = torch.nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(_SlowBackward.apply(torch.tanh(self.first(x))))


def _overlap_worker(rank: int, world_size: int) -> list[dict]:
    """Streamed iterations of _SlowNet: when each region's all-reduce was called (seen from
    outside the hook, on the aggregator's communicator), when the slow backward woke, and
    the hook's own OverlapStats."""
    torch.manual_seed(0)
    ddp = DDP(_SlowNet(), bucket_cap_mb=0.0001)  # about one bucket per tensor
    state = HookState("gs", density=0.05, start_iter=scen.START, whole_model=True,
                      overlap="stream", rows=1, cols=400, candidates=2)
    ddp.register_comm_hook(state, comm_hook)
    calls: list[float] = []
    out = []
    for t in range(scen.START + 1 + MEASURED):
        if t == scen.START + 1:  # the streaming aggregator exists: watch its all-reduces
            comm = state._aggregators[0].comm
            real = comm.allreduce_backend_async

            def noted(tensor: torch.Tensor, real=real) -> torch.futures.Future[torch.Tensor]:
                calls.append(time.perf_counter())
                return real(tensor)

            comm.allreduce_backend_async = noted
        measured = t > scen.START
        _SlowBackward.on = measured
        calls.clear()
        _SlowBackward.woke.clear()
        ddp.zero_grad()
        x = torch.randn(32, 16, generator=torch.Generator().manual_seed(100 * t + rank))
        ddp(x).square().mean().backward()
        if measured:
            out.append({"calls": list(calls), "woke": list(_SlowBackward.woke),
                        "overlap": asdict(state._aggregators[0].last_overlap)})
    return out


def test_streamed_all_reduces_start_before_the_last_bucket_is_ready() -> None:
    """A backward that is slow on purpose between the last layer and the first: the regions
    of the buckets ready before the slow part are all-reduced while it runs, not after the
    last bucket (which waiting for every bucket, as overlap='none' does, would give)."""
    ranks = run_workers(2, _overlap_worker)
    raise_worker_errors(ranks)
    for r, runs in enumerate(ranks):
        assert len(runs) == MEASURED
        for run in runs:
            overlap = OverlapStats(**run["overlap"])
            ready, started = overlap.bucket_ready, overlap.region_started
            assert overlap.regions >= 2 and len(run["calls"]) == overlap.regions, (r, run)
            assert len(run["woke"]) == 1, (r, run)
            # the layout does what it is for: the last bucket comes SLEEP after the first
            assert ready[-1] >= SLEEP, (r, ready)
            # seen from outside: the first region's all-reduce was called well before the
            # slow backward ended, and so before the last bucket could be ready
            assert run["calls"][0] < run["woke"][0] - SLEEP / 2, (r, run)
            # the hook's own record agrees
            assert started[0] < ready[-1] - SLEEP / 2, (r, ready, started)


# ------------------------------------------------------------------ checkpoints
def test_resume_keeps_the_residual_through_two_dense_iterations_then_streams_on() -> None:
    for r, ranks in enumerate(results(3)):
        res = ranks["resume"]
        assert res["saved"]["overlap"] == "stream" and res["iter"] == 8
        saved = res["saved"]["buckets"][0]["residual"]
        assert torch.count_nonzero(saved) > 0
        assert torch.equal(res["residual_after_dense"], saved)
        for t in (0, 1):
            torch.testing.assert_close(res["got"][t], res["want"][t], rtol=1e-6, atol=1e-7)
        for t in (2, 3):
            assert torch.equal(res["got"][t], res["want"][t]), f"rank {r} iteration {t}"


def test_stream_state_dict_loads_with_weights_only_and_refuses_another_overlap() -> None:
    sd = results(3)[0]["resume"]["saved"]
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert loaded["buckets"][0]["regions"] == results(3)[0]["uneven-rows1-momentum"]["sizes"]
    state = HookState("gs", whole_model=True, overlap="stream", **scen.SETTINGS["rows3"])
    state.load_state_dict(loaded)
    assert state.state_dict()["iter"] == sd["iter"]
    with pytest.raises(ValueError, match=r"saved with overlap='stream' into a HookState with "
                                         r"overlap='none'"):
        HookState("gs", whole_model=True, **scen.SETTINGS["rows3"]).load_state_dict(loaded)


# ------------------------------------------------------------------ settings
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"overlap": "async"}, r"overlap='async' is invalid: it must be one of none, stream"),
        ({"overlap": True}, r"overlap=True is invalid"),
        ({"overlap": "stream", "method": "topk"}, r"overlap='stream' is for method 'gs' only"),
        ({"overlap": "stream", "whole_model": False}, r"pass whole_model=True"),
        ({"overlap": "stream", "local_clip": 1.0}, r"local_clip=1.0 cannot be used with "
                                                   r"overlap='stream'"),
        ({"overlap": "stream", "feedback": "ef21"}, r"feedback='ef21' cannot be used with "
                                                    r"overlap='stream'.*overlap='none'"),
        ({"overlap": "stream", "prefilter": 8}, r"prefilter=8 cannot be used with "),
        ({"overlap": "stream", "reuse": 2}, r"reuse=2 cannot be used with overlap='stream'"),
    ],
)
def test_bad_overlap_raises_at_construction(kwargs: dict, match: str) -> None:
    kwargs = {"method": "gs", "whole_model": True, **kwargs}
    with pytest.raises(ValueError, match=match):
        HookState(**kwargs)


def test_overlap_none_keeps_the_old_state_dict_keys() -> None:
    assert "overlap" not in HookState("gs", whole_model=True).state_dict()
    assert HookState("gs", whole_model=True, overlap="stream").state_dict()["overlap"] == "stream"


# ------------------------------------------------------------------ the partitioned table
@pytest.mark.parametrize(
    ("sizes", "cols"),
    [([250, 984, 1960, 816], 160), ([1, 1, 10_000], 7), ([5], 1), ([3, 3, 3], 10),
     ([1234, 1960, 816], 400), ([7] * 40, 40)],
)
def test_region_columns_follow_the_documented_rule(sizes: list[int], cols: int) -> None:
    got = region_columns(sizes, cols)
    assert got == scen.split_columns(sizes, cols)
    assert sum(got) == cols and min(got) >= 1
    d, spare = sum(sizes), cols - len(sizes)
    for n, c in zip(sizes, got, strict=True):  # within one column of the proportional share
        assert abs((c - 1) - spare * n / d) < 1


def test_region_columns_refuse_fewer_columns_than_buckets() -> None:
    with pytest.raises(ValueError, match=r"cols=2 is invalid for 3 pieces: .* >= 3"):
        region_columns([10, 10, 10], 2)
    with pytest.raises(ValueError, match=r"sizes=\[0\] is invalid"):
        region_columns([0], 2)


def _sketch(sizes: list[int], cols: int, rows: int, cache: bool) -> PartitionedSketch:
    return PartitionedSketch(
        sizes, cols, lambda n, c: CountSketch(n, rows, c, seed=3, cache_hashes=cache))


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("cache", [False, True])
def test_partitioned_heavy_hitters_rank_all_estimates(rows: int, cache: bool) -> None:
    """The merge of per-region top-k equals ranking every global estimate (ties to the
    lower index): checked against estimates read region by region."""
    gen = torch.Generator().manual_seed(0)
    sizes = [3000, 17, 9000, 1500]
    sk = _sketch(sizes, 900, rows, cache)
    x = torch.randn(sum(sizes), generator=gen)
    x[torch.randint(0, x.numel(), (60,), generator=gen)] *= 40
    x[100:110] = 5.0  # ties
    for b in range(len(sizes)):
        sk.accumulate(b, x[sk.piece(b)])
    est = torch.cat([r.query() for r in sk.regions])
    for k in (1, 17, 200, 3000):
        order = torch.sort(est.abs(), descending=True, stable=True).indices[:k]
        idx, values = sk.heavy_hitters(k)
        assert torch.equal(idx, torch.sort(order).values), k
        assert torch.equal(values, est[idx])


def test_one_region_is_the_plain_count_sketch() -> None:
    x = torch.randn(5000, generator=torch.Generator().manual_seed(1))
    sk = _sketch([5000], 300, 3, False)
    sk.accumulate(0, x)
    plain = CountSketch(5000, 3, 300, seed=3)
    plain.accumulate(x)
    assert torch.equal(sk.table.view(3, 300), plain.table)
    assert sk.l2_estimate() == plain.l2_estimate()


def test_a_region_only_touches_its_own_columns() -> None:
    sk = _sketch([100, 200, 300], 60, 3, False)
    sk.accumulate(1, torch.ones(200))
    for b in (0, 2):
        assert torch.count_nonzero(sk.region_table(b)) == 0
    assert torch.count_nonzero(sk.region_table(1)) > 0


# ------------------------------------------------------------------ non-finite flags
def _nonfinite_worker(rank: int, world_size: int) -> dict:
    """Streamed iterations of the MLP in four buckets, where rank 1's gradient holds a NaN
    in the first layer (DDP's last bucket) at iteration START + 1, under
    nonfinite='raise': the flags ride on the last region's all-reduce."""
    torch.manual_seed(0)
    ddp = DDP(scen.make_model(), bucket_cap_mb=scen.LAYOUTS["many"])
    state = HookState("gs", density=0.02, start_iter=scen.START, whole_model=True,
                      overlap="stream", rows=1, cols=400, candidates=2, nonfinite="raise")
    ddp.register_comm_hook(state, comm_hook)
    for t in range(scen.START + 2):
        ddp.zero_grad()
        loss = ddp(scen.batch(rank, t)).square().mean()
        if t == scen.START + 1 and rank == 1:
            first = next(ddp.module.parameters())
            loss = loss + (first * torch.full_like(first, float("nan"))).sum() * 0
        try:
            loss.backward()
        except FloatingPointError as exc:
            return {"iteration": t, "error": str(exc)}
    return {"iteration": None}


def test_a_nan_on_one_rank_is_seen_by_every_rank_from_the_last_regions_flags() -> None:
    ranks = run_workers(3, _nonfinite_worker)
    raise_worker_errors(ranks)
    for r, res in enumerate(ranks):
        assert res["iteration"] == scen.START + 1, (r, res)
        assert "rank(s) [1]" in res["error"], (r, res["error"])


def _stream_with_warmup(rank: int, world_size: int, warmup_density: float) -> str:
    from gssgd.aggregators import build_options
    from gssgd.aggregators.sketching import streaming_options
    from gssgd.ddp import StreamingGS

    d, k = 4000, 40
    given = streaming_options(d, k, {"warmup_steps": 4, "warmup_density": warmup_density})
    _, k, options = build_options("gs", d, 0.01, **given)
    StreamingGS([2000, 2000], d, k, options)
    return "built"


@pytest.mark.parametrize(("density", "error"), [(0.25, None), (1.0, "warmup_density=1.0")])
def test_a_stream_refuses_a_warm_up_it_could_not_send_within_dense(density: float,
                                                                   error: str | None) -> None:
    """Whole-model gs sends a warm-up step that would cost more than dense as dense's
    all-reduce; a stream sends its regions as the buckets arrive and cannot switch, so it
    refuses such a warm-up, naming the value and the way out."""
    out = run_workers(2, _stream_with_warmup, density)
    for r in out:
        if error is None:
            assert r == "built"
        else:
            assert error in r["__error__"] and "overlap='none'" in r["__error__"]
