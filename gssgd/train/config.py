"""The settings of a training run (:class:`TrainConfig`): the run's settings, the method's
name and the method's own options.

Generic settings (steps, learning rate, workers, ...) are checked here and in
:mod:`gssgd.train.checks`. Method-specific ones are checked where they belong: which
methods a setting applies to comes from the method registry
(:mod:`gssgd.train.method_settings`), and the aggregator's options are validated by its
options dataclass through :class:`gssgd.ddp.HookSettings`, the same check ``HookState``
runs, so every option has exactly one rule and one message. The defaults a run fills in
(learning rate, momentum, warm-up, 1-bit Adam's recipe) come from :mod:`gssgd.recipes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gssgd.aggregators.powersgd import DEFAULT_POWERSGD_RANK as _DEFAULT_RANK
from gssgd.amp import AMP_DTYPES
from gssgd.ddp import HookSettings
from gssgd.lr_schedule import LR_SCHEDULES, LrSchedule
from gssgd.methods import METHODS, get_method, renamed_hint
from gssgd.optim import FrozenVarianceAdamW
from gssgd.recipes import max_skips_for, warmup_steps_recipe
from gssgd.train.checks import (
    apply_frozen_variance,
    apply_optimizer_recipe,
    as_flags,
    bad,
    check_betas,
    check_int,
    check_local_steps,
    check_real,
    check_simulated,
    rank_step,
)
from gssgd.train.data import TextData, load_dataset
from gssgd.train.launch import DEVICES
from gssgd.train.method_settings import (
    METHOD_SETTINGS,
    OPTION_FLAGS,
    check_settings_apply,
    flags_to_options,
    import_plugins,
    to_aggregator,
    typed_options,
)
from gssgd.train.models import MODELS, TEXT_MODELS, build_model, default_model
from gssgd.train.user_code import is_user_code

__all__ = ["DEFAULT_POWERSGD_RANK", "DEFAULT_START_ITER", "DEFAULT_WORKERS", "TrainConfig",
           "make_optimizer"]

#: Workers spawned when neither ``--workers`` nor torchrun says how many.
DEFAULT_WORKERS = 4
#: Start iteration of the compressing hooks when ``--start-iter`` is not given.
DEFAULT_START_ITER = 2
#: The low-rank methods' rank when ``--powersgd-rank`` is not given (gssgd's and PyTorch's
#: PowerSGD alike).
DEFAULT_POWERSGD_RANK = _DEFAULT_RANK


@dataclass
class TrainConfig:
    """Every setting of a training run: the run's settings, the method's name and the
    method's own options; ``gssgd train --help`` shows the same as flags.

    ``options`` holds the method's options by the field names of its options dataclass
    (``gssgd.aggregators.AGGREGATORS[method].Options``; ``k`` and ``density`` for a sparse
    method), e.g. ``{"density": 0.001, "rows": 3, "momentum": 0.9, "dtype": "float16"}``.
    Text values (``--opt NAME=VALUE``) are read as the field's type and a ``torch.dtype``
    is kept by name, so the config stays JSON; an alias becomes its option's name; None is
    the option's default. Read one with :meth:`option`. The command line's named flags
    (``--rows``, ``--local-momentum`` for ``momentum``, ...) write the same options:
    :meth:`build` takes them as keyword arguments.

    Values are checked on construction (``ValueError`` naming the flag, the valid range
    and a fix); ``None`` means "the default", which may depend on the data or the launcher.
    """

    # -- what to train
    method: str = "gs"  # how gradients are averaged: a name of gssgd.METHODS
    dataset: str = "mnist"  # digits, ..., npz:PATH, text:PATH or MODULE:FUNCTION (your data)
    model: str | None = None  # mlp, cnn, ..., MODULE:FUNCTION (yours); None: the data's default
    plugins: tuple[str, ...] = ()  # modules imported on every worker (they register methods)
    # -- optimisation
    steps: int = 500  # total steps; a resumed run continues up to this many
    batch_size: int = 32  # samples (text: windows) per worker per step
    optimizer: str = "sgd"  # sgd or adamw
    lr: float | None = None  # (peak) learning rate; None: the method's recipe
    lr_schedule: str = "constant"  # after the warm-up: constant or cosine (to 0 at the end)
    lr_warmup_steps: int = 0  # linear warm-up steps of the learning rate (0: none)
    momentum: float | None = None  # SGD momentum after aggregation; None: the method's recipe
    weight_decay: float = 0.0  # weight decay (AdamW: decoupled)
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW's betas
    freeze_variance_after: int | None = None  # AdamW: dense steps, then 1-bit Adam's (0: off)
    adam_variance: str | None = None  # after those steps: frozen (default) or moving
    adam_unseen: str | None = None  # frozen v: coordinates with none at the freeze (moving)
    seq_len: int = 64  # characters per window (text data)
    seed: int = 0  # seeds the model init, the batches and the sketch hashes
    # -- workers
    workers: int | None = None  # processes; None: WORLD_SIZE under torchrun, else 4
    device: str = "auto"  # cpu, cuda, or auto (cuda when available)
    threads: int = 1  # torch threads per worker
    amp: str | None = None  # mixed precision: fp16 (autocast + GradScaler) or bf16 autocast
    timeout: float = 300.0  # seconds a collective waits for a peer before the run fails
    simulate: bool = False  # run the workers as a simulated world in this process (large P)
    global_batch: int | None = None  # samples per step over all workers (sets batch_size)
    # -- the DDP hook (aggregator methods); the method's options are in ``options``
    start_iter: int | None = None  # steps of plain all-reduce before compression (default 2)
    per_bucket: bool = False  # aggregate each DDP bucket apart, not the whole model at once
    overlap: str | None = None  # "stream": all-reduce the sketch bucket by bucket in backward
    bucket_cap_mb: float | None = None  # DDP's bucket size in MB (None: DDP's default, 25)
    # -- local steps (DiLoCo family: gssgd.local_steps); None: every step aggregates
    local_steps: int | None = None  # H inner steps with no communication per outer step
    outer_lr: float | None = None  # the outer Nesterov step's lr (default DiLoCo's 0.7)
    outer_momentum: float | None = None  # its momentum (default DiLoCo's 0.9)
    outer_error_decay: float | None = None  # the residual's decay per outer step (None: 1)
    # -- output
    out: str | None = None  # run directory; None: runs/<method>-<dataset>-<time>
    eval_every: int = 100  # evaluate every N steps and after the last (0: after the last only)
    checkpoint_every: int = 0  # checkpoint every N steps (0: after the last only)
    resume: str | None = None  # a run directory or checkpoint file to continue from
    overwrite: bool = False  # start afresh in an --out that holds an earlier run
    progress: bool = True  # show a progress bar on rank 0
    tensorboard: str | None = None  # also log the step scalars to this TensorBoard directory
    # -- fault injection (reliability tests)
    fail_at: tuple[int, int] | None = None  # (rank, step): that rank exits abruptly there
    stall_at: tuple[int, int] | None = None  # (rank, step): that rank hangs there (a stalled peer)
    # -- the method's options by name (--opt NAME=VALUE and the named flags); last, by keyword
    options: dict[str, Any] = field(default_factory=dict, kw_only=True)

    def __post_init__(self) -> None:
        self.plugins = tuple(self.plugins)
        import_plugins(self.plugins)
        check_method(self.method)
        self.options = typed_options(self.method, self.options)
        if not isinstance(self.dataset, str) or not self.dataset:
            raise bad("dataset", self.dataset, "it must name a dataset", "For example digits.")
        if is_user_code(self.model) or is_user_code(self.dataset):
            check_user_code(self.model, self.dataset)
        elif self.model is not None and self.model not in MODELS:
            raise bad("model", self.model,
                      f"it must be one of {', '.join(MODELS)} or MODULE:FUNCTION",
                      "Leave it out for the dataset's default.")
        check_local_steps(self)
        apply_optimizer_recipe(self)
        apply_frozen_variance(self)
        if (self.option("warmup_steps") is None and self.option("feedback") != "fetchsgd"
                and not self.local_steps):
            self.set_option("warmup_steps", warmup_steps_recipe(self.method) or None)
        self.options = typed_options(self.method, self.options)  # the recipes' too
        self._check_run()
        check_settings_apply({n: getattr(self, n) for n in METHOD_SETTINGS}, [self.method])
        self._check_method_settings()
        self.fail_at = rank_step("fail_at", self.fail_at)
        self.stall_at = rank_step("stall_at", self.stall_at)

    @classmethod
    def build(cls, method: str = "gs", *, options: dict[str, Any] | None = None,
              **settings: Any) -> TrainConfig:
        """A config from the command line's spelling: the run's settings (the fields) and
        the named option flags (``density=0.001``, ``rows=3``, ``local_momentum=0.9`` for
        the option ``momentum``, ``payload_dtype``, ``powersgd_rank``: the keys of
        :data:`~gssgd.train.method_settings.OPTION_FLAGS`), which go into ``options``.
        ``TrainConfig.build(method="gs", density=0.001, rows=3)`` is
        ``TrainConfig(method="gs", options={"density": 0.001, "rows": 3})``.

        Raises:
            ValueError: as the constructor; a flag the method does not take, or one also
                given in ``options`` with another value (the message names the flag).
            TypeError: a keyword that is neither a field nor a named option flag.
        """
        flags = {name: settings.pop(name) for name in list(settings) if name in OPTION_FLAGS}
        import_plugins(tuple(settings.get("plugins", ())))
        check_method(method)
        return cls(method=method, **settings, options=flags_to_options(method, flags, options))

    def option(self, name: str, default: Any = None) -> Any:
        """The method's option ``name`` (its options dataclass's field name, ``k`` or
        ``density``), or ``default`` when it was not given."""
        return self.options.get(name, default)

    def set_option(self, name: str, value: Any) -> None:
        """Set the method's option ``name`` (None: back to its default)."""
        if value is None:
            self.options.pop(name, None)
        else:
            self.options[name] = value

    def _check_run(self) -> None:
        """The generic settings: counts, rates, devices, outputs."""
        for name in ("steps", "batch_size", "seq_len", "threads"):
            check_int(name, getattr(self, name), 1)
        for name in ("seed", "eval_every", "checkpoint_every"):
            check_int(name, getattr(self, name), 0)
        for name in ("workers", "global_batch"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 1)
        if self.simulate:
            check_simulated(self)
        check_real("lr", self.lr, "> 0", lambda v: v > 0, "For example 0.05.")
        self._check_schedule()
        check_real("momentum", self.momentum, "in [0, 1)", lambda v: 0 <= v < 1, "Or 0 for none.")
        check_real("weight_decay", self.weight_decay, ">= 0", lambda v: v >= 0)
        check_betas(self)
        check_real("timeout", self.timeout, "> 0 seconds", lambda v: v > 0, "Default: 300.")
        if self.device not in DEVICES:
            raise bad("device", self.device, f"it must be one of {', '.join(DEVICES)}")
        if self.amp is not None and self.amp not in AMP_DTYPES:
            raise bad("amp", self.amp, f"it must be one of {', '.join(AMP_DTYPES)}",
                      "Leave it out to train in float32.")
        self._check_tensorboard()
        if self.bucket_cap_mb is not None:
            check_real("bucket_cap_mb", self.bucket_cap_mb, "in (0, 1024]",
                       lambda v: 0 < v <= 1024)

    def _check_schedule(self) -> None:
        """The learning rate's schedule (:class:`~gssgd.lr_schedule.LrSchedule`)."""
        if self.lr_schedule not in LR_SCHEDULES:
            raise bad("lr_schedule", self.lr_schedule,
                      f"it must be one of {', '.join(LR_SCHEDULES)}")
        check_int("lr_warmup_steps", self.lr_warmup_steps, 0)
        if self.lr_warmup_steps and self.lr_warmup_steps >= self.steps:
            raise bad("lr_warmup_steps", self.lr_warmup_steps,
                      f"it must be below --steps {self.steps}",
                      f"A tenth of the run is usual: --lr-warmup-steps {self.steps // 10}.")

    @property
    def schedule(self) -> LrSchedule:
        """The run's learning-rate schedule (its factor at each step)."""
        return LrSchedule(self.lr_schedule, self.lr_warmup_steps, self.steps)

    def _check_tensorboard(self) -> None:
        if self.tensorboard is None:
            return
        if not isinstance(self.tensorboard, str) or not self.tensorboard:
            raise bad("tensorboard", self.tensorboard, "it must name a directory",
                      "For example --tensorboard runs/tb.")
        from gssgd.train.tensorboard import require_tensorboard

        require_tensorboard()  # before any worker starts: exit 2 with the pip command

    @property
    def trains_text(self) -> bool:
        """Whether the run trains a language model (``lm``, ``gpt``; the default model of
        ``shakespeare`` and ``text:PATH``), whose default recipe is
        :data:`~gssgd.recipes.TEXT_RECIPE`."""
        if is_user_code(self.model) or is_user_code(self.dataset):
            return isinstance(load_dataset(self.dataset), TextData)
        if self.model is not None:
            return self.model in TEXT_MODELS
        return self.dataset == "shakespeare" or self.dataset.startswith("text:")

    def _check_method_settings(self) -> None:
        """The method's own checks: its options dataclass (through HookSettings) or, for
        a DDP built-in, its rank and start; both before any worker starts."""
        if self.option("rank") is not None and get_method(self.method).aggregator is None:
            check_int("powersgd_rank", self.option("rank"), 1)
        if get_method(self.method).aggregator is not None:
            self.hook_settings()  # start_iter >= 1 and every option, by their own rules
        elif self.start_iter is not None:
            # DDP rebuilds its buckets after step 0, and PowerSGD needs one more dense step
            check_int("start_iter", self.start_iter, 2)

    # ---------------------------------------------------------------- derived settings
    def aggregator_options(self) -> dict[str, Any]:
        """The keyword options of the aggregator (``k`` included, ``density`` apart),
        defaults left out: the run's ``seed`` and its skip limit
        (:func:`~gssgd.recipes.max_skips_for` the run's steps) where the method takes
        them, then ``options`` (a dtype given by name as the ``torch.dtype``)."""
        takes = get_method(self.method).option_names()
        opts: dict[str, Any] = {"seed": self.seed} if "seed" in takes else {}
        if "max_consecutive_skips" in takes:  # a tenth of the run; an option given wins
            opts["max_consecutive_skips"] = max_skips_for(self.steps)
        opts.update(to_aggregator(self.method, {name: value for name, value in
                                                self.options.items() if name in takes}))
        return opts

    def hook_settings(self) -> HookSettings:
        """The DDP hook's settings of an aggregator method, validated by its options.

        Raises:
            ValueError: an option out of range (the message names the option).
        """
        try:
            return HookSettings(
                self.method,
                density=self.option("density"),
                start_iter=self.resolved_start_iter,
                whole_model=not self.per_bucket,
                options=self.aggregator_options(),
                overlap=self.overlap or "none",
            )
        except ValueError as err:
            raise ValueError(f"{as_flags(str(err), self.options)} (--method {self.method})"
                             ) from None

    @property
    def resolved_start_iter(self) -> int:
        """``start_iter``, or its default."""
        return DEFAULT_START_ITER if self.start_iter is None else self.start_iter

    @property
    def measured_from_step(self) -> int:
        """The first step counted in the per-step averages: the steps before it are DDP's
        bucket rebuild and the comm hook's dense warm-up."""
        return max(self.resolved_start_iter, 1)

    @classmethod
    def from_saved(cls, saved: dict[str, Any]) -> TrainConfig:
        """The config a run directory's ``config.json`` (or a checkpoint's or summary's
        ``config``) recorded, from this version or an earlier one: fields it lacks take
        their defaults, the named option fields of earlier versions (``rows``,
        ``local_momentum``, ...) go into ``options`` (:meth:`build`), and what it holds
        besides (``world_size``, ``d``) is left out.
        """
        known = set(cls.__dataclass_fields__) | set(OPTION_FLAGS)
        kept = {k: v for k, v in saved.items() if k in known}
        for name in ("betas", "fail_at", "stall_at", "plugins"):
            if isinstance(kept.get(name), list):
                kept[name] = tuple(kept[name])  # JSON wrote the tuples as lists
        return cls.build(**kept)


def check_method(method: object) -> None:
    """Raise unless ``method`` names a registered method (the message names the fix)."""
    if method not in METHODS:
        raise bad("method", method, f"it must be one of {', '.join(METHODS)}",
                  "A method of your own needs --plugin MODULE that registers it."
                  + renamed_hint(str(method)))


def check_user_code(model: str | None, dataset: str) -> None:
    """A user's ``--model``/``--dataset MODULE:FUNCTION``: load the data and build the model
    once, before any worker starts, so a mistake in them stops the run here with its
    message (the global RNG is left as it was).

    Raises:
        ValueError: the function cannot be found, or returns something unusable (the
            message names the flag, the value and the fix).
    """
    import torch

    data = load_dataset(dataset)
    with torch.random.fork_rng(devices=[]):
        build_model(model or default_model(data), data)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The run's optimizer over ``model``: SGD with ``cfg``'s lr, momentum and weight decay,
    AdamW with its lr, betas and (decoupled) weight decay, or with ``freeze_variance_after``
    :class:`~gssgd.optim.FrozenVarianceAdamW` (the same, its variance frozen after that
    many steps, or kept moving: ``cfg.adam_variance``)."""
    if cfg.freeze_variance_after:
        assert cfg.adam_variance is not None  # TrainConfig fills it in with the recipe
        return FrozenVarianceAdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas,
                                   weight_decay=cfg.weight_decay,
                                   freeze_step=cfg.freeze_variance_after,
                                   variance=cfg.adam_variance,
                                   unseen=cfg.adam_unseen or "moving")
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(
            model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay
        )
    return torch.optim.SGD(
        model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
