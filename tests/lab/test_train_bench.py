"""`gssgd bench train`: the time to target, the summaries, and small end-to-end runs.

The end-to-end runs are tiny (2 workers, digits, a few steps) and bounded by the
benchmark's own per-method timeout. The namespace run needs root and stays inside the
namespaces it creates.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import time
from pathlib import Path

import pytest

import gssgd_lab.cluster as netns
from gssgd.cli import bench
from gssgd.train.metrics import read_metrics
from gssgd_lab import train_bench
from gssgd_lab.cluster import _pid_alive
from gssgd_lab.train_bench import run_train_bench
from gssgd_lab.train_bench_config import TrainBenchConfig, train_argv
from gssgd_lab.train_summary import ELAPSED_FIELD, summarize, summarize_run, time_to_target
from gssgd_lab.workers import WorkerError, run_process

needs_root = pytest.mark.skipif(
    not netns.have_root(),
    reason="the namespace mode needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2",
)
REQUIRED = {
    "seconds_per_step",
    "samples_per_second",
    "seconds_compute_per_step",
    "bytes_sent_per_step",
    "final_test_accuracy",
    "seconds_to_target",
    "gs_throughput_speedup",
    "gs_time_to_target_speedup",
}


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gssgd")
    bench.add_parser(parser.add_subparsers(dest="command", required=True), "benchmarks")
    args = parser.parse_args(argv)
    return args.run(args)


def _record(step: int, seconds: float, acc: float | None = None, **extra) -> dict:
    rec = {"step": step, "seconds_step": seconds, "seconds_compute": seconds / 2,
           "seconds_communicate": seconds / 4, "bytes_sent": 1000.0, "bytes_sent_max": 1500.0,
           **extra}  # fmt: skip
    if acc is not None:
        rec["test_loss"], rec["test_accuracy"] = 1.0, acc
    return rec


# --------------------------------------------------------------------------- time to target


def test_time_to_target_from_a_synthetic_metrics_file(tmp_path):
    # 10 steps of 0.1 s, then 0.2 s; evaluations every 5 steps: 0.5, 0.85, 0.95, 0.97.
    records = [_record(s, 0.1 if s < 10 else 0.2) for s in range(20)]
    for step, acc in ((4, 0.5), (9, 0.85), (14, 0.95), (19, 0.97)):
        records[step].update(test_loss=1.0, test_accuracy=acc)
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in reversed(records)))  # any order
    loaded = read_metrics(path)
    # The first evaluation >= 0.9 is step 14: 10 * 0.1 + 5 * 0.2 seconds from step 0's start.
    seconds, step = time_to_target(loaded, 0.9)
    assert step == 14 and seconds == pytest.approx(2.0)
    assert time_to_target(loaded, 0.85) == (pytest.approx(1.0), 9)  # "at or above"
    assert time_to_target(loaded, 0.5)[1] == 4
    assert time_to_target(loaded, 0.99) is None
    assert time_to_target([], 0.9) is None


def test_time_to_target_skips_non_finite_accuracies_and_prefers_a_logged_clock():
    records = [_record(0, 1.0, "nan"), _record(1, 1.0, 0.95), _record(2, 1.0)]
    assert time_to_target(records, 0.9) == (pytest.approx(2.0), 1)
    for r, elapsed in zip(records, (5.0, 12.5, 13.0), strict=True):  # e.g. with evaluations
        r[ELAPSED_FIELD] = elapsed
    assert time_to_target(records, 0.9) == (12.5, 1)


def test_summaries_give_throughput_compute_and_gs_ratios():
    def run(step_s: float, reach_at: int | None, hooked: bool = True) -> list[dict]:
        recs = [_record(s, step_s if s >= 2 else 1.0) for s in range(10)]
        for r in recs:
            if not hooked:
                r.update(seconds_compute=r["seconds_step"], seconds_communicate=None)
        if reach_at is not None:
            recs[reach_at].update(test_accuracy=0.95)
        recs[-1].setdefault("test_accuracy", 0.5)
        return recs

    summary = {"status": "completed", "measured_from_step": 2, "final_test_accuracy": 0.9}
    rows = {
        "dense": summarize_run(
            run(0.4, 8, hooked=False), summary, workers=4, batch_size=32, target=0.9
        ),  # fmt: skip
        "topk": summarize_run(run(0.2, None), summary, workers=4, batch_size=32, target=0.9),
        "gs": summarize_run(run(0.1, 6), summary, workers=4, batch_size=32, target=0.9),
    }
    results = summarize(rows, {"workers": 4})
    gs, dense, topk = results["gs"], results["dense"], results["topk"]
    # Steps 0 and 1 (1 s each) are the warm-up: left out of the medians, in the clock.
    assert gs["seconds_per_step"] == pytest.approx(0.1)
    assert gs["samples_per_second"] == pytest.approx(4 * 32 / 0.1)
    assert gs["seconds_compute_per_step"] == pytest.approx(0.05)
    assert gs["seconds_overhead_per_step"] == pytest.approx(0.05)
    assert gs["seconds_to_target"] == pytest.approx(2 + 5 * 0.1) and gs["step_to_target"] == 6
    assert dense["seconds_to_target"] == pytest.approx(2 + 7 * 0.4)
    assert gs["gs_throughput_speedup"] == 1.0 and gs["gs_time_to_target_speedup"] == 1.0
    assert dense["gs_throughput_speedup"] == pytest.approx(4.0)
    assert dense["gs_time_to_target_speedup"] == pytest.approx(4.8 / 2.5)
    # topk never got there: gs's speed-up is at least topk's whole training time / gs's.
    assert topk["seconds_to_target"] is None and topk["gs_time_to_target_speedup"] is None
    assert topk["gs_time_to_target_speedup_at_least"] == pytest.approx((2 + 8 * 0.2) / 2.5)
    # dense's compute includes DDP's all-reduce; its overhead uses the others' compute.
    assert dense["compute_includes_communication"] and dense["overhead_estimated"]
    assert dense["seconds_overhead_per_step"] == pytest.approx(0.4 - statistics.median([0.1, 0.05]))
    assert results["_meta"] == {"workers": 4}


def test_train_argv_round_trips_through_the_train_parser():
    from gssgd.cli.train import add_parser as add_train_parser
    from gssgd.cli.train import settings_from_args
    from gssgd.train.config import TrainConfig

    cfg = TrainBenchConfig(
        settings={
            "dataset": "digits",
            "steps": 7,
            "density": 0.002,
            "rows": 3,
            "lr": 0.1,
            "exact": False,
            "eval_every": 3,
        },  # fmt: skip
        methods=("dense", "gs"),
        link="none",
    )
    for method in cfg.methods:
        tcfg = cfg.train_config(method, Path("somewhere") / method)
        parser = argparse.ArgumentParser()
        add_train_parser(parser.add_subparsers(), "train")
        args = parser.parse_args(train_argv(tcfg))
        assert TrainConfig.build(method=args.method, **settings_from_args(args)) == tcfg
    assert cfg.configs["dense"].option("density") is None  # method-specific settings stay with theirs
    assert cfg.configs["gs"].option("rows") == 3 and cfg.configs["gs"].option("exact") is False
    assert "--link none" in cfg.command_line("out") and "--rows 3" in cfg.command_line("out")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--methods", "dense,gss"], "unknown method"),
        (["--methods", "gs,gs"], "twice"),
        (["--link", "100mbps"], "bytes per second"),
        (["--target-accuracy", "90"], r"\(0, 1\]"),
    ],
)
def test_bad_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        _cli(["bench", "train", *argv])
    assert exc.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_bad_settings_name_the_flag(capsys):
    assert _cli(["bench", "train", "--rows", "4", "--link", "none", "--methods", "gs"]) == 2
    assert "--rows=4 is invalid" in capsys.readouterr().err
    assert _cli(["bench", "train", "--rows", "5", "--link", "none", "--methods", "dense"]) == 2
    assert "--rows does not apply to --method dense; it applies to" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--device cuda"):
        TrainBenchConfig(settings={"device": "cuda"}, link="1gbit")


# --------------------------------------------------------------------------- the pipeline


def _fake_run_method(cfg, method, run_dir, index, cluster, timeout_s):
    """Stand-in for one `gssgd train` run: the files a real one writes; 'topk' fails."""
    assert cluster is None
    run_dir.mkdir(parents=True, exist_ok=True)
    step_s = {"dense": 0.3, "topk": 0.2, "gs": 0.1}[method]
    recs = [_record(s, step_s, 0.5 + 0.05 * s if s % 2 else None) for s in range(10)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    if method == "topk":
        raise WorkerError("gssgd train worker (topk) rank 1 exited 1; its log ends:\nboom")
    summary = {"status": "completed", "measured_from_step": 2, "final_test_accuracy": 0.95,
               "d": 1234}  # fmt: skip
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "checkpoints").mkdir(exist_ok=True)


def test_a_failed_method_is_reported_and_the_others_go_on(tmp_path, monkeypatch):
    monkeypatch.setattr(train_bench, "_run_method", _fake_run_method)
    monkeypatch.setattr(train_bench, "have_root", lambda: False)
    lines: list[str] = []
    cfg = TrainBenchConfig(settings={"dataset": "digits", "steps": 10, "density": 0.01},
                           methods=("dense", "topk", "gs"), link="1gbit", target_accuracy=0.9)  # fmt: skip
    results = run_train_bench(cfg, tmp_path, echo=lines.append)
    assert "needs root" in lines[0] and "--link none" in lines[0]
    meta = results["_meta"]
    assert meta["link"] == "none" and meta["link_requested"] == "1gbit"
    assert meta["mode"] == "loopback"
    assert results["topk"]["status"] == "failed" and "boom" in results["topk"]["error"]
    assert results["topk"]["samples_per_second"] == pytest.approx(4 * 32 / 0.2)  # what it logged
    assert results["dense"]["status"] == results["gs"]["status"] == "completed"
    # 0.9 is first reached at step 9 (0.95) by every method: 10 steps of its time.
    assert results["gs"]["seconds_to_target"] == pytest.approx(1.0)
    assert results["dense"]["gs_time_to_target_speedup"] == pytest.approx(3.0)
    assert not (tmp_path / "gs" / "checkpoints").exists()
    assert (tmp_path / "train.png").stat().st_size > 0
    assert "failed" in (tmp_path / "table.txt").read_text()


def test_a_failing_process_is_stopped_with_the_workers_it_spawned(tmp_path):
    """The parent fails while its child would sleep for ten minutes: the run ends with the
    parent's error, not at its (generous) timeout, and the child is stopped with it."""
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "open(sys.argv[1], 'w').write(str(child.pid))\n"
        "time.sleep(0.3); print('trouble', flush=True); sys.exit(3)\n"
    )
    pid_file = tmp_path / "child.pid"
    timeout_s = 120.0
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"(?s)gssgd train \(x\) exited 3.*trouble"):
        run_process([sys.executable, "-c", script, str(pid_file)], tmp_path, timeout_s,
                    label="train", what="gssgd train (x)")  # fmt: skip
    assert time.monotonic() - start < timeout_s  # ended by the failure
    child = int(pid_file.read_text())
    try:
        # Killed, it is gone as soon as its new parent reaps it; a minute is far more than
        # that takes, and far less than the ten minutes it would sleep.
        deadline = time.monotonic() + 60
        while _pid_alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _pid_alive(child)
    finally:
        if _pid_alive(child):
            os.kill(child, signal.SIGKILL)


# --------------------------------------------------------------------------- real runs


def _check_results(out: Path, methods: list[str], workers: int, batch: int) -> dict:
    results = json.loads((out / "results.json").read_text())
    assert [m for m in results if m != "_meta"] == methods
    for name in methods:
        row = results[name]
        assert set(row) >= REQUIRED, name
        assert row["status"] == "completed"
        assert row["seconds_per_step"] > 0
        assert row["samples_per_second"] == pytest.approx(workers * batch / row["seconds_per_step"])
        assert row["seconds_compute_per_step"] > 0
        assert row["bytes_sent_per_step"] > 0
        assert 0 <= row["final_test_accuracy"] <= 1
        records = read_metrics(Path(row["run_dir"]) / "metrics.jsonl")
        reached = time_to_target(records, results["_meta"]["target_accuracy"])
        assert row["seconds_to_target"] == (reached[0] if reached else None)
        assert not (Path(row["run_dir"]) / "checkpoints").exists()
    assert results["gs"]["gs_throughput_speedup"] == 1.0
    for name in methods:
        ratio = results["gs"]["samples_per_second"] / results[name]["samples_per_second"]
        assert results[name]["gs_throughput_speedup"] == pytest.approx(ratio)
    meta = results["_meta"]
    for key in ("command", "machine", "date", "load_average", "workers", "link", "d", "density"):
        assert key in meta, key
    assert meta["workers"] == workers and meta["cpu_count"] == os.cpu_count()
    assert (out / "train.png").stat().st_size > 0
    assert "gs thr. x" in (out / "table.txt").read_text()
    return results


def test_loopback_run_with_two_workers_on_digits_writes_well_formed_results(tmp_path):
    argv = ["bench", "train", "--workers", "2", "--link", "none", "--dataset", "digits"]
    # One method keeps the test fast (each run starts 3 processes); the ratios between
    # methods are checked on synthetic runs above.
    argv += ["--methods", "gs", "--steps", "4", "--eval-every", "2", "--batch-size", "16"]
    argv += ["--target-accuracy", "0.05", "--out", str(tmp_path)]
    assert _cli(argv) == 0
    results = _check_results(tmp_path, ["gs"], workers=2, batch=16)
    assert results["_meta"]["mode"] == "loopback"
    assert (tmp_path / "gs" / "logs" / "train.log").exists()
    # Every accuracy is >= 0.05: the first evaluation (after step 1) is the time to target.
    assert results["gs"]["step_to_target"] == 1


@pytest.mark.slow  # a real training run over 20 Mbit/s links: about 30 s
@needs_root
def test_namespace_run_with_two_workers_on_rate_limited_links_runs_and_tears_down(tmp_path):
    cfg = TrainBenchConfig(
        settings={
            "workers": 2,
            "dataset": "digits",
            "steps": 3,
            "eval_every": 0,
            "batch_size": 16,
        },  # fmt: skip
        methods=("gs",),
        link="20mbit",
        target_accuracy=0.05,
    )
    results = run_train_bench(cfg, tmp_path, echo=lambda _: None)
    _check_results(tmp_path, ["gs"], workers=2, batch=16)
    assert results["_meta"]["mode"] == "namespaces"
    assert results["_meta"]["link_bps"] == 20_000_000
    logs = sorted(p.name for p in (tmp_path / "gs" / "logs").iterdir())
    assert logs == ["rank0.log", "rank1.log"]
    mine = [n for n in netns._list_namespaces() if netns._owner_pid(n, "gsn") == os.getpid()]
    assert mine == []
