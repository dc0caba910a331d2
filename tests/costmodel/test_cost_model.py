"""The cost model: its byte formulas against real aggregators, its fit, its predictions."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.distributed as dist

import gssgd
from gssgd.bench.model_report import model_report
from gssgd.costmodel import (
    VARIANTS,
    CostModel,
    Measurement,
    _nnls,
    calibrate,
    load_measurements,
    method_spec,
    prediction_errors,
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
    flag = (p - 1) * 4  # the non-finite flag's all-gather
    assert traffic(gs, p).critical_bytes == 3 * (rows_cols + 4 * k) * 4 + flag
    topk = traffic(method_spec("topk", d, k=k), p)  # a ring all-gather forwards the others'
    assert topk.sent[0] == topk.received[0] == (p - 1) * 2 * k * 4 + flag
    assert traffic(method_spec("gtopk", d, k=k), p).critical_bytes == 3 * 2 * k * 4 + flag
    # dense: the flags ride at the end of its all-reduce (gloo's segments move a rank's
    # share by a few elements)
    dense = traffic(method_spec("dense", d), p)
    assert abs(dense.sent[0] - 2 * (p - 1) * 4 * (d + p) // p) <= 2 * p * 4
    assert dense.rounds == 2 * (p - 1)
    sketched_spec = method_spec("sketched", d, k=k, cols=5000, candidates=4)
    sketched = traffic(sketched_spec, p)  # float16 tables by default: 2 bytes a cell
    assert sketched_spec.table_bytes == 2
    assert sketched.received[0] == (p - 1) * (rows_cols * 2 + 4 * k * 4) + flag
    assert sketched.received[1] == 4 * k * 4 + 2 * k * 4 + flag


def _synthetic(model: CostModel, rates) -> list[Measurement]:
    out = []
    for rate in rates:
        for p in (2, 4, 8):
            for d in (10**5, 10**6):
                for name in VARIANTS:
                    spec = method_spec(name, d, 0.001)
                    pred = model.predict(spec, p, rate)
                    out.append(Measurement(spec, p, rate, pred.total, pred.compute, "synthetic"))
    return out


def test_calibration_recovers_known_alpha_beta_eta_and_gamma():
    truth = CostModel(alpha=2.5e-4, beta0=1.7e-9, eta=0.81, gamma={n: 3e-8 for n in VARIANTS})
    fitted = calibrate(_synthetic(truth, (None, 10**8, 10**9)))
    assert fitted.alpha == pytest.approx(truth.alpha, rel=1e-6)
    assert fitted.beta0 == pytest.approx(truth.beta0, rel=1e-6)
    assert fitted.eta == pytest.approx(truth.eta, rel=1e-6)
    assert fitted.gamma == pytest.approx(truth.gamma, rel=1e-9)
    assert fitted.notes == []
    errors = prediction_errors(fitted, _synthetic(truth, (10**10,)))
    assert max(abs(e.rel_error) for e in errors) < 1e-6


def test_calibration_takes_alpha_from_the_latency_probes_and_fits_the_rest():
    truth = CostModel(alpha=6e-4, beta0=2e-9, eta=0.9, gamma={n: 3e-8 for n in VARIANTS})
    probed = [dataclasses.replace(m, alpha_probe=6e-4) for m in _synthetic(truth, (None, 10**8))]
    fitted = calibrate(probed)
    assert fitted.alpha == 6e-4
    assert fitted.beta0 == pytest.approx(2e-9, rel=1e-6)
    assert fitted.eta == pytest.approx(0.9, rel=1e-6)
    assert any("latency probes" in note for note in fitted.notes)
    assert calibrate(probed, fit_alpha=True).alpha == pytest.approx(6e-4, rel=1e-6)


def test_gamma_is_per_core_when_the_measured_run_shared_cores():
    truth = CostModel(gamma={n: 3e-8 for n in VARIANTS})
    shared = []
    for m in _synthetic(truth, (10**9,)):
        stretched = truth.predict(m.spec, m.world_size, m.rate_bps, compute_share=2.0)
        shared.append(
            dataclasses.replace(
                m,
                seconds_per_step=stretched.total,
                seconds_compute=stretched.compute,
                compute_share=2.0,
            )
        )
    fitted = calibrate(shared)
    assert fitted.gamma["gs"] == pytest.approx(3e-8, rel=1e-9)
    assert max(abs(e.rel_error) for e in prediction_errors(fitted, shared)) < 1e-6


def test_calibration_on_one_link_rate_keeps_beta0_and_says_so():
    base = CostModel.default()
    truth = dataclasses.replace(base, alpha=8e-5, eta=0.7)
    fitted = calibrate(_synthetic(truth, (10**8,)))
    assert fitted.alpha == pytest.approx(8e-5, rel=1e-6)
    assert fitted.eta == pytest.approx(0.7, rel=1e-6)
    assert fitted.beta0 == base.beta0
    assert any("beta0" in note for note in fitted.notes)


def test_nnls_never_returns_a_negative_parameter():
    a = torch.tensor([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]]).numpy()
    b = torch.tensor([3.0, 2.0, 1.0]).numpy()  # the unconstrained slope is negative
    x = _nnls(a, b)
    assert (x >= 0).all() and x[1] == 0 and x[0] == pytest.approx(2.0)


@pytest.mark.parametrize("rate", [None, 10**8, 10**9, 10**10, 10**11])
def test_predictions_grow_with_bytes_and_fall_with_link_rate(rate):
    model = CostModel.default()
    for name in VARIANTS:
        for p in (2, 3, 16, 1024):
            specs = [method_spec(name, d, 0.001) for d in (10**4, 10**6, 10**8, 10**9)]
            times = [model.predict(s, p, rate) for s in specs]
            volumes = [traffic(s, p).critical_bytes for s in specs]
            assert volumes == sorted(volumes)
            bandwidth = [t.bandwidth for t in times]
            assert bandwidth == sorted(bandwidth) and bandwidth[0] < bandwidth[-1]
            totals = [t.total for t in times]
            assert totals == sorted(totals)
            if rate is not None:  # a slower link never helps; where the wire binds, it hurts
                slower = model.predict(specs[2], p, rate // 10).total
                faster = model.predict(specs[2], p, rate).total
                assert slower > faster if rate <= 10**9 else slower >= faster
    small, big = method_spec("gs", 10**6, 0.001, cols=1000), method_spec("gs", 10**6, 0.001)
    assert model.predict(small, 64, rate).total < model.predict(big, 64, rate).total


def test_method_spec_names_the_valid_methods_on_a_typo():
    with pytest.raises(ValueError, match=r"unknown benchmark method 'gss'.*gs-backend"):
        method_spec("gss", 1000)


def test_load_measurements_explains_a_missing_results_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="gssgd bench comm --out DIR"):
        load_measurements(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({"gs": {}}))
    with pytest.raises(ValueError, match="_meta"):
        load_measurements(tmp_path)


def test_model_report_without_calibration_uses_the_documented_defaults(tmp_path):
    lines: list[str] = []
    result = model_report([], [], tmp_path, methods=["dense", "gs"], d=10**7, echo=lines.append)
    text = "\n".join(lines)
    assert "documented defaults" in text
    assert result["model"]["source"] == "defaults"
    for png in ("model_vs_workers.png", "model_vs_d.png"):
        assert (tmp_path / png).stat().st_size > 0
    saved = json.loads((tmp_path / "model.json").read_text())
    assert set(saved["predictions"]["1000000000"]["vs_workers"]["gs"]) == {
        str(2**i) for i in range(1, 11)
    }


def test_model_report_what_if_overrides_change_the_predictions(tmp_path):
    quiet = {"methods": ["gtopk"], "d": 10**7, "echo": lambda _: None}
    base = model_report([], [], tmp_path / "a", **quiet)
    fast = model_report([], [], tmp_path / "b", overrides={"alpha": 1e-6}, **quiet)
    at_1024 = [r["predictions"]["100000000"]["vs_workers"]["gtopk"]["1024"] for r in (base, fast)]
    assert at_1024[1] < at_1024[0]
    assert fast["predictions_model"]["alpha"] == 1e-6
    with pytest.raises(ValueError, match="alpha, beta0 or eta"):
        model_report([], [], tmp_path / "c", overrides={"gamma": 1.0}, **quiet)


def test_the_default_constants_are_the_stored_fits() -> None:
    """One set of CPU constants: the three-constant model's defaults are the stored fit's
    (its ``bench_model``: round cost, software cost per byte, fitted on the same runs) and
    compute laws at COMPUTE_REF_D (fit.json), and
    the cpu device predicts the same compute there."""
    from gssgd.costmodel import store
    from gssgd.costmodel.compute_law import COMPUTE_REF_D
    from gssgd.costmodel.devices import get_device

    fit = store.load("fit.json")
    model = CostModel.default()
    assert model.alpha == fit["bench_model"]["alpha"] > 0
    assert model.beta0 == fit["bench_model"]["beta0"] > 0  # the loopback runs give it
    assert set(model.gamma) == set(fit["cpu_compute"])
    cpu = get_device("cpu")
    for name in ("dense", "topk", "gs", "gs-half", "powersgd"):
        spec = method_spec(name, COMPUTE_REF_D, 0.001)
        assert cpu.compression_seconds(spec) == pytest.approx(model.gamma_of(spec) * spec.d)
