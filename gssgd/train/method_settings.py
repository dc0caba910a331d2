"""The method's own settings in a training run: which flags apply to which method, and the
method's options given by name (``--opt NAME=VALUE``) or by their named flags.

A run's config holds the method's name and, in ``options``, the method's options by the
field names of its options dataclass (``gssgd.aggregators.AGGREGATORS[name].Options``), so
a plugin method's new option reaches the trainer with no edit here. Some options also have
a named flag (``--rows``, ``--density``, ``--local-momentum`` for ``momentum``, ...:
:data:`OPTION_FLAGS`): the flag writes the same option, and :func:`flags_to_options` moves
the flags given into ``options`` (one given both ways with different values is an error).

Which methods a setting applies to comes from the method registry
(:func:`gssgd.methods.applies_to`); the values are validated by the options dataclass
through :class:`gssgd.ddp.HookSettings`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from gssgd.aggregators import AGGREGATORS
from gssgd.aggregators.options import PAYLOAD_DTYPES
from gssgd.methods import METHODS, applies_to, get_method
from gssgd.train.user_code import import_user_module
from gssgd.validate import bad_value, is_int

__all__ = [
    "METHOD_FLAGS",
    "METHOD_SETTINGS",
    "OPTION_FLAGS",
    "check_settings_apply",
    "flag",
    "flag_of",
    "flags_to_options",
    "import_plugins",
    "merge_opts",
    "option_types",
    "parse_opt",
    "setting_applies_to",
    "settings_for",
    "to_aggregator",
    "typed_options",
]

#: The named flags that set one of the method's options: the flag's name (``--rows``:
#: ``rows``) -> the option's name (``--local-momentum`` is ``--opt momentum``,
#: ``--payload-dtype`` ``--opt dtype``, ``--powersgd-rank`` ``--opt rank``).
OPTION_FLAGS: dict[str, str] = {
    "density": "density", "k": "k", "local_momentum": "momentum", "warmup_steps": "warmup_steps",
    "warmup_density": "warmup_density", "local_clip": "local_clip", "feedback": "feedback",
    "payload_dtype": "dtype", "rows": "rows", "cols": "cols", "candidates": "candidates",
    "exact": "exact", "allreduce": "allreduce", "table_dtype": "table_dtype", "guard": "guard",
    "prefilter": "prefilter", "reuse": "reuse", "chunk": "chunk", "powersgd_rank": "rank",
}
#: TrainConfig fields (run settings, not options) that apply to some methods only.
METHOD_SETTINGS: tuple[str, ...] = (
    "start_iter", "per_bucket", "overlap", "freeze_variance_after", "adam_variance",
    "adam_unseen", "outer_error_decay",
)
#: Every flag that applies to some methods only (None or False = not given).
METHOD_FLAGS: tuple[str, ...] = tuple(OPTION_FLAGS) + METHOD_SETTINGS
#: Method-specific TrainConfig fields that apply to the methods taking another setting
#: (``overlap``: every method of the DDP hook; its value's own check says which mode serves
#: which method).
_APPLIES_LIKE = {"overlap": "per_bucket", "freeze_variance_after": "feedback", "adam_variance": "feedback",
                 "adam_unseen": "feedback", "outer_error_decay": "feedback"}
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def flag(name: str) -> str:
    """The command-line flag of a TrainConfig field or named option flag:
    ``local_momentum`` -> ``--local-momentum``."""
    return "--" + name.replace("_", "-")


#: Option name -> the name of its named flag (``momentum`` -> ``local_momentum``).
_FLAG_OF = {option: name for name, option in OPTION_FLAGS.items()}


def flag_of(option: str) -> str:
    """How a user names the option ``option``: its named flag (``momentum`` ->
    ``--local-momentum``), else ``--opt NAME``."""
    return flag(_FLAG_OF[option]) if option in _FLAG_OF else f"--opt {option}"


# --------------------------------------------------------------------------- named settings


def setting_applies_to(name: str) -> tuple[str, ...]:
    """The registered methods a TrainConfig field or named option flag applies to (every
    method for generic ones)."""
    if name not in METHOD_FLAGS:
        return tuple(METHODS)
    takers = set(applies_to(_APPLIES_LIKE.get(name) or OPTION_FLAGS.get(name, name)))
    takers |= set(applies_to(name))  # a DDP built-in's train setting (its rank)
    return tuple(m for m in METHODS if m in takers)


def option_applies_to(name: str) -> tuple[str, ...]:
    """The registered methods whose options take ``name`` (``--opt NAME=...``)."""
    return tuple(m for m in METHODS if name in option_types(m))


def _which(methods: list[str]) -> str:
    return f"--method {methods[0]}" if len(methods) == 1 else f"--methods {','.join(methods)}"


def check_settings_apply(settings: Mapping[str, Any], methods: Iterable[str]) -> None:
    """Refuse a method-specific setting, named option flag or ``--opt`` option (in
    ``settings["options"]``) that none of ``methods`` takes.

    The one check behind ``gssgd train`` (one method) and ``gssgd compare`` (several): a
    setting a method would silently ignore is an error that names the flag and the fix.

    Raises:
        ValueError: such a setting.
    """
    methods = list(methods)
    for name in METHOD_FLAGS:
        if settings.get(name) in (None, False):
            continue
        takers = setting_applies_to(name)
        if not set(methods) & set(takers):
            raise ValueError(
                f"{flag(name)} does not apply to {_which(methods)}; it applies to "
                f"{', '.join(takers) or 'no registered method'}. Drop {flag(name)} or pick "
                "such a method."
            )
    for name, value in (settings.get("options") or {}).items():
        takers = option_applies_to(name)
        if not set(methods) & set(takers):
            raise ValueError(
                f"--opt {name}={value} does not apply to {_which(methods)}: no such method "
                f"has an option {name!r}; it applies to {', '.join(takers) or 'no registered method'}"
                f". Drop --opt {name}, or pick such a method.")


def settings_for(method: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` (:meth:`TrainConfig.build <gssgd.train.config.TrainConfig.build>`
    keyword arguments: run settings, named option flags, ``options``) without those
    ``method`` does not take (only the options ``method`` has stay).

    ``gssgd compare`` builds one config per method from the same flags this way.
    """
    out = {name: value for name, value in settings.items()
           if name not in METHOD_FLAGS or method in setting_applies_to(name)}
    if out.get("options"):
        takes = option_types(method)
        out["options"] = {k: v for k, v in out["options"].items() if k in takes} or None
    return out


def import_plugins(modules: Iterable[str]) -> None:
    """Import each module (it registers its methods with :func:`gssgd.register_method`).

    The working directory is on the import path, as for ``--model MODULE:FUNCTION``
    (:func:`gssgd.train.user_code.import_user_module`).

    Raises:
        ValueError: a module that cannot be imported (the message names it and the fix).
    """
    for name in modules:
        import_user_module(name, "--plugin")


# --------------------------------------------------------------------------- --opt NAME=VALUE


def parse_opt(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` (one ``--opt``) as ``(NAME, VALUE)``; VALUE stays text until the
    method's option types are known (:func:`split_options`).

    Raises:
        ValueError: no ``=``, or an empty name.
    """
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not name.strip().isidentifier():
        raise ValueError(f"--opt {text!r} is not NAME=VALUE with NAME an option's name; for "
                         "example --opt rows=3 (or a plugin's --opt levels=16)")
    return name.strip(), value.strip()


def merge_opts(pairs: Iterable[tuple[str, str]] | None) -> dict[str, str] | None:
    """The ``--opt`` pairs as one mapping (None when there are none).

    Raises:
        ValueError: one name given two different values.
    """
    out: dict[str, str] = {}
    for name, value in pairs or ():
        if name in out and out[name] != value:
            raise ValueError(f"--opt {name}={out[name]} and --opt {name}={value} give the "
                             f"option {name!r} two values; give it once.")
        out[name] = value
    return out or None


def option_types(method: str) -> dict[str, Any]:
    """Option name -> type of ``method``'s options (its options dataclass's fields, ``k``
    and ``density`` for a sparse method, and the aliases), from the registry. A DDP
    built-in has the option flags among its train settings (``torch-powersgd``: ``rank``,
    an integer)."""
    spec = get_method(method)
    if spec.aggregator is None:
        return {OPTION_FLAGS[s]: int for s in spec.train_settings if s in OPTION_FLAGS}
    cls = spec.aggregator
    fields = [f for f in dataclasses.fields(cls.Options) if f.name != "shapes"]
    try:
        hints = typing.get_type_hints(cls.Options)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: read its text
        hints = {}
    found = {f.name: hints.get(f.name, f.type) for f in fields}
    if not cls.sends_all:
        found |= {"k": int, "density": float}
    for alias, name in _aliases(method).items():
        found[alias] = found.get(name, Any)
    return found


def _aliases(method: str) -> dict[str, str]:
    """Alias -> option name of ``method``'s options (``matrix_approximation_rank``)."""
    cls = AGGREGATORS.get(method)
    return dict(getattr(cls.Options, "aliases", {})) if cls is not None else {}


def _members(hint: Any) -> tuple[Any, ...]:
    """The types a field's annotation allows (``int | None`` -> ``(int, NoneType)``)."""
    if isinstance(hint, str):  # an annotation that did not resolve
        names = {"int": int, "float": float, "bool": bool, "str": str, "None": type(None),
                 "torch.dtype": torch.dtype}
        return tuple(names.get(part.strip(), part.strip()) for part in hint.split("|"))
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _kind(members: tuple[Any, ...]) -> str:
    words = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
             type(None): "none", torch.dtype: f"a dtype ({', '.join(PAYLOAD_DTYPES)})"}
    return " or ".join(words.get(m, str(m)) for m in members)


def _parse(text: str, members: tuple[Any, ...]) -> Any:
    """``text`` as the first of ``members`` it reads as (LookupError: none)."""
    low = text.lower()
    if type(None) in members and low in ("none", "null"):
        return None
    if bool in members and low in _TRUE + _FALSE:
        return low in _TRUE
    for kind in (int, float):
        if kind in members:
            try:
                return kind(text)
            except ValueError:
                pass
    if torch.dtype in members and text in PAYLOAD_DTYPES:
        return text  # kept by name (the config stays JSON); :func:`to_aggregator` converts
    if str in members:
        return text
    raise LookupError(text)


def _option_error(method: str, name: str, value: object, why: str) -> ValueError:
    valid = ", ".join(option_types(method))
    return ValueError(f"--opt {name}={value} is invalid: {why}. The options of {method!r}: "
                      f"{valid}.")


def coerce_option(method: str, name: str, value: Any) -> Any:
    """One option of ``method`` as its field's type: text (from the command line) parsed,
    anything else kept for the options dataclass to check.

    Raises:
        ValueError: an unknown option, or text that is not of the option's type (the
            message names the option, the value, the valid options and the fix).
    """
    types_ = option_types(method)
    if name not in types_:
        raise _option_error(method, name, value, f"method {method!r} has no option {name!r}. "
                            "Use one of its options' names")
    if isinstance(value, torch.dtype) and torch.dtype in _members(types_[name]):
        for text, dtype in PAYLOAD_DTYPES.items():
            if dtype == value:
                return text  # kept by name: the config stays JSON
    if not isinstance(value, str):
        return value
    members = _members(types_[name])
    try:
        return _parse(value, members)
    except LookupError:
        example = {int: "3", float: "0.5", bool: "true"}.get(members[0], "...")
        raise _option_error(method, name, value, f"option {name!r} takes {_kind(members)}, "
                            f"for example --opt {name}={example}") from None


def _differ(a: Any, b: Any) -> bool:
    """Whether two values of one option differ (NaN given twice is the same value, left
    for the option's own check to refuse)."""
    both_nan = isinstance(a, float) and isinstance(b, float) and a != a and b != b
    return not both_nan and a != b


def typed_options(method: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` of ``method`` checked and typed (:func:`coerce_option`), by the options'
    own names (an alias becomes its option), in the order of :func:`option_types`; a None
    value (the option's default) is left out.

    Raises:
        ValueError: a DDP built-in without that option, an unknown option, a value that is
            not of the option's type, or an option given by two names with two values.
    """
    types_ = option_types(method)
    aliases = _aliases(method)
    found: dict[str, Any] = {}
    for name, value in (options or {}).items():
        if name not in types_ and get_method(method).aggregator is None:
            raise ValueError(f"--opt {name}={value} is invalid: method {method!r} is one of "
                             "DDP's own hooks and has no options dataclass. Drop --opt; its "
                             "settings are flags (gssgd train --help).")
        typed, option = coerce_option(method, name, value), aliases.get(name, name)
        if typed is None:
            continue
        if option in found and _differ(found[option], typed):
            raise ValueError(f"--opt {name}={value!r} and --opt {option}={found[option]!r} give "
                             f"the option {option!r} of {method!r} two values; give it once.")
        found[option] = typed
    return {name: found[name] for name in types_ if name in found}


def _check_flag(name: str, value: Any) -> None:
    """The checks of a named flag's value that name the flag (the others are the options
    dataclass's, through HookSettings)."""
    if name in ("payload_dtype", "table_dtype") and not isinstance(value, torch.dtype) \
            and value not in PAYLOAD_DTYPES:
        raise bad_value(flag(name), value, f"it must be one of {', '.join(PAYLOAD_DTYPES)}")
    if name == "powersgd_rank" and (not is_int(value) or value < 1):
        raise bad_value(flag(name), value, "it must be an integer >= 1")


def flags_to_options(method: str, flags: Mapping[str, Any],
                     options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` (``--opt``) with the named option flags given (``rows=3``,
    ``local_momentum=0.9``; None, or False for a method the flag does not apply to: not
    given) written in under their options' names (:data:`OPTION_FLAGS`).

    Raises:
        ValueError: a flag the method does not take (naming the flag), a bad option, or
            one given both by its flag and by ``--opt`` with different values.
    """
    merged = typed_options(method, options)
    given = {name: value for name, value in flags.items()
             if value is not None and not (value is False
                                           and method not in setting_applies_to(name))}
    check_settings_apply(given, [method])
    for name, value in given.items():
        _check_flag(name, value)
        option = OPTION_FLAGS[name]
        if option in merged and _differ(merged[option], coerce_option(method, option, value)):
            raise ValueError(
                f"{flag(name)} {value!r} and --opt {option}={merged[option]!r} give the option "
                f"{option!r} of {method!r} two values; give it once ({flag(name)} is --opt "
                f"{option}).")
        merged[option] = value
    return merged


def to_aggregator(method: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as the aggregator takes them: a dtype option given by name becomes the
    ``torch.dtype``."""
    types_ = option_types(method)
    return {name: PAYLOAD_DTYPES[value]
            if isinstance(value, str) and torch.dtype in _members(types_.get(name)) else value
            for name, value in options.items()}
