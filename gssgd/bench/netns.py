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

Where things live: this module only re-exports; the code is in

- :mod:`gssgd.costmodel.link_rate`: :func:`parse_link_rate` and :class:`LinkShape`;
- :mod:`gssgd.bench.netns_host`: :func:`have_root`, :func:`require_root`, the
  ``ip`` commands, the pid-carrying names and :func:`cleanup_leftovers`;
- :mod:`gssgd.bench.emulated_cluster`: :class:`EmulatedCluster`.
"""

from __future__ import annotations

# Imports written `X as X` are kept only so that code which imported X from here still can.
from gssgd.bench.emulated_cluster import DEFAULT_SUBNET, EmulatedCluster
from gssgd.bench.netns_host import DEFAULT_PREFIX, cleanup_leftovers, have_root, require_root
from gssgd.bench.netns_host import ROOT_MESSAGE as ROOT_MESSAGE
from gssgd.bench.netns_host import _instance_tag as _instance_tag
from gssgd.bench.netns_host import _list_namespaces as _list_namespaces
from gssgd.bench.netns_host import _owner_pid as _owner_pid
from gssgd.bench.netns_host import _pid_alive as _pid_alive
from gssgd.costmodel.link_rate import LinkShape, parse_link_rate

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_SUBNET",
    "EmulatedCluster",
    "LinkShape",
    "cleanup_leftovers",
    "have_root",
    "parse_link_rate",
    "require_root",
]
