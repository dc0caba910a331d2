"""What one ``gssgd bench train`` run trains: :class:`TrainBenchConfig`, and the
``gssgd train`` command line of each method's run (:func:`train_argv`).

The configuration runs the trainer's own checks for every method when it is made, so a
bad setting fails before anything trains; each method's run is then one ``gssgd train``
whose flags are the settings that differ from the trainer's defaults.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gssgd.methods import TRAIN_BENCH_METHODS
from gssgd_lab.cluster import parse_link_rate

__all__ = ["DEFAULT_METHODS", "TrainBenchConfig", "train_argv", "train_flags"]

#: What ``gssgd bench train`` runs unless told otherwise: the fastest dense baseline (DDP's
#: own all-reduce, which overlaps with the backward pass) and the sparse methods.
DEFAULT_METHODS: tuple[str, ...] = TRAIN_BENCH_METHODS
#: Settings always written into the reproducing command (bench train's own defaults).
_ALWAYS = ("workers", "dataset", "model", "steps", "batch_size", "eval_every", "device")
#: TrainConfig fields a benchmark sets per method itself.
_PER_METHOD = ("method", "out", "resume", "overwrite", "fail_at", "stall_at")


@dataclass(frozen=True)
class TrainBenchConfig:
    """One ``gssgd bench train`` run.

    Attributes:
        settings: :meth:`gssgd.train.config.TrainConfig.build` keyword arguments shared by every
            method (``workers``, ``dataset``, ``model``, ``steps``, ``batch_size``,
            ``density``, ``eval_every``, ...); method-specific ones go to the methods that
            take them. Not ``method``, ``out``, ``resume``, ``overwrite``, ``fail_at``.
        methods: ``gssgd train --method`` names, run in this order.
        link: every worker's link rate ("100mbit", "1gbit", ...) or "none" for loopback.
        target_accuracy: the test accuracy whose first reaching is timed, in (0, 1].
        timeout_s: each method's limit in seconds; None derives one from the size of the
            run (generous: it only catches a stall).
        keep_checkpoints: keep the final checkpoint the trainer writes (deleted by default:
            the benchmark needs only the metrics).

    Raises:
        ValueError: an unknown or repeated method, a bad link or target, or a setting the
            trainer refuses (its own message, naming the flag).
    """

    settings: Mapping[str, Any]
    methods: tuple[str, ...] = DEFAULT_METHODS
    link: str = "100mbit"
    target_accuracy: float = 0.9
    timeout_s: float | None = None
    keep_checkpoints: bool = False
    configs: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from gssgd.methods import parse_methods
        from gssgd.train.config import TrainConfig
        from gssgd.train.method_settings import settings_for

        settings = dict(self.settings)
        settings.pop("progress", None)  # the runs never show a progress bar
        given = sorted(set(settings) & set(_PER_METHOD))
        if given:
            raise ValueError(f"settings {given} are set per method by the benchmark; drop them")
        for name, default in (("workers", 4), ("device", "cpu")):
            if settings.get(name) is None:
                settings[name] = default
        object.__setattr__(self, "settings", settings)
        object.__setattr__(self, "methods", parse_methods(self.methods))
        parse_link_rate(self.link)  # raises with the valid forms
        if self.link_bps is not None and settings["device"] != "cpu":
            raise ValueError(
                f"--device {settings['device']} with --link {self.link}: the emulated links "
                "shape gloo's TCP traffic only (NCCL between local GPUs bypasses them); use "
                "--device cpu, or --link none"
            )
        target = self.target_accuracy
        if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target <= 1:
            raise ValueError(
                f"target_accuracy={target!r} must be a number in (0, 1], e.g. 0.9 "
                "(--target-accuracy)"
            )
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s={self.timeout_s!r} must be > 0 seconds (or None)")
        # The trainer's own checks, method by method, before anything runs.
        configs = {
            m: TrainConfig.build(
                m, **settings_for(m, settings), out=m, overwrite=True, progress=False
            )  # fmt: skip
            for m in self.methods
        }
        object.__setattr__(self, "configs", configs)

    @property
    def link_bps(self) -> int | None:
        """The link rate in bits per second, or None for loopback."""
        return parse_link_rate(self.link)

    @property
    def workers(self) -> int:
        """P, the number of workers every method trains on."""
        return int(self.settings["workers"])

    def train_config(self, method: str, run_dir: Path) -> Any:
        """The :class:`~gssgd.train.config.TrainConfig` of ``method``, writing to ``run_dir``."""
        return dataclasses.replace(self.configs[method], out=str(run_dir))

    def command_line(self, out: Path | str) -> str:
        """The ``gssgd bench train`` command that reproduces this run into ``out``."""
        return shlex.join([
            "gssgd", "bench", "train",
            "--methods", ",".join(self.methods),
            "--link", self.link,
            "--target-accuracy", f"{self.target_accuracy:g}",
            *train_flags(self.settings, always=_ALWAYS),
            *(["--method-timeout", f"{self.timeout_s:g}"] if self.timeout_s is not None else []),
            *(["--keep-checkpoints"] if self.keep_checkpoints else []),
            "--out", str(out),
        ])  # fmt: skip


def train_flags(settings: Mapping[str, Any], always: Sequence[str] = ()) -> list[str]:
    """``gssgd train`` arguments for TrainConfig settings (and named option flags): those
    that differ from its defaults, and those named in ``always`` when they are not None."""
    from gssgd.train.config import TrainConfig

    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    out: list[str] = []
    for name, value in settings.items():
        if value is None or (value == defaults.get(name) and name not in always):
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + name.replace("_", "-"))  # --no-progress, --no-exact
        elif name in ("fail_at", "stall_at"):
            out += [flag, f"{value[0]}:{value[1]}"]
        elif name == "options":  # the method's options by name: --opt NAME=VALUE each
            out += [a for k, v in value.items() for a in ("--opt", f"{k}={v}")]
        else:
            out += [flag, str(value)]
    return out


def train_argv(cfg: Any) -> list[str]:
    """The arguments after ``gssgd`` that make ``gssgd train`` run ``cfg`` (a TrainConfig).

    Every field that differs from TrainConfig's default becomes its flag (the run's
    settings map one to one onto the fields), and each of the method's options its named
    flag (``--rows 3``, ``--local-momentum 0.9``) or ``--opt NAME=VALUE``; ``--method``
    and ``--workers`` are always given.
    """
    from gssgd.train.method_settings import OPTION_FLAGS

    settings = dataclasses.asdict(cfg)
    method, options = settings.pop("method"), dict(settings.pop("options"))
    named = {name: options.pop(option) for name, option in OPTION_FLAGS.items()
             if option in options}
    ordered: dict[str, Any] = {}
    for name, value in settings.items():
        if name == "start_iter":  # the named option flags sit before the hook's settings
            ordered.update(named)
        ordered[name] = value
    ordered["options"] = options or None
    return ["train", "--method", method, *train_flags(ordered, always=("workers",))]
