"""The cluster cost model: link parsing, patterns read from the traffic formulas, the step
split with overlap, the device constants, and the held-out fit on measured cells."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from gssgd.comm import HEADER_BYTES
from gssgd.costmodel import store
from gssgd.costmodel.cluster import (
    BACKWARD_FRACTION,
    DDP_BUCKET_CAP_BYTES,
    Link,
    last_bucket_share,
    overlap_of,
    parse_latency,
    parse_link,
    predict_step,
)
from gssgd.costmodel.compute_law import ComputeLaw, fit_compute_law
from gssgd.costmodel.devices import Device, get_device
from gssgd.costmodel.fit import (
    HOLD_OUTS,
    FittedModel,
    Measurement,
    fit_model,
    held_out,
    held_out_errors,
    margin_of,
    recommendation_check,
)
from gssgd.costmodel.method_specs import method_spec, traffic
from gssgd.costmodel.network import Network, pattern_of, rounds_of

#: A cluster network as advise predicts with: the ring's 0.9 for every pattern here.
CLUSTER = Network(default_efficiency=0.9)

GRID = Path(__file__).resolve().parents[2] / "docs" / "results" / "grid"


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("dense", "ring"),
        ("dense16", "ring"),
        ("topk", "allgather"),
        ("gtopk", "recursive_doubling"),
        ("sketched", "star"),
        ("gs", "ring"),
        ("gs-backend", "ring"),
        ("gs-half", "ring"),
        ("gs-rd", "recursive_doubling"),
    ],
)
def test_pattern_is_read_from_the_methods_traffic_formula(name: str, pattern: str) -> None:
    assert pattern_of(method_spec(name, 10**6, 0.001)) == pattern


@pytest.mark.parametrize(
    ("text", "bps"),
    [("1gbit", 10**9), ("10gbit", 10**10), ("400gbit", 4 * 10**11), ("25GBIT", 25 * 10**9)],
)
def test_parse_link_takes_rates_up_to_400gbit(text: str, bps: int) -> None:
    assert parse_link(text) == bps


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("500gbit", r"'500gbit' = 500000000000 bit/s is outside 1mbit..400gbit; .* --link 10gbit"),
        ("500kbit", r"outside 1mbit..400gbit"),
        ("none", r"needs a rate; give one in 1mbit..400gbit, e.g. --link 10gbit"),
        ("10gbps", r"'10gbps' is not understood: .* write bits"),
    ],
)
def test_parse_link_errors_name_the_value_the_range_and_the_fix(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_link(text)


@pytest.mark.parametrize(
    ("text", "seconds"), [("20us", 20e-6), ("1.5ms", 1.5e-3), ("500ns", 5e-7), ("0.2 s", 0.2)]
)
def test_parse_latency(text: str, seconds: float) -> None:
    assert parse_latency(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("20", r"latency '20' is not understood: give a number and a unit .* --latency 20us"),
        ("fast", r"not understood"),
        ("2s", r"latency '2s' is outside 100ns..1s; .* --latency 20us"),
        ("10ns", r"outside 100ns..1s"),
    ],
)
def test_parse_latency_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_latency(text)


H200 = get_device("h200")


def test_communication_is_the_methods_own_rounds_and_bytes() -> None:
    """Latency: the link's per round; bandwidth: the payload's critical bytes and gloo's
    48-byte preambles on the busiest link (three per exchange of recursive doubling: two
    with the message, the partner's ready note), at the pattern's efficiency."""
    spec = method_spec("gtopk", 25_000_000, 0.001)
    link = Link(10**10, 20e-6)
    step = predict_step(spec, 64, link, H200, CLUSTER, fwdbwd_s=0.03)
    t = traffic(spec, 64)
    per_byte = 8 / (0.9 * 10**10)
    exchanges = 3 * 2 * 6  # 6 rounds of 2 tensors; the flags ride in the index message
    assert t.header_bytes == HEADER_BYTES * exchanges
    assert t.rounds == 6
    assert step.latency == pytest.approx(20e-6 * t.rounds)
    assert step.bandwidth == pytest.approx((t.critical_bytes + t.header_bytes) * per_byte)
    assert step.hidden == 0.0 and step.overlap == "none"
    assert step.total == pytest.approx(0.03 + step.compression + step.communication)


def test_a_network_adds_its_round_cost_driven_wait_burst_credit_and_software_per_byte() -> None:
    """Each term by its input: the driven wait per other worker on the partner's core
    (s - 1), the burst credit per round of the link's token bucket, software per byte."""
    spec = method_spec("gs-rd", 10**7, 0.001)
    t, r = traffic(spec, 8), rounds_of(spec, 8)
    net = Network(efficiency={"recursive_doubling": 0.5}, round_s=1e-3, driven_round_s=2e-3,
                  burst_credit=0.5, software_s_per_byte=1e-9)
    link = Link(10**8, 0.0, burst_bytes=50_000)  # tbf's bucket at 100 Mbit/s: 50 kB
    step = predict_step(spec, 8, link, H200, net, fwdbwd_s=0.0, compute_share=3.0)
    assert step.latency == pytest.approx(1e-3 * t.rounds + (3.0 - 1) * 2e-3 * r.driven)
    bucket = 0.5 * 50_000 * t.rounds
    wire = (t.critical_bytes + t.header_bytes - bucket) * 8 / (0.5 * 10**8)
    assert step.bandwidth == pytest.approx(max(wire, 3.0 * 1e-9 * (t.critical_bytes
                                                                   + t.header_bytes)))
    loopback = predict_step(spec, 8, Link(None), H200, net, fwdbwd_s=0.0, compute_share=3.0)
    assert loopback.bandwidth == pytest.approx(3.0 * 1e-9 * (t.critical_bytes + t.header_bytes))
    # a cluster: a core per worker, a link without a token bucket: neither term is there
    alone = predict_step(spec, 8, Link(10**8, 0.0), H200, net, fwdbwd_s=0.0)
    assert alone.latency == pytest.approx(1e-3 * t.rounds)
    assert alone.bandwidth == pytest.approx((t.critical_bytes + t.header_bytes) * 8
                                            / (0.5 * 10**8))


def test_dense_hides_its_all_reduce_up_to_the_backward_time() -> None:
    spec = method_spec("dense", 25_000_000)
    slow = predict_step(spec, 8, Link(10**9, 20e-6), H200, CLUSTER, fwdbwd_s=0.03)
    assert slow.overlap == "backward"
    assert slow.hidden == pytest.approx(BACKWARD_FRACTION * 0.03)  # capped by backward
    fast = predict_step(spec, 8, Link(4 * 10**11, 1e-6), H200, CLUSTER, fwdbwd_s=0.03)
    assert fast.hidden == pytest.approx(fast.communication)  # all of it hides
    assert fast.total == pytest.approx(fast.compute)
    powersgd = method_spec("powersgd", 25_000_000)  # the whole-model hook: after backward
    assert overlap_of(powersgd) == "none"


def test_the_devices_overlap_efficiency_scales_what_backward_hides() -> None:
    spec = method_spec("dense", 3_464_810)
    link = Link(10**9, 1e-3)
    cpu = get_device("cpu")
    half = dataclasses.replace(H200, overlap_efficiency=0.5)
    full = predict_step(spec, 4, link, H200, CLUSTER, fwdbwd_s=1.0)
    assert full.hidden == pytest.approx(full.communication)  # backward is long enough
    assert predict_step(spec, 4, link, half, CLUSTER, fwdbwd_s=1.0).hidden == pytest.approx(
        0.5 * full.hidden
    )
    on_cpu = predict_step(spec, 4, link, cpu, CLUSTER, fwdbwd_s=1.0)
    assert on_cpu.overlap == "backward" and on_cpu.hidden == 0.0  # measured: gloo hides none
    assert on_cpu.total == pytest.approx(on_cpu.compute + on_cpu.communication)
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match=r"overlap_efficiency=.* must be in \[0, 1\]"):
            dataclasses.replace(H200, overlap_efficiency=bad)


def test_streaming_gs_hides_only_its_table_all_reduce() -> None:
    spec = method_spec("gs", 25_000_000, 0.001)
    link = Link(10**9, 20e-6)
    plain = predict_step(spec, 16, link, H200, CLUSTER, fwdbwd_s=10.0)
    stream = predict_step(spec, 16, link, H200, CLUSTER, fwdbwd_s=10.0, overlap="table")
    table = predict_step(dataclasses.replace(spec, exact=False), 16, link, H200, CLUSTER,
                         fwdbwd_s=10.0)
    assert overlap_of(spec, stream=True) == "table" and overlap_of(spec, stream=False) == "none"
    assert stream.hidden == pytest.approx(table.communication)
    assert 0 < stream.hidden < stream.communication
    assert stream.total == pytest.approx(plain.total - table.communication)
    with pytest.raises(ValueError, match=r"overlap='sometimes' must be 'backward', 'table', 'buckets'"):
        predict_step(spec, 16, link, H200, CLUSTER, fwdbwd_s=1.0, overlap="sometimes")


def test_a_per_bucket_hook_hides_every_buckets_communication_but_the_lasts() -> None:
    """``overlap="buckets"`` (PowerSGD as advise recommends it): DDP's last bucket, the
    first 25 MB of gradient, communicates after backward; the rest hides up to backward's
    time, scaled by the device's overlap efficiency (none on this CPU)."""
    link = Link(10**8, 20e-6)
    big = method_spec("powersgd", 25_000_000)  # 100 MB of gradient: a quarter in the last
    share = last_bucket_share(big.d)
    assert share == pytest.approx(DDP_BUCKET_CAP_BYTES / 100_000_000)
    long_backward = predict_step(big, 16, link, H200, CLUSTER, fwdbwd_s=100.0,
                                 overlap="buckets")
    assert long_backward.overlap == "buckets"
    assert long_backward.hidden == pytest.approx((1 - share) * long_backward.communication)
    short = predict_step(big, 16, link, H200, CLUSTER, fwdbwd_s=1e-4, overlap="buckets")
    assert short.hidden == pytest.approx(BACKWARD_FRACTION * 1e-4)  # capped by backward
    one_bucket = method_spec("powersgd", 3_464_810)  # 13.9 MB: DDP's last bucket is all of it
    assert last_bucket_share(one_bucket.d) == 1.0
    assert predict_step(one_bucket, 16, link, H200, CLUSTER, fwdbwd_s=100.0,
                        overlap="buckets").hidden == 0.0
    on_cpu = predict_step(big, 16, link, get_device("cpu"), CLUSTER, fwdbwd_s=100.0,
                          overlap="buckets")
    assert on_cpu.hidden == 0.0  # measured: this CPU's backward hides none


def test_h200_compression_costs_follow_what_each_method_does() -> None:
    """From the stored record's primitives: passes, top-k, sketch rows, recovery, and
    PowerSGD's products per unit of rank."""
    d = 25_557_032
    rec = store.load("devices.json")["devices"]["h200"]
    dense = H200.compression_seconds(method_spec("dense", d))
    topk = H200.compression_seconds(method_spec("topk", d, 0.001))
    gs1 = H200.compression_seconds(method_spec("gs", d, 0.001, rows=1))
    gs3 = H200.compression_seconds(method_spec("gs", d, 0.001, rows=3))
    assert topk == pytest.approx((rec["topk_s_per_elem"] + 5 * rec["pass_s_per_elem"]) * d)
    assert dense < topk < gs1 < gs3
    assert gs3 - gs1 == pytest.approx(2 * rec["sketch_s_per_elem_row"] * d)
    r1, r4 = (H200.compression_seconds(method_spec(n, d)) for n in ("powersgd-r1", "powersgd-r4"))
    assert r4 - r1 == pytest.approx(3 * rec["lowrank_s_per_elem_rank"] * d)
    assert H200.fwdbwd_s_per_param == rec["fwdbwd_s_per_param"]


def test_h100_and_a100_are_the_h200_scaled_by_their_datasheets() -> None:
    data = store.load("devices.json")
    sheets, h200 = data["datasheets"], data["devices"]["h200"]
    for name in ("h100", "a100"):
        dev = get_device(name)
        memory = sheets["h200"]["hbm_TBps"] / sheets[name]["hbm_TBps"]
        compute = sheets["h200"]["tf32_dense_TFLOPS"] / sheets[name]["tf32_dense_TFLOPS"]
        assert dev.topk_s_per_elem == pytest.approx(h200["topk_s_per_elem"] * memory)
        assert dev.fwdbwd_s_per_param == pytest.approx(h200["fwdbwd_s_per_param"] * compute)
        assert "derived" in dev.summary and sheets[name]["source"]
    assert get_device("a100").topk_s_per_elem > get_device("h100").topk_s_per_elem


def test_cpu_compression_costs_follow_the_fitted_compute_laws() -> None:
    """The CPU device predicts with the stored fit's per-method laws (per element a power of
    d: the caches), and a variant without a law of its own costs like its aggregator."""
    cpu = get_device("cpu")
    law = store.load("fit.json")["cpu_compute"]["dense"]
    for d in (10**6, 25 * 10**6):
        dense = cpu.compression_seconds(method_spec("dense", d))
        assert dense == pytest.approx(ComputeLaw(law["gamma"], law["slope"]).seconds(d))
    per_elem = [cpu.compression_seconds(method_spec("dense", d)) / d for d in (10**6, 25 * 10**6)]
    assert per_elem[1] / per_elem[0] == pytest.approx(25 ** law["slope"])
    gs_stream = dataclasses.replace(method_spec("gs", 10**6, 0.001), name="gs-stream")
    assert cpu.compression_seconds(gs_stream) == pytest.approx(
        cpu.compression_seconds(method_spec("gs", 10**6, 0.001)), rel=1e-12
    )


def test_unknown_device_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown device 'tpu'; known devices: a100, cpu, h100, h200"):
        get_device("tpu")


def _cpu(compute: dict[str, ComputeLaw]) -> Device:
    return Device(name="cpu", summary="synthetic", fwdbwd_s_per_param=0.0, compute=compute,
                  overlap_efficiency=0.0)


def _synthetic(model: FittedModel, specs, runs) -> list[Measurement]:
    """Measurements that ``model`` predicts exactly, each run with its own probed latency
    and share of a core, its compute from the model's laws."""
    out = []
    for i, (p, rate) in enumerate(runs):
        for spec in specs:
            m = Measurement(spec, p, rate, 1.0, 0.0, source=f"run{i}",
                            alpha_probe=1e-3 * (1 + i / 10), compute_share=1.5 + p / 8)
            m = dataclasses.replace(m, seconds_compute=model.predict_compute(m))
            out.append(dataclasses.replace(m, seconds_per_step=model.predict(m)))
    return out


def _truth(efficiency: dict[str, float], **network) -> FittedModel:
    laws = {"dense": ComputeLaw(2e-9, 0.3), "gs": ComputeLaw(1.2e-8, 0.05),
            "gs-rd": ComputeLaw(1.5e-8), "gtopk": ComputeLaw(2.2e-8, 0.1),
            "sketched": ComputeLaw(1.3e-8, 0.0), "topk": ComputeLaw(2.1e-8, 0.1)}
    return FittedModel(Network(efficiency=efficiency, **network), laws)


TRUTH = {"ring": 0.9, "recursive_doubling": 0.45, "star": 0.95, "allgather": 0.6}
RUNS = [(4, 10**8), (8, 10**8), (4, 10**9), (8, 10**9), (6, 10**8)]


def test_fit_recovers_the_efficiencies_and_compute_and_predicts_every_hold_out() -> None:
    """A world the model describes exactly: the fit finds its constants, and every
    hold-out (by run, by worker count, by size) predicts the held-out points exactly."""
    truth = _truth(TRUTH, driven_round_s=3.5e-3, burst_credit=0.5)
    specs = [method_spec(n, d, 0.001) for n in truth.compute for d in (10**6, 10**7, 25 * 10**6)]
    data = _synthetic(truth, specs, RUNS)
    fitted = fit_model(data)
    net = fitted.network
    assert net.burst_credit == 0.5
    assert net.driven_round_s == pytest.approx(3.5e-3, rel=1e-6)
    assert (net.round_s, net.software_s_per_byte) == (0.0, 0.0)  # given by the link's inputs
    for pattern, eff in TRUTH.items():
        assert fitted.network.eta(pattern) == pytest.approx(eff, rel=1e-6), pattern
    for name, law in truth.compute.items():
        assert fitted.compute[name].gamma == pytest.approx(law.gamma, rel=1e-9), name
        assert fitted.compute[name].slope == pytest.approx(law.slope, abs=1e-9), name
    for by in HOLD_OUTS:
        rows = held_out_errors(data, by)
        assert len(rows) == len(data) and max(abs(r.rel_error) for r in rows) < 1e-6, by
    recs = recommendation_check(held_out_errors(data))
    assert len(recs) == len(RUNS) and all(r.within(0.0) for r in recs)


def test_a_hold_out_by_worker_count_never_sees_that_count() -> None:
    """Fit on P = 4 and 6 only, the P = 8 points carry the error of a model that never saw
    P = 8: here a world whose all-gather slows at P = 8 (0.6 -> 0.3), which the held-out
    check by worker count shows and the one by run hides less well."""
    truth = _truth(TRUTH)
    slow = _truth({**TRUTH, "allgather": 0.3})
    specs = [method_spec("topk", d, 0.01) for d in (10**6, 10**7)]
    data = [m if m.world_size != 8 else dataclasses.replace(
        m, seconds_per_step=slow.predict(m)) for m in _synthetic(truth, specs, RUNS)]
    record = held_out(data)
    p8 = [r for r in held_out_errors(data, "workers") if r.measurement.world_size == 8]
    assert p8 and all(r.rel_error < -0.05 for r in p8)  # predicted faster than measured
    assert record["workers"]["max_abs_rel_error"] >= max(abs(r.rel_error) for r in p8) - 1e-12
    assert margin_of(record, "topk") >= record["workers"]["per_family"]["topk"][
        "median_abs_rel_error"]


def test_the_margin_is_the_worst_communication_median_of_the_three_hold_outs() -> None:
    held = {by: {"communication": {"median_abs_rel_error": 0.1,
                                   "per_family": {"gs": {"median_abs_rel_error": e}}}}
            for by, e in zip(HOLD_OUTS, (0.05, 0.12, 0.08), strict=True)}
    assert margin_of(held, "gs") == 0.12
    assert margin_of(held, "powersgd") == 0.1  # not measured: the overall median


def test_held_out_check_on_measured_cells_predicts_within_the_documented_error(
    held_out,
) -> None:
    """The committed runs of the stored fit (the grid of today's code: P = 4 and 8, d = 1M,
    10M and 25M, 100 Mbit/s and 1 Gbit/s, every method, PowerSGD over ResNet layer shapes).
    Recomputed; missing runs fail, they do not skip."""
    runs, rows = held_out
    assert len(runs) == 12 and len({r.measurement.source for r in rows}) == 12
    errors = sorted(abs(r.rel_error) for r in rows)
    assert all(math.isfinite(e) for e in errors)
    assert errors[len(errors) // 2] < 0.15  # median: the bar
    recs = recommendation_check(rows)
    # the first choice is the fastest or within 10 % in 8 of 12 runs (docs/benchmarks.md);
    # every miss is gTop-k's symmetric exchange (or local Top-k) ranked above its tree,
    # measured at most 1.37x faster: none may be further off than that
    assert sum(r.within(0.10) for r in recs) >= 8 and len(recs) == 12
    assert all(r.within(0.40) for r in recs), [(r.run, r.recommended, r.ratio) for r in recs]
    assert {r.measurement.spec.name for r in rows} >= {"powersgd", "powersgd-r1", "powersgd-r4",
                                                       "gs", "topk", "gtopk", "dense"}
    assert all(r.measurement.spec.shapes and len(r.measurement.spec.shapes) > 1
               for r in rows if r.measurement.spec.aggregator == "powersgd")


def test_rounds_split_into_collective_and_driven() -> None:
    d = 10**7
    for p in (4, 8, 16):
        for name in ("dense", "dense16", "gs", "gs-rd", "gtopk", "topk", "sketched",
                     "powersgd"):
            spec = method_spec(name, d, 0.001)
            r = rounds_of(spec, p)
            assert r.total == traffic(spec, p).rounds, (name, p)
            driven = pattern_of(spec) in ("recursive_doubling", "star")
            assert (r.driven > 0) == driven, (name, p)
    # gs by recursive doubling at P = 8: log2(8) = 3 exchanges for the table and 3 for the
    # exact values
    assert rounds_of(method_spec("gs-rd", d, 0.001), 8).driven == 6
    assert rounds_of(method_spec("gtopk", d, 0.001), 8).driven == 3


def test_compute_law_recovers_a_known_slope_and_is_flat_at_one_size() -> None:
    truth = ComputeLaw(gamma=4e-9, slope=0.3)
    points = [(d, truth.per_element(d)) for d in (10**6, 10**7, 25 * 10**6)]
    law = fit_compute_law(points)
    assert law.gamma == pytest.approx(4e-9, rel=1e-9)
    assert law.slope == pytest.approx(0.3, rel=1e-9)
    assert law.seconds(10**7, share=2.0) == pytest.approx(2.0 * 4e-9 * 10**0.3 * 10**7)
    flat = fit_compute_law([(10**6, 2e-9), (10**6, 8e-9)])
    assert flat.slope == 0.0 and flat.gamma == pytest.approx(4e-9)  # the geometric mean
    with pytest.raises(ValueError, match="positive"):
        fit_compute_law([(10**6, 0.0)])


def test_a_gpu_cluster_is_predicted_with_one_efficiency_and_no_gloo_headers() -> None:
    """advise predicts a GPU cluster with the fitted network as NCCL's: every pattern at the
    ring's efficiency, no 48-byte gloo preambles, no token bucket; the CPU keeps the fit."""
    from gssgd.costmodel.advice import cluster_network, fitted_network

    fitted = fitted_network()
    cluster = cluster_network(get_device("h200"))
    assert cluster_network(get_device("cpu")) == fitted and fitted.headers
    ring = fitted.eta("ring")
    assert fitted.eta("recursive_doubling") < ring  # what the emulated links measured
    assert {cluster.eta(p) for p in ("ring", "recursive_doubling", "allgather", "star")} == {ring}
    assert not cluster.headers and cluster.burst_credit == 0.0
    spec = method_spec("gtopk", 10**6, 0.001)
    t = traffic(spec, 64)
    link = Link(10**9, 0.0)
    for net, headers in ((fitted, t.header_bytes), (cluster, 0)):
        step = predict_step(spec, 64, link, get_device("h200"), net, fwdbwd_s=0.0,
                            overlap="none")
        wire = 8.0 * (t.critical_bytes + headers) / (net.eta("recursive_doubling") * 10**9)
        assert step.bandwidth == pytest.approx(wire)
