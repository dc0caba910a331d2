"""The method's own options in a training run: the config holds them in one place
(``options``, by the options dataclass's field names); ``--opt NAME=VALUE`` passes any option
of the chosen method (a plugin's new one too) to every rank's aggregator, the named flags
write the same options, saved configs of earlier versions load, and a bad ``--opt`` is
refused with the option, the value, the valid options and the fix."""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from gssgd.cli.main import build_parser, main
from gssgd.cli.train import settings_from_args
from gssgd.methods import register_method, unregister_method
from gssgd.train.config import TrainConfig
from gssgd.train.method_settings import (
    check_settings_apply,
    coerce_option,
    merge_opts,
    parse_opt,
    settings_for,
    typed_options,
)

PLUGIN = "tests.train.toy_levels"
QUICK = ["--dataset", "digits", "--batch-size", "16", "--no-progress", "--timeout", "60",
         "--eval-every", "0"]


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The toy plugin registered here (and by ``--plugin`` in every worker); its
    aggregators record the ``levels`` they got in the returned directory."""
    module = importlib.import_module(PLUGIN)
    register_method(module.METHOD, replace=True)
    record = tmp_path / "record"
    record.mkdir()
    monkeypatch.setenv(module.RECORD_ENV, str(record))
    yield record
    unregister_method(module.METHOD.name)


def _recorded(record: Path) -> list[int]:
    return [json.loads(p.read_text())["levels"] for p in sorted(record.iterdir())]


def _opts(*pairs: str) -> list[str]:
    return [a for pair in pairs for a in ("--opt", pair)]


# --------------------------------------------------------------------------- end to end


def test_a_plugin_option_trains_through_gssgd_train_on_gloo_workers(toy: Path,
                                                                    tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = main(["train", "--plugin", PLUGIN, "--method", "toylevels", *_opts("levels=16"),
                 *QUICK, "--workers", "2", "--steps", "4", "--out", str(out)])
    assert code == 0
    assert _recorded(toy) == [16, 16]  # both ranks' aggregators got the new option
    saved = json.loads((out / "config.json").read_text())
    assert saved["options"] == {"levels": 16}
    assert TrainConfig.from_saved(saved).options == {"levels": 16}


def test_a_plugin_option_reaches_compare_and_the_simulated_world(toy: Path,
                                                                 tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    code = main(["compare", "--plugin", PLUGIN, "--methods", "dense,toylevels",
                 *_opts("levels=32"), "--simulate", "--workers", "3", *QUICK, "--steps", "3",
                 "--out", str(out)])
    assert code == 0
    assert set(_recorded(toy)) == {32}
    assert json.loads((out / "dense" / "config.json").read_text())["options"] == {}
    assert json.loads((out / "toylevels" / "config.json").read_text())["options"] == {
        "levels": 32}


def test_a_builtin_option_without_a_flag_reaches_the_aggregator() -> None:
    cfg = TrainConfig(method="gs", dataset="digits", options={"nonfinite": "skip"})
    assert cfg.options == {"nonfinite": "skip", "warmup_steps": 100}  # and the recipe's
    assert cfg.aggregator_options()["nonfinite"] == "skip"
    assert cfg.hook_settings().options["nonfinite"] == "skip"


def test_opt_seed_overrides_the_run_seed_for_the_aggregator_only(toy: Path) -> None:
    randomk = pytest.importorskip("examples.randomk")
    register_method(randomk.METHOD, replace=True)
    try:
        cfg = TrainConfig(method="randomk", dataset="digits", seed=5, options={"seed": "3"})
        assert cfg.seed == 5 and cfg.aggregator_options()["seed"] == 3
        assert TrainConfig(method="randomk", dataset="digits", seed=5
                           ).aggregator_options()["seed"] == 5
    finally:
        unregister_method("randomk")


# --------------------------------------------------------------------------- old flags


@pytest.mark.parametrize(("method", "flags", "opts"), [
    ("gs", ["--rows", "3"], ["rows=3"]),
    ("gs", ["--no-exact"], ["exact=false"]),
    ("gs", ["--table-dtype", "float16"], ["table_dtype=float16"]),
    ("gs", ["--density", "0.05", "--cols", "600"], ["density=0.05", "cols=600"]),
    ("topk", ["--k", "7", "--feedback", "ef21"], ["k=7", "feedback=ef21"]),
    ("topk", ["--local-momentum", "0.9"], ["momentum=0.9"]),
    ("topk", ["--warmup-steps", "0", "--local-clip", "1"], ["warmup_steps=0", "local_clip=1"]),
    ("dense", ["--payload-dtype", "float16"], ["dtype=float16"]),
    ("powersgd", ["--powersgd-rank", "4"], ["rank=4"]),
    ("powersgd", ["--powersgd-rank", "4"], ["matrix_approximation_rank=4"]),  # an alias
])
def test_a_named_flag_is_the_same_option_as_opt(method: str, flags: list[str],
                                                opts: list[str]) -> None:
    parser = build_parser()
    configs = [
        TrainConfig.build(method, **settings_from_args(
            parser.parse_args(["train", "--method", method, "--dataset", "digits", *argv])))
        for argv in (flags, _opts(*opts), flags + _opts(*opts))  # both ways, agreeing: fine
    ]
    assert configs[0] == configs[1] == configs[2]
    assert configs[0].aggregator_options() == configs[1].aggregator_options()
    name = opts[0].split("=")[0]
    assert configs[0].option({"matrix_approximation_rank": "rank"}.get(name, name)) is not None


def test_the_options_sit_in_one_mapping_and_named_flags_write_it() -> None:
    cfg = TrainConfig.build(method="gs", dataset="digits", rows=3, cols=600, exact=False)
    assert cfg == TrainConfig(method="gs", dataset="digits",
                              options={"rows": "3", "cols": 600, "exact": False})
    assert (cfg.option("rows"), cfg.option("cols"), cfg.option("exact")) == (3, 600, False)
    assert not {"rows", "density", "local_momentum"} & {f.name for f in dataclasses.fields(cfg)}
    fields = dataclasses.fields(TrainConfig)
    assert fields[-1].name == "options" and fields[-1].kw_only  # by keyword, last in config.json
    assert list(dataclasses.asdict(cfg))[-1] == "options"
    # the named flags' options under the options' own names
    topk = TrainConfig.build(method="topk", local_momentum=0.9, k=7)
    assert (topk.option("momentum"), topk.option("k")) == (0.9, 7)
    assert TrainConfig.build(method="powersgd", powersgd_rank=4).option("rank") == 4
    assert TrainConfig.build(method="torch-powersgd", powersgd_rank=4).option("rank") == 4


def test_a_typed_dtype_is_kept_by_name() -> None:
    typed = TrainConfig(method="dense", options={"dtype": torch.float16})
    assert typed.options == {"dtype": "float16"}
    assert typed == TrainConfig.build(method="dense", payload_dtype="float16")
    assert typed.aggregator_options()["dtype"] is torch.float16
    assert json.loads(json.dumps(dataclasses.asdict(typed)))["options"] == {"dtype": "float16"}


def test_saved_configs_load_old_and_new() -> None:
    cfg = TrainConfig.build(method="gs", dataset="digits", rows=3, cols=600, exact=False)
    saved = json.loads(json.dumps({**dataclasses.asdict(cfg), "world_size": 2, "d": 100}))
    assert TrainConfig.from_saved(saved) == cfg
    # a config.json of an earlier version: the options as fields of their own
    old = {k: v for k, v in saved.items() if k != "options"}
    old |= {"rows": 3, "cols": 600, "exact": False, "warmup_steps": 100, "density": None,
            "local_momentum": None, "powersgd_rank": None}
    assert TrainConfig.from_saved(old) == cfg
    assert TrainConfig.from_saved({**old, "options": None}) == cfg


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(("argv", "match"), [
    (["--method", "toylevels", *_opts("levels=many")],
     r"--opt levels=many is invalid: option 'levels' takes an integer, for example "
     r"--opt levels=3\. The options of 'toylevels': .*levels"),
    (["--method", "toylevels", *_opts("level=16")],
     r"--opt level=16 is invalid: method 'toylevels' has no option 'level'.*options of "
     r"'toylevels': .*levels"),
    (["--method", "toylevels", *_opts("levels=0")],
     r"--opt levels=0 is invalid: it must be an integer in \[1, 127\]\. For example "
     r"levels=16\. \(--method toylevels\)"),
    (["--method", "toylevels", *_opts("levels=3", "levels=4")], r"two values; give it once"),
    (["--method", "gs", "--rows", "3", *_opts("rows=5")],
     r"--rows 3 and --opt rows=5 give the option 'rows' of 'gs' two values"),
    (["--method", "gs", *_opts("exact=maybe")], r"'exact' takes true or false"),
    (["--method", "ddp-fp16", *_opts("rows=3")], r"has no options dataclass.*Drop --opt"),
])
def test_bad_opt_is_refused_with_the_fix(toy: Path, argv: list[str], match: str,
                                         capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--plugin", PLUGIN, "--dataset", "digits", *argv]) == 2
    assert re.search(match, capsys.readouterr().err)


@pytest.mark.parametrize("argv", [["--density", "nan"], _opts("density=nan"),
                                  ["--density", "nan", *_opts("density=nan")]])
def test_a_nan_density_is_one_line_naming_its_range(argv: list[str],
                                                    capsys: pytest.CaptureFixture) -> None:
    """NaN is not equal to itself: it took the "given twice" path into a KeyError."""
    assert main(["train", "--dataset", "digits", "--method", "gs", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "--density=nan is invalid: it must be a number in (0, 1]" in err, err


def test_opt_without_a_value_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(["train", "--opt", "rows"])
    assert info.value.code == 2
    assert "--opt 'rows' is not NAME=VALUE" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not NAME=VALUE"):
        parse_opt("=3")


def test_compare_refuses_an_option_no_method_takes() -> None:
    with pytest.raises(ValueError, match=r"--opt rows=3 does not apply to --methods dense,topk"):
        check_settings_apply({"options": {"rows": "3"}}, ["dense", "topk"])
    both = {"options": {"rows": "3"}, "lr": 0.1}
    check_settings_apply(both, ["dense", "gs"])
    assert settings_for("dense", both) == {"options": None, "lr": 0.1}
    assert settings_for("gs", both) == {"options": {"rows": "3"}, "lr": 0.1}


def test_values_are_read_as_the_option_field_type() -> None:
    assert coerce_option("gs", "cols", "none") is None
    assert coerce_option("gs", "exact", "Yes") is True
    assert coerce_option("topk", "momentum", "1") == 1.0
    assert coerce_option("topk", "local_clip", "1e-3") == 1e-3
    assert coerce_option("gs", "guard", "raise") == "raise"
    assert coerce_option("gs", "rows", 5) == 5  # typed values are kept for the dataclass
    assert typed_options("dense", {"dtype": "bfloat16", "nonfinite": "skip"}) == {
        "nonfinite": "skip", "dtype": "bfloat16"}
    assert typed_options("powersgd", {"matrix_approximation_rank": "3"}) == {"rank": 3}
    assert typed_options("gs", {"cols": None, "rows": "3"}) == {"rows": 3}  # None: default
    assert merge_opts([("rows", "3"), ("rows", "3")]) == {"rows": "3"}
    assert merge_opts([]) is None


def test_bench_train_passes_the_options_on_as_opt_flags() -> None:
    from gssgd_lab.train_bench_config import train_flags

    assert train_flags({"options": {"levels": 16, "exact": False}}) == [
        "--opt", "levels=16", "--opt", "exact=False"]
