"""How a worker leaves its process group, whether its work returned or raised: the
failed run's objects (model, DDP's reducer, the aggregators' communicators: they hold the process
group) are released and collected while Python is whole, then the group is destroyed (its
gloo threads joined), and only then does the process end. A spawned worker then ends with
``os._exit`` (its status: 0, or 1 after an error), skipping interpreter finalization: a
gloo thread finishing late work there would need the GIL, which a finalizing interpreter
no longer hands out, and C++ aborts the process (``terminate called without an active
exception``). When one spawned worker fails, the parent gives the others
:data:`~gssgd.train.launch.LEAVE_GRACE_S` seconds to leave the same way before it stops them.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing.util
import os
import sys
import traceback
from typing import NoReturn

import torch.distributed as dist

__all__ = ["die_with_launcher", "die_with_parent", "exit_worker", "leave_process_group",
           "leave_together", "release"]

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
