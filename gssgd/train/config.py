"""The settings of a training run (:class:`TrainConfig`) and their checks.

Generic settings (steps, learning rate, workers, ...) are checked here. Method-specific
ones are checked where they belong: which methods a setting applies to comes from the
method registry (:func:`gssgd.methods.applies_to`), and the aggregator's options are
validated by its options dataclass through :class:`gssgd.ddp.HookSettings`, the same check
``HookState`` runs, so every option has exactly one rule and one message.
"""

from __future__ import annotations

import importlib
import math
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gssgd.aggregators.lowrank import DEFAULT_POWERSGD_RANK as _DEFAULT_RANK
from gssgd.aggregators.options import OWN_MOMENTUM_FEEDBACKS, PAYLOAD_DTYPES
from gssgd.amp import AMP_DTYPES
from gssgd.ddp import STREAMING_METHODS, HookSettings
from gssgd.local_steps import DILOCO_OUTER_LR, DILOCO_OUTER_MOMENTUM
from gssgd.methods import METHODS, applies_to, get_method, renamed_hint
from gssgd.optim import UNSEEN_RULES, VARIANCES, dense_steps_for
from gssgd.train.launch import DEVICES
from gssgd.train.models import MODELS, TEXT_MODELS

__all__ = [
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
#: PowerSGD's rank when ``--powersgd-rank`` is not given (gssgd's ``powersgd`` and PyTorch's
#: ``torch-powersgd`` alike).
DEFAULT_POWERSGD_RANK = _DEFAULT_RANK

#: What ``--optimizer`` accepts.
OPTIMIZERS: tuple[str, ...] = ("sgd", "adamw")
#: AdamW's learning rate when ``--lr`` is not given (the character LSTM's is
#: :data:`ADAMW_LM_LR`).
ADAMW_LR = 1e-3
#: AdamW's learning rate on the character LSTM (``--model lm``, text's default model) when
#: ``--lr`` is not given: the best of dense AdamW's sweep (0.001 / 0.003 / 0.01, 1,500
#: steps, three seeds: 1.737 / 1.635 / 1.590), and the lr every sparse recipe was measured
#: at there (docs/study.md, "Keep your optimizer").
ADAMW_LM_LR = 1e-2
#: A sparse method under AdamW: dense AdamW steps before the variance freezes and the
#: momentum is compressed (1-bit Adam's recipe, ``--freeze-variance-after``), by default.
ADAMW_FREEZE_STEPS = 150

#: TrainConfig fields that are aggregator options under another name.
_OPTION_NAMES = {"local_momentum": "momentum", "payload_dtype": "dtype", "powersgd_rank": "rank"}
#: TrainConfig fields that apply to some methods only (None or False = not given).
METHOD_SETTINGS: tuple[str, ...] = (
    "density",
    "k",
    "local_momentum",
    "warmup_steps",
    "warmup_density",
    "local_clip",
    "feedback",
    "payload_dtype",
    "rows",
    "cols",
    "candidates",
    "exact",
    "allreduce",
    "table_dtype",
    "guard",
    "prefilter",
    "reuse",
    "chunk",
    "powersgd_rank",
    "start_iter",
    "per_bucket",
    "overlap",
    "freeze_variance_after",
    "adam_variance",
    "adam_unseen",
    "outer_error_decay",
)
#: Method-specific TrainConfig fields that are neither options nor hook settings, and the
#: methods that take them.
_ONLY_FOR: dict[str, tuple[str, ...]] = {"overlap": STREAMING_METHODS}
#: Method-specific TrainConfig fields that apply to the methods taking another option.
_APPLIES_LIKE = {"freeze_variance_after": "feedback", "adam_variance": "feedback",
                 "adam_unseen": "feedback", "outer_error_decay": "feedback"}


def flag(name: str) -> str:
    """The command-line flag of a TrainConfig field: ``local_momentum`` -> ``--local-momentum``."""
    return "--" + name.replace("_", "-")


def _bad(name: str, value: object, valid: str, fix: str = "") -> ValueError:
    return ValueError(f"{flag(name)}={value!r} is invalid: {valid}.{' ' + fix if fix else ''}")


def setting_applies_to(name: str) -> tuple[str, ...]:
    """The registered methods a TrainConfig field applies to (every method for generic ones)."""
    if name not in METHOD_SETTINGS:
        return tuple(METHODS)
    if name in _ONLY_FOR:
        return tuple(m for m in _ONLY_FOR[name] if m in METHODS)
    takers = set(applies_to(_APPLIES_LIKE.get(name) or _OPTION_NAMES.get(name, name)))
    takers |= set(applies_to(name))  # a DDP built-in's train setting (torch-powersgd's rank)
    return tuple(m for m in METHODS if m in takers)


def check_settings_apply(settings: dict[str, Any], methods: Iterable[str]) -> None:
    """Refuse a method-specific setting that none of ``methods`` takes.

    The one check behind ``gssgd train`` (one method) and ``gssgd compare`` (several): a
    setting a method would silently ignore is an error that names the flag and the fix.

    Raises:
        ValueError: such a setting.
    """
    methods = list(methods)
    for name in METHOD_SETTINGS:
        if settings.get(name) in (None, False):
            continue
        takers = setting_applies_to(name)
        if not set(methods) & set(takers):
            which = f"--method {methods[0]}" if len(methods) == 1 else f"--methods {','.join(methods)}"
            raise ValueError(
                f"{flag(name)} does not apply to {which}; it applies to "
                f"{', '.join(takers) or 'no registered method'}. Drop {flag(name)} or pick "
                "such a method."
            )


def settings_for(method: str, settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` (TrainConfig keyword arguments) without those ``method`` does not take.

    ``gssgd compare`` builds one config per method from the same flags this way.
    """
    return {
        name: value
        for name, value in settings.items()
        if name not in METHOD_SETTINGS or method in setting_applies_to(name)
    }


def import_plugins(modules: Iterable[str]) -> None:
    """Import each module (it registers its methods with :func:`gssgd.register_method`).

    Raises:
        ValueError: a module that cannot be imported (the message names it and the fix).
    """
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ValueError(
                f"--plugin {name!r} cannot be imported ({err}); give an importable module "
                "name (on PYTHONPATH) whose import registers the method."
            ) from err


@dataclass
class TrainConfig:
    """Every setting of a training run; ``gssgd train --help`` shows the same as flags.

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
    payload_dtype: str | None = None  # dense: float32 (default), float16 or bfloat16 payload
    rows: int | None = None  # sketch rows, odd (sketched, gs; default 1)
    cols: int | None = None  # sketch columns (sketched, gs; default 40·k, capped at d/(4 rows))
    candidates: int | None = None  # m: the sketch proposes m*k candidates (default 32, m*k <= d/8)
    exact: bool | None = None  # gs: fetch exact values of the candidates (default True)
    allreduce: str | None = None  # gs: recursive_doubling (default) or backend
    table_dtype: str | None = None  # sketched, gs: sketch tables on the wire: float32, float16, bfloat16
    guard: str | None = None  # gs: on a collapsed sketch grow it (default), raise, or off
    prefilter: int | None = None  # sketched, gs: each worker sketches only its own prefilter*k largest
    reuse: int | None = None  # gs: sketch every reuse-th step, between them reuse its candidates
    chunk: int | None = None  # gs: select by chunk of this many coordinates (DeMo/SparseLoCo)
    powersgd_rank: int | None = None  # powersgd, torch-powersgd: the rank r (default 2)
    start_iter: int | None = None  # steps of plain all-reduce before compression (default 2)
    per_bucket: bool = False  # aggregate each DDP bucket apart, not the whole model at once
    overlap: str | None = None  # gs: "stream" all-reduces the sketch bucket by bucket in backward
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

    def __post_init__(self) -> None:
        self.plugins = tuple(self.plugins)
        import_plugins(self.plugins)
        if self.method not in METHODS:
            raise _bad("method", self.method, f"it must be one of {', '.join(METHODS)}",
                       "A method of your own needs --plugin MODULE that registers it."
                       + renamed_hint(str(self.method)))
        if not isinstance(self.dataset, str) or not self.dataset:
            raise _bad("dataset", self.dataset, "it must name a dataset", "For example digits.")
        if self.model is not None and self.model not in MODELS:
            raise _bad("model", self.model, f"it must be one of {', '.join(MODELS)}",
                       "Leave it out for the dataset's default.")
        self._check_local_steps()
        self._apply_recipe()
        self._apply_frozen_variance()
        if self.warmup_steps is None and self.feedback != "fetchsgd" and not self.local_steps:
            self.warmup_steps = get_method(self.method).recipe_warmup_steps() or None
        for name in ("steps", "batch_size", "seq_len", "threads"):
            _check_int(name, getattr(self, name), 1)
        for name in ("seed", "eval_every", "checkpoint_every"):
            _check_int(name, getattr(self, name), 0)
        if self.workers is not None:
            _check_int("workers", self.workers, 1)
        if self.global_batch is not None:
            _check_int("global_batch", self.global_batch, 1)
        if self.simulate:
            self._check_simulated()
        _check_real("lr", self.lr, "> 0", lambda v: v > 0, "For example 0.05.")
        _check_real("momentum", self.momentum, "in [0, 1)", lambda v: 0 <= v < 1, "Or 0 for none.")
        _check_real("weight_decay", self.weight_decay, ">= 0", lambda v: v >= 0)
        self._check_betas()
        _check_real("timeout", self.timeout, "> 0 seconds", lambda v: v > 0, "Default: 300.")
        if self.device not in DEVICES:
            raise _bad("device", self.device, f"it must be one of {', '.join(DEVICES)}")
        if self.amp is not None and self.amp not in AMP_DTYPES:
            raise _bad("amp", self.amp, f"it must be one of {', '.join(AMP_DTYPES)}",
                       "Leave it out to train in float32.")
        if self.tensorboard is not None and (not isinstance(self.tensorboard, str)
                                             or not self.tensorboard):
            raise _bad("tensorboard", self.tensorboard, "it must name a directory",
                       "For example --tensorboard runs/tb.")
        if self.tensorboard is not None:
            from gssgd.train.tensorboard import require_tensorboard

            require_tensorboard()  # before any worker starts: exit 2 with the pip command
        if self.bucket_cap_mb is not None:
            _check_real("bucket_cap_mb", self.bucket_cap_mb, "in (0, 1024]",
                        lambda v: 0 < v <= 1024)
        check_settings_apply({n: getattr(self, n) for n in METHOD_SETTINGS}, [self.method])
        self._check_method_settings()
        self.fail_at = _rank_step("fail_at", self.fail_at)
        self.stall_at = _rank_step("stall_at", self.stall_at)

    @property
    def trains_text(self) -> bool:
        """Whether the run trains a language model (``lm``, ``gpt``; the default model of
        ``shakespeare`` and ``text:PATH``), whose default recipe is
        :data:`~gssgd.methods.TEXT_RECIPE`."""
        if self.model is not None:
            return self.model in TEXT_MODELS
        return self.dataset == "shakespeare" or self.dataset.startswith("text:")

    def _apply_recipe(self) -> None:
        """Fill the learning rate and momentum left out: SGD's from the method's recipe
        (on a language model a sparse method also takes the local momentum of
        :data:`~gssgd.methods.TEXT_SPARSE_RECIPE` unless the optimizer's momentum, a
        local momentum or another error feedback was given; the optimizer's momentum
        defaults to 0 wherever the aggregator keeps one), AdamW's :data:`ADAMW_LR` (on the
        character LSTM :data:`ADAMW_LM_LR`; AdamW has no ``momentum``: its betas play that
        part).

        Raises:
            ValueError: an unknown optimizer, or ``momentum`` given with AdamW."""
        if self.optimizer not in OPTIMIZERS:
            raise _bad("optimizer", self.optimizer, f"it must be one of {', '.join(OPTIMIZERS)}",
                       "For example --optimizer adamw.")
        if self.optimizer == "adamw":
            if self.momentum not in (None, 0, 0.0):
                raise _bad("momentum", self.momentum, "it must be left out with AdamW",
                           "AdamW's first moment is --betas' first value.")
            lstm = self.model == "lm" or (self.model is None and self.trains_text)
            if self.lr is None:
                self.lr = ADAMW_LM_LR if lstm else ADAMW_LR
            self.momentum = 0.0
            return
        # local steps: the inner optimizer trains alone between outer steps, as dense does
        method = get_method("dense" if self.local_steps else self.method)
        recipe_lr, recipe_momentum = method.recipe(text=self.trains_text)
        local = method.recipe_local_momentum(text=self.trains_text)
        if (local is not None and self.local_momentum is None and not self.momentum
                and self.feedback in (None, "ef")):
            self.local_momentum = local  # the momentum moves into the aggregator (DGC)
        inner = bool(self.local_momentum) or self.feedback in OWN_MOMENTUM_FEEDBACKS
        self.lr = recipe_lr if self.lr is None else self.lr
        if self.momentum is None:  # none on top of a momentum the aggregator keeps
            self.momentum = 0.0 if inner else recipe_momentum

    def _apply_frozen_variance(self) -> None:
        """``freeze_variance_after`` N: 1-bit Adam's recipe (:mod:`gssgd.optim`): N dense
        AdamW steps (``start_iter`` N), then the variance frozen and the momentum compressed
        (``feedback="onebit"`` with momentum beta1). Fills those settings, or refuses ones
        given otherwise. Left out, a sparse method under AdamW takes
        :data:`ADAMW_FREEZE_STEPS` unless its error feedback, start or local momentum was
        chosen; 0 turns it off (AdamW on the classic error-fed update). The variance after
        the N steps, ``adam_variance``, is frozen unless given (1-bit Adam's; kept moving,
        it won on the character LSTM at density 0.001 and lost by far on the character
        GPT there: docs/study.md).

        Raises:
            ValueError: without AdamW, or with a conflicting start_iter, feedback or
                local momentum."""
        n = self.freeze_variance_after
        if self.method not in setting_applies_to("freeze_variance_after") or (
                self.local_steps and not n):
            return  # check_settings_apply (or _check_local_steps) refuses it if given
        for name, valid in (("adam_variance", VARIANCES), ("adam_unseen", UNSEEN_RULES)):
            if getattr(self, name) is not None and getattr(self, name) not in valid:
                raise _bad(name, getattr(self, name), f"it must be one of {', '.join(valid)}",
                           f"Leave it out for the default, {valid[0]}.")
        chosen = (self.feedback, self.start_iter, self.local_momentum)
        if n is None and self.optimizer == "adamw" and chosen == (None, None, None):
            n = self.freeze_variance_after = ADAMW_FREEZE_STEPS
            if isinstance(self.steps, int) and self.steps <= n:
                n = self.freeze_variance_after = dense_steps_for(self.steps)
                warnings.warn(
                    f"gssgd train: --steps {self.steps} is not longer than AdamW's default "
                    f"dense warm-up of {ADAMW_FREEZE_STEPS} steps, which would leave the whole "
                    "run dense; using --freeze-variance-after "
                    + (f"{n} (a tenth of the run)" if n else "0 (AdamW on the error-fed "
                       "update: the run is too short for a warm-up)")
                    + ". Give --freeze-variance-after N to choose.", UserWarning, stacklevel=2)
        for name in ("adam_variance", "adam_unseen"):
            if not n and getattr(self, name) is not None:
                raise _bad(name, getattr(self, name), "it applies to 1-bit Adam's recipe only "
                           "(--optimizer adamw with --freeze-variance-after N > 0)",
                           f"Drop {flag(name)}, or use that recipe.")
        if n is None:
            return
        _check_int("freeze_variance_after", n, 0)
        if n == 0:  # kept as 0, not None: a config checked again must stay off
            return
        if self.optimizer != "adamw":
            raise _bad("freeze_variance_after", n, "it freezes AdamW's variance",
                       "Add --optimizer adamw, or drop --freeze-variance-after.")
        if isinstance(self.steps, int) and n >= self.steps:
            raise _bad("freeze_variance_after", n, f"it must be below --steps {self.steps} (the "
                       "steps before it are dense AdamW, so the whole run would be dense)",
                       f"Use a tenth of the run, --freeze-variance-after "
                       f"{dense_steps_for(self.steps)}, or 0 for AdamW on the error-fed "
                       "update." if dense_steps_for(self.steps) else "Use 0 (AdamW on the "
                       "error-fed update): the run is too short for dense steps first.")
        if self.adam_variance is None:
            self.adam_variance = "frozen"
        if self.adam_unseen is None:
            self.adam_unseen = UNSEEN_RULES[0]
        beta1 = float(self.betas[0]) if isinstance(self.betas, (tuple, list)) else None
        wanted = {"start_iter": n, "feedback": "onebit", "local_momentum": beta1}
        for name, value in wanted.items():
            given = getattr(self, name)
            if given is not None and given != value:
                raise _bad(name, given, f"--freeze-variance-after {n} sets it to {value!r}",
                           f"Drop {flag(name)}: the frozen-variance recipe sets it.")
            setattr(self, name, value)

    def _check_local_steps(self) -> None:
        """``local_steps`` H: the outer step's settings, and what cannot go with it (DDP's
        built-in hooks, the hook's own schedules and layouts, fp16's scaler).

        Raises:
            ValueError: a bad H or outer setting, or a flag local steps do not take."""
        if self.local_steps is None:
            for name in ("outer_lr", "outer_momentum", "outer_error_decay"):
                if getattr(self, name) is not None:
                    raise _bad(name, getattr(self, name), "it sets the outer step of local "
                               "steps", "Add --local-steps H, or drop it.")
            return
        _check_int("local_steps", self.local_steps, 1)
        if self.outer_lr is None:
            self.outer_lr = DILOCO_OUTER_LR
        if self.outer_momentum is None:
            self.outer_momentum = DILOCO_OUTER_MOMENTUM
        _check_real("outer_lr", self.outer_lr, "> 0", lambda v: v > 0,
                    f"DiLoCo's: {DILOCO_OUTER_LR}.")
        _check_real("outer_momentum", self.outer_momentum, "in [0, 1)", lambda v: 0 <= v < 1,
                    f"DiLoCo's: {DILOCO_OUTER_MOMENTUM}.")
        if self.outer_error_decay is not None:  # None: 1, classic error feedback
            _check_real("outer_error_decay", self.outer_error_decay, "in (0, 1]",
                        lambda v: 0 < v <= 1, "1 is classic error feedback; SparseLoCo's "
                        "decays it (with --outer-momentum 0).")
        if get_method(self.method).aggregator is None:
            raise _bad("method", self.method, "local steps aggregate the pseudo-gradient "
                       "with a gssgd method", "Use dense (DiLoCo's outer step) or a sparse one.")
        refused = {"per_bucket": self.per_bucket, "overlap": self.overlap not in (None, "none"),
                   "start_iter": self.start_iter is not None, "amp": self.amp == "fp16",
                   "freeze_variance_after": bool(self.freeze_variance_after),
                   "bucket_cap_mb": self.bucket_cap_mb is not None}
        used = [flag(name) for name, on in refused.items() if on]
        if used:
            raise ValueError(
                f"{', '.join(used)} cannot be combined with --local-steps: the outer step "
                "aggregates the whole model's pseudo-gradient once every H steps, with no "
                "DDP hook (no buckets, dense warm-up or 1-bit Adam schedule) and no fp16 "
                "scaler (--amp bf16 works). Drop those flags.")

    def _check_betas(self) -> None:
        betas = tuple(self.betas) if isinstance(self.betas, (tuple, list)) else self.betas
        if not (isinstance(betas, tuple) and len(betas) == 2 and all(
                isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1
                for b in betas)):
            raise _bad("betas", self.betas, "it must be two numbers in [0, 1)",
                       "For example --betas 0.9 0.999.")
        self.betas = (float(betas[0]), float(betas[1]))

    def _check_simulated(self) -> None:
        """What a simulated world (:mod:`gssgd.train.simulate`) runs: an aggregator method
        over the whole model in float32, from step 0, on the CPU."""
        if get_method(self.method).aggregator is None:
            raise _bad("method", self.method, "a simulated world runs gssgd's aggregator "
                       "methods only", "Use dense (the all-reduce baseline) instead of DDP's "
                       "built-in hooks, or drop --simulate.")
        unsupported = {
            "per_bucket": self.per_bucket, "overlap": self.overlap not in (None, "none"),
            "amp": self.amp is not None, "resume": self.resume is not None,
            "fail_at": self.fail_at is not None, "stall_at": self.stall_at is not None,
            "tensorboard": self.tensorboard is not None, "device": self.device == "cuda",
        }
        used = [name for name, on in unsupported.items() if on]
        if used:
            flags = ", ".join("--" + n.replace("_", "-") for n in used)
            raise ValueError(
                f"{flags} cannot be combined with --simulate: a simulated world trains one "
                "replica for all ranks, over the whole model, in float32 on the CPU, from "
                "step 0. Drop those flags, or run real workers (drop --simulate)."
            )

    def _check_method_settings(self) -> None:
        """The method's own checks: its options dataclass (through HookSettings) or, for
        PyTorch's PowerSGD hook, its rank; both before any worker starts."""
        for name in ("table_dtype", "payload_dtype"):
            value = getattr(self, name)
            if value is not None and value not in PAYLOAD_DTYPES:
                raise _bad(name, value, f"it must be one of {', '.join(PAYLOAD_DTYPES)}")
        if self.powersgd_rank is not None:
            _check_int("powersgd_rank", self.powersgd_rank, 1)
        if get_method(self.method).aggregator is not None:
            self.hook_settings()  # start_iter >= 1 and every option, by their own rules
        elif self.start_iter is not None:
            # DDP rebuilds its buckets after step 0, and PowerSGD needs one more dense step
            _check_int("start_iter", self.start_iter, 2)

    # ---------------------------------------------------------------- derived settings
    def aggregator_options(self) -> dict[str, Any]:
        """The keyword options of the aggregator (``k`` included), defaults left out."""
        opts: dict[str, Any] = {}
        takes = get_method(self.method).option_names()
        for name in METHOD_SETTINGS:
            option = _OPTION_NAMES.get(name, name)
            value = getattr(self, name)
            if value is None or option not in takes:
                continue
            opts[option] = PAYLOAD_DTYPES[value] if option in ("dtype", "table_dtype") else value
        if "seed" in takes:
            opts["seed"] = self.seed
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
            raise ValueError(f"{_as_flags(str(err))} (--method {self.method})") from None

    @property
    def resolved_start_iter(self) -> int:
        """``start_iter``, or its default."""
        return DEFAULT_START_ITER if self.start_iter is None else self.start_iter

    @property
    def measured_from_step(self) -> int:
        """The first step counted in the per-step averages: the steps before it are DDP's
        bucket rebuild and the comm hook's dense warm-up."""
        return max(self.resolved_start_iter, 1)


def _as_flags(message: str) -> str:
    """An options dataclass's message (``rows=4 is invalid: ...``) with the option named by
    its flag (``--rows=4 is invalid: ...``), so the command line's user reads their flag."""
    name, sep, rest = message.partition("=")
    field = {option: f for f, option in _OPTION_NAMES.items()}.get(name, name)
    return flag(field) + sep + rest if sep and field in METHOD_SETTINGS else message


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _bad(name, value, f"it must be an integer >= {minimum}")


def _check_real(
    name: str, value: object, valid: str, ok: Callable[[float], bool], fix: str = ""
) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not ok(value)
    ):
        raise _bad(name, value, f"it must be a number {valid}", fix)


def _rank_step(name: str, value: object) -> tuple[int, int] | None:
    """Validate a fault-injection ``(rank, step)`` pair (None passes)."""
    if value is None:
        return None
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value)
    ):
        raise _bad(name, value, "it must be RANK:STEP with integers >= 0",
                   f"For example {flag(name)} 1:10.")
    return (int(value[0]), int(value[1]))
