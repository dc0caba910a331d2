"""Every value-taking option of every ``gssgd`` command, fed a bad number, answers with one
line and exit status 2: never a traceback, never a run.

The walk reads the options from the parser itself (a new flag is walked the day it is
added) and gives each one NaN, +-inf, -1, a word and a float that overflows. Options whose
value is a name or a path rather than a number are left out by name below. A bad value that
were accepted would start workers: starting a process or a process group is a tripwire here
(the test fails at once instead of training).
"""

from __future__ import annotations

import argparse
import multiprocessing.process
import subprocess
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from gssgd.cli.main import build_parser, main
from gssgd.methods import METHODS

#: What each option is fed: none of them is a valid number for any numeric flag.
BAD_VALUES = ("nan", "inf", "-inf", "-1", "abc", "1e400")
#: Options whose value is a name, a path or a list of names, not a number.
NOT_NUMBERS = frozenset({
    "--out", "--json", "--write", "--study-spec", "--calibrate", "--model",
    "--dataset", "--methods", "--method", "--evidence", "--resume", "--arch", "--device",
    "--opt", "--fail-at", "--stall-at", "--sizes", "--layouts", "--plugin", "--tensorboard",
    "--feedback",
})
#: What a command needs besides the walked option to get as far as checking it.
BASE = {
    "advise": ["--workers", "32", "--link", "10gbit", "--params", "25M", "--arch", "resnet"],
    "study": ["examples/user_model_study.toml"],
}
#: An option that applies to some methods only, and a method it applies to.
METHOD_OF = {"--powersgd-rank": "powersgd"}


class Accepted(BaseException):
    """A bad value got through: the command began to start its workers."""


@pytest.fixture
def tripwire(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting a process, a subprocess or a process group raises :class:`Accepted`."""
    def trip(*_args: object, **_kwargs: object) -> None:
        raise Accepted

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", trip)
    monkeypatch.setattr(subprocess.Popen, "__init__", trip)
    monkeypatch.setattr(dist, "init_process_group", trip)


def _value_options(parser: argparse.ArgumentParser, command: list[str]
                   ) -> Iterator[tuple[list[str], argparse.Action]]:
    """(the command's words, an option taking a number) over every (sub)command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _value_options(sub, [*command, name])
        elif (action.option_strings and action.nargs != 0 and not action.choices
              and action.option_strings[-1] not in NOT_NUMBERS | {"--help"}):
            yield command, action


def _argv(command: list[str], action: argparse.Action, bad: str) -> list[str] | None:
    """The command line that gives ``action`` the value ``bad`` (None: cannot be typed)."""
    flag = action.option_strings[-1]
    method = METHOD_OF.get(flag)
    picked = [] if method is None else [
        "--method" if command == ["train"] else "--methods", method]
    if isinstance(action.nargs, int):  # several numbers: "-inf" reads as a flag there
        if bad == "-inf":
            return None
        return [*command, *BASE.get(command[0], []), *picked, flag, *[bad] * action.nargs]
    return [*command, *BASE.get(command[0], []), *picked, f"{flag}={bad}"]


def _answer(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[object, str]:
    """The exit status of ``gssgd ARGV`` and its stderr."""
    try:
        status: object = main(argv)
    except SystemExit as stop:
        status = stop.code
    except Accepted:
        status = "accepted: workers were started"
    return status, capsys.readouterr().err.strip()


def _is_one_line_refusal(status: object, err: str, name: str, bad: str) -> bool:
    """Status 2, one line, naming the option and the value (1e400 reads back as inf)."""
    return (status == 2 and err.count("\n") == 0 and "Traceback" not in err
            and name.lstrip("-") in err and (bad in err or bad == "1e400"))


COMMANDS = sorted({" ".join(command) for command, _ in _value_options(build_parser(), [])})


@pytest.mark.parametrize("command", COMMANDS)
def test_every_numeric_option_refuses_bad_values_in_one_line(
        command: str, tripwire: None, capsys: pytest.CaptureFixture) -> None:
    wrong = []
    walked = 0
    for words, action in _value_options(build_parser(), []):
        if " ".join(words) != command:
            continue
        for bad in BAD_VALUES:
            argv = _argv(words, action, bad)
            if argv is None:
                continue
            walked += 1
            status, err = _answer(argv, capsys)
            if not _is_one_line_refusal(status, err, action.option_strings[-1], bad):
                wrong.append(f"gssgd {' '.join(argv)} -> {status}: {err[-300:]}")
    assert walked, command
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("method", ["gs", "topk", "gtopk", "sketched", "powersgd"])
def test_every_opt_key_refuses_bad_values_in_one_line(
        method: str, tripwire: None, capsys: pytest.CaptureFixture) -> None:
    """``--opt KEY=VALUE`` for each of the method's options (``--density nan`` once gave a
    KeyError traceback)."""
    wrong = []
    for key in sorted(METHODS[method].option_names()):
        for bad in BAD_VALUES:
            argv = ["train", "--method", method, "--opt", f"{key}={bad}"]
            status, err = _answer(argv, capsys)
            if not _is_one_line_refusal(status, err, key, bad):
                wrong.append(f"gssgd {' '.join(argv)} -> {status}: {err[-300:]}")
    assert not wrong, "\n".join(wrong)


def test_the_walk_covers_every_command() -> None:
    assert {"train", "compare", "study", "advise", "bench comm", "bench train",
            "bench device", "bench kernels"} <= set(COMMANDS)
    assert "bench model" not in COMMANDS  # removed: one step model (advise's)
