"""A worker dies with its launcher (:mod:`gssgd.train.launch`): a study's worker processes
by the parent-death signal, every spawned rank by it and by a watch of its launcher (a
fork server may outlive the launcher), so a killed launcher leaves no rank training into
a folder a resumed run will use."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: What two gloo ranks run: write their pids, then sleep far past the test (a module of
#: its own: a rank imports the function it runs).
SLEEPER = """
import os, time
from pathlib import Path

def sleeper(worker, folder):
    Path(folder, f"rank{worker.rank}").write_text(str(os.getpid()))
    time.sleep(600)
"""
LAUNCHER = """
import sys
from gssgd.train.launch import launch
from sleepy import sleeper

launch(sleeper, 2, args=(sys.argv[1],), timeout_s=900)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_process_whose_parent_is_gone_ends_at_once() -> None:
    code = ("from gssgd.train.launch import die_with_parent\n"
            "die_with_parent(parent=-1)\nprint('still here')")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1 and "still here" not in done.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's parent-death signal")
def test_spawned_ranks_die_when_their_launcher_is_killed(tmp_path: Path) -> None:
    (tmp_path / "sleepy.py").write_text(SLEEPER)
    out = tmp_path / "pids"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(out)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(list(out.glob("rank*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)  # the second pid's bytes
    pids = [int(p.read_text()) for p in sorted(out.glob("rank*"))]
    assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids), "a rank outlived its killed launcher"
