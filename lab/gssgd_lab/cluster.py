"""An emulated cluster on one machine: P workers on rate-limited links.

Communication-efficient training only pays off when the network is the bottleneck,
and on one machine it never is: loopback moves tens of Gbit/s. This module builds a
small fake network in which it is, so that ``gssgd bench comm --link 1gbit`` measures
what a real 1 Gbit/s cluster would see.

The topology is a star around one switch, like a rack behind a top-of-rack switch::

      namespace  <tag>-0             namespace  <tag>-sw             namespace  <tag>-1
    +------------------+          +------------------------+          +------------------+
    | rank 0           |          |      bridge <tag>br    |          | rank 1           |
    | <tag>n0 10.213.0.1 ==veth== <tag>h0            <tag>h1 ==veth== <tag>n1 10.213.0.2 |
    | tbf: upload      |          | tbf: download of 0     |          | tbf: upload      |
    +------------------+          | tbf: download of 1     |          +------------------+
                                  +------------------------+

1. Every worker runs in its own **network namespace**: its own interfaces, routes and
   ports, so P processes on one kernel look like P hosts. (``ip netns exec NAME cmd``
   runs a command inside one; :meth:`EmulatedCluster.popen` does that for you.)
2. A **veth pair** is a virtual cable: what goes in one end comes out of the other.
   One end sits in the worker's namespace and carries its address; the other end is a
   port of a **Linux bridge**, a software Ethernet switch.
3. Each cable is rate-limited by a **token bucket filter** (``tc qdisc ... tbf``). tbf
   holds a bucket of ``burst`` bytes that refills at ``rate``; a packet may leave only
   when the bucket holds enough tokens for it, otherwise it waits in a queue (at most
   ``latency`` long; past that, packets are dropped and TCP backs off as it would at a
   congested switch). So a long transfer runs at ``rate``, and only the first ``burst``
   bytes after an idle period go out at memory speed.
4. A qdisc only shapes what a device *sends*. The worker-side end's egress is the
   worker's **upload**; the bridge-side end's egress is its **download**. Shaping both
   gives full-duplex links of the given rate, as in a real switched network: a server
   that receives from P-1 workers at once is limited by its own download link
   (incast), and one that sends to P-1 workers by its upload link.

The bridge lives in a namespace of its own (``<tag>-sw``) rather than in the root
namespace. The root namespace thus never sees one of these interfaces, and the host's
firewall cannot interfere: with ``br_netfilter`` loaded, bridged frames go through the
iptables FORWARD chain of the bridge's namespace, and a host whose FORWARD policy is
DROP (common where Docker runs) would silently drop them. A fresh namespace has empty
tables. Nothing in the root namespace has an address in the subnet, so no packet of
the emulated cluster can leave it, and two clusters may use the same subnet at once.

Use::

    with EmulatedCluster(world_size=4, link="100mbit") as cluster:
        procs = [cluster.popen(rank, [sys.executable, "worker.py"],
                               env={"RANK": str(rank), "WORLD_SIZE": "4",
                                    "MASTER_PORT": "29500"})
                 for rank in range(4)]
        for proc in procs:
            proc.wait(timeout=600)

Each worker then calls ``torch.distributed.init_process_group("gloo")`` as usual:
``MASTER_ADDR`` (rank 0's address) and ``GLOO_SOCKET_IFNAME`` are already in its
environment. gloo needs the latter: left alone, it binds to the address that the
host name resolves to, which lies outside the namespace (or is loopback), so the
ranks could not reach each other, or would talk over loopback past the shaping.

Needs root (``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN``) and iproute2 (``ip``, ``tc``).
``netem`` is not assumed to exist, so links have bandwidth but no added delay; model
latency in code where it matters. Note that NCCL between GPUs of one machine uses
shared memory or NVLink and bypasses the network entirely: the emulation shapes gloo
(and NCCL only with ``NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1``).

Teardown always runs: on leaving the ``with`` block (also by an exception), on SIGINT
or SIGTERM while the cluster exists (the handlers tear down, then behave as the
previous handlers would), and at interpreter exit. A run killed with SIGKILL leaves
its namespaces behind; the next cluster removes them (:func:`cleanup_leftovers`).
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import itertools
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any

from gssgd.costmodel.link_rate import LinkShape, format_rate, parse_link_rate

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_SUBNET",
    "ROOT_MESSAGE",
    "EmulatedCluster",
    "LinkShape",
    "cleanup_leftovers",
    "have_root",
    "parse_link_rate",
    "require_root",
]

log = logging.getLogger("gssgd_lab.cluster")


# The host side: root, the ``ip`` commands, pid-carrying names, leftovers.

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


# The cluster: namespaces, cables, bridge and qdiscs.

DEFAULT_SUBNET = "10.213.0.0/24"
"""Private subnet of the emulated cluster; it exists only inside its namespaces."""

_TERM_GRACE_S = 3.0

_serials = itertools.count()


def _checked_layout(world_size: int, subnet: str, mtu: int, prefix: str) -> ipaddress.IPv4Network:
    """The cluster's subnet, once P, the subnet, the MTU and the name prefix are checked to
    fit together (P host addresses in a private subnet, interface names within the
    kernel's limit).

    Raises:
        ValueError: a bad argument; the message names it, the valid range and the fix.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be an int >= 1")
    _check_prefix(prefix)
    try:
        network = ipaddress.IPv4Network(subnet)
    except ValueError as exc:
        raise ValueError(
            f"subnet={subnet!r} is not an IPv4 network such as {DEFAULT_SUBNET!r}: {exc}"
        ) from None
    if not network.is_private:
        raise ValueError(
            f"subnet={subnet!r} is not a private range; use one such as "
            f"{DEFAULT_SUBNET!r}, so that no address can collide with a real host"
        )
    hosts = network.num_addresses - 2
    if world_size > hosts:
        raise ValueError(
            f"world_size={world_size} does not fit subnet {subnet} ({hosts} host "
            f"addresses); use a larger subnet, e.g. 10.213.0.0/16"
        )
    rank_digits = len(str(world_size - 1))
    if len(prefix) + _TAG_DIGITS + 2 + rank_digits > _IFNAMSIZ:
        raise ValueError(
            f"world_size={world_size} with prefix={prefix!r} makes interface names "
            f"longer than {_IFNAMSIZ} characters; use a shorter prefix"
        )
    if isinstance(mtu, bool) or not isinstance(mtu, int) or not 576 <= mtu <= 65535:
        raise ValueError(f"mtu={mtu!r} must be an int in 576..65535; 1500 is Ethernet's")
    return network


# --------------------------------------------------------------------------- the cluster


class EmulatedCluster:
    """P worker namespaces joined by rate-limited veth links to one bridge.

    See the module docstring for the topology and why it is built this way.

    Args:
        world_size: number of workers P (>= 1, at most the subnet's host count).
        link: the rate of every worker's link in each direction: a text for
            :func:`parse_link_rate` (``"1gbit"``), an int in bits per second, or
            ``None`` / ``"none"`` for unshaped links (still namespaces, no qdisc).
        subnet: a private IPv4 subnet; rank r gets its (r+1)-th host address, so rank 0
            is 10.213.0.1 by default. It exists only inside this cluster's namespaces.
        mtu: MTU of every veth, 1500 (Ethernet) by default; 9000 emulates jumbo frames
            and costs less CPU at 10gbit and above.
        burst_bytes: tbf bucket size; ``None`` for the default of :class:`LinkShape`.
        latency_ms: the longest a packet may queue in tbf before it is dropped.
        prefix: name prefix of everything created (1 to 5 lowercase letters).

    Raises:
        ValueError: a bad argument; the message names it, the valid range and the fix.
        PermissionError: not root (see :func:`require_root`).

    Example:
        >>> with EmulatedCluster(2, link="20mbit") as cluster:  # doctest: +SKIP
        ...     cluster.master_addr, cluster.ifname(1)
        ('10.213.0.1', 'gsn02n9c0n1')
    """

    def __init__(
        self,
        world_size: int,
        link: str | int | None = "1gbit",
        *,
        subnet: str = DEFAULT_SUBNET,
        mtu: int = 1500,
        burst_bytes: int | None = None,
        latency_ms: float = 50.0,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        network = _checked_layout(world_size, subnet, mtu, prefix)
        if isinstance(link, bool):
            raise ValueError(f"link={link!r} must be a rate such as '1gbit', an int, or None")
        rate = link if isinstance(link, int) else parse_link_rate(link)
        self.shape = (
            None
            if rate is None
            else LinkShape(rate, mtu=mtu, burst_bytes=burst_bytes, latency_ms=latency_ms)
        )
        require_root()

        self.world_size = world_size
        self.link_bps: int | None = rate
        self.mtu = mtu
        self.prefix = prefix
        self.network = network
        self._addresses = [
            str(address) for address in itertools.islice(network.hosts(), world_size)
        ]
        self.tag = ""  # chosen by start(), when the names are known to be free
        self._namespaces: list[str] = []  # created so far, in order
        self._procs: list[subprocess.Popen[Any]] = []
        self._old_handlers: dict[int, Any] = {}
        self._started = False
        self._closed = False

    # -- names -----------------------------------------------------------------------

    def namespace(self, rank: int) -> str:
        """The name of rank's network namespace (for ``ip netns exec``)."""
        return f"{self.tag}-{self._check_rank(rank)}"

    @property
    def switch_namespace(self) -> str:
        """The namespace that holds the bridge and the switch ends of the cables."""
        return f"{self.tag}-sw"

    @property
    def bridge(self) -> str:
        """The bridge's name (inside :attr:`switch_namespace`)."""
        return f"{self.tag}br"

    def ifname(self, rank: int) -> str:
        """The veth inside rank's namespace: the value of ``GLOO_SOCKET_IFNAME`` there."""
        return f"{self.tag}n{self._check_rank(rank)}"

    def switch_ifname(self, rank: int) -> str:
        """The bridge-side end of rank's cable; its egress is rank's download."""
        return f"{self.tag}h{self._check_rank(rank)}"

    def address(self, rank: int) -> str:
        """Rank's IPv4 address."""
        return self._addresses[self._check_rank(rank)]

    @property
    def master_addr(self) -> str:
        """Rank 0's address: the value of ``MASTER_ADDR`` for every rank."""
        return self._addresses[0]

    def _check_rank(self, rank: int) -> int:
        if not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank={rank!r} must be an int in 0..{self.world_size - 1}")
        if not self.tag:
            raise RuntimeError("the cluster is not started: use it as `with EmulatedCluster(...)`")
        return rank

    # -- running workers -------------------------------------------------------------

    def env(self, rank: int) -> dict[str, str]:
        """The networking variables a worker of this rank needs.

        ``MASTER_ADDR`` is rank 0's address. ``GLOO_SOCKET_IFNAME`` makes gloo bind to the
        worker's veth (and so go through the shaped link) instead of the address the host
        name resolves to. ``NCCL_SOCKET_IFNAME`` does the same for NCCL's sockets.
        """
        ifname = self.ifname(rank)
        return {
            "MASTER_ADDR": self.master_addr,
            "GLOO_SOCKET_IFNAME": ifname,
            "NCCL_SOCKET_IFNAME": ifname,
        }

    def exec_argv(self, rank: int, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed so that it runs inside rank's namespace."""
        return ["ip", "netns", "exec", self.namespace(rank), *argv]

    def popen(
        self,
        rank: int,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` inside rank's namespace; teardown kills it if still running.

        Args:
            rank: the worker, 0..world_size-1.
            argv: the command, e.g. ``[sys.executable, "-m", "mypkg.worker"]``.
            env: the environment (default: this process's), to which :meth:`env`'s
                variables are added; they override values of the same name.
            **kwargs: passed on to :class:`subprocess.Popen` (``stdout=``, ``cwd=``...).

        Returns:
            The process. ``ip netns exec`` replaces itself with ``argv``, so its pid is
            the worker's.
        """
        if not self._started or self._closed:
            raise RuntimeError("popen() needs a running cluster: call it inside `with`")
        full_env = dict(os.environ if env is None else env)
        full_env.update(self.env(rank))
        proc = subprocess.Popen(self.exec_argv(rank, argv), env=full_env, **kwargs)
        self._procs.append(proc)
        return proc

    # -- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> EmulatedCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """Build the namespaces, the bridge, the cables and the qdiscs.

        Removes the leftovers of crashed earlier runs first. Installs the SIGINT/SIGTERM
        handlers and the ``atexit`` fallback before creating anything, so an interrupt
        during setup also tears down what exists.
        """
        if self._started:
            raise RuntimeError("this cluster was already started; make a new one")
        self._started = True
        cleanup_leftovers(self.prefix)
        self._install_handlers()
        atexit.register(self.close)
        try:
            self.tag = self._free_tag()
            _live_tags.add(self.tag)
            self._build()
        except BaseException:
            self.close()
            raise
        log.info(
            "emulated cluster %s: %d workers on %s, %s",
            self.tag,
            self.world_size,
            self.network,
            self.shape or "unshaped links",
        )

    def _free_tag(self) -> str:
        existing = {name[: len(self.prefix) + _TAG_DIGITS + 1] for name in _list_namespaces()}
        for _ in range(36):
            tag = _instance_tag(os.getpid(), next(_serials), self.prefix)
            if tag not in existing and tag not in _live_tags:
                return tag
        raise RuntimeError(
            f"process {os.getpid()} already runs 36 emulated clusters; close some first"
        )

    def _new_namespace(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self._namespaces.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])
        # IPv4 only: gloo binds to the first address of GLOO_SOCKET_IFNAME, which would
        # otherwise be an IPv6 link-local one; this also skips duplicate address detection.
        _run(
            ["ip", "netns", "exec", name, "sh", "-c",
             "for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 "
             "/proc/sys/net/ipv6/conf/default/disable_ipv6; "
             "do [ -w $f ] && echo 1 > $f; done; true"]
        )  # fmt: skip

    def _build(self) -> None:
        switch = self.switch_namespace
        self._new_namespace(switch)
        _run(["ip", "-n", switch, "link", "add", self.bridge, "type", "bridge",
              "forward_delay", "0", "stp_state", "0"])  # fmt: skip
        _run(["ip", "-n", switch, "link", "set", self.bridge, "mtu", str(self.mtu), "up"])
        prefixlen = str(self.network.prefixlen)
        for rank in range(self.world_size):
            netns, inner, outer = self.namespace(rank), self.ifname(rank), self.switch_ifname(rank)
            self._new_namespace(netns)
            # Both ends are born in their namespaces: nothing appears in the root one.
            _run(["ip", "-n", switch, "link", "add", outer, "mtu", str(self.mtu), "type", "veth",
                  "peer", "name", inner, "mtu", str(self.mtu), "netns", netns])  # fmt: skip
            _run(["ip", "-n", switch, "link", "set", outer, "master", self.bridge, "up"])
            _run(["ip", "-n", netns, "addr", "add", f"{self.address(rank)}/{prefixlen}",
                  "dev", inner])  # fmt: skip
            _run(["ip", "-n", netns, "link", "set", inner, "up"])
            if self.shape is not None:
                tbf = self.shape.tc_args()
                # upload: what the worker sends leaves through its own end
                _run(["tc", "-n", netns, "qdisc", "replace", "dev", inner, "root", *tbf])
                # download: what the switch sends to the worker leaves through the other end
                _run(["tc", "-n", switch, "qdisc", "replace", "dev", outer, "root", *tbf])

    def close(self) -> None:
        """Tear everything down: idempotent, never raises, safe on half-built state.

        Kills the processes started with :meth:`popen` (SIGTERM, then SIGKILL after
        3 s), then anything else left in the namespaces, then deletes the namespaces,
        which destroys the cables and the bridge with them. SIGINT and SIGTERM are
        held back meanwhile and delivered once the previous handlers are back.
        """
        if self._closed or not self._started:
            self._closed = True
            return
        self._closed = True
        blocked = _block_signals()
        try:
            self._stop_procs()
            for netns in reversed(self._namespaces):
                try:
                    _delete_namespace(netns)
                except Exception as exc:  # teardown must go on whatever fails
                    log.warning("could not delete namespace %s: %s", netns, exc)
            self._namespaces.clear()
            _live_tags.discard(self.tag)
            with contextlib.suppress(Exception):
                atexit.unregister(self.close)
            self._restore_handlers()
        finally:
            _unblock_signals(blocked)

    def _stop_procs(self) -> None:
        alive = [proc for proc in self._procs if proc.poll() is None]
        for proc in alive:
            with contextlib.suppress(OSError):
                proc.terminate()
        deadline = time.monotonic() + _TERM_GRACE_S
        for proc in alive:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=_TERM_GRACE_S)
        self._procs.clear()

    # -- signals ---------------------------------------------------------------------

    def _install_handlers(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                previous = signal.getsignal(signum)
                if previous is signal.SIG_IGN:
                    continue  # the caller chose to ignore it (e.g. nohup): keep that
                signal.signal(signum, self._on_signal)
            except ValueError:  # not the main thread: atexit and __exit__ remain
                return
            self._old_handlers[signum] = previous

    def _restore_handlers(self) -> None:
        for signum, previous in self._old_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                if signal.getsignal(signum) == self._on_signal:
                    signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._old_handlers.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        previous = self._old_handlers.get(signum, signal.SIG_DFL)
        log.warning("signal %d: tearing down emulated cluster %s", signum, self.tag)
        self.close()
        if callable(previous):
            previous(signum, frame)  # e.g. default_int_handler raises KeyboardInterrupt
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            raise SystemExit(128 + signum)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._started else "not started"
        return (
            f"EmulatedCluster(world_size={self.world_size}, link="
            f"{format_rate(self.link_bps) if self.link_bps else 'none'}, "
            f"subnet={self.network}, tag={self.tag or '-'}, {state})"
        )


def _block_signals() -> set[signal.Signals] | None:
    try:
        return signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    except (AttributeError, OSError, ValueError):
        return None


def _unblock_signals(previous_mask: set[signal.Signals] | None) -> None:
    if previous_mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
