"""gssgd.ddp: DDP communication hooks on real gloo processes against reference aggregators."""

from __future__ import annotations

import io
import pickle
from functools import cache

import pytest
import torch
import torch.distributed as dist

from gssgd.comm import ring_allreduce
from gssgd.ddp import HookState, comm_hook
from tests.ddp import scenarios as scen
from tests.dist_utils import raise_worker_errors, run_workers

WORLD_SIZES = [2, 3]
RUNS = [f"{m}-{mode}" for m in scen.METHODS for mode in scen.MODES] + [
    "gs-whole-view", "gs-momentum-bucket"]


@cache
def results(world_size: int) -> list[dict]:
    """Per rank, ``{run: result}``; at P = 2 the resume and error scenarios too (see
    ``scen.run_all_resume_and_errors``: one spawn instead of three)."""
    fn = scen.run_all_resume_and_errors if world_size == 2 else scen.run_all
    out = run_workers(world_size, fn)
    raise_worker_errors(out)
    return out


def _scenario(name: str) -> list[dict]:
    """Per rank, the result of ``scen.<name>(rank, 2)``, run in the spawn of ``results(2)``."""
    out = [rank[f"scenario/{name}"] for rank in results(2)]
    raise_worker_errors(out)
    return out


def resume_results() -> dict:
    return _scenario("resume")[0]


def error_results() -> list[dict]:
    return _scenario("errors")


@cache
def param_numels() -> list[int]:
    return [p.numel() for p in scen.make_model().parameters()]


# ------------------------------------------------------------------ against the reference
@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_compressed_grads_equal_the_reference_aggregator_bitwise(world_size: int, run: str) -> None:
    for r, ranks in enumerate(results(world_size)):
        res = ranks[run]
        for t in range(scen.START, scen.ITERS):
            assert torch.equal(res["got"][t], res["want"][t]), f"rank {r} iteration {t}"


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_grads_before_start_iter_are_the_plain_average(world_size: int, run: str) -> None:
    for ranks in results(world_size):
        res = ranks[run]
        for t in range(scen.START):
            torch.testing.assert_close(res["got"][t], res["want"][t], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_grads_are_bitwise_identical_on_every_rank(world_size: int, run: str) -> None:
    ranks = results(world_size)
    for r in range(1, world_size):
        assert torch.equal(ranks[r][run]["got"], ranks[0][run]["got"]), f"rank {r}"


@pytest.mark.parametrize("run", RUNS)
def test_compression_changes_the_grads(run: str) -> None:
    """The sparse methods really deliver a sparse update (the hook is not a no-op)."""
    got = results(2)[0][run]["got"][-1]
    if run.startswith("dense"):
        assert torch.count_nonzero(got) > 0.9 * got.numel()
    else:
        assert torch.count_nonzero(got) <= 0.05 * got.numel()


def _bucket_numels(layout: dict[int, list[int]]) -> dict[int, int]:
    numels = param_numels()
    return {i: sum(numels[p] for p in pos) for i, pos in layout.items()}


def _is_partition(layout: dict[int, list[int]]) -> bool:
    """Every parameter in exactly one bucket; buckets numbered 0..n-1."""
    flat = [p for i in sorted(layout) for p in layout[i]]
    return sorted(flat) == list(range(len(param_numels()))) and sorted(layout) == list(
        range(len(layout))
    )


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ddp_rebuilds_its_buckets_so_whole_model_order_matters(world_size: int) -> None:
    """The scenario is meaningful, whatever torch's exact bucketing: DDP lays its buckets
    out anew after iteration 0, into several buckets whose order is not the model's, and
    keeps that layout (the same on every rank) from then on."""
    ranks = results(world_size)
    layouts = ranks[0]["topk-whole"]["layouts"]
    assert all(r["topk-whole"]["layouts"] == layouts for r in ranks)
    assert all(_is_partition(layout) for layout in layouts), layouts
    rebuilt = layouts[1]
    assert all(layout == rebuilt for layout in layouts[1:]), layouts
    assert layouts[0] != rebuilt, "DDP did not rebuild its buckets after iteration 0"
    assert len(rebuilt) >= 2, f"CAP_MB={scen.CAP_MB} made a single bucket: {rebuilt}"
    in_bucket_order = [p for i in sorted(rebuilt) for p in rebuilt[i]]
    assert in_bucket_order != sorted(in_bucket_order), "buckets already in model order"


# ------------------------------------------------------------------ statistics
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_warm_up_counts_the_ring_figure_per_bucket(world_size: int) -> None:
    """Rank 0's share of gloo's ring all-reduce of every bucket: its bytes, and a message
    per non-empty segment."""
    numels = param_numels()
    res = results(world_size)[0]["gs-bucket"]
    for t in range(scen.START):
        buckets = [sum(numels[i] for i in pos) for pos in res["layouts"][t].values()]
        rings = [ring_allreduce(4 * n, world_size) for n in buckets]
        stats = res["stats"][t]
        assert stats["bytes_sent"] == sum(r.sent[0] for r in rings)
        assert stats["bytes_received"] == sum(r.received[0] for r in rings)
        assert stats["messages"] == sum(r.messages[0] for r in rings)
        assert stats["messages_received"] == sum(r.messages_received[0] for r in rings)
        assert stats["k"] == stats["d"] == sum(numels)
        assert stats["seconds_communicate"] > 0


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_last_stats_sum_the_iterations_steps(world_size: int, run: str) -> None:
    numels = param_numels()
    res = results(world_size)[0][run]
    assert res["iter"] == list(range(1, scen.ITERS + 1))
    method, mode = run.split("-")[:2]
    density = scen.METHODS[method].get("density")
    for t in range(scen.START, scen.ITERS):
        stats = res["stats"][t]
        buckets = [sum(numels[i] for i in pos) for pos in res["layouts"][t].values()]
        if mode == "whole":
            buckets = [sum(buckets)]
        assert stats["d"] == sum(numels)
        want_k = sum(n if density is None else max(1, round(density * n)) for n in buckets)
        assert stats["k"] == want_k
        assert stats["bytes_sent"] > 0 and stats["bytes_received"] > 0
        assert stats["messages"] > 0 and stats["rounds"] > 0
        assert stats["seconds_communicate"] > 0 and not stats["skipped"]
        if method == "gs":
            assert stats["delivered_fraction"] is not None
        else:
            assert stats["delivered_fraction"] is None


def test_whole_model_gs_sends_less_than_the_dense_warm_up() -> None:
    stats = results(3)[0]["gs-whole"]["stats"]
    assert stats[-1]["bytes_sent"] < stats[0]["bytes_sent"] / 2


# ------------------------------------------------------------------ checkpoints
def test_resumed_whole_model_run_is_bitwise_the_uninterrupted_one() -> None:
    """Saved after 3 iterations, loaded with weights_only=True into a fresh DDP whose
    first iteration has another bucket layout: the gradients match bit for bit."""
    res = resume_results()
    assert res["saved_iter"] == 3 and res["resumed_iter"] == 6
    for t, (a, b) in enumerate(zip(res["uninterrupted"], res["resumed"], strict=True)):
        assert torch.equal(a, b), f"iteration {t}"


def test_pickle_keeps_settings_and_residuals_and_drops_the_group() -> None:
    res = resume_results()
    before, after = res["pickle_before"], res["pickle_after"]
    assert res["pickle_group_dropped"]
    assert before["iter"] == after["iter"] == 4
    buckets = set(res["pickle_layouts"])  # the buckets DDP made, one residual each
    assert len(buckets) >= 2
    assert set(before["buckets"]) == set(after["buckets"]) == buckets
    for i, sd in before["buckets"].items():
        assert torch.count_nonzero(sd["residual"]) > 0
        assert torch.equal(sd["residual"], after["buckets"][i]["residual"])
    assert after["layouts"] == before["layouts"]


def test_unpickled_state_resumes_from_its_residuals() -> None:
    """One dense iteration in the new process (pre-rebuild layout; residuals untouched),
    then compression continues from the saved residuals, like reference aggregators
    loaded with the same states."""
    res = resume_results()
    for i, sd in res["pickle_before"]["buckets"].items():
        assert torch.equal(res["residual_after_dense"]["buckets"][i]["residual"], sd["residual"])
    torch.testing.assert_close(res["pickle_got"][0], res["pickle_want"][0], rtol=1e-6, atol=1e-7)
    for t in (1, 2):
        assert torch.equal(res["pickle_got"][t], res["pickle_want"][t]), f"iteration {t}"


def test_state_dict_loads_with_weights_only() -> None:
    sd = resume_results()["saved_sd"]
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert loaded["method"] == "gs" and loaded["whole_model"] is True
    assert set(loaded) == {"iter", "method", "whole_model", "buckets", "layouts", "world_size",
                           "rank", "density", "options", "totals"}
    assert loaded["buckets"][0]["residual"].shape == (sum(param_numels()),)
    assert [pos for pos, _ in loaded["layouts"][0]] == list(range(8))  # model order


def test_state_dict_round_trip_into_a_new_state() -> None:
    sd = resume_results()["saved_sd"]
    state = HookState("gs", whole_model=True, density=0.02, **scen.SKETCH)
    state.load_state_dict(sd)
    again = state.state_dict()
    assert again["iter"] == sd["iter"]
    assert torch.equal(again["buckets"][0]["residual"], sd["buckets"][0]["residual"])
    assert again["layouts"] == sd["layouts"]


# ------------------------------------------------------------------ errors in DDP
def test_k_larger_than_a_bucket_is_a_clear_error_on_every_rank() -> None:
    """k is one more than the smallest bucket (and less than the model): the first bucket
    that small is named, with its size."""
    for res in error_results():
        sizes = _bucket_numels(res["layouts"])
        k = res["k"]
        assert k <= sum(param_numels())
        index = min(i for i, n in sizes.items() if n < k)
        msg = res["k_too_large"]
        assert msg.startswith(f"ValueError: k={k} is larger than bucket {index}"), msg
        assert f"d={sizes[index]} " in msg and "density=" in msg


def test_resume_with_another_bucket_layout_is_a_clear_error() -> None:
    """A per-bucket state saved under CAP_MB's layout, resumed under OTHER_CAP_MB's: the
    first bucket whose parameters differ is named."""
    numels = param_numels()
    for res in error_results():
        saved, other = res["layouts"], res["other_layouts"]

        def sizes(layout: dict[int, list[int]], i: int) -> list[int] | None:
            return [numels[p] for p in layout[i]] if i in layout else None

        differing = [i for i in sorted(saved) if sizes(saved, i) != sizes(other, i)]
        assert differing, f"the two caps made the same layout: {saved}"
        msg = res["other_layout"]
        assert msg.startswith(f"ValueError: bucket {differing[0]} holds"), msg
        assert "saved residual" in msg and "bucket_cap_mb" in msg


def test_resume_in_model_order_without_binding_the_model_is_a_clear_error() -> None:
    for res in error_results():
        assert "call state.bind(model)" in res["unbound"], res["unbound"]


# ------------------------------------------------------------------ settings (no processes)
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"method": "adam"}, r"method='adam' is invalid: it must be one of dense, topk, gtopk"),
        ({"start_iter": 0}, r"start_iter=0 is invalid: it must be an integer >= 1"),
        ({"start_iter": True}, r"start_iter=True is invalid"),
        ({"start_iter": 2.0}, r"start_iter=2.0 is invalid"),
        ({"whole_model": "yes"}, r"whole_model='yes' is invalid: it must be True or False"),
        ({"k": 0}, r"k=0 is invalid: it must be an integer >= 1"),
        ({"k": "5"}, r"k='5' is invalid"),
        ({"density": 1.5}, r"density=1.5 is invalid: it must be a number in \(0, 1\]"),
        ({"density": 0.01, "k": 5}, r"both density=0.01 and k=5 were given"),
        ({"method": "dense", "k": 5}, r"method 'dense' .* takes no k"),
        ({"foo": 1}, r"unknown option\(s\) \['foo'\] for method 'gs'"),
        ({"rows": 4}, r"rows=4 is invalid: it must be an odd integer"),
        ({"method": "topk", "momentum": 1.0}, r"momentum=1.0 is invalid"),
        ({"model": "net"}, r"model=str is invalid: it must be a torch.nn.Module"),
    ],
)
def test_bad_settings_raise_at_construction(kwargs: dict, match: str) -> None:
    kwargs = {"method": "gs", **kwargs}
    with pytest.raises(ValueError, match=match):
        HookState(**kwargs)


def test_construction_does_not_touch_the_process_group() -> None:
    assert not dist.is_initialized()
    state = HookState("gs", start_iter=5, whole_model=True, rows=5, k=100)
    assert (state.method, state.start_iter, state.whole_model) == ("gs", 5, True)
    assert state.options == {"rows": 5, "k": 100} and state.iter == 0
    sd = state.state_dict()
    assert {k: sd[k] for k in ("iter", "method", "whole_model", "buckets", "layouts",
                               "world_size", "rank", "options")} == {
        "iter": 0, "method": "gs", "whole_model": True, "buckets": {}, "layouts": {},
        "world_size": 1, "rank": 0, "options": {"rows": 5, "k": 100}}
    assert sd["totals"]["iterations"] == 0


def test_loading_another_methods_state_names_both() -> None:
    sd = HookState("topk").state_dict()
    with pytest.raises(ValueError, match=r"saved for method 'topk' into a HookState for "
                                         r"method 'gs'"):
        HookState("gs").load_state_dict(sd)


def test_loading_another_modes_state_is_an_error() -> None:
    sd = HookState("gs", whole_model=True).state_dict()
    with pytest.raises(ValueError, match=r"whole_model=True into a HookState with "
                                         r"whole_model=False"):
        HookState("gs").load_state_dict(sd)


def test_loading_something_else_is_an_error() -> None:
    with pytest.raises(ValueError, match="not a HookState state_dict"):
        HookState("gs").load_state_dict({"residual": torch.zeros(3)})


def test_pickle_of_a_fresh_state_keeps_its_settings() -> None:
    state = HookState("dense", start_iter=3, dtype=torch.float16)
    copy = pickle.loads(pickle.dumps(state))
    assert copy.settings == state.settings and copy.group is None
    assert repr(copy) == repr(state)


def test_comm_hook_has_the_signature_ddp_checks() -> None:
    """register_comm_hook rejects string annotations (from __future__ import annotations)."""
    ann = comm_hook.__annotations__
    assert ann["bucket"] is dist.GradBucket
    assert ann["return"] == torch.futures.Future[torch.Tensor]
