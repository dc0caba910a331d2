"""One mapping from errors to exit statuses, shared by every ``gssgd`` subcommand.

A subcommand's ``run(args)`` hands its body to :func:`run_command`, which returns the body's
status and turns the errors a user can act on into a one-line message and a status:

==========  =====================================================================
status      when
==========  =====================================================================
0           done (or what the body returned)
1           the run failed: a worker died or stalled, a lost peer, an OS error, a
            non-finite value, or one of the command's own ``failures``
2           invalid input: :class:`ValueError`, :class:`FileNotFoundError`, a bad
            checkpoint or an unavailable dataset (argparse exits 2 for bad flags too)
130         interrupted (Ctrl-C)
==========  =====================================================================

Anything else is a bug and keeps its traceback. A body may also raise
:class:`CommandError` with a message and a status of its own.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

__all__ = [
    "FAILED",
    "INTERRUPTED",
    "OK",
    "USAGE",
    "CommandError",
    "Parser",
    "exit_status",
    "run_command",
]

OK, FAILED, USAGE, INTERRUPTED = 0, 1, 2, 130


class CommandError(Exception):
    """An expected failure a command reports itself: the message and the exit status."""

    def __init__(self, message: str, status: int = FAILED) -> None:
        super().__init__(message)
        self.status = status


class Parser(argparse.ArgumentParser):
    """``argparse``'s parser whose errors are one line (no usage block): the command, the
    flag, the value and what it must be, and where to read more. Exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _usage_errors() -> tuple[type[BaseException], ...]:
    # Imported here: the CLI's modules load without the training stack until an error.
    from gssgd.train.checkpoint import CheckpointError
    from gssgd.train.data import DatasetUnavailableError

    return (ValueError, FileNotFoundError, CheckpointError, DatasetUnavailableError)


def _is_run_failure(err: BaseException) -> bool:
    from gssgd.train.launch import WorkerFailed, is_user_error

    return isinstance(err, WorkerFailed) or is_user_error(err)


def exit_status(err: BaseException, failures: tuple[type[BaseException], ...] = ()) -> int | None:
    """The exit status of ``err`` (see the module's table), or None for a bug.

    Args:
        err: what the command raised.
        failures: further error types that mean the command's run failed (status 1), e.g.
            RuntimeError for commands whose emulated cluster reports setup problems so.
    """
    if isinstance(err, CommandError):
        return err.status
    if isinstance(err, KeyboardInterrupt):
        return INTERRUPTED
    if not isinstance(err, Exception):  # SystemExit and the like pass through
        return None
    if isinstance(err, _usage_errors()):
        return USAGE
    if isinstance(err, failures) or _is_run_failure(err):
        return FAILED
    return None


def run_command(
    name: str,
    body: Callable[[], int | None],
    *,
    failures: tuple[type[BaseException], ...] = (),
    interrupted: str = "stopped",
) -> int:
    """Run a subcommand's body and return its exit status.

    Args:
        name: the command as users type it (``gssgd bench comm``), the messages' prefix.
        body: the work; returns the status (None: 0).
        failures: further error types that mean the run failed (see :func:`exit_status`).
        interrupted: what the message on Ctrl-C says after "interrupted; ".

    Returns:
        The body's status, or the status of the error it raised (its message printed to
        stderr on one line, without a traceback).

    Raises:
        BaseException: what the body raised when it is a bug (no status for it).
    """
    try:
        status = body()
    except BaseException as err:
        code = exit_status(err, failures)
        if code is None:
            raise
        if code == INTERRUPTED:
            message = f"{name}: interrupted; {interrupted}"
        elif code == USAGE:
            message = f"{name}: error: {err}"
        else:
            message = f"{name} failed: {err}"
        print(message, file=sys.stderr)
        return code
    return OK if status is None else status
