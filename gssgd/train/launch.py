"""Start the workers of a run: join torchrun's process group, or spawn local ones.

Two ways in, one function (:func:`launch`):

1. **Under torchrun** (``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` in the environment):
   this process is one worker; it joins torchrun's group through ``env://`` (gloo on the
   CPU, NCCL when CUDA is used) and runs ``fn`` once. Single node, multi-node and
   elastic launches all look the same from here.
2. **Started plainly**: this process starts ``world_size`` local workers with
   ``torch.multiprocessing`` (a fork server that has imported torch and the training loop
   once, or "spawn" where there is none) and waits for them. They meet through
   a ``FileStore`` in a private temporary directory and talk gloo over the loopback
   interface only (``GLOO_SOCKET_IFNAME=lo``; ``MASTER_ADDR=127.0.0.1``). No socket is
   opened on any other interface: a ``TCPStore`` rendezvous would listen on every
   interface whatever ``MASTER_ADDR`` says, so none is used.

Every process group gets the run's ``timeout``: a peer that died or hangs makes the
others fail after that many seconds instead of waiting forever.

How a worker leaves its process group, whether ``fn`` returned or raised (the section
"leaving" below): the failed run's objects (model, DDP's reducer, the aggregators' communicators: they hold the process
group) are released and collected while Python is whole, then the group is destroyed (its
gloo threads joined), and only then does the process end. A spawned worker then ends with
``os._exit`` (its status: 0, or 1 after an error), skipping interpreter finalization: a
gloo thread finishing late work there would need the GIL, which a finalizing interpreter
no longer hands out, and C++ aborts the process (``terminate called without an active
exception``). When one spawned worker fails, the parent gives the others
:data:`LEAVE_GRACE_S` seconds to leave the same way before it stops them.

Example::

    def work(worker: Worker, message: str) -> str:
        return f"{message} from rank {worker.rank} of {worker.world_size}"

    launch(work, world_size=2, args=("hello",))   # 'hello from rank 0 of 2'
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing.util
import os
import pickle
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import wait as wait_for_sentinels
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = [
    "CUDA_BACKEND_ENV",
    "DEVICES",
    "LEAVE_GRACE_S",
    "cuda_backend",
    "die_with_launcher",
    "die_with_parent",
    "exit_worker",
    "is_user_error",
    "launch",
    "leave_process_group",
    "leave_together",
    "release",
    "resolve_device_kind",
    "torchrun_world_size",
    "under_torchrun",
    "Worker",
    "WorkerFailed",
]

#: What ``--device`` accepts.
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
#: The process group backend of ``--device cuda``: ``nccl`` (default; one GPU per worker)
#: or ``gloo`` (CUDA tensors over gloo; workers may share a GPU, worker i on GPU
#: i mod count: how ``tools/gpu_check.sh`` runs 2 and 4 workers on one GPU, which NCCL
#: refuses). gloo moves CUDA tensors only in all-reduce and broadcast, not point to point.
CUDA_BACKEND_ENV = "GSSGD_CUDA_BACKEND"

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
_RESULT_FILE = "rank0-result.pkl"

#: After a spawned worker fails, seconds the others get to leave on their own (they fail
#: too, at once when their peer's connections close) before the parent stops them (at most
#: the run's timeout). A stalled worker is stopped after this.
LEAVE_GRACE_S = 15.0


@dataclass(frozen=True)
class Worker:
    """Who this process is in the run.

    Attributes:
        rank: global rank, in ``[0, world_size)``.
        world_size: number of workers.
        local_rank: rank on this node (picks the GPU).
        device: where this worker computes (``cpu`` or ``cuda:LOCAL_RANK``).
        backend: the process group's backend, ``"gloo"`` or ``"nccl"``.
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


class WorkerFailed(RuntimeError):
    """A spawned worker exited with an error (its own message is on stderr above).

    Attributes:
        rank: the first rank seen failing.
        exit_code: its exit code (negative: killed by that signal).
    """

    def __init__(self, rank: int, exit_code: int | None, detail: str = "") -> None:
        self.rank, self.exit_code = rank, exit_code
        how = (
            f"exit code {exit_code}"
            if exit_code is None or exit_code >= 0
            else (f"signal {-exit_code}")
        )
        super().__init__(f"worker rank {rank} failed ({how}){detail}")


def under_torchrun() -> bool:
    """True when torchrun (or another launcher) set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``."""
    return all(name in os.environ for name in _TORCHRUN_VARS)


def torchrun_world_size() -> int | None:
    """``WORLD_SIZE`` from the environment under torchrun, else None."""
    return int(os.environ["WORLD_SIZE"]) if under_torchrun() else None


def cuda_backend() -> str:
    """``GSSGD_CUDA_BACKEND`` (``nccl`` unless set), validated.

    Raises:
        ValueError: the variable holds something other than ``nccl`` or ``gloo``.
    """
    value = os.environ.get(CUDA_BACKEND_ENV, "nccl").strip().lower() or "nccl"
    if value not in ("nccl", "gloo"):
        raise ValueError(
            f"{CUDA_BACKEND_ENV}={value!r} is invalid: use nccl (one GPU per worker) or gloo "
            "(workers may share a GPU)"
        )
    return value


def resolve_device_kind(device: str, world_size: int) -> str:
    """``"cpu"`` or ``"cuda"`` for ``--device``, checked against this machine.

    Args:
        device: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``.
        world_size: workers on this node (NCCL needs one GPU per worker).

    Raises:
        ValueError: an unknown device, CUDA asked for but absent, or too few GPUs.
    """
    if device not in DEVICES:
        raise ValueError(f"--device={device!r} is invalid: use one of {', '.join(DEVICES)}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                "--device cuda: this torch build or machine has no CUDA device; use --device cpu"
            )
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        if cuda_backend() == "nccl" and per_node > torch.cuda.device_count():
            raise ValueError(
                f"--device cuda: {per_node} workers on this node but only "
                f"{torch.cuda.device_count()} GPU(s); NCCL needs one GPU per worker. Use fewer "
                "--workers or --device cpu"
            )
    return device


def launch(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...] = (),
    timeout_s: float = 300.0,
    device: str = "auto",
) -> Any:
    """Run ``fn(worker, *args)`` on every worker of the run.

    Args:
        fn: a module-level function (it is pickled for spawned workers). It gets a
            :class:`Worker` first; the process group is initialised before it runs and
            destroyed after it returns.
        world_size: workers to spawn when started plainly; under torchrun it must equal
            ``WORLD_SIZE``.
        args: further arguments of ``fn`` (picklable).
        timeout_s: seconds a collective may wait for its peers before failing.
        device: ``"auto"``, ``"cpu"`` or ``"cuda"`` (see :func:`resolve_device_kind`).

    Returns:
        Rank 0's return value of ``fn`` when this process is rank 0 or the spawning
        parent; None on the other ranks under torchrun.

    Raises:
        ValueError: ``world_size`` disagrees with torchrun's, or a bad device.
        WorkerFailed: a spawned worker exited with an error.
    """
    kind = resolve_device_kind(device, world_size)
    if under_torchrun():
        return _as_torchrun_rank(fn, world_size, args, timeout_s, kind)
    with tempfile.TemporaryDirectory(prefix="gssgd-rendezvous-") as tmp:
        context = mp.start_processes(
            _spawned,
            args=(world_size, tmp, kind, timeout_s, fn, args, dict(os.environ), os.getpid()),
            nprocs=world_size,
            join=False,
            start_method=_start_method(),
        )
        failed = _join(context.processes, min(LEAVE_GRACE_S, timeout_s))
        if failed is not None:
            raise WorkerFailed(*failed)
        result_file = Path(tmp) / _RESULT_FILE
        with open(result_file, "rb") as f:
            return pickle.load(f)


def _as_torchrun_rank(fn: Callable[..., Any], world_size: int, args: tuple[Any, ...],
                      timeout_s: float, kind: str) -> Any:
    """Under torchrun: join its group as this rank, run ``fn``, leave (rank 0's result)."""
    env_size = torchrun_world_size()
    if env_size != world_size:
        raise ValueError(
            f"--workers {world_size} but torchrun started WORLD_SIZE={env_size} workers; "
            "leave --workers out under torchrun (its --nproc-per-node and --nnodes decide)"
        )
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    store = _restart_store(rank, world_size, timeout_s)
    worker = _init(rank, world_size, local_rank, kind, timeout_s, store=store)
    try:
        result = fn(worker, *args)
        leave_together()
    except BaseException as err:
        release(err)  # the caller reports it; the failed run's objects go first
        raise
    finally:
        leave_process_group(rank)
    return result if rank == 0 else None


#: What the fork server imports once, so that every worker it forks starts with torch and
#: the training loop already imported (a spawned interpreter spends seconds of a small
#: machine's cores importing torch, for every worker of every run).
#: torch._dynamo is what torch's optimizers import on their first construction; zarr reads
#: MNIST. A module that is not installed is skipped.
_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "numpy", "zarr", "gssgd.train.loop",
            "gssgd.train.simulate"]


def _start_method() -> str:
    """"forkserver" with :data:`_PRELOAD` where the platform has it (Linux, macOS), else
    "spawn". Each worker still starts from a clean import, not from this process's state, and
    gets this process's environment as it is at the launch (:func:`_spawned` sets it)."""
    if "forkserver" not in mp.get_all_start_methods():
        return "spawn"
    mp.get_context("forkserver").set_forkserver_preload(_PRELOAD)
    return "forkserver"


def _join(processes: list[Any], grace_s: float) -> tuple[int, int] | None:
    """Wait for the spawned workers; ``(rank, exit code)`` of the first that failed, or None.

    Once one fails the others get ``grace_s`` seconds to leave on their own (each reports
    its own error and leaves the process group cleanly); any still running then are
    stopped (SIGTERM, then SIGKILL). Any exception here (Ctrl-C) stops them all too.
    """
    alive = {p.sentinel: rank for rank, p in enumerate(processes)}
    failed: tuple[int, int] | None = None
    deadline: float | None = None
    try:
        while alive:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait_for_sentinels(list(alive), timeout=left)
            if not ready:  # the grace is over
                break
            for sentinel in ready:
                rank = alive.pop(sentinel)
                processes[rank].join()
                code = processes[rank].exitcode
                if code != 0 and failed is None:
                    failed = (rank, code)
                    deadline = time.monotonic() + grace_s
    finally:
        _stop([processes[rank] for rank in alive.values()])
    return failed


def _stop(processes: list[Any]) -> None:
    """SIGTERM the processes, then SIGKILL those still alive 5 s later; reap them all."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + 5.0
    for p in processes:
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _restart_store(rank: int, world_size: int, timeout_s: float) -> Any:
    """After an elastic restart, torchrun's store under a fresh key prefix (else None).

    torchrun keeps its rendezvous store across restarts; the first attempt's process group
    left its peers' addresses there, and a restarted group reading them would try to reach
    workers that are gone. Each attempt therefore gets keys of its own.
    """
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt == 0:
        return None
    agent_hosts_it = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    base = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=not agent_hosts_it and rank == 0,
        timeout=timedelta(seconds=timeout_s),
    )
    return dist.PrefixStore(f"gssgd/attempt{attempt}", base)


def _init(
    rank: int, world_size: int, local_rank: int, kind: str, timeout_s: float, store: Any
) -> Worker:
    """Initialise the default process group and say who this worker is."""
    if kind == "cuda":  # NCCL: local_rank < device_count was checked; gloo may share
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = cuda_backend()
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
        **({"init_method": "env://"} if store is None else {}),
    )
    return Worker(rank, world_size, local_rank, device, backend)


def _spawned(
    rank: int,
    world_size: int,
    rendezvous_dir: str,
    kind: str,
    timeout_s: float,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    env: dict[str, str],
    launcher: int,
) -> None:
    """Body of a spawned worker: join the local group, run ``fn``, hand rank 0's result back.

    ``env`` is the launching process's environment at the launch (a fork server started
    earlier holds an older one); ``launcher`` its pid: the rank ends if it is killed.

    An exception is printed here, once and briefly for a user error, with its traceback for
    anything else. Then, whatever happened, the worker leaves the process group and ends
    (:func:`exit_worker`) with status 0, or 1 after an error; it never returns.
    """
    die_with_launcher(launcher)  # no rank trains on after its launcher was killed
    os.environ.clear()
    os.environ.update(env)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only: never listen on other interfaces
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    for name, value in (("RANK", rank), ("WORLD_SIZE", world_size), ("LOCAL_RANK", rank)):
        os.environ[name] = str(value)  # what torchrun would have set, for code that reads it
    code = 0
    try:
        store = dist.FileStore(os.path.join(rendezvous_dir, "store"), world_size)
        worker = _init(rank, world_size, rank, kind, timeout_s, store)
        result = fn(worker, *args)
        if rank == 0:
            with open(os.path.join(rendezvous_dir, _RESULT_FILE), "wb") as f:
                pickle.dump(result, f)
        del result
        leave_together()
    except KeyboardInterrupt:  # the parent stops the others with SIGINT/SIGTERM
        code = 1
    except SystemExit as err:  # fn chose its own status
        code = err.code if isinstance(err.code, int) else 1
    except Exception as err:  # noqa: BLE001 - report, then exit non-zero
        if is_user_error(err):
            print(f"gssgd: rank {rank}: {err}", file=sys.stderr, flush=True)
        else:
            print(
                f"gssgd: rank {rank} crashed:\n{traceback.format_exc()}",
                file=sys.stderr,
                flush=True,
            )
        release(err)
        code = 1
    # Outside the except blocks: the error and its traceback are gone from this frame.
    exit_worker(rank, code)


def is_user_error(err: BaseException) -> bool:
    """Errors whose message says it all (bad input, a lost peer): no traceback needed."""
    from gssgd.train.checkpoint import CheckpointError  # launch stays usable on its own
    from gssgd.train.data import DatasetUnavailableError

    lost_peer = isinstance(err, dist.DistError) or (
        isinstance(err, RuntimeError)
        and any(
            s in str(err)
            for s in (
                "Connection closed",
                "Connection reset",
                "Timed out",
                "timed out",
                "Socket Timeout",
            )
        )
    )
    return lost_peer or isinstance(
        err,
        (ValueError, FloatingPointError, OSError, CheckpointError, DatasetUnavailableError),
    )


# --------------------------------------------------------------------------- leaving


#: How often (seconds) a spawned rank looks whether its launcher is still there.
LAUNCHER_POLL_S = 1.0


def die_with_parent(parent: int | None = None) -> None:
    """Ask the kernel to kill this process when its parent dies (Linux's parent-death
    signal; elsewhere nothing is armed), and end now if the parent is already gone.

    A worker that outlived its launcher would go on training into folders that a resumed
    run is about to use.

    Args:
        parent: the parent's pid as the parent saw it (None: this process's parent now).
    """
    parent = os.getppid() if parent is None else parent
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))
    if os.getppid() != parent:
        os._exit(1)


def die_with_launcher(launcher: int) -> None:
    """End this rank (SIGKILL) soon after the process that launched it is gone.

    The parent-death signal (:func:`die_with_parent`) covers a rank whose parent is the
    launcher ("spawn"); a rank forked by the fork server is the server's child, and the
    server may outlive a killed launcher (tests/train/test_leave.py), so a daemon thread looks every
    :data:`LAUNCHER_POLL_S` seconds whether the launcher's pid is still alive.

    Args:
        launcher: the pid of the process that started the ranks.
    """
    die_with_parent()
    import signal
    import threading
    import time

    def watch() -> None:
        while True:
            time.sleep(LAUNCHER_POLL_S)
            try:
                os.kill(launcher, 0)
            except ProcessLookupError:
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="gssgd-launcher-watch", daemon=True).start()


def leave_together() -> None:
    """A last barrier after a successful run: no worker tears its connections down while a
    peer is still inside a collective (seen as a rare SIGABRT in gloo at exit under load)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def release(err: BaseException) -> None:
    """Drop the locals of the frames ``err`` (and the errors it chains) passed through: they
    hold the failed run (model, DDP, communicators, and through them the process group).
    The traceback still prints; frames still executing are left alone."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        traceback.clear_frames(err.__traceback__)
        err = err.__cause__ or err.__context__


def leave_process_group(rank: int) -> bool:
    """Leave the process group cleanly: collect what still holds it (the run's DDP
    reducer and communicators, often in reference cycles), then destroy it, so its gloo
    threads are joined now and not at interpreter exit. Returns False if destroying failed
    (said on stderr)."""
    gc.collect()
    ok = True
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as err:  # noqa: BLE001 - the run's own outcome matters more
            print(f"gssgd: rank {rank}: leaving the process group failed: {err}",
                  file=sys.stderr, flush=True)
            ok = False
    gc.collect()
    return ok


def exit_worker(rank: int, code: int) -> NoReturn:
    """End a spawned worker: leave the group (:func:`leave_process_group`), release its
    multiprocessing objects, flush, ``os._exit(code)``.

    ``os._exit`` comes last, after the group is gone: it skips interpreter finalization,
    where any gloo thread still finishing work would need the GIL and abort the process
    (``terminate called without an active exception``). Files the run writes are flushed
    or closed by then (metrics lines are flushed one by one, checkpoints written atomically).

    It also skips multiprocessing's own exit handlers, so they run here first (the
    finalizers a worker process runs when its target returns, priority >= 0): among them
    the unlinking of named semaphores that libraries made in the worker (tqdm's write
    lock, numcodecs' blosc lock when reading MNIST). Left alone, they were registered with
    the parent's resource tracker, which reported them as "leaked semaphore objects" when
    the parent exited.
    """
    if not leave_process_group(rank):
        code = code or 1
    with contextlib.suppress(Exception):  # a cleanup that fails must not change the status
        multiprocessing.util._run_finalizers(0)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stream holds nothing back
            stream.flush()
    os._exit(code)
