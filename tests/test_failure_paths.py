"""Failure paths users reached in their own setups (docs/reliability.md, rows 33 to 37).

* A summed sketch table holding NaN or Inf (a float16 table overflowing on the wire:
  ``+inf + -inf`` is NaN) crashed ``heavy_hitters`` of a one-row cached sketch with
  ``range() arg 3 must not be zero``; it now ranks non-finite estimates first, the same way
  whatever the NaNs' bits.
* ``query()`` of no coordinates with cached hashes crashed the same way.
* Ranks that disagree on their settings all raise; every rank leaves the process group
  cleanly (no ``terminate called without an active exception`` from C++ at exit) and the
  run exits with the documented status.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from gssgd import CountSketch
from gssgd.train.launch import Worker

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------- non-finite sketch tables


def _reference_top(est: torch.Tensor, k: int) -> list[int]:
    """Rank all estimates: non-finite |estimate| first, then by |estimate|, ties to the lower
    index (what heavy_hitters documents)."""
    mag = est.abs().double().numpy()
    mag = np.where(np.isnan(mag), np.inf, mag)
    order = np.lexsort((np.arange(mag.size), -mag))  # last key first: -mag, then index
    return order[:k].tolist()


def _overflowed_sum(d: int, rows: int, cols: int, cache: bool) -> CountSketch:
    """Two ranks' sketches summed as gs-SGD does with table_dtype=float16: each table is
    divided by P = 2 and sent as float16 (where 1e9 overflows to +-inf), summed, times P."""
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(d, generator=gen), torch.randn(d, generator=gen)
    a[100], b[100] = 1e9, -1e9  # +inf + -inf: NaN in the summed table
    a[7000], b[7000] = 1e9, 1e9  # +-inf
    sketches = []
    for x in (a, b):
        sk = CountSketch(d, rows=rows, cols=cols, seed=11, cache_hashes=cache)
        sk.accumulate(x)
        sketches.append(sk)
    wire = [(sk.table / 2).to(torch.float16) for sk in sketches]
    summed = (wire[0] + wire[1]).to(torch.float32).mul_(2)
    return sketches[0].with_table(summed)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("cache", [True, False])
def test_overflowed_float16_table_ranks_non_finite_estimates_first(rows: int, cache: bool) -> None:
    d, cols, k = 20_000, 800, 40
    summed = _overflowed_sum(d, rows, cols, cache)
    assert torch.isnan(summed.table).any() and torch.isinf(summed.table).any()
    est = summed.query()
    for ordered in (True, False):
        idx, values = summed.heavy_hitters(k, ordered=ordered)
        want = _reference_top(est, k)
        got = idx.tolist() if ordered else sorted(idx.tolist())
        assert got == (want if ordered else sorted(want))
        assert torch.equal(values, est[idx]) or torch.equal(values.isnan(), est[idx].isnan())
    # the overflowed coordinates are among the chosen: their buckets rank first
    chosen = set(summed.heavy_hitters(k)[0].tolist())
    assert {100, 7000} <= chosen


@pytest.mark.parametrize("rows", [1, 3, 5])
def test_nan_bits_do_not_change_the_selection(rows: int) -> None:
    """Ranks holding the same table select the same set whatever their NaNs' bits (a
    +inf + -inf may give a negative NaN on one device, a positive one on another)."""
    d, cols = 8192, 256
    sk = CountSketch(d, rows=rows, cols=cols, seed=5, cache_hashes=True)
    sk.accumulate(torch.randn(d, generator=torch.Generator().manual_seed(1)))
    results = []
    for bits in (0x7FC00000, -0x400000, 0x7F800001, 0x7FFFFFFF):  # quiet, negative, payloads
        table = sk.table.clone()
        nan = torch.tensor([bits], dtype=torch.int32).view(torch.float32)
        assert torch.isnan(nan).all()
        table[:, 3] = nan  # one bucket per row
        table[0, 9] = torch.inf
        hh = sk.with_table(table).heavy_hitters(20)
        results.append(hh[0].tolist())
        assert results[-1] == _reference_top(sk.with_table(table).query(), 20)
    assert all(r == results[0] for r in results)


def test_one_row_cached_sketch_with_nan_at_the_threshold_no_longer_crashes() -> None:
    """The reported crash: one row, cached hashes, a NaN bucket where the k-th largest
    |value| lies (``range() arg 3 must not be zero`` before the fix)."""
    d = 10_000
    sk = CountSketch(d, rows=1, cols=400, cache_hashes=True)
    sk.accumulate(torch.randn(d, generator=torch.Generator().manual_seed(0)))
    sk.table[0, 5] = torch.nan
    idx, values = sk.heavy_hitters(10)
    assert idx.numel() == 10 and bool(values.isnan().all())  # bucket 5 holds > 10 coordinates
    assert idx.tolist() == _reference_top(sk.query(), 10)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("cache", [True, False])
def test_query_of_no_coordinates_is_empty(rows: int, cache: bool) -> None:
    sk = CountSketch(5000, rows=rows, cols=64, cache_hashes=cache, dtype=torch.float64)
    sk.accumulate(torch.randn(5000, dtype=torch.float64))
    out = sk.query(torch.empty(0, dtype=torch.long))
    assert out.shape == (0,) and out.dtype == torch.float64
    with pytest.raises(ValueError, match=r"k=0 is invalid: it must be an integer in \[1, 5000\]"):
        sk.heavy_hitters(0)


# ----------------------------------------------------------------- ranks that disagree

# A method registered by a --plugin whose aggregator reports a different seed on each rank:
# the rank-agreement check makes every rank raise the same ValueError at the first step.
_PLUGIN = '''
import torch.distributed as dist

from gssgd import Method, register_method
from gssgd.aggregators.topk import LocalTopk


class Skewed(LocalTopk):
    name = "skewed"

    def agreement_fields(self):
        return {**super().agreement_fields(), "seed": dist.get_rank()}


register_method(Method("skewed", "top-k whose ranks disagree (test)", Skewed), replace=True)
'''

_TRAIN = ["train", "--plugin", "skewed_plugin", "--method", "skewed", "--dataset", "digits",
          "--model", "mlp", "--steps", "3", "--batch-size", "16", "--eval-every", "0",
          "--no-progress", "--timeout", "60"]


def _env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "skewed_plugin.py").write_text(textwrap.dedent(_PLUGIN))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def _assert_clean_disagreement(done: subprocess.CompletedProcess, at_least: int) -> None:
    err = done.stderr
    assert "terminate called" not in err, err  # no C++ abort on any rank
    assert f'File "{ROOT / "gssgd"}' not in err, err  # a one-line error, no traceback of ours
    assert err.count("ranks disagree on the aggregator configuration: seed") >= at_least, err


def test_disagreeing_spawned_ranks_exit_cleanly(tmp_path: Path) -> None:
    """Every rank reports the disagreement, leaves the group, and exits 1; the parent
    reports the failed run and exits 1 (``gssgd train``: 1 = the run failed)."""
    done = subprocess.run(
        [sys.executable, "-m", "gssgd.cli.main", *_TRAIN, "--workers", "2",
         "--out", str(tmp_path / "run")],
        env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 1, done.stderr
    _assert_clean_disagreement(done, at_least=2)  # every rank said it and left on its own
    assert "gssgd train failed: worker rank" in done.stderr
    assert "exit code 1" in done.stderr
    assert "Terminating process" not in done.stderr  # no rank had to be killed


def test_disagreeing_torchrun_ranks_exit_cleanly(tmp_path: Path) -> None:
    """Under torchrun each rank is its own ``gssgd train`` and exits 2 (a ValueError: invalid
    input); torchrun reports the group's failure with its own status 1. (torchrun stops the
    other ranks once the first has exited, so only that one's message is certain.)"""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this python")
    done = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "gssgd.cli.main",
         *_TRAIN, "--out", str(tmp_path / "run")],
        env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 1, done.stderr
    _assert_clean_disagreement(done, at_least=1)
    assert "exitcode  : 2" in done.stderr  # the root cause: a rank's own status


def _fail_with_work_in_flight(worker: Worker) -> None:
    """What a failing training run leaves behind, in miniature: the process group held in a
    reference cycle (as DDP and the aggregators hold it), and on rank 0 an all-reduce still
    in flight with a Python callback when every rank raises. Rank 1 raises a second later,
    without joining the all-reduce."""
    holder: dict = {"group": dist.group.WORLD}
    holder["self"] = holder
    if worker.rank == 0:
        work = dist.all_reduce(torch.ones(1000), async_op=True)
        holder["pending"] = work.get_future().then(lambda fut: fut.value()[0].sum())
    else:
        time.sleep(1.0)
    raise ValueError(f"settings disagree (test) on rank {worker.rank}")


def test_workers_failing_with_work_in_flight_leave_the_group_before_exiting() -> None:
    """Before, the group outlived destroy_process_group in the cycle until interpreter
    finalization, where the failing all-reduce aborted rank 0 in C++ (``terminate called
    ...``, signal 6) or the parent killed it. Now every rank collects it, leaves the group
    and exits 1 on its own; the parent raises WorkerFailed with status 1."""
    code = (
        "from gssgd.train.launch import launch, WorkerFailed\n"
        "from tests.test_failure_paths import _fail_with_work_in_flight\n"
        "try:\n"
        "    launch(_fail_with_work_in_flight, 2, timeout_s=60, device='cpu')\n"
        "except WorkerFailed as err:\n"
        "    print('parent:', err.rank, err.exit_code)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "terminate called" not in done.stderr, done.stderr
    assert "Terminating process" not in done.stderr, done.stderr  # nobody had to be stopped
    for rank in (0, 1):
        assert f"gssgd: rank {rank}: settings disagree (test) on rank {rank}" in done.stderr
    assert done.stdout.split()[-1] == "1", done.stdout  # WorkerFailed(rank, exit code 1)
