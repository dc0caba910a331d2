"""Tests for the gssgd command line: parsing, refusals, and real runs end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gssgd.cli import main as cli_main
from gssgd.cli.main import build_parser, main

REPO = Path(__file__).resolve().parents[2]
# Quick digits settings shared by the end-to-end runs.
QUICK = ["--dataset", "digits", "--workers", "2", "--batch-size", "16", "--no-progress",
         "--timeout", "60"]


def _run(args: list[str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run a command from a neutral directory with the repo's interpreter."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=REPO)


# ---------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["compare", "--help"]])
def test_help_teaches_and_exits_zero(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "example" in text
    if argv[0] == "train":
        for flag in ("--method", "--density", "--rows", "--resume", "--fail-at", "--timeout"):
            assert flag in text
        assert "gs-SGD" in text and "(default: 300.0)" in text


def test_every_subcommand_module_has_the_two_functions() -> None:
    for name in cli_main.SUBCOMMANDS:
        module = cli_main.subcommand(name)
        assert callable(module.add_parser) and callable(module.run)
    assert list(cli_main.SUBCOMMANDS)[:2] == ["train", "compare"]


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["trian"], []])
def test_help_and_a_mistyped_command_answer_before_torch_is_imported(argv: list[str]) -> None:
    """``gssgd --help`` (and a command argparse refuses) loads no subcommand module, so no
    torch: the answer is immediate. Checked in a fresh interpreter."""
    code = ("import sys\nfrom gssgd.cli.main import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit as e:\n    status = e.code\n"
            "print('torch imported:', 'torch' in sys.modules, file=sys.stderr)")
    done = _run([sys.executable, "-c", code, *argv], timeout=60)
    assert "torch imported: False" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_flag_value_is_one_line_naming_the_flag(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(["train", "--steps", "ten"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("gssgd train: error: argument --steps:") and "--help" in err


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        ([], "required: COMMAND"),
        (["train", "--bogus"], "unrecognized arguments: --bogus"),
        (["train", "--dens", "0.1"], "unrecognized arguments: --dens"),  # no abbreviations
        (["train", "--steps", "ten"], "invalid int value: 'ten'"),
        (["train", "--density", "0.1", "--k", "5"], "not allowed with argument"),
        (["train", "--fail-at", "one"], "is not RANK:STEP"),
        (["compare", "--method", "gs"], "unrecognized arguments: --method"),
    ],
)
def test_bad_flags_are_rejected_by_the_parser(
    argv: list[str], match: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["train", "--steps", "0"], "--steps=0 is invalid: it must be an integer >= 1"),
        (["train", "--method", "adam"], "--method='adam' is invalid: it must be one of dense"),
        (["train", "--method", "topk", "--rows", "5"], "--rows does not apply to --method topk"),
        (["train", "--method", "gs", "--rows", "4"], "--rows=4 is invalid: it must be an odd"),
        (["train", "--dataset", "nope"], "unknown dataset 'nope'"),
        (["compare", "--methods", "dense,adam"], "unknown method(s) adam"),
        (["compare", "--methods", "dense,topk", "--rows", "5"],
         "--rows does not apply to --methods dense,topk; it applies to sketched, gs"),
    ],
)
def test_bad_values_are_refused_before_any_worker_starts(
    argv: list[str], match: str, capsys: pytest.CaptureFixture
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert match in err and "error:" in err


def test_defaults_parse_into_a_runnable_config() -> None:
    args = build_parser().parse_args(["train"])
    assert args.method == "gs" and args.dataset == "mnist" and args.workers is None
    assert args.timeout == 300.0 and args.threads == 1 and args.exact is None
    args = build_parser().parse_args(["compare"])
    assert args.methods == "dense,topk,gtopk,sketched,gs,powersgd" and args.dataset == "mnist"


# ---------------------------------------------------------------------------- end to end


def test_console_script_trains_with_self_spawned_workers(tmp_path: Path) -> None:
    out = tmp_path / "run"
    script = Path(sys.executable).with_name("gssgd")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "gssgd.cli.main"]
    done = _run([*command, "train", "--method", "topk", *QUICK, "--steps", "6",
                 "--checkpoint-every", "3", "--out", str(out)])
    assert done.returncode == 0, done.stderr
    assert "done after 6 steps" in done.stderr
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 6
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "latest", "step-00000003.pt", "step-00000006.pt"]


def test_a_killed_worker_fails_the_run_and_names_the_resume_command(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = _run([sys.executable, "-m", "gssgd.cli.main", "train", "--method", "ddp-allreduce", *QUICK,
                 "--steps", "8", "--checkpoint-every", "2", "--fail-at", "1:5",
                 "--out", str(out)])
    assert done.returncode == 1
    assert "rank 1 exits abruptly" in done.stderr
    assert f"continue from step-00000004.pt with --resume {out}" in done.stderr


def test_compare_ends_without_warnings_or_leaked_semaphores(tmp_path: Path) -> None:
    """Spawned workers end with ``os._exit``; multiprocessing objects made in them (tqdm's
    write lock) were reported by the parent's resource tracker when ``gssgd compare``
    exited ("There appear to be 4 leaked semaphore objects"), which reads as a crash.
    Warnings stay on here (no PYTHONWARNINGS=ignore, unlike :func:`_run`)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    done = subprocess.run(
        [sys.executable, "-m", "gssgd.cli.main", "compare", "--methods", "dense,topk", *QUICK,
         "--steps", "4", "--out", str(tmp_path / "cmp")],
        capture_output=True, text=True, timeout=300, env=env, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert "resource_tracker" not in done.stderr, done.stderr
    assert "leaked semaphore" not in done.stderr, done.stderr
    assert not [line for line in done.stderr.splitlines() if "Warning" in line], done.stderr


def test_torchrun_launch_joins_its_group(torchrun_gs_run) -> None:
    """``torchrun --nproc-per-node 2 -m gssgd.cli.main train --method gs --dataset digits
    --steps 20 ...``: the session's launch (tests/conftest.py), which the elastic-restart
    test in tests/train/test_elastic.py compares its restarted run with."""
    out, done = torchrun_gs_run
    assert done.args[1:3] == ["-m", "torch.distributed.run"] and "gssgd.cli.main" in done.args
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["status"] == "completed"
    assert summary["steps"] == 20
    assert done.stderr.count("done after 20 steps") == 1  # rank 0 alone reports


def test_compare_writes_results_plots_and_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "cmp"
    code = main(["compare", "--methods", "dense,gs", *QUICK, "--steps", "8",
                 "--eval-every", "4", "--rows", "3", "--out", str(out)])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results) == ["dense", "gs"]
    for method, r in results.items():
        assert r["status"] == "completed", method
        for key in ("final_test_accuracy", "bytes_sent_per_step", "seconds_per_step"):
            assert isinstance(r[key], float), (method, key)
    assert results["gs"]["bytes_sent_per_step"] < results["dense"]["bytes_sent_per_step"]
    for png in ("vs_step.png", "vs_bytes.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "bytes/worker/step" in table and "dense" in table and "gs" in table
    # --rows went to gs only: its run used 3 rows, dense's config has none.
    assert json.loads((out / "gs" / "config.json").read_text())["options"]["rows"] == 3
    assert "rows" not in json.loads((out / "dense" / "config.json").read_text())["options"]


def test_compare_table_shows_each_method_against_dense_and_its_optimizer() -> None:
    from gssgd.cli.compare import table

    def run(loss: float, optimizer: str, lr: float, momentum: float) -> dict:
        return {"final_test_loss": loss, "optimizer": optimizer, "lr": lr,
                "momentum": momentum, "status": "completed"}

    text = table({"dense": run(2.0, "sgd", 1.6, 0.9), "topk": run(2.05, "sgd", 1.6, 0.9),
                  "gs": {**run(1.9, "adamw", 0.001, 0.0), "freeze_variance_after": 150,
                         "adam_variance": "frozen"},
                  "gtopk": {**run(2.1, "adamw", 0.001, 0.0), "freeze_variance_after": 150,
                            "adam_variance": "moving"}},
                 text=True)
    lines = {line.split()[0]: line for line in text.splitlines()[2:]}
    assert "vs dense" in text.splitlines()[0]
    assert "+2.5%" in lines["topk"] and "-5.0%" in lines["gs"] and "+0.0%" in lines["dense"]
    assert "sgd lr 1.6, m 0.9" in lines["topk"]
    assert "adamw lr 0.001, frozen after 150" in lines["gs"]
    assert "adamw lr 0.001, moving after 150" in lines["gtopk"]
    images = table({"dense": {"final_test_accuracy": 0.98}, "gs": {"final_test_accuracy": 0.9775}})
    assert "-0.25 pt" in images.splitlines()[3]


def test_compare_trains_every_method_with_adamw_when_told(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "adamw"
    code = main(["compare", "--methods", "dense,topk", *QUICK, "--steps", "6", "--eval-every",
                 "0", "--optimizer", "adamw", "--weight-decay", "0.01", "--out", str(out)])
    assert code == 0
    for method in ("dense", "topk"):
        config = json.loads((out / method / "config.json").read_text())
        assert (config["optimizer"], config["lr"], config["weight_decay"]) == ("adamw", 0.001, 0.01)
    table = capsys.readouterr().out
    assert table.count("adamw lr 0.001") == 2 and "vs dense" in table


def test_compare_counts_bytes_to_the_studies_target() -> None:
    """``bytes_to_target`` is the busiest link's bytes at the first evaluation that reaches
    dense's final figure by the studies' rule (gssgd.study.curves: 0.5 point of accuracy,
    3 % of loss): a value exactly on the target reaches it, one just short does not."""
    from gssgd.cli.compare import add_bytes_to_target

    def curve(values: list[float], key: str) -> list[dict]:
        return [{"step": 10 * i, key: v, "bytes_sent_max": 100.0, "bytes_received_max": 50.0}
                for i, v in enumerate(values)]

    results = {m: {"final_test_accuracy": 0.98} for m in ("dense", "gs", "topk")}
    curves = {"dense": curve([0.9, 0.98], "test_accuracy"),
              "gs": curve([0.97, 0.975, 0.99], "test_accuracy"),  # 0.975 = 0.98 - 0.005
              "topk": curve([0.9, 0.9749], "test_accuracy")}
    add_bytes_to_target(results, curves, text=False)
    assert results["gs"]["bytes_to_target"] == 200.0 and results["gs"]["target"] == 0.975
    assert results["dense"]["bytes_to_target"] == 200.0
    assert results["topk"]["bytes_to_target"] is None
    text = {m: {"final_test_loss": 2.0} for m in ("dense", "gs")}
    add_bytes_to_target(text, {"dense": curve([2.0], "test_loss"),
                               "gs": curve([2.5, 2.06, 2.0], "test_loss")}, text=True)
    assert text["gs"]["bytes_to_target"] == 200.0 and text["gs"]["target"] == 2.0 * 1.03
