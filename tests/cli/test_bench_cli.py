"""``gssgd bench``'s command line without running a benchmark: help, --methods, exit codes."""

from __future__ import annotations

import argparse
import re

import pytest

from gssgd.aggregators.dense import DenseAllReduce
from gssgd.cli import bench
from gssgd.cli.errors import CommandError, exit_status, run_command
from gssgd.cli.main import main
from gssgd.costmodel import VARIANTS, method_spec, traffic
from gssgd.costmodel.devices import get_device
from gssgd.methods import METHODS, Method, register_method, unregister_method
from gssgd_lab.workers import WorkerError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gssgd")
    bench.add_parser(parser.add_subparsers(dest="command", required=True), "benchmarks")
    return parser


class _Toy(DenseAllReduce):
    name = "toy"


@pytest.fixture
def toy():
    """A method registered for the test only (after the parser was built, where it matters)."""
    yield lambda: register_method(Method("toy", "a toy dense all-reduce", _Toy))
    unregister_method("toy")


@pytest.mark.parametrize(
    ("command", "names"),
    [("comm", lambda: VARIANTS), ("train", lambda: METHODS)],
)
def test_help_lists_the_registered_methods(command, names, capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", command, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "--methods" in text
    for name in names():
        assert re.search(rf"\b{re.escape(name)}\b", text), name


def test_bench_comm_accepts_a_method_registered_after_the_parser_was_built(toy):
    parser = _parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "comm", "--methods", "toy"])
    toy()
    args = parser.parse_args(["bench", "comm", "--methods", "gs,toy"])
    assert args.methods == ("gs", "toy")


def test_a_registered_method_is_modelled_without_a_case_of_its_own(toy):
    toy()
    spec = method_spec("toy", 10**6, 0.001)
    assert spec.aggregator == "toy" and spec.k == 10**6
    assert traffic(spec, 4) == traffic(method_spec("dense", 10**6), 4)
    cpu = get_device("cpu")  # no law of its own: the costliest method's
    assert cpu.compression_seconds(spec) == max(
        cpu.compression_seconds(method_spec(name, 10**6, 0.001)) for name in cpu.compute)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["comm", "--methods", ""], "no method given"),
        (["comm", "--methods", "gs,topk,gs"], "twice"),
        (["comm", "--methods", "dense,ddp-fp16"], "unknown method"),
    ],
)
def test_a_bad_method_list_exits_2_with_the_valid_names(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        _parser().parse_args(["bench", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err)
    if "unknown" in message:
        assert "gs-backend" in err


@pytest.mark.parametrize(
    ("err", "failures", "status"),
    [
        (ValueError("bad"), (), 2),
        (FileNotFoundError("gone"), (), 2),
        (WorkerError("rank 1 died"), (RuntimeError,), 1),  # what the lab's commands pass
        (PermissionError("root"), (), 1),
        (RuntimeError("Connection reset by peer"), (), 1),
        (RuntimeError("no cluster"), (RuntimeError,), 1),
        (RuntimeError("a bug"), (), None),
        (KeyError("a bug"), (), None),
        (KeyboardInterrupt(), (), 130),
        (CommandError("told", 3), (), 3),
    ],
)
def test_one_mapping_from_errors_to_exit_statuses(err, failures, status):
    assert exit_status(err, failures) == status


def test_run_command_prints_one_line_and_reraises_bugs(capsys):
    def fail(err: BaseException):
        def body():
            raise err

        return body

    assert run_command("gssgd x", lambda: None) == 0
    assert run_command("gssgd x", lambda: 3) == 3
    assert run_command("gssgd x", fail(ValueError("bad value"))) == 2
    assert capsys.readouterr().err == "gssgd x: error: bad value\n"
    assert run_command("gssgd x", fail(KeyboardInterrupt()), interrupted="stopped") == 130
    assert capsys.readouterr().err == "gssgd x: interrupted; stopped\n"
    with pytest.raises(KeyError):
        run_command("gssgd x", fail(KeyError("bug")))


def test_the_lab_joins_bench_through_its_entry_points():
    from gssgd_lab.cli import bench_comm, bench_kernels, bench_train

    found = bench.subcommands()
    assert found["comm"] is bench_comm and found["train"] is bench_train
    assert found["kernels"] is bench_kernels


def test_a_lab_command_without_the_lab_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setattr(bench, "subcommands", lambda: {"device": bench.bench_device})
    assert main(["bench", "train", "--workers", "4", "--link", "1gbit"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gssgd bench train: error: it comes with the lab")
    assert "scripts/setup.sh --dev" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as info:  # a name that is no command at all
        main(["bench", "trian"])
    assert info.value.code == 2
