"""``overlap="buckets"``: per-bucket hooks that return futures a thread completes while the
backward pass goes on (gssgd.ddp.hook.HookCore.overlapped_bucket_step), against the synchronous
path, on real gloo processes: P = 3, >= 8 buckets, every rank's backward delayed at
random, 20 steps, every per-bucket method."""

from __future__ import annotations

import pytest
import torch

from gssgd.ddp import HookState
from tests.ddp.overlap_scenarios import (
    METHODS,
    START_ITER,
    STEPS,
    both,
    nan_in_a_middle_bucket,
)
from tests.dist_utils import raise_worker_errors, run_workers


@pytest.mark.parametrize("method", list(METHODS))
def test_overlapped_buckets_give_the_synchronous_results_bitwise(method: str) -> None:
    out = run_workers(3, both, method)
    raise_worker_errors(out)
    for rank in out:
        assert rank["none"]["buckets"] >= 8
        assert rank["none"]["bytes"] == rank["buckets"]["bytes"]
        assert rank["none"]["returned_pending"] == 0  # the synchronous path blocks
        assert rank["buckets"]["returned_pending"] >= 40  # most buckets went on a thread
        for a, b in zip(rank["none"]["weights"], rank["buckets"]["weights"], strict=True):
            assert torch.equal(a, b), method
        for overlap in ("none", "buckets"):  # what the backward waited for the hook
            assert len(rank[overlap]["blocked"]) == STEPS - START_ITER
            assert all(blocked > 0 for blocked, _ in rank[overlap]["blocked"])
        # the synchronous hook's calls hold the backward for all of its phases, and more
        assert all(blocked >= phases for blocked, phases in rank["none"]["blocked"])
    for a, b in zip(out[0]["buckets"]["weights"], out[2]["buckets"]["weights"], strict=True):
        assert torch.equal(a, b)  # every rank the same model


def test_overlap_buckets_is_for_per_bucket_mode_without_propagate() -> None:
    with pytest.raises(ValueError, match="overlap='buckets' averages each DDP bucket"):
        HookState("topk", density=0.1, whole_model=True, overlap="buckets")
    with pytest.raises(ValueError, match="cannot be used with nonfinite='propagate'"):
        HookState("topk", density=0.1, whole_model=False, overlap="buckets",
                  nonfinite="propagate")


@pytest.mark.parametrize("label", ["dense", "topk"])  # started in the hook; on the lane's thread
def test_a_bucket_that_fails_fails_the_backward_on_every_rank_with_its_own_type(label: str
                                                                               ) -> None:
    out = run_workers(3, nan_in_a_middle_bucket, label)
    raise_worker_errors(out)
    for rank in out:
        assert rank["raised"] is not None, label
        kind, message, step = rank["raised"]
        assert (kind, step) == ("FloatingPointError", 3), message
        assert "nonfinite='raise'" in message
