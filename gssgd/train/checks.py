"""The checks of a training run's settings (:class:`~gssgd.train.config.TrainConfig`), each
naming the flag, the valid range and a fix; and the recipes that fill settings left out
(from :mod:`gssgd.recipes`), applied to the config with the same checks."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from gssgd import validate
from gssgd.local_steps import DILOCO_OUTER_LR, DILOCO_OUTER_MOMENTUM
from gssgd.methods import get_method
from gssgd.optim import UNSEEN_RULES, VARIANCES, dense_steps_for
from gssgd.recipes import adamw_lr, default_freeze_steps, onebit_settings, sgd_settings
from gssgd.train.method_settings import (
    METHOD_FLAGS,
    METHOD_SETTINGS,
    OPTION_FLAGS,
    flag,
    flag_of,
    setting_applies_to,
)
from gssgd.validate import bad_value

#: A :class:`~gssgd.train.config.TrainConfig` (not imported: the config imports this module).
TrainConfig = Any

__all__ = [
    "OPTIMIZERS", "apply_frozen_variance", "apply_optimizer_recipe", "bad", "check_int",
    "check_local_steps", "check_real", "check_simulated", "rank_step",
]

#: What ``--optimizer`` accepts.
OPTIMIZERS: tuple[str, ...] = ("sgd", "adamw")


def bad(name: str, value: object, valid: str, fix: str = "") -> ValueError:
    """The error for a TrainConfig field, named by its flag: ``--name=value is invalid:
    valid. fix`` (:func:`gssgd.validate.bad_value`)."""
    return bad_value(flag(name), value, valid, fix)


def check_int(name: str, value: object, minimum: int) -> None:
    """Raise unless ``value`` is an integer >= ``minimum`` (the field named by its flag)."""
    validate.check_int(flag(name), value, minimum)


def check_real(name: str, value: object, valid: str, ok: Callable[[float], bool],
               fix: str = "") -> None:
    """Raise unless ``value`` is a finite number for which ``ok`` holds (named by its flag)."""
    validate.check_number(flag(name), value, valid, ok, fix)


def rank_step(name: str, value: object) -> tuple[int, int] | None:
    """Validate a fault-injection ``(rank, step)`` pair (None passes)."""
    if value is None:
        return None
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or any(not validate.is_int(v) or v < 0 for v in value)):
        raise bad(name, value, "it must be RANK:STEP with integers >= 0",
                  f"For example {flag(name)} 1:10.")
    return (int(value[0]), int(value[1]))


def as_flags(message: str, opts: object = None) -> str:
    """An options dataclass's message (``rows=4 is invalid: ...``) with the option named as
    the user gave it: its flag (``--rows=4 is invalid: ...``, a hook setting's too), or
    ``--opt`` for another option in ``opts`` (the config's options)."""
    name, sep, rest = message.partition("=")
    field = {option: f for f, option in OPTION_FLAGS.items()}.get(name, name)
    if sep and field in METHOD_FLAGS:
        return flag(field) + sep + rest
    if sep and isinstance(opts, dict) and name in opts:
        return f"--opt {name}{sep}{rest}"
    return message


# --------------------------------------------------------------------------- recipes


def apply_optimizer_recipe(cfg: TrainConfig) -> None:
    """Fill the learning rate and momentum left out (:mod:`gssgd.recipes`): SGD's from the
    method's recipe (:func:`~gssgd.recipes.sgd_settings`, which may move the momentum into
    the aggregator), AdamW's lr (:func:`~gssgd.recipes.adamw_lr`; AdamW has no
    ``momentum``: its betas play that part).

    Raises:
        ValueError: an unknown optimizer, or ``momentum`` given with AdamW."""
    if cfg.optimizer not in OPTIMIZERS:
        raise bad("optimizer", cfg.optimizer, f"it must be one of {', '.join(OPTIMIZERS)}",
                  "For example --optimizer adamw.")
    if cfg.optimizer == "adamw":
        if cfg.momentum not in (None, 0, 0.0):
            raise bad("momentum", cfg.momentum, "it must be left out with AdamW",
                      "AdamW's first moment is --betas' first value.")
        if cfg.lr is None:
            cfg.lr = adamw_lr(cfg.model == "lm" or (cfg.model is None and cfg.trains_text))
        cfg.momentum = 0.0
        return
    cfg.lr, cfg.momentum, local_momentum = sgd_settings(
        cfg.method, cfg.trains_text, cfg.lr, cfg.momentum, cfg.option("momentum"),
        cfg.option("feedback"), bool(cfg.local_steps))
    cfg.set_option("momentum", local_momentum)


def _check_adam_choices(cfg: TrainConfig) -> None:
    for name, valid in (("adam_variance", VARIANCES), ("adam_unseen", UNSEEN_RULES)):
        if getattr(cfg, name) is not None and getattr(cfg, name) not in valid:
            raise bad(name, getattr(cfg, name), f"it must be one of {', '.join(valid)}",
                      f"Leave it out for the default, {valid[0]}.")


def _freeze_steps(cfg: TrainConfig) -> int | None:
    """``freeze_variance_after``, or its default for a sparse method under AdamW whose
    error feedback, start and local momentum were left out (warned when the run is short)."""
    n = cfg.freeze_variance_after
    chosen = (cfg.option("feedback"), cfg.start_iter, cfg.option("momentum"))
    if n is None and cfg.optimizer == "adamw" and chosen == (None, None, None):
        n, warning = default_freeze_steps(cfg.steps)
        cfg.freeze_variance_after = n
        if warning is not None:
            warnings.warn(warning, UserWarning, stacklevel=3)
    for name in ("adam_variance", "adam_unseen"):
        if not n and getattr(cfg, name) is not None:
            raise bad(name, getattr(cfg, name), "it applies to 1-bit Adam's recipe only "
                      "(--optimizer adamw with --freeze-variance-after N > 0)",
                      f"Drop {flag(name)}, or use that recipe.")
    return n


def _check_freeze_steps(cfg: TrainConfig, n: int) -> None:
    if cfg.optimizer != "adamw":
        raise bad("freeze_variance_after", n, "it freezes AdamW's variance",
                  "Add --optimizer adamw, or drop --freeze-variance-after.")
    if isinstance(cfg.steps, int) and n >= cfg.steps:
        tenth = dense_steps_for(cfg.steps)
        raise bad("freeze_variance_after", n, f"it must be below --steps {cfg.steps} (the "
                  "steps before it are dense AdamW, so the whole run would be dense)",
                  f"Use a tenth of the run, --freeze-variance-after {tenth}, or 0 for AdamW "
                  "on the error-fed update." if tenth else "Use 0 (AdamW on the error-fed "
                  "update): the run is too short for dense steps first.")


def apply_frozen_variance(cfg: TrainConfig) -> None:
    """``freeze_variance_after`` N: 1-bit Adam's recipe (:mod:`gssgd.optim`): N dense AdamW
    steps, then the variance frozen and the momentum compressed
    (:func:`~gssgd.recipes.onebit_settings`). Fills those settings, or refuses ones given
    otherwise. Left out, a sparse method under AdamW takes
    :func:`~gssgd.recipes.default_freeze_steps` unless its error feedback, start or local
    momentum was chosen; 0 turns it off (AdamW on the classic error-fed update). The
    variance after the N steps, ``adam_variance``, is frozen unless given.

    Raises:
        ValueError: without AdamW, or with a conflicting start_iter, feedback or
            local momentum."""
    if cfg.method not in setting_applies_to("freeze_variance_after") or (
            cfg.local_steps and not cfg.freeze_variance_after):
        return  # check_settings_apply (or check_local_steps) refuses it if given
    _check_adam_choices(cfg)
    n = _freeze_steps(cfg)
    if n is None:
        return
    check_int("freeze_variance_after", n, 0)
    if n == 0:  # kept as 0, not None: a config checked again must stay off
        return
    _check_freeze_steps(cfg, n)
    cfg.adam_variance = cfg.adam_variance or VARIANCES[0]
    cfg.adam_unseen = cfg.adam_unseen or UNSEEN_RULES[0]
    beta1 = float(cfg.betas[0]) if isinstance(cfg.betas, (tuple, list)) else None
    for name, value in onebit_settings(n, beta1).items():
        setting = name in METHOD_SETTINGS  # start_iter; else one of the method's options
        given, shown = (getattr(cfg, name), flag(name)) if setting else (cfg.option(name),
                                                                          flag_of(name))
        if given is not None and given != value:
            raise bad_value(shown, given, f"--freeze-variance-after {n} sets it to {value!r}",
                            f"Drop {shown}: the frozen-variance recipe sets it.")
        if setting:
            setattr(cfg, name, value)
        else:
            cfg.set_option(name, value)


# --------------------------------------------------------------------------- combinations


def check_local_steps(cfg: TrainConfig) -> None:
    """``local_steps`` H: the outer step's settings, and what cannot go with it (DDP's
    built-in hooks, the hook's own schedules and layouts, fp16's scaler).

    Raises:
        ValueError: a bad H or outer setting, or a flag local steps do not take."""
    if cfg.local_steps is None:
        for name in ("outer_lr", "outer_momentum", "outer_error_decay"):
            if getattr(cfg, name) is not None:
                raise bad(name, getattr(cfg, name), "it sets the outer step of local steps",
                          "Add --local-steps H, or drop it.")
        return
    check_int("local_steps", cfg.local_steps, 1)
    cfg.outer_lr = DILOCO_OUTER_LR if cfg.outer_lr is None else cfg.outer_lr
    if cfg.outer_momentum is None:
        cfg.outer_momentum = DILOCO_OUTER_MOMENTUM
    check_real("outer_lr", cfg.outer_lr, "> 0", lambda v: v > 0, f"DiLoCo's: {DILOCO_OUTER_LR}.")
    check_real("outer_momentum", cfg.outer_momentum, "in [0, 1)", lambda v: 0 <= v < 1,
               f"DiLoCo's: {DILOCO_OUTER_MOMENTUM}.")
    if cfg.outer_error_decay is not None:  # None: 1, classic error feedback
        check_real("outer_error_decay", cfg.outer_error_decay, "in (0, 1]", lambda v: 0 < v <= 1,
                   "1 is classic error feedback; SparseLoCo's decays it (with "
                   "--outer-momentum 0).")
    if get_method(cfg.method).aggregator is None:
        raise bad("method", cfg.method, "local steps aggregate the pseudo-gradient with a "
                  "gssgd method", "Use dense (DiLoCo's outer step) or a sparse one.")
    refused = {"per_bucket": cfg.per_bucket, "overlap": cfg.overlap not in (None, "none"),
               "start_iter": cfg.start_iter is not None, "amp": cfg.amp == "fp16",
               "freeze_variance_after": bool(cfg.freeze_variance_after),
               "bucket_cap_mb": cfg.bucket_cap_mb is not None}
    used = [flag(name) for name, on in refused.items() if on]
    if used:
        raise ValueError(
            f"{', '.join(used)} cannot be combined with --local-steps: the outer step "
            "aggregates the whole model's pseudo-gradient once every H steps, with no "
            "DDP hook (no buckets, dense warm-up or 1-bit Adam schedule) and no fp16 "
            "scaler (--amp bf16 works). Drop those flags.")


def check_simulated(cfg: TrainConfig) -> None:
    """What a simulated world (:mod:`gssgd.train.simulate`) runs: an aggregator method over
    the whole model in float32, from step 0, on the CPU."""
    if get_method(cfg.method).aggregator is None:
        raise bad("method", cfg.method, "a simulated world runs gssgd's aggregator methods "
                  "only", "Use dense (the all-reduce baseline) instead of DDP's built-in "
                  "hooks, or drop --simulate.")
    unsupported = {
        "per_bucket": cfg.per_bucket, "overlap": cfg.overlap not in (None, "none"),
        "amp": cfg.amp is not None, "resume": cfg.resume is not None,
        "fail_at": cfg.fail_at is not None, "stall_at": cfg.stall_at is not None,
        "device": cfg.device == "cuda",
    }
    used = [flag(name) for name, on in unsupported.items() if on]
    if used:
        raise ValueError(
            f"{', '.join(used)} cannot be combined with --simulate: a simulated world trains "
            "one replica for all ranks, over the whole model, in float32 on the CPU, from "
            "step 0. Drop those flags, or run real workers (drop --simulate).")


def check_betas(cfg: TrainConfig) -> None:
    """AdamW's betas: two numbers in [0, 1), stored as a tuple of floats."""
    betas = tuple(cfg.betas) if isinstance(cfg.betas, (tuple, list)) else cfg.betas
    if not (isinstance(betas, tuple) and len(betas) == 2 and all(
            validate.is_number(b) and 0 <= b < 1 for b in betas)):
        raise bad("betas", cfg.betas, "it must be two numbers in [0, 1)",
                  "For example --betas 0.9 0.999.")
    cfg.betas = (float(betas[0]), float(betas[1]))
