"""The host side of the namespace emulation: root, iproute2 commands, names, leftovers.

- :func:`have_root` / :func:`require_root`: may this process build namespaces?
- ``_run`` and friends: the ``ip`` commands that list, empty and delete namespaces.
- The names: every namespace and interface name carries its owner's pid
  (:func:`_instance_tag`), so that :func:`cleanup_leftovers` can remove what a crashed
  run left behind without touching a live cluster of another process.

:class:`gssgd.bench.emulated_cluster.EmulatedCluster` builds on these; the topology is
described in :mod:`gssgd.bench.netns`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Sequence

__all__ = ["DEFAULT_PREFIX", "ROOT_MESSAGE", "cleanup_leftovers", "have_root", "require_root"]

# The name these messages had before netns.py was split, so that logging settings made
# for "gssgd.bench.netns" still apply to them.
log = logging.getLogger("gssgd.bench.netns")

DEFAULT_PREFIX = "gsn"
"""Prefix of every namespace and interface name this module creates."""

ROOT_MESSAGE = "the namespace mode needs root (run as root, or use --link none)"

_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21

_TAG_DIGITS = 5  # a pid in base 36: 36**5 > 2**22, Linux's largest pid_max
_B36 = "0123456789abcdefghijklmnopqrstuvwxyz"
_IFNAMSIZ = 15  # the kernel's limit on interface names, without the trailing NUL

_CMD_TIMEOUT_S = 30.0

_live_tags: set[str] = set()  # tags of the clusters this process currently owns


# --------------------------------------------------------------------------- privileges


def _effective_caps() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return None


def have_root() -> bool:
    """Whether this process may build namespaces, bridges and qdiscs.

    True when the effective capabilities hold ``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN``
    (as for root outside a restricted container) and iproute2's ``ip`` and ``tc``
    are installed.
    """
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    caps = _effective_caps()
    if caps is None:
        return os.geteuid() == 0
    needed = (1 << _CAP_NET_ADMIN) | (1 << _CAP_SYS_ADMIN)
    return caps & needed == needed


def require_root() -> None:
    """Raise ``PermissionError`` unless :func:`have_root` holds.

    Raises:
        PermissionError: "the namespace mode needs root (run as root, or use --link
            none)", with what exactly is missing.
    """
    if shutil.which("ip") is None or shutil.which("tc") is None:
        raise PermissionError(
            f"{ROOT_MESSAGE}; also, iproute2's 'ip' and 'tc' were not found on PATH "
            f"(install iproute2, e.g. apt-get install iproute2)"
        )
    if not have_root():
        raise PermissionError(
            f"{ROOT_MESSAGE}; this process (euid {os.geteuid()}) lacks CAP_NET_ADMIN "
            f"or CAP_SYS_ADMIN"
        )


# --------------------------------------------------------------------------- commands


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one iproute2 command; with ``check``, a failure is a RuntimeError that names it."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=_CMD_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        if check:
            raise RuntimeError(
                f"`{' '.join(argv)}` did not finish in {_CMD_TIMEOUT_S:g} s"
            ) from exc
        return subprocess.CompletedProcess(list(argv), -1, "", "timeout")
    if check and done.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(argv)}` failed (exit {done.returncode}): {done.stderr.strip()}"
        )
    return done


def _list_namespaces() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _list_root_links() -> list[str]:
    out = _run(["ip", "-o", "link", "show"], check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


def _kill_namespace_processes(netns: str) -> None:
    """SIGKILL whatever still runs inside ``netns``: a namespace lives while a process does."""
    pids = _run(["ip", "netns", "pids", netns], check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
            os.kill(int(pid), signal.SIGKILL)


def _delete_namespace(netns: str) -> None:
    _kill_namespace_processes(netns)
    _run(["ip", "netns", "delete", netns], check=False)


# --------------------------------------------------------------------------- names


def _base36(value: int, width: int) -> str:
    digits = []
    for _ in range(width):
        value, digit = divmod(value, 36)
        digits.append(_B36[digit])
    return "".join(reversed(digits))


def _instance_tag(pid: int, serial: int, prefix: str = DEFAULT_PREFIX) -> str:
    """``prefix + pid in base 36 (5 chars) + serial in base 36 (1 char)``: e.g. ``gsn02n9c0``.

    The owner's pid in every name lets :func:`cleanup_leftovers` tell a crashed run's
    leftovers from a live cluster of another process.
    """
    return f"{prefix}{_base36(pid, _TAG_DIGITS)}{_B36[serial % 36]}"


def _owner_pid(name: str, prefix: str) -> int | None:
    """The owning pid encoded in a name made by this module, or None if it is not one."""
    match = re.match(rf"^{re.escape(prefix)}([0-9a-z]{{{_TAG_DIGITS}}})[0-9a-z](?:-|h|n|br)", name)
    return int(match[1], 36) if match else None


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (dead, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def _is_stale(name: str, prefix: str) -> bool:
    pid = _owner_pid(name, prefix)
    if pid is None:
        return False
    if pid == os.getpid():  # our pid, but maybe reused from a crashed run
        return name[: len(prefix) + _TAG_DIGITS + 1] not in _live_tags
    return not _pid_alive(pid)


def cleanup_leftovers(prefix: str = DEFAULT_PREFIX, *, only_dead_owners: bool = True) -> list[str]:
    """Remove namespaces and interfaces that an earlier, crashed run left behind.

    A run killed with SIGKILL cannot tear down. Its namespaces stay (with any worker
    still running in them), and so would the next run's names if they collided. Every
    name this module makes carries its owner's pid, so leftovers are those whose owner
    is gone. Processes still inside a leftover namespace are killed first, since a
    namespace lives on as long as one process does.

    Args:
        prefix: the name prefix to look for (``"gsn"`` unless a cluster chose another).
        only_dead_owners: remove only what belongs to processes that no longer exist
            (the default, safe while other clusters run). False removes every name of
            this module's form with this prefix, also live clusters of other processes.

    Returns:
        The names removed (namespaces and root-namespace interfaces), sorted.

    Raises:
        PermissionError: not root (see :func:`require_root`).
    """
    _check_prefix(prefix)
    require_root()
    removed = []
    for netns in _list_namespaces():
        if _owner_pid(netns, prefix) is None:
            continue
        if only_dead_owners and not _is_stale(netns, prefix):
            continue
        _delete_namespace(netns)
        removed.append(netns)
    # This module never leaves interfaces in the root namespace, but a half-made setup
    # of an older layout could: remove those of the same form.
    for link in _list_root_links():
        if _owner_pid(link, prefix) is None:
            continue
        if only_dead_owners and not _is_stale(link, prefix):
            continue
        if _run(["ip", "link", "delete", link], check=False).returncode == 0:
            removed.append(link)
    if removed:
        log.info("removed leftovers of earlier runs: %s", ", ".join(sorted(removed)))
    return sorted(removed)


def _check_prefix(prefix: str) -> None:
    if not isinstance(prefix, str) or re.fullmatch(r"[a-z]{1,5}", prefix) is None:
        raise ValueError(
            f"prefix={prefix!r} must be 1 to 5 lowercase letters (interface names are "
            f"limited to {_IFNAMSIZ} characters); the default is {DEFAULT_PREFIX!r}"
        )
