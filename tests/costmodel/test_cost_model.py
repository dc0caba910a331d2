"""The cost model's byte formulas against real aggregators, the measurements the fit reads,
and the step time ``gssgd bench`` sizes its limits by."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

import gssgd
from gssgd.costmodel import (
    VARIANTS,
    emulated_step_seconds,
    load_measurements,
    method_spec,
    traffic,
)
from tests.dist_utils import raise_worker_errors, run_workers

D = 3000
DENSITY = 0.01
SIZES = (2, 3, 4)


def _measure_every_method(rank: int, world_size: int) -> dict:
    """On 4 ranks: for P = 2, 3, 4 (a subgroup of the first P ranks) run every benchmark
    method twice and return its second step's bytes, rounds and messages, by (P, method)."""
    groups = {p: dist.new_group(list(range(p))) for p in SIZES}  # every rank makes every group
    grad = torch.randn(D, generator=torch.Generator().manual_seed(rank))
    out = {}
    for p, group in groups.items():
        if rank >= p:
            continue
        for name in VARIANTS:
            spec = method_spec(name, D, DENSITY)
            agg = gssgd.make_aggregator(
                spec.aggregator, D, group=group, **spec.aggregator_options()
            )
            agg.step(grad)  # the first step also checks rank agreement
            agg.step(grad)
            s = agg.last_stats
            out[(p, name)] = (s.bytes_sent, s.bytes_received, s.rounds, s.messages,
                              s.messages_received)
    return out


def test_byte_formulas_equal_the_aggregators_last_stats_for_2_3_and_4_ranks():
    results = run_workers(4, _measure_every_method)
    raise_worker_errors(results)
    for p in SIZES:
        for name in VARIANTS:
            t = traffic(method_spec(name, D, DENSITY), p)
            for rank in range(p):
                measured = results[rank][(p, name)]
                want = (t.sent[rank], t.received[rank], t.rounds, t.messages[rank],
                        t.messages_received[rank])
                assert measured == want, (p, name, rank)


def test_byte_formulas_match_the_documented_figures():
    d, k, p = 1_000_000, 1000, 8
    gs = method_spec("gs-rd", d, k=k, cols=5000, candidates=4)
    rows_cols = gs.rows * 5000
    # the ranks' non-finite flags ride in each method's first message: P values after gs's
    # table, one index after local Top-k's list, one int32 of bits after gTop-k's and
    # Sketched-SGD's indices and a value after each sketch
    assert traffic(gs, p).critical_bytes == 3 * (rows_cols + p + 4 * k) * 4
    topk = traffic(method_spec("topk", d, k=k), p)  # a ring all-gather forwards the others'
    assert topk.sent[0] == topk.received[0] == (p - 1) * (2 * k * 4 + 4)
    assert traffic(method_spec("gtopk", d, k=k), p).critical_bytes == 3 * (2 * k * 4 + 4)
    # dense: the flags ride at the end of its all-reduce (gloo's segments move a rank's
    # share by a few elements)
    dense = traffic(method_spec("dense", d), p)
    assert abs(dense.sent[0] - 2 * (p - 1) * 4 * (d + p) // p) <= 2 * p * 4
    assert dense.rounds == 2 * (p - 1)
    sketched_spec = method_spec("sketched", d, k=k, cols=5000, candidates=4)
    sketched = traffic(sketched_spec, p)  # float16 tables by default: 2 bytes a cell
    assert sketched_spec.table_bytes == 2
    assert sketched.received[0] == (p - 1) * ((rows_cols + 1) * 2 + 4 * k * 4)
    assert sketched.received[1] == 4 * k * 4 + 4 + 2 * k * 4


@pytest.mark.parametrize("rate", [None, 10**8, 10**9])
def test_the_emulated_step_grows_with_bytes_and_falls_with_link_rate(rate):
    """``emulated_step_seconds`` (the stored fit on this machine's links, by which ``gssgd
    bench`` sizes its time limits): more bytes never take less time, a slower link never
    helps, a smaller sketch is faster on a rate-limited link."""
    for name in VARIANTS:
        for p in (2, 3, 16):
            specs = [method_spec(name, d, 0.001) for d in (10**4, 10**6, 10**8)]
            volumes = [traffic(s, p).critical_bytes for s in specs]
            times = [emulated_step_seconds(s, p, rate) for s in specs]
            assert volumes == sorted(volumes) and times == sorted(times), (name, p)
            if rate is not None:  # where the wire binds (dense's 400 MB), it hurts
                slower = emulated_step_seconds(specs[2], p, rate // 10)
                faster = emulated_step_seconds(specs[2], p, rate)
                assert slower > faster if name == "dense" else slower >= faster, (name, p)
    small, big = method_spec("gs", 10**6, 0.001, cols=1000), method_spec("gs", 10**6, 0.001)
    if rate == 10**8:  # loopback has no cost per byte, 1 Gbit/s's 500 kB bucket holds both
        assert emulated_step_seconds(small, 4, rate) < emulated_step_seconds(big, 4, rate)


def test_method_spec_names_the_valid_methods_on_a_typo():
    with pytest.raises(ValueError, match=r"unknown benchmark method 'gss'.*gs-backend"):
        method_spec("gss", 1000)


def test_load_measurements_explains_a_missing_results_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="gssgd bench comm --out DIR"):
        load_measurements(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({"gs": {}}))
    with pytest.raises(ValueError, match="_meta"):
        load_measurements(tmp_path)
