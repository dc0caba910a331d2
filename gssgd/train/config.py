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

from dataclasses import dataclass
from typing import Any

from gssgd.aggregators.lowrank import DEFAULT_POWERSGD_RANK as _DEFAULT_RANK
from gssgd.aggregators.options import PAYLOAD_DTYPES
from gssgd.amp import AMP_DTYPES
from gssgd.ddp import HookSettings
from gssgd.methods import METHODS, get_method, renamed_hint
from gssgd.recipes import ADAMW_FREEZE_STEPS, ADAMW_LM_LR, ADAMW_LR, warmup_steps_recipe
from gssgd.train.checks import (
    OPTIMIZERS,
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
from gssgd.train.launch import DEVICES
from gssgd.train.method_settings import (
    METHOD_SETTINGS,
    OPTION_NAMES,
    check_settings_apply,
    flag,
    import_plugins,
    setting_applies_to,
    settings_for,
    split_options,
    to_aggregator,
)
from gssgd.train.models import MODELS, TEXT_MODELS

__all__ = [
    "ADAMW_FREEZE_STEPS",
    "ADAMW_LM_LR",
    "ADAMW_LR",
    "DEFAULT_POWERSGD_RANK",
    "DEFAULT_START_ITER",
    "DEFAULT_WORKERS",
    "METHOD_SETTINGS",
    "OPTIMIZERS",
    "TrainConfig",
    "check_settings_apply",
    "flag",
    "import_plugins",
    "setting_applies_to",
    "settings_for",
]

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

    The method's options are its options dataclass's fields
    (``gssgd.aggregators.AGGREGATORS[method].Options``): ``options`` holds any of them by
    name (``--opt NAME=VALUE``, text parsed to the field's type), and the named fields
    below the "aggregation" line are sugar for the common ones (``rows`` is
    ``options={"rows": ...}``, ``local_momentum`` is ``momentum``, ``payload_dtype``
    ``dtype``, ``powersgd_rank`` ``rank``). On construction an option with a named field
    moves onto it (given both ways with different values: an error), so ``options`` keeps
    the others.

    Values are checked on construction (``ValueError`` naming the flag, the valid range
    and a fix); ``None`` means "the default", which may depend on the data or the launcher.
    """

    # -- what to train
    method: str = "gs"  # how gradients are averaged: a name of gssgd.METHODS
    dataset: str = "mnist"  # digits, mnist, fashion-mnist, shakespeare, npz:PATH or text:PATH
    model: str | None = None  # mlp, cnn, resnet or lm; None: the dataset's default (cnn, lm)
    plugins: tuple[str, ...] = ()  # modules imported on every worker (they register methods)
    # -- optimisation
    steps: int = 500  # total steps; a resumed run continues up to this many
    batch_size: int = 32  # samples (text: windows) per worker per step
    optimizer: str = "sgd"  # sgd or adamw
    lr: float | None = None  # learning rate (constant); None: the method's recipe
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
    # -- aggregation; None: the method's own default (checked by its options dataclass)
    density: float | None = None  # fraction of coordinates sent (default 0.01), or give k
    k: int | None = None  # coordinates sent per worker, instead of density
    local_momentum: float | None = None  # the error feedback's momentum (0: off; by feedback)
    warmup_steps: int | None = None  # density warm-up: steps from warmup_density down to density
    warmup_density: float | None = None  # the warm-up's starting density (default 0.25)
    local_clip: float | None = None  # clip each worker's gradient to this norm / sqrt(P)
    feedback: str | None = None  # error feedback: ef (default), ef21, global, onebit, fetchsgd
    payload_dtype: str | None = None  # the all-reduced payload: float32 (default), float16, bfloat16
    rows: int | None = None  # sketch rows, odd (default 1)
    cols: int | None = None  # sketch columns (default 40·k, capped at d/(4 rows))
    candidates: int | None = None  # m: the sketch proposes m*k candidates (default 32, m*k <= d/8)
    exact: bool | None = None  # fetch exact values of the candidates (default True)
    allreduce: str | None = None  # how sketches are summed: recursive_doubling or backend
    table_dtype: str | None = None  # sketch tables on the wire: float32, float16, bfloat16
    guard: str | None = None  # on a collapsed sketch grow it (default), raise, or off
    prefilter: int | None = None  # sketch only each worker's own prefilter*k largest
    reuse: int | None = None  # sketch every reuse-th step, reusing its candidates between
    chunk: int | None = None  # select by chunk of this many coordinates (DeMo/SparseLoCo)
    powersgd_rank: int | None = None  # low-rank methods: the rank r (default 2)
    start_iter: int | None = None  # steps of plain all-reduce before compression (default 2)
    per_bucket: bool = False  # aggregate each DDP bucket apart, not the whole model at once
    overlap: str | None = None  # "stream": all-reduce the sketch bucket by bucket in backward
    bucket_cap_mb: float | None = None  # DDP's bucket size in MB (None: DDP's default, 25)
    options: dict[str, Any] | None = None  # any option of the method by name (--opt NAME=VALUE)
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

    def __post_init__(self) -> None:
        self.plugins = tuple(self.plugins)
        import_plugins(self.plugins)
        if self.method not in METHODS:
            raise bad("method", self.method, f"it must be one of {', '.join(METHODS)}",
                      "A method of your own needs --plugin MODULE that registers it."
                      + renamed_hint(str(self.method)))
        self._take_options()
        if not isinstance(self.dataset, str) or not self.dataset:
            raise bad("dataset", self.dataset, "it must name a dataset", "For example digits.")
        if self.model is not None and self.model not in MODELS:
            raise bad("model", self.model, f"it must be one of {', '.join(MODELS)}",
                      "Leave it out for the dataset's default.")
        check_local_steps(self)
        apply_optimizer_recipe(self)
        apply_frozen_variance(self)
        if self.warmup_steps is None and self.feedback != "fetchsgd" and not self.local_steps:
            self.warmup_steps = warmup_steps_recipe(self.method) or None
        self._check_run()
        check_settings_apply({n: getattr(self, n) for n in METHOD_SETTINGS}, [self.method])
        self._check_method_settings()
        self.fail_at = rank_step("fail_at", self.fail_at)
        self.stall_at = rank_step("stall_at", self.stall_at)

    def _take_options(self) -> None:
        """The options given by name (``--opt``), typed by the method's options dataclass;
        those with a named field move onto it.

        Raises:
            ValueError: an option the method does not have, a value not of its type, or
                one given both by name and by its flag with different values."""
        named, rest = split_options(self.method, self.options)
        for field, value in named.items():
            given = getattr(self, field)
            if given is not None and given != value:
                option = OPTION_NAMES.get(field, field)
                raise ValueError(
                    f"{flag(field)} {given!r} and --opt {option}={value!r} give the option "
                    f"{option!r} of {self.method!r} two values; give it once ({flag(field)} "
                    f"is --opt {option}).")
            setattr(self, field, value)
        self.options = rest or None

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
        if self.model is not None:
            return self.model in TEXT_MODELS
        return self.dataset == "shakespeare" or self.dataset.startswith("text:")

    def _check_method_settings(self) -> None:
        """The method's own checks: its options dataclass (through HookSettings) or, for
        a DDP built-in, its rank and start; both before any worker starts."""
        for name in ("table_dtype", "payload_dtype"):
            value = getattr(self, name)
            if value is not None and value not in PAYLOAD_DTYPES:
                raise bad(name, value, f"it must be one of {', '.join(PAYLOAD_DTYPES)}")
        if self.powersgd_rank is not None:
            check_int("powersgd_rank", self.powersgd_rank, 1)
        if get_method(self.method).aggregator is not None:
            self.hook_settings()  # start_iter >= 1 and every option, by their own rules
        elif self.start_iter is not None:
            # DDP rebuilds its buckets after step 0, and PowerSGD needs one more dense step
            check_int("start_iter", self.start_iter, 2)

    # ---------------------------------------------------------------- derived settings
    def aggregator_options(self) -> dict[str, Any]:
        """The keyword options of the aggregator (``k`` included), defaults left out: the
        named fields, the run's ``seed`` where the method takes one, then ``options``."""
        opts: dict[str, Any] = {}
        takes = get_method(self.method).option_names()
        for name in METHOD_SETTINGS:
            option = OPTION_NAMES.get(name, name)
            value = getattr(self, name)
            if value is None or option not in takes:
                continue
            opts[option] = PAYLOAD_DTYPES[value] if option in ("dtype", "table_dtype") else value
        if "seed" in takes:
            opts["seed"] = self.seed
        if self.options:
            opts.update(to_aggregator(self.method, self.options))
        return opts

    def hook_settings(self) -> HookSettings:
        """The DDP hook's settings of an aggregator method, validated by its options.

        Raises:
            ValueError: an option out of range (the message names the option).
        """
        try:
            return HookSettings(
                self.method,
                density=self.density,
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
        """The config a run directory's ``config.json`` (or a checkpoint's ``config``)
        recorded, from this version or an earlier one (fields it lacks take their
        defaults; what it holds besides the fields, ``world_size`` and ``d``, is left out).
        """
        known = set(cls.__dataclass_fields__)
        kept = {k: v for k, v in saved.items() if k in known}
        for name in ("betas", "fail_at", "stall_at", "plugins"):
            if isinstance(kept.get(name), list):
                kept[name] = tuple(kept[name])  # JSON wrote the tuples as lists
        return cls(**kept)
