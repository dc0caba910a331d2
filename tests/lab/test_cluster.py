"""Tests of the emulated cluster: rates, shaping, teardown on every path, gloo inside it.

Everything that builds namespaces needs root and is skipped without it. All traffic
stays inside the namespaces the tests create (subnet 10.213.0.0/24 on a private
bridge); every transfer is bounded in bytes and seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gssgd_lab.cluster as netns  # the module whose require_root reads have_root
from gssgd_lab.cluster import (
    EmulatedCluster,
    _instance_tag,
    cleanup_leftovers,
    have_root,
    parse_link_rate,
)

REPO = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(
    not have_root(),
    reason="network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2",
)
TIMEOUT_S = 20

# A receiver that reports (bytes, bytes of the first read, seconds from first to last byte);
# the first read is the tbf bucket's burst, so leaving it out measures the steady rate.
RECEIVER = r"""
import socket, sys, time
srv = socket.socket()
srv.bind((sys.argv[1], 5201)); srv.listen(1); srv.settimeout(20)
print("ready", flush=True)
conn, _ = srv.accept(); conn.settimeout(20)
want, got, first, t0 = int(sys.argv[2]), 0, 0, None
while got < want:
    chunk = conn.recv(1 << 20)
    if not chunk:
        break
    if t0 is None:
        t0, first = time.perf_counter(), len(chunk)
    got += len(chunk)
print(got, first, time.perf_counter() - t0, flush=True)
"""
SENDER = r"""
import socket, sys, time
deadline = time.monotonic() + 10
while True:
    try:
        sock = socket.create_connection((sys.argv[1], 5201), timeout=5)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
sock.sendall(b"x" * int(sys.argv[2]))
sock.close()
"""
ALL_REDUCE = r"""
import datetime, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
t = torch.full((4096,), float(dist.get_rank() + 1))
dist.all_reduce(t)
print(t.min().item(), t.max().item(), flush=True)
dist.destroy_process_group()
"""
# A cluster owner that prints its tag and a worker's pid, then waits to be signalled.
# It sets the SIGINT handler an interactive run has: a background job inherits SIGINT
# ignored, and the cluster then leaves it ignored (as it should).
OWNER = r"""
import signal, sys, time
from gssgd_lab.cluster import EmulatedCluster
signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    with EmulatedCluster(2, link="100mbit") as cluster:
        worker = cluster.popen(1, ["sleep", "30"])
        print(cluster.tag, worker.pid, flush=True)
        time.sleep(30)
except KeyboardInterrupt:
    sys.exit(3)
"""


def _names_with(tag: str) -> list[str]:
    """Namespaces and root-namespace links whose name starts with ``tag``."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in netns.splitlines() if line.strip()]
    names += [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()]
    return [name for name in names if name.startswith(tag)]


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _running(pid)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _throughput_bps(cluster: EmulatedCluster, nbytes: int) -> float:
    """Steady-state TCP goodput from rank 0 to rank 1, in bits per second."""
    receiver = cluster.popen(
        1, [sys.executable, "-c", RECEIVER, cluster.address(1), str(nbytes)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert receiver.stdout is not None
    assert receiver.stdout.readline().strip() == "ready"
    sender = cluster.popen(0, [sys.executable, "-c", SENDER, cluster.address(1), str(nbytes)])
    out, _ = receiver.communicate(timeout=TIMEOUT_S)
    assert sender.wait(timeout=TIMEOUT_S) == 0
    got, first, seconds = out.split()
    assert int(got) == nbytes
    return (int(got) - int(first)) * 8 / float(seconds)


# --------------------------------------------------------------------------- rates


@pytest.mark.parametrize(
    ("text", "bps"),
    [
        ("100mbit", 100_000_000),
        ("1gbit", 1_000_000_000),
        ("10gbit", 10_000_000_000),
        ("500kbit", 500_000),
        ("2.5gbit", 2_500_000_000),
        (" 20MBit ", 20_000_000),
        ("none", None),
        ("None", None),
        (None, None),
    ],
)
def test_parse_link_rate_accepts_tc_units(text: str | None, bps: int | None) -> None:
    assert parse_link_rate(text) == bps


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("100mbps", r"'100mbps'.*bytes per second"),
        ("100", r"'100' is not understood.*100mbit"),
        ("fast", r"'fast' is not understood.*1gbit.*'none'"),
        ("", r"'' is not understood"),
        ("-5mbit", r"'-5mbit' is not understood"),
        ("1kbit", r"'1kbit' = 1000 bit/s is outside 10kbit..1000gbit"),
        ("0gbit", r"outside 10kbit..1000gbit"),
    ],
)
def test_parse_link_rate_rejects_bad_text_naming_the_value(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_link_rate(text)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"world_size": 0}, r"world_size=0 must be an int >= 1"),
        ({"world_size": 300}, r"world_size=300 does not fit subnet 10.213.0.0/24"),
        ({"world_size": 2, "subnet": "8.8.8.0/24"}, r"not a private range"),
        ({"world_size": 2, "link": "1gbps"}, r"'1gbps'"),
        ({"world_size": 2, "mtu": 100}, r"mtu=100 must be an int in 576..65535"),
        ({"world_size": 2, "prefix": "Gs-"}, r"prefix='Gs-' must be 1 to 5 lowercase"),
        ({"world_size": 2, "burst_bytes": 100}, r"burst_bytes=100 must be an int of at least"),
    ],
)
def test_cluster_rejects_bad_arguments_before_touching_the_system(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        EmulatedCluster(**kwargs)


def test_cluster_without_root_says_so_and_how_to_avoid_it(monkeypatch) -> None:
    monkeypatch.setattr(netns, "have_root", lambda: False)
    with pytest.raises(PermissionError, match=r"needs root \(run as root, or use --link none\)"):
        EmulatedCluster(2, link="1gbit")


# --------------------------------------------------------------------------- shaping


@needs_root
def test_shaped_link_runs_near_its_rate_and_unshaped_is_much_faster() -> None:
    with EmulatedCluster(2, link="20mbit") as cluster:
        assert cluster.master_addr == "10.213.0.1"
        assert len(cluster.ifname(1)) <= 15
        shaped = _throughput_bps(cluster, 2_000_000)
    with EmulatedCluster(2, link=None) as cluster:
        unshaped = _throughput_bps(cluster, 2_000_000)
    print(f"20mbit: {shaped / 1e6:.1f} Mbit/s, none: {unshaped / 1e6:.0f} Mbit/s")
    assert 0.3 * 20e6 < shaped < 1.5 * 20e6
    assert unshaped > 10 * shaped


@needs_root
def test_gloo_all_reduce_runs_through_the_shaped_veths() -> None:
    world = 2
    with EmulatedCluster(world, link="100mbit") as cluster:
        procs = [
            cluster.popen(
                rank, [sys.executable, "-c", ALL_REDUCE],
                env={**_env(), "RANK": str(rank), "WORLD_SIZE": str(world),
                     "MASTER_PORT": "29500"},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            for rank in range(world)
        ]  # fmt: skip
        outputs = [proc.communicate(timeout=60) for proc in procs]
        for proc, (out, err) in zip(procs, outputs, strict=True):
            assert proc.returncode == 0, err
            assert out.split() == ["3.0", "3.0"]  # 1 + 2 on every element
        stats = subprocess.run(
            ["ip", "-n", cluster.namespace(1), "-j", "-s", "link", "show", cluster.ifname(1)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert json.loads(stats)[0]["stats64"]["tx"]["bytes"] > 4096 * 4  # the tensor left here


# --------------------------------------------------------------------------- teardown


@needs_root
def test_exit_removes_every_name_and_kills_workers() -> None:
    with EmulatedCluster(3, link="1gbit") as cluster:
        tag = cluster.tag
        assert len(_names_with(tag)) == 4  # three workers and the switch
        worker = cluster.popen(2, ["sleep", "30"])
    assert _names_with(tag) == []
    assert _wait_gone(worker.pid)
    cluster.close()  # idempotent


@needs_root
def test_exception_inside_with_still_tears_down() -> None:
    with pytest.raises(RuntimeError, match="boom"), EmulatedCluster(2, link="20mbit") as cluster:
        tag = cluster.tag
        raise RuntimeError("boom")
    assert _names_with(tag) == []


@needs_root
def test_interrupt_during_setup_removes_the_half_built_state() -> None:
    class Interrupted(EmulatedCluster):
        def _build(self) -> None:
            self._new_namespace(self.switch_namespace)
            raise KeyboardInterrupt

    handlers = [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)]
    cluster = Interrupted(2, link="20mbit")
    with pytest.raises(KeyboardInterrupt), cluster:
        pass
    assert cluster.tag and _names_with(cluster.tag) == []
    assert [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)] == handlers


@needs_root
@pytest.mark.parametrize(("signum", "exit_code"), [(signal.SIGINT, 3), (signal.SIGTERM, 143)])
def test_signal_tears_down_then_acts_as_the_previous_handler(signum: int, exit_code: int) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER], env=_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        tag, worker_pid = owner.stdout.readline().split()
        assert _names_with(tag)
        owner.send_signal(signum)
        assert owner.wait(timeout=TIMEOUT_S) == exit_code  # 3: KeyboardInterrupt was raised
        assert _names_with(tag) == []
        assert _wait_gone(int(worker_pid))
    finally:
        owner.kill()
        owner.wait()


@needs_root
def test_cleanup_leftovers_removes_what_a_killed_run_left() -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER], env=_env(), stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    tag, worker_pid = owner.stdout.readline().split()
    owner.kill()  # SIGKILL: no teardown can run
    owner.wait()
    left = _names_with(tag)
    assert sorted(left) == [f"{tag}-0", f"{tag}-1", f"{tag}-sw"]
    assert _running(int(worker_pid))  # still alive, inside the leftover namespace

    removed = cleanup_leftovers()
    assert set(left) <= set(removed)
    assert _names_with(tag) == []
    assert _wait_gone(int(worker_pid))


@needs_root
def test_cleanup_leftovers_spares_live_owners_and_removes_dead_ones() -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()
    dead = _instance_tag(finished.pid, 0)
    live = _instance_tag(1, 0)  # pid 1 never exits
    made = [f"{dead}-0", f"{live}-0"]
    try:
        for name in made:
            subprocess.run(["ip", "netns", "add", name], check=True)
        subprocess.run(["ip", "link", "add", f"{dead}br", "type", "bridge"], check=True)

        removed = cleanup_leftovers()
        assert {f"{dead}-0", f"{dead}br"} <= set(removed)
        assert _names_with(dead) == []
        assert _names_with(live) == [f"{live}-0"]
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        subprocess.run(["ip", "link", "delete", f"{dead}br"], capture_output=True)
