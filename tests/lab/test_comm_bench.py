"""`gssgd bench comm` end to end: loopback and namespace runs, failures, the CLI.

The runs are small (2 workers, d = 20000, 2 timed steps) and every one is bounded by the
benchmark's own timeout. Namespace runs need root and stay inside their namespaces.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import pytest

import gssgd_lab.cluster as netns
from gssgd.cli import bench
from gssgd.costmodel import VARIANTS, method_spec, traffic
from gssgd_lab.comm_bench import _launch, run_comm_bench
from gssgd_lab.comm_config import CommBenchConfig
from gssgd_lab.workers import WorkerError

FIELDS = {
    "seconds_per_step",
    "bytes_sent_per_step",
    "bytes_received_per_step",
    "seconds_compress",
    "seconds_communicate",
    "seconds_decompress",
    "speedup_of_gs",
    "seconds_other",
}
needs_root = pytest.mark.skipif(
    not netns.have_root(),
    reason="the namespace mode needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2",
)


def _cli(argv: list[str]) -> int:
    """The main program's way in, in miniature: a parser with `bench` registered."""
    parser = argparse.ArgumentParser(prog="gssgd")
    bench.add_parser(parser.add_subparsers(dest="command", required=True), "benchmarks")
    args = parser.parse_args(argv)
    return args.run(args)


@pytest.fixture(scope="module")
def loopback_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("comm_none")
    argv = ["bench", "comm", "--workers", "2", "--d", "20000", "--density", "0.001"]
    argv += ["--link", "none", "--repeats", "2", "--warmup", "1", "--out", str(out)]
    assert _cli(argv) == 0
    return out


def _check_results(results: dict, workers: int, d: int, density: float) -> None:
    methods = [m for m in results if not m.startswith("_")]
    gs_seconds = results["gs"]["seconds_per_step"]
    for name in methods:
        row = results[name]
        assert set(row) >= FIELDS, name
        assert row["seconds_per_step"] > 0
        assert row["seconds_per_step"] == statistics.median(row["seconds_per_step_all"])
        # The ratio comes from the same run's times.
        assert row["speedup_of_gs"] == pytest.approx(row["seconds_per_step"] / gs_seconds)
        # The bytes are those of the formulas, rank by rank and for the busiest rank.
        t = traffic(method_spec(name, d, density), workers)
        assert row["bytes_sent_per_rank"] == list(t.sent), name
        assert row["bytes_received_per_rank"] == list(t.received), name
        assert row["bytes_sent_per_step"] == statistics.mean(t.sent)
        assert row["bytes_received_max_per_step"] == max(t.received)
        assert row["rounds"] == t.rounds
    assert results["gs"]["speedup_of_gs"] == 1.0
    meta = results["_meta"]
    for key in ("command", "workers", "d", "k", "density", "link", "threads", "torch"):
        assert key in meta
    assert meta["workers"] == workers and meta["d"] == d and meta["k"] == round(density * d)
    assert meta["machine"] and meta["cpu_count"] == os.cpu_count() and meta["date"]


def test_loopback_run_writes_results_whose_bytes_match_the_formulas(loopback_run):
    results = json.loads((loopback_run / "results.json").read_text())
    assert [m for m in results if m != "_meta"] == list(VARIANTS)
    _check_results(results, workers=2, d=20000, density=0.001)
    assert results["_meta"]["link"] == "none" and results["_meta"]["mode"] == "loopback"
    # gs and topk by the design's figures: rows*cols table cells (float16 by default) and
    # m*k float32 values per round (at P = 2 the ring sends each once), no indices; topk
    # sends and receives (P-1) * 2k numbers. Plus the non-finite flag's (P-1) * 4 bytes.
    gs = results["gs"]["spec"]
    k, rows, cols, m = gs["k"], gs["rows"], gs["cols"], gs["candidates"]
    assert k == 20 and gs["table_bytes"] == 2
    assert results["gs"]["bytes_sent_per_step"] == rows * cols * 2 + m * k * 4 + 4
    assert results["topk"]["bytes_received_per_step"] == 2 * k * 4 + 4
    assert (loopback_run / "comm.png").stat().st_size > 0
    assert "gs speed-up" in (loopback_run / "table.txt").read_text()


@needs_root
def test_namespace_run_on_100mbit_links_runs_and_tears_down(tmp_path):
    cfg = CommBenchConfig(
        workers=2,
        d=20000,
        density=0.001,
        link="100mbit",
        methods=("dense", "topk", "gs"),
        repeats=2,
        warmup=1,
    )
    results = run_comm_bench(cfg, tmp_path, echo=lambda _: None)
    _check_results(results, workers=2, d=20000, density=0.001)
    assert results["_meta"]["mode"] == "namespaces"
    assert results["_meta"]["link_bps"] == 100_000_000
    mine = [n for n in netns._list_namespaces() if netns._owner_pid(n, "gsn") == os.getpid()]
    assert mine == []


def test_without_root_a_rate_falls_back_to_loopback_and_says_so(tmp_path, monkeypatch):
    from gssgd_lab import comm_bench

    monkeypatch.setattr(comm_bench, "have_root", lambda: False)
    monkeypatch.setattr(comm_bench, "_launch", _fake_launch)
    lines: list[str] = []
    cfg = CommBenchConfig(workers=2, d=1000, link="1gbit", methods=("topk", "gs"), repeats=1)
    results = run_comm_bench(cfg, tmp_path, echo=lines.append)
    assert "needs root" in lines[0] and "--link none" in lines[0]
    assert results["_meta"]["link"] == "none" and results["_meta"]["link_requested"] == "1gbit"


def _fake_launch(cfg, work, argv, namespaces, timeout_s):
    """Stand-in workers: the records a real run writes, without starting processes."""
    assert not namespaces
    for r in range(cfg.workers):
        methods = {}
        for spec in cfg.specs:
            t = traffic(spec, cfg.workers)
            rec = {"wall": [0.01], "bytes_sent": [t.sent[r]], "bytes_received": [t.received[r]]}
            rec.update(messages=[1], rounds=[t.rounds], seconds_compress=[0.001])
            rec.update(seconds_communicate=[0.005], seconds_decompress=[0.002])
            methods[spec.name] = rec
        (work / f"rank{r}.json").write_text(json.dumps({"rank": r, "methods": methods}))


def _running_with(marker: str) -> list[int]:
    """Pids of the live processes whose command line holds ``marker`` (zombies excluded)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


# Rank 1 fails at once; the others would sleep for ten minutes if nobody stopped them.
FAILING_WORKER = r"""
import json, os, sys, time, traceback
rank, out = os.environ["RANK"], sys.argv[1]
if rank == "1":
    try:
        raise ValueError("boom on rank 1")
    except ValueError as exc:
        err = {"rank": rank, "time": time.time(), "error": repr(exc),
               "traceback": traceback.format_exc()}
        open(os.path.join(out, f"rank{rank}.error.json"), "w").write(json.dumps(err))
        sys.exit(1)
time.sleep(600)
"""
#: A limit the tests below never reach when the code is right, even on a loaded machine.
GENEROUS_TIMEOUT_S = 120.0


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs Linux /proc")
def test_a_failing_worker_fails_the_run_fast_with_its_traceback(tmp_path):
    """The failure is reported as soon as it happens: the run ends with rank 1's error (a
    run that waited for the others would end with the timeout's message instead, since
    they sleep far longer), and the other ranks are stopped, not left running."""
    cfg = CommBenchConfig(workers=3, d=1000, link="none", methods=("gs",), repeats=1)
    marker = str(tmp_path)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"rank 1 failed.*boom on rank 1"):
        _launch(cfg, tmp_path, [sys.executable, "-c", FAILING_WORKER, marker], False,
                GENEROUS_TIMEOUT_S)  # fmt: skip
    assert time.monotonic() - start < GENEROUS_TIMEOUT_S  # ended by the failure
    assert _running_with(marker) == []


def test_a_worker_killed_without_a_traceback_is_named(tmp_path):
    cfg = CommBenchConfig(workers=2, d=1000, link="none", methods=("gs",), repeats=1)
    script = (
        "import os, signal, time\n"
        "if os.environ['RANK'] == '0': os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(600)"
    )
    with pytest.raises(WorkerError, match="rank 0 was killed by signal 9 without a traceback"):
        _launch(cfg, tmp_path, [sys.executable, "-c", script], False, GENEROUS_TIMEOUT_S)


def test_a_real_worker_reports_its_own_error(tmp_path):
    cfg = CommBenchConfig(workers=2, d=1000, link="none", methods=("gs",), repeats=1)
    argv = [sys.executable, "-m", "gssgd_lab.comm_worker", "--config", str(tmp_path / "nope")]
    with pytest.raises(WorkerError, match=r"(?s)rank \d failed.*FileNotFoundError.*nope"):
        _launch(cfg, tmp_path, [*argv, "--out", str(tmp_path)], False, GENEROUS_TIMEOUT_S)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs Linux /proc")
def test_a_stalled_run_stops_at_its_timeout(tmp_path):
    """Workers that would sleep for ten minutes: the run stops at its 2 s timeout (not
    before), says so, and leaves nothing running."""
    cfg = CommBenchConfig(workers=2, d=1000, link="none", methods=("gs",), repeats=1)
    marker = str(tmp_path)
    sleeper = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(600)",
               marker]  # fmt: skip
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"did not finish within its timeout of 2 s"):
        _launch(cfg, tmp_path, sleeper, False, 2.0)
    assert time.monotonic() - start >= 2.0
    assert _running_with(marker) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--methods", "dense,gss"], "unknown method"),
        (["--link", "100mbps"], "bytes per second"),
        (["--d", "1.5e3x"], "whole number"),
        (["--density", "2"], r"\(0, 1\]"),
        (["--frobnicate", "1"], "unrecognized arguments"),
    ],
)
def test_bad_arguments_are_refused_with_the_valid_range(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        _cli(["bench", "comm", *argv])
    assert exc.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_bad_config_values_name_the_value_and_the_fix(capsys):
    assert _cli(["bench", "comm", "--rows", "4", "--link", "none"]) == 2
    assert "rows=4" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"workers=0 is invalid.*--workers 4"):
        CommBenchConfig(workers=0)


def test_arch_gives_powersgd_the_layer_shapes_and_the_command_line_keeps_it():
    """``--arch resnet``: PowerSGD compresses the ResNet layout at d matrix by matrix (the
    cost model's calibration runs), the other methods are unchanged, and the printed
    command reproduces it."""
    from gssgd.costmodel.architectures import layer_shapes

    cfg = CommBenchConfig(workers=2, d=1_000_000, methods=("powersgd", "gs"), arch="resnet")
    power, gs = cfg.specs
    assert power.shapes == layer_shapes("resnet", 1_000_000) and len(power.shapes) > 100
    assert gs == method_spec("gs", 1_000_000, 0.001, shapes=power.shapes)
    assert traffic(power, 2).critical_bytes != traffic(
        CommBenchConfig(workers=2, d=1_000_000, methods=("powersgd",)).specs[0], 2).critical_bytes
    assert "--arch resnet" in cfg.command_line()
