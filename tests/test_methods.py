"""The method registry: one entry per method, read by every layer.

A toy method (random-k with error feedback, ``examples/randomk.py``, outside the package)
is registered and then used through every way in: ``make_aggregator``, the DDP hook via
``gssgd train`` (spawned gloo workers that import the plugin), the CLI entry point, the cost
model. Every registered aggregator's ``traffic`` formula is checked against what its
``step`` really sends, on real gloo processes (P = 3, 4 and 5: subgroups of one spawn).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import gssgd
from gssgd.cli.main import main
from gssgd.comm import ring_allreduce
from gssgd.costmodel import method_spec, traffic
from gssgd.costmodel.devices import get_device
from gssgd.methods import (
    BENCH_VARIANTS,
    METHODS,
    Method,
    Variant,
    applies_to,
    get_method,
    get_variant,
    parse_methods,
    register_method,
    unregister_method,
)
from gssgd.train.config import TrainConfig
from gssgd.train.loop import run_training
from gssgd.train.method_settings import setting_applies_to
from gssgd.train.metrics import read_metrics
from tests.dist_utils import raise_worker_errors, run_on_prefixes, run_workers

PLUGIN = "examples.randomk"


@pytest.fixture()
def randomk():
    """The toy method, registered for the test and removed after it."""
    import examples.randomk as module

    register_method(module.METHOD, replace=True)
    yield module
    unregister_method("randomk")


# ---------------------------------------------------------------------------- the registry


def test_every_name_has_one_code_path() -> None:
    assert list(gssgd.AGGREGATORS) == ["dense", "topk", "gtopk", "sketched", "gs", "powersgd"]
    builtins = [m.name for m in METHODS.values() if m.is_builtin]
    assert builtins == ["ddp-allreduce", "ddp-fp16", "torch-powersgd"]
    for name, cls in gssgd.AGGREGATORS.items():
        assert METHODS[name].aggregator is cls and cls.name == name
    bench = [n for n, (m, _) in BENCH_VARIANTS.items() if not m.is_builtin]
    assert bench == ["dense", "dense16", "topk", "gtopk", "gtopk-tree", "sketched", "gs",
                     "gs-backend", "gs-rd", "gs-hd", "gs-estimate", "gs-small", "gs-half",
                     "powersgd", "powersgd-r1", "powersgd-r4"]


def test_settings_apply_by_the_options_the_method_takes() -> None:
    assert applies_to("rows") == ("sketched", "gs")
    assert applies_to("table_dtype") == applies_to("prefilter") == ("sketched", "gs")
    assert applies_to("dtype") == ("dense",)
    assert set(applies_to("density")) == {"topk", "gtopk", "sketched", "gs"}
    assert setting_applies_to("local_momentum") == ("topk", "gtopk", "sketched", "gs", "powersgd")
    assert setting_applies_to("payload_dtype") == ("dense",)
    assert "torch-powersgd" in setting_applies_to("start_iter")
    assert "powersgd" in setting_applies_to("start_iter")
    # gssgd's PowerSGD takes the rank as its option, PyTorch's hook as a training setting
    assert setting_applies_to("powersgd_rank") == ("powersgd", "torch-powersgd")
    assert "powersgd" not in applies_to("density")
    assert "ddp-allreduce" not in setting_applies_to("start_iter")


def test_method_lists_are_parsed_in_one_place() -> None:
    assert parse_methods("gs, topk,gs") == ("gs", "topk")
    with pytest.raises(ValueError, match=r"unknown method\(s\) adam; give a comma-separated"):
        parse_methods("dense,adam")
    with pytest.raises(ValueError, match="no method given"):
        parse_methods(" , ")
    with pytest.raises(ValueError, match="ddp-fp16"):
        parse_methods("dense16", valid=METHODS)
    with pytest.raises(ValueError, match="unknown benchmark method 'torch-powersgd'"):
        get_variant("torch-powersgd")
    with pytest.raises(ValueError, match="PyTorch's own PowerSGD hook is torch-powersgd"):
        parse_methods("pytorch-powersgd", valid=METHODS)
    assert get_variant("gs-half")[0].name == "gs"


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Method("", "x"), "non-empty string"),
        (lambda: Method("a,b", "x"), "without commas"),
        (lambda: Method("x", "x", aggregator=int), "subclass of gssgd.Aggregator"),
        (lambda: register_method(Method("gs", "again", METHODS["gs"].aggregator)),
         "registered already"),
        (lambda: register_method(Method("gs2", "x", METHODS["gs"].aggregator)),
         "has name='gs'"),
        (lambda: register_method(Method("y", "x", variants=(Variant("gs-half", "x"),))),
         "is taken by method 'gs'"),
    ],
)
def test_bad_registrations_say_what_to_change(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()
    assert "y" not in METHODS and "gs2" not in METHODS


# ---------------------------------------------------------------------------- a new method


def test_a_registered_method_reaches_every_layer(randomk) -> None:
    assert get_method("randomk").aggregator is randomk.RandomK
    assert gssgd.AGGREGATORS["randomk"] is randomk.RandomK
    assert set(applies_to("density")) >= {"randomk"}
    assert "randomk" not in setting_applies_to("local_momentum")  # it takes no momentum
    spec = method_spec("randomk", 10_000, density=0.01)
    flag, ring = (4 - 1) * 4, ring_allreduce(4 * 100, 4)  # the flag's all-gather, k floats
    assert spec.k == 100 and traffic(spec, 4).sent[0] == flag + ring.sent[0]
    # no calibration of its own yet: the cost model uses topk's compute law
    cpu = get_device("cpu")
    assert cpu.compression_seconds(spec) == cpu.compression_seconds(
        method_spec("topk", 10_000, density=0.01))
    assert parse_methods("gs,randomk") == ("gs", "randomk")
    with pytest.raises(ValueError, match="seed=-1 is invalid"):
        gssgd.make_aggregator("randomk", 100, seed=-1)
    unregister_method("randomk")
    assert "randomk" not in gssgd.AGGREGATORS and "randomk" not in BENCH_VARIANTS


def test_a_registered_method_trains_through_the_hook(tmp_path: Path, randomk) -> None:
    # --plugin makes every spawned worker import (and so register) the method too
    cfg = TrainConfig.build(method="randomk", plugins=(PLUGIN,), dataset="digits", workers=2,
                      steps=20, batch_size=16, lr=0.2, momentum=0.0, density=0.25,
                      eval_every=0, progress=False, out=str(tmp_path), timeout=60.0)
    summary = run_training(cfg)
    assert summary is not None and summary["status"] == "completed"
    d = summary["d"]
    k = max(1, round(0.25 * d))
    # a compressed step (after the first, which checks rank agreement) sends the flag and
    # a ring all-reduce of k values (P = 2)
    last = read_metrics(tmp_path / "metrics.jsonl")[-1]
    assert last["bytes_sent"] == 4 + (2 * 1 * 4 * k) // 2
    assert summary["final_test_accuracy"] > 0.3  # it learns (chance: 0.1)


def test_a_registered_method_runs_from_the_command_line(tmp_path: Path, randomk) -> None:
    out = tmp_path / "cli"
    code = main(["train", "--plugin", PLUGIN, "--method", "randomk", "--dataset", "digits",
                 "--workers", "2", "--steps", "6", "--batch-size", "16", "--k", "50",
                 "--eval-every", "0", "--no-progress", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "randomk" and summary["status"] == "completed"


# ---------------------------------------------------------------------------- traffic


def _measured_traffic(
    rank: int, world_size: int, names: list[str], group: dist.ProcessGroup | None = None
) -> dict[str, tuple]:
    import examples.randomk  # noqa: F401  (registers randomk in this worker)

    out = {}
    d = 3_000
    for name in names:
        spec = method_spec(name, d, density=0.01, rows=3)
        agg = gssgd.make_aggregator(spec.aggregator, d, group=group, **spec.aggregator_options())
        gen = torch.Generator().manual_seed(rank)
        for _ in range(2):  # the first step adds the rank-agreement check
            agg.step(torch.randn(d, generator=gen))
        s = agg.last_stats
        out[name] = (s.bytes_sent, s.bytes_received, s.rounds, s.messages, s.messages_received)
    return out


TRAFFIC_SIZES = [3, 4, 5]



@cache
def _traffic_results(names: tuple[str, ...]) -> list[dict[int, dict[str, tuple]]]:
    results = run_workers(
        max(TRAFFIC_SIZES), run_on_prefixes, _measured_traffic, TRAFFIC_SIZES, list(names)
    )
    raise_worker_errors(results)
    return results


@pytest.mark.parametrize("world_size", TRAFFIC_SIZES)
def test_every_traffic_formula_is_what_the_step_sends(world_size: int, randomk) -> None:
    """P = 5 on the whole world, P = 3 and 4 on subgroups of it (group-local ranks): bytes,
    rounds and messages each way."""
    names = [n for n, (m, _) in BENCH_VARIANTS.items() if not m.is_builtin]
    assert "randomk" in names
    ranks = _traffic_results(tuple(names))[:world_size]
    results = [per_size[world_size] for per_size in ranks]
    assert len(results) == world_size
    for name in names:
        # no built-in method pays a flag exchange of its own (its flags ride in its first
        # message); a plugin that all-gathers them (randomk) counts P - 1 rounds for it
        method = BENCH_VARIANTS[name][0]
        control = method.aggregator.control_traffic(world_size).rounds
        assert control == (0 if method.name != "randomk" else world_size - 1), name
        want = traffic(method_spec(name, 3_000, density=0.01, rows=3), world_size)
        for rank, got in enumerate(results):
            assert got[name] == (want.sent[rank], want.received[rank], want.rounds,
                                 want.messages[rank], want.messages_received[rank]), (name, rank)
