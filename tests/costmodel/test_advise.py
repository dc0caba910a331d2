"""``gssgd advise``: parsing of sizes, rates and latencies, the JSON schema, every method
priced (PowerSGD on layer shapes, local steps), recommendations made only among methods a
study measured reaching the target and only beyond the model's error, no cliff between
neighbouring worker counts, the advise -> study -> advise loop on a user's model,
copyable commands, the printed error being the predicting model's, and errors that say
what to do."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest

from gssgd.cli.main import main
from gssgd.costmodel.advice import (
    DEFAULT_RUN_STEPS,
    advise,
    candidate_methods,
    cluster_network,
    fitted_network,
    held_out_error,
    parse_params,
    parse_workers,
    pick,
)
from gssgd.costmodel.architectures import layer_shapes
from gssgd.costmodel.cluster import Link, predict_step
from gssgd.costmodel.devices import get_device
from gssgd.costmodel.evidence import Study
from gssgd.costmodel.fit import HOLD_OUTS, held_out, load_measurements, margin_of, rated
from gssgd.costmodel.method_specs import traffic
from gssgd.ddp import HookState
from gssgd.recipes import SPARSE_WARMUP_STEPS
from gssgd.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
RESNET = layer_shapes("resnet", 25_600_000)


def _advise(**kw):
    """advise for a ResNet-50-sized image model on H200s unless told otherwise."""
    args = {"params": 25_600_000, "shapes": RESNET, "family": "image",
            "link": Link(10**9, 20e-6), "device": get_device("h200"), **kw}
    return advise(**args)


def _advise_json(capsys, *argv: str) -> dict:
    assert main(["advise", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("25.6M", 25_600_000),
        ("124m", 124_000_000),
        ("1.3B", 1_300_000_000),
        ("1.3g", 1_300_000_000),
        ("7e9", 7_000_000_000),
        ("25600000", 25_600_000),
        ("1_000k", 1_000_000),
    ],
)
def test_parse_params_takes_suffixes(text: str, value: int) -> None:
    assert parse_params(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("25.6X", r"'25.6X' is not understood: .* e.g. --params 25.6M"),
        ("12", r"'12' = 12 is outside 1000..1e13; .* --params 25.6M"),
        ("-5M", r"not understood"),
    ],
)
def test_parse_params_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_params(text)


def test_parse_workers_range() -> None:
    assert parse_workers("64") == 64
    with pytest.raises(ValueError, match=r"workers '1' is outside 2..65536; .* --workers 64"):
        parse_workers("1")
    with pytest.raises(ValueError, match=r"workers 'many' is not a whole number; .* --workers 64"):
        parse_workers("many")


def test_json_output_has_every_method_split_and_a_recommendation(capsys) -> None:
    out = _advise_json(
        capsys,
        "--params",
        "25.6M",
        "--arch",
        "resnet",
        "--workers",
        "64",
        "--link",
        "10gbit",
        "--latency",
        "20us",
        "--device",
        "h200",
        "--density",
        "0.001",
    )
    assert out["inputs"] == {
        "params": 25_600_000,
        "workers": 64,
        "link_bps": 10**10,
        "latency_s": pytest.approx(20e-6),
        "device": "h200",
        "density": 0.001,
        "run_steps": DEFAULT_RUN_STEPS,
        "family": "image",
        "architecture": "resnet",
    }
    assert set(out["methods"]) == set(candidate_methods())
    assert "gs-estimate" not in out["methods"]
    for name, m in out["methods"].items():
        assert m["total"] == pytest.approx(m["compute"] + m["communication"] - m["hidden"]), name
        assert 0 <= m["hidden"] <= m["communication"]
        assert m["compute"] == pytest.approx(m["fwdbwd"] + m["compression"])
    rec = out["recommended"]
    totals = {n: m["total"] for n, m in out["methods"].items()}
    assert out["fastest_step"] == min(totals, key=totals.__getitem__)
    # the recommendation: measured reaching the target, and the fastest there or within
    # its margin of the one picked
    assert out["methods"][rec["name"]]["eligible"] and rec["why"]
    to_target = {n: m["to_target"]["seconds"] for n, m in out["methods"].items()
                 if m["eligible"]}
    fastest = min(to_target, key=to_target.__getitem__)
    margin = out["methods"][fastest]["margin"]["total"]
    assert to_target[fastest] * (1 + margin) >= to_target[rec["name"]] or rec["name"] == fastest
    for m in out["methods"].values():
        t, e = m["to_target"], m["evidence"]
        assert m["eligible"] == bool(e["reached"])
        assert m["margin"]["total"] == pytest.approx(m["margin"]["model_error"]
                                                     + m["margin"]["evidence_penalty"])
        if not m["eligible"]:
            assert t["steps"] is None and t["seconds"] is None
        else:
            assert t["steps"] == math.ceil(DEFAULT_RUN_STEPS * e["steps_ratio"])
            assert t["seconds"] == pytest.approx(t["steps"] * m["total"]
                                                 + m["warmup"]["extra_seconds"])
    assert rec["seconds_per_step"] == pytest.approx(totals[rec["name"]])
    assert rec["train_command"].startswith(f"gssgd train --method {rec['method']} --workers 64")
    assert out["model_error"] == held_out_error()
    assert out["evidence"]["caveats"] and out["evidence"]["model_size"] == {
        "16": 80_602, "64": 80_602}
    assert "H200" in out["device"]["summary"]


def test_the_recommendation_changes_with_the_link_rate(capsys) -> None:
    base = ("--params", "25.6M", "--arch", "resnet", "--workers", "16", "--latency", "5us")
    slow_advice = _advise_json(capsys, *base, "--link", "1gbit")["recommended"]
    fast = _advise_json(capsys, *base, "--link", "400gbit")["recommended"]["name"]
    slow = slow_advice["name"]
    # 1 Gbit/s: PowerSGD's factors (rank 4: its larger messages hide behind the backward
    # of every bucket but the last, as the per-bucket hook runs them)
    assert slow == "powersgd-r4"
    assert "--per-bucket --overlap buckets" in slow_advice["train_command"]
    assert "whole_model=False, overlap='buckets'" in slow_advice["call"]
    assert fast.startswith("dense")  # fast links: the all-reduce hides behind backward


def test_a_measured_cell_gets_a_recommendation_within_10_percent_of_the_fastest(capsys) -> None:
    """P = 4, d = 25M, 100 Mbit/s on this machine (studies/aggregation_grid/results): measured gTop-k
    1.57 s, local Top-k 1.79 s, gs with float32 tables (by the ring 1.85 s; by recursive
    doubling, gs-rd, slower), dense 13.5 s. With the run's own measured latency (1.05 ms)
    and no backward the step model ranks a Top-k method's step first."""
    out = _advise_json(
        capsys,
        "--params",
        "25M",
        "--arch",
        "resnet",
        "--methods",
        "dense,topk,gtopk,sketched,gs-rd",
        "--workers",
        "4",
        "--link",
        "100mbit",
        "--latency",
        "1.05ms",
        "--device",
        "cpu",
        "--compute-ms",
        "0",
    )
    assert out["fastest_step"] in ("gtopk", "topk")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--params", "25.6M", "--arch", "resnet", "--workers", "1", "--link", "10gbit"],
            r"workers '1' is outside 2..65536",
        ),
        (
            ["--params", "25.6M", "--arch", "resnet", "--workers", "8", "--link", "10gbps"],
            r"link rate '10gbps' is not understood",
        ),
        (
            ["--params", "25.6M", "--arch", "resnet", "--workers", "8", "--link", "800gbit"],
            r"outside 1mbit..400gbit; give a rate in that range, e.g. --link 10gbit",
        ),
        (
            ["--params", "25.6M", "--arch", "resnet", "--workers", "8", "--link", "10gbit", "--latency", "soon"],
            r"latency 'soon' is not understood",
        ),
        (
            ["--params", "2.5Q", "--arch", "resnet", "--workers", "8", "--link", "10gbit"],
            r"parameter count '2.5Q' is not understood",
        ),
        (
            ["--params", "25.6M", "--arch", "resnet", "--workers", "8", "--link", "10gbit", "--density", "2"],
            r"--density '2' must be a number in 1e-09..1; e.g. --density 0.001",
        ),
        (
            ["--params", "25.6M", "--arch", "resnet", "--workers", "8", "--link", "10gbit", "--device", "tpu"],
            r"unknown device 'tpu'; known devices: a100, cpu, h100, h200",
        ),
        (
            ["--params", "25.6M", "--arch", "resnet", "--workers", "8", "--link", "10gbit", "--compute-ms", "-3"],
            r"--compute-ms '-3' must be a number in 0..3.6e\+06",
        ),
        (
            ["--model", "vgg", "--workers", "8", "--link", "10gbit"],
            r"unknown model 'vgg'; shipped models are .*gpt.*, or give your own as "
            r"MODULE:FUNCTION .*or --params N with --arch",
        ),
        (
            ["--params", "25.6M", "--arch", "resnet", "--workers", "8", "--link", "10gbit",
             "--methods", "gs,foo"],
            r"unknown method\(s\) foo",
        ),
        (
            ["--params", "25.6M", "--workers", "8", "--link", "10gbit"],
            r"--params 25.6M needs --arch \(transformer, resnet\): PowerSGD's message",
        ),
        (
            ["--workers", "8", "--link", "10gbit"],
            r"give the model: --model NAME .*or --params N with --arch",
        ),
        (
            ["--model", "gpt", "--link", "10gbit"],
            r"--workers is required",
        ),
    ],
)
def test_bad_input_exits_2_with_the_value_the_range_and_the_fix(argv, message, capsys) -> None:
    assert main(["advise", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gssgd advise: error:")
    assert re.search(message, err), err


def test_text_report_shows_the_split_the_commands_and_the_error(capsys) -> None:
    assert (
        main(
            [
                "advise",
                "--model",
                "gpt",
                "--workers",
                "4",
                "--link",
                "100mbit",
                "--device",
                "cpu",
                "--latency",
                "1ms",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "gpt, 3,258,433 parameters (language family)" in text
    for column in ("step ms", "compute", "comm", "hidden", "MB/step", "target s", "margin",
                   "evidence"):  # fmt: skip
        assert column in text
    assert text.count("recommended:") == 1 and "use --method" not in text  # one pick
    assert "train:     gssgd train --method" in text and "DDP:       " in text
    assert "step model error, held out (median): the step by run" in text and "powersgd" in text
    assert "its communication alone by run" in text
    assert "by worker count" in text and "by size" in text
    assert "are unvalidated until a device measures them" in text
    # a GPT reads the transformer's study, not the LSTM's (the first by name), with its
    # caveat: every best at the lowest learning rate tried
    assert "evidence: character GPT (gpt-s)" in text and "its model:" not in text
    assert "caveat: P=16: 9 of 9 methods' best learning rate is an edge" in text
    assert "step time only: quality not measured for the language family:" in text


def test_an_unmeasured_or_missed_method_is_listed_never_recommended() -> None:
    """The GPT's cell at 16 workers: every measured gs, PowerSGD and local Top-k setting
    missed dense's loss + 3 %, and gs-small was never run: each steps faster than dense16,
    each is listed with its step time only, and dense16 (which reached) is the pick."""
    params = 124_000_000
    a = advise(params=params, workers=16, link=Link(10**9, 20e-6), device=get_device("h200"),
               density=0.001, shapes=layer_shapes("transformer", params), family="language",
               architecture="transformer")
    assert a.study is not None and a.study.name == "gpt-equal-budget"
    by_name = {c.name: c for c in a.candidates}
    assert a.recommended.name == "dense16" and a.recommended.eligible
    for name in ("gs-small", "gs", "powersgd-r1", "diloco-h100"):
        c = by_name[name]
        assert not c.eligible and c.target_seconds(a.run_steps) is None, name
        assert c.rank_key(a.run_steps)[0] > 0  # after every eligible one
        assert c.step.total < a.recommended.step.total  # faster, still not recommended
    assert not by_name["gs-small"].evidence.measured and "none of" in by_name["gs-small"].evidence.kin
    lstm = advise(params=params, workers=16, link=Link(10**9, 20e-6), device=get_device("h200"),
                  density=0.001, shapes=layer_shapes("transformer", params), family="language",
                  architecture="lstm")
    assert lstm.study is not None and lstm.study.name == "lstm-equal-budget"


def _variants(workers: int) -> tuple:
    a = _advise(workers=workers,
                methods=["gs-half", "gs-backend", "gs-rd", "dense16", "powersgd-r4"])
    return a, {c.name: c for c in a.candidates}


@pytest.mark.parametrize("workers", [8, 16])
def test_a_variant_equal_to_the_defaults_at_its_p_sets_nothing(workers: int) -> None:
    """gs's defaults are the ring and float16 tables at every P: gs-half and gs-backend are
    gs as it comes, so their commands carry no flags of their own."""
    a, by_name = _variants(workers)
    for name in ("gs-half", "gs-backend"):
        assert by_name[name].options() == {}, name
        assert a.train_command(by_name[name]) == \
            f"gssgd train --method gs --workers {workers} --density 0.001"


def test_hook_call_and_train_command_carry_a_variants_options() -> None:
    a, by_name = _variants(8)
    assert "--table-dtype float32" in a.train_command(by_name["gs-rd"])
    assert "table_dtype=torch.float32" in a.hook_call(by_name["gs-rd"])
    assert "--allreduce recursive_doubling" in a.train_command(by_name["gs-rd"])
    assert "--payload-dtype float16" in a.train_command(by_name["dense16"])
    assert "--density" not in a.train_command(by_name["dense16"])
    # the printed call builds: evaluate it with HookState and torch in scope
    import torch

    model = torch.nn.Linear(3, 2)
    for name, whole_model, overlap in (("gs-rd", True, "none"),
                                       ("powersgd-r4", False, "buckets")):  # overlapped
        state = eval(a.hook_call(by_name[name]),
                     {"HookState": HookState, "torch": torch, "ddp_model": model})
        assert isinstance(state, HookState)
        assert (state.whole_model, state.overlap) == (whole_model, overlap), name
    assert "--per-bucket --overlap buckets" in a.train_command(by_name["powersgd-r4"])
    assert "--powersgd-rank 4" in a.train_command(by_name["powersgd-r4"])
    assert "rank=4" in a.hook_call(by_name["powersgd-r4"])


def test_the_printed_error_is_the_predicting_models_on_the_committed_runs(held_out) -> None:
    """fit.json's held-out record recomputed from its committed runs (by run, by worker
    count, by size; missing runs fail, not skip), each method's and family's; the network
    advise predicts with is the one fitted there, and its error is what the report prints."""
    runs, _ = held_out
    got = held_out_recomputed(runs)
    stored = held_out_error()
    for key in ("runs", "recommended_within_10pct", "recommendation_runs"):
        assert stored[key] == got[key], key
    for by in HOLD_OUTS:
        assert stored[by]["points"] == got[by]["points"], by
        for key in ("median_abs_rel_error", "max_abs_rel_error"):
            assert stored[by][key] == pytest.approx(got[by][key], rel=1e-5), (by, key)
        for fam, err in got[by]["per_family"].items():
            assert stored[by]["per_family"][fam]["median_abs_rel_error"] == pytest.approx(
                err["median_abs_rel_error"], rel=1e-5), (by, fam)
        for fam, err in got[by]["communication"]["per_family"].items():
            assert stored[by]["communication"]["per_family"][fam][
                "median_abs_rel_error"] == pytest.approx(err["median_abs_rel_error"],
                                                         rel=1e-5), (by, fam)
        assert set(stored[by]["per_family"]) >= {"dense", "topk", "gtopk", "gs", "powersgd"}
        assert stored[by]["median_abs_rel_error"] <= 0.15, by  # the bar
    for fam in stored["run"]["per_family"]:
        assert margin_of(stored, fam) == max(
            stored[by]["communication"]["per_family"][fam]["median_abs_rel_error"]
            for by in HOLD_OUTS), fam
        assert stored["run"]["per_family"][fam]["median_abs_rel_error"] <= 0.25, fam
    net = fitted_network()  # the one model: what the link and the cores give, nothing more
    assert (net.round_s, net.software_s_per_byte) == (0.0, 0.0)
    cover = stored["validated_on"]
    assert cover["workers"] == [4, 8] and cover["d"] == [10**6, 10**7, 25 * 10**6]


def held_out_recomputed(runs: list[Path]) -> dict:
    return held_out(rated(m for r in runs for m in load_measurements(r)))


def test_streamed_gs_is_a_candidate_that_hides_its_table_all_reduce() -> None:
    """Streamed gs is priced with its own shape (40·k float32 columns, m = 32, every
    coordinate sketched) and the ring; the same spec unstreamed communicates as long."""
    link = Link(10**10, 20e-6)
    a = _advise(workers=8, link=link, methods=["gs-stream", "gs-backend"])
    by_name = {c.name: c for c in a.candidates}
    stream = by_name["gs-stream"]
    spec = stream.spec
    assert (spec.cols, spec.candidates, spec.table_bytes, spec.prefilter) == (
        40 * spec.k, 32, 4, 0)
    ring = predict_step(dataclasses.replace(spec, name="gs-backend"), 8, link,
                        get_device("h200"), cluster_network(get_device("h200")),
                        overlap="none")
    assert stream.step.overlap == "table" and ring.overlap == "none"
    assert stream.step.communication == pytest.approx(ring.communication)
    assert 0 < stream.step.hidden < stream.step.communication
    # the hook streams with that shape by itself: the command names the overlap only
    assert a.train_command(stream) == \
        "gssgd train --method gs --workers 8 --density 0.001 --overlap stream"
    assert a.hook_call(stream).endswith("warmup_steps=100, overlap='stream')")
    assert "gs-stream" in candidate_methods()


def test_the_warmup_counts_each_of_its_steps_own_bytes_and_a_run_includes_it() -> None:
    """By default every sparse candidate warms up as ``gssgd train`` does (100 steps); its
    bytes are the sum of each warm-up step's own traffic, and a run of ``run_steps`` adds
    the warm-up's extra time and bytes to the steady steps'."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    assert defaults["steps"] == DEFAULT_RUN_STEPS
    link, workers = Link(10**9, 20e-6), 6
    a = advise(params=2_000_000, workers=workers, link=link, device=get_device("h200"),
               shapes=layer_shapes("resnet", 2_000_000),
               methods=["dense", "topk", "gtopk", "sketched", "gs"])  # fmt: skip
    for c in a.candidates:
        w, spec = c.warmup, c.spec
        steady = traffic(spec, workers)
        assert w.step_bytes_sent == max(steady.sent)
        record = a.as_dict()["methods"][c.name]
        n = a.run_steps
        if c.name == "dense":
            assert w.steps == 0 and w.bytes_sent == 0 and w.extra_seconds == 0
            assert record["run"]["bytes_sent"] == n * max(steady.sent)
            continue
        assert w.steps == spec.warmup_steps == SPARSE_WARMUP_STEPS
        per_rank = [0] * workers
        for t in range(w.steps):
            sent = traffic(spec, workers, step=t).sent
            per_rank = [x + y for x, y in zip(per_rank, sent, strict=True)]
        assert w.bytes_sent == max(per_rank)
        assert w.extra_bytes_sent > 0 and w.extra_seconds > 0
        assert record["run"]["bytes_sent"] == max(per_rank) + (n - w.steps) * max(steady.sent)
        assert record["run"]["seconds"] == pytest.approx(n * c.step.total + w.extra_seconds)
        assert record["warmup"]["bytes_sent"] == w.bytes_sent
        assert "warmup_steps=100" in a.hook_call(c)  # the hook's own default is none
        assert "--warmup-steps" not in a.train_command(c)  # gssgd train's default


def test_no_warmup_when_asked_and_the_commands_say_so(capsys) -> None:
    a = advise(params=2_000_000, workers=6, link=Link(10**9, 20e-6), device=get_device("h200"),
               shapes=layer_shapes("resnet", 2_000_000), methods=["gs", "topk"],
               warmup_steps=0, run_steps=50)  # fmt: skip
    for c in a.candidates:
        assert c.warmup.steps == 0 and c.warmup.extra_seconds == 0
        assert c.run_seconds(50) == pytest.approx(50 * c.step.total)
        assert "--warmup-steps 0" in a.train_command(c)
        assert "warmup_steps" not in a.hook_call(c)
    out = _advise_json(capsys, "--params", "2M", "--arch", "resnet", "--workers", "6", "--link",
                       "1gbit", "--methods", "gs", "--warmup-steps", "10", "--steps", "40")
    gs = out["methods"]["gs"]
    assert gs["warmup"]["steps"] == 10 and out["inputs"]["run_steps"] == 40
    assert gs["run"]["seconds"] == pytest.approx(40 * gs["total"] + gs["warmup"]["extra_seconds"])
    assert main(["advise", "--params", "2M", "--arch", "resnet", "--workers", "6", "--link",
                 "1gbit", "--warmup-steps", "-1"]) == 2
    assert "--warmup-steps '-1' must be a whole number >= 0" in capsys.readouterr().err


#: The audit's five cells (issue #46): workers, link, params, architecture.
AUDIT = [(8, "1gbit", "25.6M", "resnet"), (32, "1gbit", "25.6M", "resnet"),
         (32, "1gbit", "125M", "transformer"), (8, "1gbit", "1.3B", "transformer"),
         (128, "10gbit", "1.3B", "transformer")]


@pytest.mark.parametrize(("workers", "link", "params", "arch"), AUDIT)
def test_the_pick_is_what_the_cost_model_prices_fastest_powersgd_included(
        capsys, workers: int, link: str, params: str, arch: str) -> None:
    out = _advise_json(capsys, "--params", params, "--arch", arch, "--workers", str(workers),
                       "--link", link)
    methods = out["methods"]
    for name in ("powersgd", "powersgd-r1", "powersgd-r4"):
        assert methods[name]["total"] > 0 and methods[name]["bytes_sent_per_step"] > 0
    assert methods[out["recommended"]["name"]]["eligible"]  # measured reaching the target
    for m in methods.values():  # nothing without measured steps has a time to the target
        if m["to_target"]["seconds"] is not None:
            assert m["eligible"] and m["evidence"]["steps_ratio"] is not None
    if arch == "resnet" and workers == 32:  # measured at P = 16 and 64: PowerSGD's rank 4
        assert out["best_measured"] == "powersgd-r4"  # (its messages overlap the backward)


def test_far_from_the_evidence_the_nearest_answers_with_its_distance(capsys) -> None:
    """124M transformer at 128 workers: the GPT's study ran P = 16 only; the lookup takes
    P = 16, says 8x the workers, and its penalty widens the margin; a method the study did
    not run says what it measured of the same method."""
    far = _advise_json(capsys, "--params", "124M", "--arch", "transformer", "--workers",
                       "128", "--link", "10gbit", "--density", "0.01")
    topk = far["methods"]["topk"]
    assert topk["evidence"]["measured_at_workers"] == 16
    assert topk["evidence"]["workers_factor"] == 8 and topk["evidence"]["confidence"] == "far"
    assert topk["evidence"]["reached"] is False  # +10.0 % on the GPT
    assert topk["margin"]["evidence_penalty"] == pytest.approx(
        0.15 + 0.05 * math.log10(124_000_000 / 434_772))
    image = _advise_json(capsys, "--model", "cnn", "--workers", "16", "--link", "1gbit")
    assert image["methods"]["powersgd"]["evidence"]["steps_ratio"] is not None  # rank 2
    assert image["methods"]["diloco-h30"]["evidence"]["not_measured_because"] == \
        "diloco-h30 was not run in mnist-lr-grid"
    assert image["methods"]["diloco-h30"]["evidence"]["its_method_measured"] is None
    # a gs shape the study did not run: what it did measure of gs at the nearest P
    kin = image["methods"]["gs-stream"]["evidence"]["its_method_measured"]
    assert kin.startswith("its measured gs settings at P=16: ")


def test_local_steps_pay_their_outer_step_every_h_steps() -> None:
    a = _advise(workers=32, methods=["dense", "diloco-h10", "diloco-h100"])
    by = {c.name: c for c in a.candidates}
    dense, h10, h100 = by["dense"], by["diloco-h10"], by["diloco-h100"]
    assert h10.step.bandwidth == pytest.approx(dense.step.bandwidth / 10)
    assert h100.step.latency == pytest.approx(dense.step.latency / 100)
    assert h10.step.hidden == 0.0 and h10.step.fwdbwd == dense.step.fwdbwd
    assert h10.warmup.step_bytes_sent == dense.warmup.step_bytes_sent // 10
    assert a.train_command(h10).endswith("--local-steps 10")
    assert a.hook_call(h100) == "LocalSteps(model, 'dense', local_steps=100)"


#: The issue's grid: ResNet-50, GPT-2 and a 1.3B transformer, 8/32/128 workers, 1/10/25
#: Gbit/s links on H200s.
GRID_MODELS = {"resnet-50": (25_557_032, "resnet", "image"),
               "gpt-2": (124_439_808, "transformer", "language"),
               "1.3B": (1_300_000_000, "transformer", "language")}


def _grid_advice(params: int, arch: str, family: str, workers: int, gbit: float):
    return advise(params=params, workers=workers, link=Link(int(gbit * 10**9), 20e-6),
                  device=get_device("h200"), shapes=layer_shapes(arch, params), family=family,
                  architecture=arch)


@pytest.mark.parametrize("model", sorted(GRID_MODELS))
def test_no_recommendation_on_the_grid_lacks_measured_steps(model: str) -> None:
    params, arch, family = GRID_MODELS[model]
    for workers in (8, 32, 128):
        for gbit in (1, 10, 25):
            a = _grid_advice(params, arch, family, workers, gbit)
            rec = a.recommended
            assert rec.eligible and rec.evidence.steps_ratio is not None, (workers, gbit)
            assert rec.name in {c.name for c in a.candidates if c.evidence.measured}


def test_resnet_50_is_recommended_a_measured_method_and_diloco_only_priced(capsys) -> None:
    assert main(["advise", "--params", "25.6M", "--arch", "resnet", "--workers", "32",
                 "--link", "1gbit"]) == 0
    text = capsys.readouterr().out
    rec = re.search(r"^recommended: (\S+)", text, re.M)
    assert rec and rec.group(1) in ("powersgd", "powersgd-r4", "dense16", "dense")
    unmeasured = text.split("step time only: quality not measured for the image family:")[1]
    unmeasured = unmeasured.split("recommended:")[0]
    for h in (10, 30, 100):
        assert f"diloco-h{h} " in unmeasured  # priced, never recommended
    assert "--local-steps" not in text.split("recommended:")[1]


def test_neighbouring_worker_counts_keep_the_pick_and_its_verdicts() -> None:
    """GPT-2 at 10 Gbit/s: the same pick at 32 and 33 workers (it flipped to PowerSGD rank
    1, measured missing the target, at twice the measured P before); and across P = 2..200
    the set of recommendable methods does not change with P (the verdict holds at every
    measured P), so only the step model can move the pick."""
    params, arch, family = GRID_MODELS["gpt-2"]
    at = {p: _grid_advice(params, arch, family, p, 10) for p in (32, 33)}
    assert at[32].recommended.name == at[33].recommended.name
    params, arch, family = GRID_MODELS["resnet-50"]
    sets = {frozenset(c.name for c in _grid_advice(params, arch, family, p, 10).candidates
                      if c.eligible) for p in (2, 7, 16, 31, 33, 64, 65, 200)}
    assert len(sets) == 1 and {"dense", "dense16", "powersgd"} <= next(iter(sets))


def test_a_7b_model_on_400gbit_links_gets_dense_or_dense16() -> None:
    """No algorithm switch for a step inside the model's error (DiLoCo was picked for a
    0.05 % shorter step)."""
    a = _grid_advice(7_000_000_000, "transformer", "language", 64, 400)
    assert a.recommended.name in ("dense", "dense16")


def test_within_its_margin_the_simpler_method_is_picked() -> None:
    """A study (the user's own) where dense, dense16 and PowerSGD rank 2 all reached the
    target in dense's steps: at 1 Gbit/s PowerSGD's step is many times faster and it is
    picked; with a margin wider than its lead, the simpler dense16 is, said so."""
    same = {"seeds": 3, "gap": 0.0, "steps_ratio": 1.0}
    study = Study("mine", "my study", "image", "steps", "dense - 0.5 point",
                  {8: {"dense": same, "dense16": same, "powersgd-r2": same}},
                  d={8: 25_600_000})
    a = _advise(workers=8, study=study, methods=["dense", "dense16", "powersgd", "gs"])
    by = {c.name: c for c in a.candidates}
    assert a.recommended.name == "powersgd" and "beyond its margin" in a.why
    assert by["powersgd"].evidence.penalty == 0.0  # the same P and size: no distance
    assert not by["gs"].eligible  # not in the study: priced, never picked
    lead = (by["dense16"].target_seconds(a.run_steps)
            / by["powersgd"].target_seconds(a.run_steps))
    wide = dataclasses.replace(by["powersgd"], comm_error=1e3)  # a margin past its lead
    assert wide.margin > lead - 1
    chosen, why = pick([by["dense"], by["dense16"], wide, by["gs"]], a.run_steps)
    assert chosen.name in ("dense16", "dense") and why.startswith("within the model's error")


def test_the_advise_study_advise_loop_on_a_users_own_model(tmp_path, monkeypatch,
                                                           capsys) -> None:
    """advise writes a study spec for the user's MODULE:FUNCTION model and workers;
    gssgd study runs it; advise --evidence recommends from what it measured."""
    monkeypatch.chdir(ROOT)  # examples/ is importable from the working directory
    spec = tmp_path / "mine.toml"
    model = ["--model", "examples.user_model:mlp", "--dataset", "examples.user_model:blobs",
             "--workers", "3", "--link", "1gbit", "--steps", "30"]
    assert main(["advise", *model, "--study-spec", str(spec), "--study-methods", "1",
                 "--study-budget", "1", "--study-seeds", "1"]) == 0
    assert f"wrote {spec}" in capsys.readouterr().out
    text = spec.read_text()
    assert 'model = "examples.user_model:mlp"' in text and "workers = 3" in text
    assert "[methods.dense]" in text and "[methods.dense16]" in text
    assert text.count("lr = { low = 0.01, high = 0.5, log = true }") == 3  # one range for all
    out = tmp_path / "study"
    assert main(["study", str(spec), "--out", str(out)]) == 0
    capsys.readouterr()
    advice = _advise_json(capsys, *model, "--evidence", str(out))
    assert advice["evidence"]["title"].startswith("your study")
    assert advice["inputs"]["params"] == 1_604
    rec = advice["methods"][advice["recommended"]["name"]]
    assert rec["eligible"] and rec["evidence"]["measured_at_workers"] == 3
    assert rec["evidence"]["workers_factor"] == 1 and rec["evidence"]["size_factor"] == 1
    measured = {n for n, m in advice["methods"].items() if m["evidence"]["measured_at_workers"]}
    assert {"dense", "dense16"} <= measured and len(measured) >= 3
    assert main(["advise", *model, "--evidence", str(tmp_path / "nothing")]) == 2
    assert "holds no summary.json" in capsys.readouterr().err


def test_a_users_model_is_named_module_function_with_or_without_its_data(capsys) -> None:
    with_data = _advise_json(capsys, "--model", "examples.user_model:mlp", "--dataset",
                             "examples.user_model:blobs", "--workers", "4", "--link", "1gbit")
    assert with_data["inputs"]["params"] == 20 * 64 + 64 + 64 * 4 + 4
    stand_in = _advise_json(capsys, "--model", "examples.user_model:mlp", "--workers", "4",
                            "--link", "1gbit")  # MNIST-shaped stand-in images
    assert stand_in["inputs"]["params"] == 784 * 64 + 64 + 64 * 10 + 10
    assert stand_in["inputs"]["family"] == "image"
    assert main(["advise", "--model", "nosuchmodule:net", "--workers", "4", "--link",
                 "1gbit"]) == 2
    assert "cannot be imported" in capsys.readouterr().err


def test_the_device_line_says_what_is_derived_or_estimated(capsys) -> None:
    base = ["advise", "--params", "25.6M", "--arch", "resnet", "--workers", "8", "--link",
            "1gbit"]
    assert main([*base, "--device", "h100"]) == 0
    assert "derived from the H200's measurement by datasheet ratios; not measured" in \
        capsys.readouterr().out
    assert main([*base, "--device", "h200"]) == 0
    assert "estimated, not measured" in capsys.readouterr().out
