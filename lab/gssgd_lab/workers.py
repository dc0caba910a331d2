"""Start a benchmark's worker processes, watch them, stop them, and say what went wrong.

Shared by ``gssgd bench comm`` (its own workers) and ``gssgd bench train`` (``gssgd
train`` workers). Two ways to start P ranks of one command:

* on **loopback**: P local processes that meet at ``127.0.0.1`` on a free port, gloo
  bound to ``lo`` (``GLOO_SOCKET_IFNAME=lo``);
* on **emulated links**: each rank inside its own network namespace of an
  :class:`gssgd_lab.cluster.EmulatedCluster`, ``MASTER_ADDR`` = rank 0's address and
  ``GLOO_SOCKET_IFNAME`` = the rank's veth.

Either way every rank gets torchrun's variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), so a program that
joins a torchrun group with ``env://`` joins this one. :func:`run_process` starts a single
command instead (a program that spawns its own local workers).

Each process writes its stdout and stderr to ``WORK/<label>.log``. :func:`supervise`
waits for all of them: the first failure stops the others at once (SIGTERM, then SIGKILL
after a grace period) and raises :class:`WorkerError` with the earliest error (a
worker's ``<label>.error.json`` if it wrote one, else the end of its log); so does the
whole run's timeout, naming the ranks still running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gssgd_lab.cluster import ROOT_MESSAGE, EmulatedCluster

__all__ = [
    "MASTER_PORT_NETNS",
    "WorkerError",
    "free_port",
    "run_process",
    "run_ranks",
    "stop",
    "supervise",
    "tail",
    "worker_env",
]

POLL_S = 0.05
STOP_GRACE_S = 3.0
MASTER_PORT_NETNS = 29500
"""The rendezvous port inside an emulated cluster: a fresh namespace has every port free."""


class WorkerError(RuntimeError):
    """A benchmark worker failed or the run timed out; the message holds its error."""


def namespaces_or_loopback(cfg: Any, echo: Any, root: bool) -> tuple[Any, bool]:
    """The run to make: ``(cfg, True)`` for emulated links, or the loopback variant.

    A link rate needs network namespaces, hence root; without root the run falls back to
    ``--link none`` and says so, rather than failing.

    Args:
        cfg: a benchmark config dataclass with ``link`` and ``link_bps``.
        echo: where the note goes.
        root: whether this process may build namespaces (``netns.have_root()``).
    """
    if cfg.link_bps is None:
        return cfg, False
    if not root:
        echo(f"note: {ROOT_MESSAGE}; running --link none (loopback) instead")
        return dataclasses.replace(cfg, link="none"), False
    return cfg, True


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def package_env(threads: int) -> dict[str, str]:
    """This process's environment, with this package importable and ``threads`` OpenMP threads."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.update(OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    return env


def worker_env(
    rank: int, world: int, port: int, threads: int, *, local: tuple[int, int] | None = None
) -> dict[str, str]:
    """The environment of one rank: torchrun's variables (but ``MASTER_ADDR``), threads.

    Args:
        rank, world: the rank and the world size.
        port: ``MASTER_PORT``.
        threads: ``OMP_NUM_THREADS``.
        local: ``(LOCAL_RANK, LOCAL_WORLD_SIZE)``; default ``(rank, world)``, as for P
            processes on one host. In an emulated cluster each rank is a host of its own:
            ``(0, 1)``.
    """
    local_rank, local_world = local if local is not None else (rank, world)
    env = package_env(threads)
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(local_world),
        MASTER_PORT=str(port),
    )
    return env


def tail(path: Path, chars: int = 4000) -> str:
    """The last ``chars`` characters of a log, or a note that there is none."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return text[-chars:].strip() or "(empty log)"


def stop(procs: Sequence[subprocess.Popen[Any]], *, groups: bool = False) -> None:
    """Terminate the live processes, then kill what is left after a grace period.

    Args:
        procs: the processes.
        groups: signal each process's whole process group (for processes started with
            ``start_new_session=True``: it then reaches the workers they spawned), and
            do so even when the leader has exited already.
    """

    def signal_(p: subprocess.Popen[Any], signum: int) -> None:
        with contextlib.suppress(OSError):
            if groups:
                os.killpg(p.pid, signum)  # the group we created; its id is the leader's pid
            else:
                p.send_signal(signum)

    alive = [p for p in procs if groups or p.poll() is None]
    for p in alive:
        signal_(p, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for p in alive:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        if groups or p.poll() is None:
            signal_(p, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=STOP_GRACE_S)


def supervise(
    procs: Sequence[subprocess.Popen[Any]],
    work: Path,
    timeout_s: float,
    *,
    labels: Sequence[str] | None = None,
    what: str = "benchmark worker",
    hint: str = "Raise --timeout.",
    groups: bool = False,
) -> None:
    """Wait for every process; on the first failure or at the timeout stop all and raise.

    Args:
        procs: the processes, one per label.
        work: the directory of their ``<label>.log`` (and ``<label>.error.json``).
        timeout_s: the whole run's limit in seconds.
        labels: each process's name (default ``rank0``, ``rank1``, ...).
        what: how the messages call a process ("benchmark worker", "gssgd train worker").
        hint: what to do about a timeout.
        groups: stop whole process groups (see :func:`stop`).

    Raises:
        WorkerError: the earliest failing process's error (from its
            ``<label>.error.json``, else its log), or a timeout naming those still running.
    """
    labels = list(labels) if labels is not None else [f"rank{r}" for r in range(len(procs))]
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [p.poll() for p in procs]
        failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            time.sleep(0.5)  # let the others notice, so the earliest error can be told
            stop(procs, groups=groups)
            raise WorkerError(_failure_message(work, failed, codes, labels, what))
        if all(c == 0 for c in codes):
            return
        if time.monotonic() > deadline:
            running = [i for i, c in enumerate(codes) if c is None]
            stop(procs, groups=groups)
            logs = "\n".join(
                f"--- {_name(labels[i])}:\n{tail(work / f'{labels[i]}.log', 800)}" for i in running
            )
            names = [_name(labels[i]) for i in running]
            raise WorkerError(
                f"the run did not finish within its timeout of {timeout_s:.0f} s "
                f"({', '.join(names)} still running; stopped). {hint} Last log lines:\n{logs}"
            )
        time.sleep(POLL_S)


def _name(label: str) -> str:
    """``rank3`` -> ``rank 3``; other labels as they are."""
    return f"rank {label[4:]}" if label.startswith("rank") and label[4:].isdigit() else label


def _who(what: str, label: str) -> str:
    """``benchmark worker rank 3``; a process that is not a rank goes by ``what`` alone."""
    name = _name(label)
    return f"{what} {name}" if name != label else what


def _failure_message(
    work: Path,
    failed: list[int],
    codes: list[int | None],
    labels: Sequence[str],
    what: str,
) -> str:
    """The earliest error a process reported, and which failed without reporting one."""
    errors = []
    for i, label in enumerate(labels):
        path = work / f"{label}.error.json"
        if path.exists():
            with contextlib.suppress(OSError, ValueError):
                errors.append({**json.loads(path.read_text()), "_index": i})
    reported = {e["_index"] for e in errors}
    lines = []
    for i in (i for i in failed if i not in reported):
        code = codes[i]
        how = (
            f"was killed by signal {-code} without a traceback (out of memory? killed?)"
            if code is not None and code < 0
            else f"exited {code}"
        )
        lines.append(
            f"{_who(what, labels[i])} {how}; its log ends:\n{tail(work / f'{labels[i]}.log', 1500)}"
        )
    if errors:
        first = min(errors, key=lambda e: e["time"])
        others = sorted(_name(labels[e["_index"]]) for e in errors if e is not first)
        also = f" ({', '.join(others)} failed after it)" if others else ""
        lines.append(
            f"{_who(what, labels[first['_index']])} failed{also}: {first['error']}\n"
            f"{first['traceback'].rstrip()}"
        )
    return "\n".join(lines) + f"\nLogs: {work}/*.log"


def run_ranks(
    world_size: int,
    argv: Sequence[str],
    work: Path,
    timeout_s: float,
    *,
    cluster: EmulatedCluster | None = None,
    port: int | None = None,
    threads: int = 1,
    env: Mapping[str, str] | None = None,
    what: str = "benchmark worker",
    hint: str = "Raise --timeout.",
) -> None:
    """Run ``argv`` as ranks 0..P-1 to completion, each logging to ``work/rank{r}.log``.

    Args:
        world_size: P.
        argv: the command every rank runs.
        work: where the logs go (created if missing).
        timeout_s: the whole run's limit.
        cluster: a started :class:`EmulatedCluster` of at least P ranks to run in (rank r
            in its namespace r), or None for loopback.
        port: ``MASTER_PORT``; default :data:`MASTER_PORT_NETNS` in a cluster, a free
            port on loopback.
        threads: ``OMP_NUM_THREADS`` of every rank.
        env: further variables for every rank.
        what, hint: see :func:`supervise`.

    Raises:
        WorkerError: see :func:`supervise`. The processes are stopped on any way out.
    """
    work.mkdir(parents=True, exist_ok=True)
    logs = [open(work / f"rank{r}.log", "w") for r in range(world_size)]  # noqa: SIM115
    procs: list[subprocess.Popen[Any]] = []
    try:
        for r in range(world_size):
            if cluster is not None:
                rank_env = worker_env(r, world_size, port or MASTER_PORT_NETNS, threads,
                                      local=(0, 1))  # fmt: skip
                rank_env.update(env or {})
                rank_env.update(cluster.env(r))
                proc = cluster.popen(r, argv, env=rank_env, stdout=logs[r],
                                     stderr=subprocess.STDOUT)  # fmt: skip
            else:
                if port is None:
                    port = free_port()
                rank_env = worker_env(r, world_size, port, threads)
                rank_env.update(env or {})
                rank_env.update(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo")
                proc = subprocess.Popen(argv, env=rank_env, stdout=logs[r],
                                        stderr=subprocess.STDOUT)  # fmt: skip
            procs.append(proc)
        supervise(procs, work, timeout_s, what=what, hint=hint)
    finally:
        stop(procs)  # also on Ctrl-C; a cluster stops its own again on closing
        for f in logs:
            f.close()


def run_process(
    argv: Sequence[str],
    work: Path,
    timeout_s: float,
    *,
    label: str = "main",
    threads: int = 1,
    env: Mapping[str, str] | None = None,
    what: str = "benchmark process",
    hint: str = "Raise --timeout.",
) -> None:
    """Run one local command to completion, logging to ``work/<label>.log``.

    For a program that starts its own workers (``gssgd train`` spawning on loopback).
    Its environment holds none of torchrun's variables.

    Raises:
        WorkerError: see :func:`supervise`.
    """
    work.mkdir(parents=True, exist_ok=True)
    full_env = package_env(threads)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT"):  # fmt: skip
        full_env.pop(name, None)  # it must not believe it runs under torchrun
    full_env.update(env or {})
    procs: list[subprocess.Popen[Any]] = []
    with open(work / f"{label}.log", "w") as log:
        try:
            # A session (and process group) of its own: stopping it reaches the workers it
            # spawned too, which would otherwise outlive it.
            procs.append(subprocess.Popen(argv, env=full_env, stdout=log,
                                          stderr=subprocess.STDOUT,
                                          start_new_session=True))  # fmt: skip
            supervise(procs, work, timeout_s, labels=[label], what=what, hint=hint,
                      groups=True)  # fmt: skip
        except BaseException:  # also Ctrl-C; supervise stopped them already otherwise
            stop(procs, groups=True)
            raise
