"""Counted bytes against what a gloo process really writes to its sockets.

Linux counts, per process, the bytes passed to write-like system calls: ``wchar`` in
``/proc/self/io``. gloo's TCP transport writes every message with ``writev`` on its sockets
(gloo/transport/tcp/pair.cc, ``Pair::write``), so ``wchar`` read before and after one
aggregator step is exactly what the step put on the wire from this process: its payload and
gloo's 48-byte preambles (:data:`gssgd.comm.HEADER_BYTES`), two per message it sends (the
send-ready note and the payload's own) and one per message it receives (the recv-ready note
going back). Nothing else in a worker writes during a step.

For every registered aggregator, on P = 16 real gloo processes and on a subgroup of three of
them (one spawn: starting 16 processes on two cores is most of the test's time), each method
runs two warm-up steps, which open the connections and pass the rank-agreement check, and
one measured step, and every rank checks::

    counted bytes_sent <= written <= counted bytes_sent + gssgd.comm.wire_overhead(...)

The upper bound has no slack: a collective counted with fewer bytes than the wire carries
(an all-gather counted as its own n bytes while gloo's ring forwards the others' too, or the
non-finite flag's all-gather counted as 4 bytes) fails it by the missing bytes.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gssgd import make_aggregator
from gssgd.aggregators import AGGREGATORS
from gssgd.comm import HEADER_BYTES, wire_overhead
from tests.dist_utils import raise_worker_errors, run_workers

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/io").exists(), reason="needs Linux's per-process I/O counters"
)

#: The MNIST CNN at density 0.001: the shape of the issue's figures.
D, DENSITY = 80_602, 0.001
WARMUP_STEPS = 2
WORLD_SIZES = (3, 16)


def _written() -> int:
    """Bytes this process has passed to write-like system calls so far."""
    for line in Path("/proc/self/io").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "wchar":
            return int(value)
    raise RuntimeError("/proc/self/io has no wchar line")


def _measure(names: list[str], group: dist.ProcessGroup | None) -> dict[str, dict[str, int]]:
    """Per method: one step's counted statistics and the bytes this process wrote in it."""
    out = {}
    gen = torch.Generator().manual_seed(dist.get_rank())
    for name in names:
        agg = make_aggregator(name, D, density=DENSITY, group=group)
        for _ in range(WARMUP_STEPS):
            agg.step(torch.randn(D, generator=gen))
        grad = torch.randn(D, generator=gen)
        dist.barrier(group=group)  # every rank's earlier writes are done before anyone measures
        before = _written()
        agg.step(grad)
        written = _written() - before
        s = agg.last_stats
        out[name] = {
            "written": written,
            "bytes_sent": s.bytes_sent,
            "messages": s.messages,
            "messages_received": s.messages_received,
        }
    return out


def _point_to_point(group: dist.ProcessGroup) -> list[int]:
    """Rank 0 sends rank 1 a message of 100 bytes, then one of 4 MiB: the bytes each wrote."""
    out = []
    for size in (100, 4 << 20):
        x = torch.zeros(size, dtype=torch.uint8)
        for measured in (False, True):  # the first opens the pair's slot
            dist.barrier(group=group)
            before = _written()
            if dist.get_rank() == 0:
                dist.send(x, 1)
            else:
                dist.recv(x, 0)
            if measured:
                out.append(_written() - before)
    return out


def _run(rank: int, world_size: int, names: list[str]) -> dict:
    """Every method on the whole world, then on ranks 0-2 (the others wait in the last
    barrier: a process writes nothing for another's collective it has not joined), then a
    point-to-point pair on ranks 0 and 1."""
    small, pair = dist.new_group([0, 1, 2]), dist.new_group([0, 1])  # every rank makes both
    out: dict = {world_size: _measure(names, None)}
    if rank < 3:
        out[3] = _measure(names, small)
    if rank < 2:
        out["pair"] = _point_to_point(pair)
    dist.barrier()
    return out


@cache
def _results() -> list[dict]:
    ranks = run_workers(max(WORLD_SIZES), _run, list(AGGREGATORS))
    raise_worker_errors(ranks)
    return ranks


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", list(AGGREGATORS))
def test_counted_bytes_are_what_gloo_writes(world_size: int, name: str) -> None:
    """Every rank's payload plus gloo's preambles is what its process wrote, to the byte."""
    for rank, res in enumerate(_results()[:world_size]):
        got = res[world_size][name]
        counted = got["bytes_sent"]
        overhead = wire_overhead(got["messages"], got["messages_received"])
        assert counted <= got["written"] <= counted + overhead, (
            f"{name}, P = {world_size}, rank {rank}: wrote {got['written']} B, counted "
            f"{counted} B of payload + {overhead} B of preambles ({got['messages']} messages "
            f"sent, {got['messages_received']} received): "
            f"{got['written'] - counted - overhead:+d} B not counted"
        )


def test_a_preamble_is_48_bytes_per_message_not_per_write_call() -> None:
    """A message of 100 bytes and one of 4 MiB (several ``writev`` calls) carry the same
    preambles: two written by the sender, one by the receiver."""
    sender, receiver = _results()[0]["pair"], _results()[1]["pair"]
    assert sender == [100 + 2 * HEADER_BYTES, (4 << 20) + 2 * HEADER_BYTES]
    assert receiver == [HEADER_BYTES, HEADER_BYTES]


def test_wchar_counts_this_process_writes() -> None:
    """The counter moves by exactly the bytes a write passes, here to /dev/null."""
    before = _written()
    with open(os.devnull, "wb") as f:
        f.write(b"x" * 1000)
    assert _written() - before == 1000
