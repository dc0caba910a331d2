"""examples/accelerate_gssgd.py on CPU: two gloo processes, checkpoint and resume of the hook.

Two ``torchrun`` launches of the example (Accelerate on gloo via ``ACCELERATE_USE_CPU``):
6 optimizer steps of 2 accumulated micro-batches with ``accelerator.save_state`` after step
3, then a fresh launch that ``accelerator.load_state``s that checkpoint and runs steps 4-6.
gs in whole-model mode with a bound model resumes without a dense step, so the two must
end bitwise equal: parameters, and each rank's own residual.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("accelerate")

from examples.accelerate_gssgd import EveryRankHookState  # noqa: E402
from gssgd.ddp import HookState  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STEPS, SAVE_AT, WORLD = 6, 3, 2


def _launch(out: Path, *extra: str) -> None:
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "HF_HOME": str(out.parent / "hf"),
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={WORLD}", str(ROOT / "examples" / "accelerate_gssgd.py"),
           "--steps", str(STEPS), "--accumulate", "2", "--out", str(out), *extra]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("accelerate")
    _launch(tmp / "full", "--save-at", str(SAVE_AT))
    _launch(tmp / "resumed", "--resume", str(tmp / "full" / "checkpoint"))
    return {"full": tmp / "full", "resumed": tmp / "resumed"}


def _final(run: Path, rank: int) -> dict:
    return torch.load(run / f"final_rank{rank}.pt", weights_only=True)


def test_resumed_run_ends_bitwise_equal_to_the_uninterrupted_one(runs: dict) -> None:
    for rank in range(WORLD):
        full, resumed = _final(runs["full"], rank), _final(runs["resumed"], rank)
        assert resumed["started_at"] == SAVE_AT and full["started_at"] == 0
        assert full["step"] == resumed["step"] == STEPS
        for a, b in zip(full["params"], resumed["params"], strict=True):
            assert torch.equal(a, b), f"rank {rank}"
        a, b = full["hook"]["buckets"][0]["residual"], resumed["hook"]["buckets"][0]["residual"]
        assert torch.count_nonzero(a) > 0
        assert torch.equal(a, b), f"rank {rank}: residual"


def test_the_hook_reduces_once_per_optimizer_step_under_accumulate(runs: dict) -> None:
    for rank in range(WORLD):
        assert _final(runs["full"], rank)["hook"]["iter"] == STEPS
        assert _final(runs["resumed"], rank)["hook"]["iter"] == STEPS


def test_the_checkpoint_holds_each_ranks_own_residual(runs: dict) -> None:
    """Accelerate writes a registered object once; the wrapper saved both ranks' states."""
    saved = torch.load(runs["full"] / "checkpoint" / "custom_checkpoint_0.pkl",
                       weights_only=True)
    assert saved["world_size"] == WORLD and len(saved["ranks"]) == WORLD
    residuals = [r["buckets"][0]["residual"] for r in saved["ranks"]]
    assert all(r["iter"] == SAVE_AT for r in saved["ranks"])
    assert not torch.equal(residuals[0], residuals[1])


def test_loading_with_another_number_of_processes_is_a_clear_error() -> None:
    wrapper = EveryRankHookState(HookState("gs", density=0.01))
    saved = {"world_size": 2, "ranks": [HookState("gs").state_dict()] * 2}
    with pytest.raises(ValueError, match=r"saved by 2 processes, but 1 are running; resume "
                                         r"with 2 processes \(accelerate launch --num_processes 2"):
        wrapper.load_state_dict(saved)
