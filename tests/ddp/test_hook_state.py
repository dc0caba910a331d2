"""What a new user meets in :class:`gssgd.ddp.HookState`: options a method does not use are
refused, PyTorch's name for PowerSGD's rank is accepted, ``whole_model`` follows
``model=``, and a saved state knows its world: loaded into another world size or rank, or
with other settings, it is refused with what was saved and what is running (real gloo
processes, 2 ranks, and 1 for the smaller world). Also: running totals in the stats and
the checkpoint, the ``gssgd`` logger, and :class:`~gssgd.ddp.EveryRankHookState`.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import gssgd
from gssgd.aggregators import build_options
from gssgd.ddp import EveryRankHookState, HookState, comm_hook
from tests.ddp.scenarios import CAP_MB, batch, make_model
from tests.dist_utils import raise_worker_errors, run_each, run_workers


# --------------------------------------------------------------------- construction
@pytest.mark.parametrize(("method", "match"), [
    ("powersgd", r"density=0\.01 does not apply to 'powersgd'.*takes .*rank, warm_start"),
    ("dense", r"density=0\.01 does not apply to 'dense': it sends every coordinate.*dtype"),
])
def test_a_density_the_method_does_not_use_is_refused_naming_its_options(
        method: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HookState(method, density=0.01)


def test_pytorchs_name_for_the_powersgd_rank_is_accepted() -> None:
    state = HookState("powersgd", matrix_approximation_rank=3)
    assert state.options == {"rank": 3}
    assert build_options("powersgd", 100, matrix_approximation_rank=4)[2].rank == 4
    with pytest.raises(ValueError, match="name the same option of 'powersgd'; give one"):
        HookState("powersgd", rank=2, matrix_approximation_rank=3)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['matrix_approximation_rank'\]"):
        HookState("gs", matrix_approximation_rank=3)


def test_whole_model_is_the_default_when_the_model_is_given() -> None:
    model = make_model()
    assert HookState("gs", density=0.01, model=model).whole_model
    assert not HookState("gs", density=0.01).whole_model
    assert not HookState("gs", density=0.01, model=model, whole_model=False).whole_model


def test_every_rank_hook_state_is_in_the_package() -> None:
    assert "EveryRankHookState" in gssgd.ddp.__all__
    with pytest.raises(ValueError, match="it must be a gssgd.ddp.HookState"):
        EveryRankHookState(object())  # type: ignore[arg-type]


# --------------------------------------------------------------------- world and totals
START, STEPS = 2, 5


def _train(rank: int, state: HookState, steps: range) -> DDP:
    ddp = DDP(make_model(), bucket_cap_mb=CAP_MB)
    state.bind(ddp)
    ddp.register_comm_hook(state, comm_hook)
    for step in steps:
        ddp.zero_grad()
        ddp(batch(rank, step)).square().mean().backward()
    return ddp


def _save(rank: int, world: int, folder: str) -> dict:
    """Train with a handler on the ``gssgd`` logger; save this rank's state."""
    records: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("gssgd")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    state = HookState("topk", density=0.05, start_iter=START, whole_model=True)
    sent = []
    ddp = DDP(make_model(), bucket_cap_mb=CAP_MB)
    state.bind(ddp)
    ddp.register_comm_hook(state, comm_hook)
    for step in range(STEPS):
        ddp.zero_grad()
        ddp(batch(rank, step)).square().mean().backward()
        sent.append(state.last_stats.bytes_sent)
    logger.removeHandler(handler)
    sd = state.state_dict()
    torch.save(sd, Path(folder) / f"rank{rank}.pt")
    every = EveryRankHookState(state).state_dict()
    reloaded = HookState("topk", density=0.05, start_iter=START, whole_model=True)
    EveryRankHookState(reloaded).load_state_dict(every)
    return {"sent": sent, "totals": state.totals, "records": records, "sd": sd,
            "every_world": every["world_size"],
            "every_mine": torch.equal(reloaded.state_dict()["buckets"][0]["residual"],
                                      sd["buckets"][0]["residual"]),
            "reloaded_totals": reloaded.totals}


def _load(rank: int, world: int, folder: str, file_rank: int, changes: dict) -> str:
    """Load ``rank{file_rank}.pt`` into a state (with ``changes``) and train one step."""
    settings = {"density": 0.05, "start_iter": START, "whole_model": True, **changes}
    state = HookState("topk", **settings)
    state.load_state_dict(torch.load(Path(folder) / f"rank{file_rank}.pt", weights_only=True))
    _train(rank, state, range(STEPS, STEPS + 1))
    return "loaded"


def _saved_then_swapped(rank: int, world: int, folder: str) -> dict:
    out = {"save": _save(rank, world, folder)}
    out.update(run_each(rank, world, _load, {
        "own": (folder, rank, {}),
        "swapped": (folder, 1 - rank, {}),
        "density": (folder, rank, {"density": 0.1}),
        "options": (folder, rank, {"momentum": 0.5}),
        "nonfinite may change": (folder, rank, {"nonfinite": "raise"}),
    }))
    return out


@pytest.fixture(scope="module")
def runs() -> dict:
    with tempfile.TemporaryDirectory() as folder:
        two = run_workers(2, _saved_then_swapped, folder)
        raise_worker_errors(two)
        one = run_workers(1, run_each, _load, {"rank0": (folder, 0, {}),
                                               "rank1": (folder, 1, {})})
        raise_worker_errors(one)
    return {"two": two, "one": one[0]}


def _error(result: object) -> str:
    assert isinstance(result, dict) and "__error__" in result, result
    return result["__error__"]


def test_a_state_loaded_into_a_smaller_world_is_refused(runs: dict) -> None:
    for file_rank in (0, 1):
        message = _error(runs["one"][f"rank{file_rank}"])
        assert f"saved by rank {file_rank} of 2 processes, but it is loaded by rank 0 of 1" \
            in message
        assert "Resume with 2 processes" in message


def test_a_state_loaded_by_another_rank_is_refused(runs: dict) -> None:
    for rank in (0, 1):
        assert runs["two"][rank]["own"] == "loaded"
        message = _error(runs["two"][rank]["swapped"])
        assert f"saved by rank {1 - rank} of 2 processes, but it is loaded by rank {rank} of 2" \
            in message


def test_a_state_loaded_with_other_settings_is_refused_naming_them(runs: dict) -> None:
    assert "density: saved 0.05, running 0.1" in _error(runs["two"][0]["density"])
    assert "momentum: saved None, running 0.5" in _error(runs["two"][0]["options"])
    assert runs["two"][0]["nonfinite may change"] == "loaded"


def test_the_state_records_world_rank_method_and_options(runs: dict) -> None:
    for rank in (0, 1):
        sd = runs["two"][rank]["save"]["sd"]
        assert (sd["world_size"], sd["rank"], sd["method"]) == (2, rank, "topk")
        assert sd["density"] == 0.05 and sd["options"] == {}


def test_running_totals_sum_every_iteration_and_survive_a_checkpoint(runs: dict) -> None:
    for rank in (0, 1):
        save = runs["two"][rank]["save"]
        totals = save["totals"]
        assert (totals.iterations, totals.dense_iterations, totals.compressed_iterations) == (
            STEPS, START, STEPS - START)
        assert totals.bytes_sent == sum(save["sent"]) > 0
        assert save["reloaded_totals"] == totals


def test_the_gssgd_logger_says_when_compression_starts(runs: dict) -> None:
    records = runs["two"][0]["save"]["records"]
    assert any(f"iteration {START}: topk compresses from here on" in r for r in records), records


def test_every_rank_hook_state_hands_each_rank_its_own_residual(runs: dict) -> None:
    for rank in (0, 1):
        assert runs["two"][rank]["save"]["every_world"] == 2
        assert runs["two"][rank]["save"]["every_mine"]
