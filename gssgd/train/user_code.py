"""A user's own code, named ``MODULE:FUNCTION``: their model, their data, their methods.

``gssgd train --model mymodels:tiny_mlp --dataset mydata:load`` trains the user's model on
the user's data through the same trainer as the built-ins (the hook's dense first steps,
the warm-up, the recipes), on real processes and in the simulated world alike. Every
worker imports the module itself, so the module must be importable where the workers run:
on ``PYTHONPATH``, or a file in the working directory (which :func:`import_user_module`
puts on ``sys.path``, as ``python -m`` would, since a console script does not).

The contracts (``examples/user_model.py`` is a complete example):

- a **dataset function** takes no argument and returns an
  :class:`~gssgd.train.data.ImageData` or :class:`~gssgd.train.data.TextData`,
  a mapping with the arrays ``x_train, y_train, x_test, y_test`` (checked and normalised
  as a ``npz:PATH`` file is), or a ``str`` (a text, modelled character by character);
- a **model function** takes the loaded data and returns an ``nn.Module`` that maps a
  batch of ``x`` to logits (``(B, classes)`` for images and features, ``(B, T, vocab)``
  for text), built from the global RNG (the trainer seeds it, so every rank builds the
  same model).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["import_user_module", "is_user_code", "load_function"]

#: Prefixes that name a user's data file, not code (``npz:PATH``, ``text:PATH``).
FILE_PREFIXES = ("npz:", "text:")


def is_user_code(name: object) -> bool:
    """Whether ``name`` is ``MODULE:FUNCTION`` (and not a ``npz:``/``text:`` file)."""
    return (isinstance(name, str) and ":" in name
            and not name.startswith(FILE_PREFIXES))


def import_user_module(module: str, flag: str) -> Any:
    """Import ``module``, with the working directory on ``sys.path``.

    Args:
        module: a dotted module name.
        flag: the flag that named it (``--model``, ``--plugin``), for the message.

    Raises:
        ValueError: the module cannot be imported; the message names it and the fix.
    """
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)  # after everything installed: a local file never shadows one
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ValueError(
            f"{flag} {module!r} cannot be imported ({err}); give an importable module: a "
            "package on PYTHONPATH or a .py file in the working directory"
        ) from err


def load_function(name: str, flag: str) -> Callable[..., Any]:
    """The function ``FUNCTION`` of module ``MODULE`` named by ``MODULE:FUNCTION``.

    Args:
        name: ``MODULE:FUNCTION`` (``FUNCTION`` may be dotted: ``MODULE:Class.build``).
        flag: the flag that named it (``--model``, ``--dataset``), for the messages.

    Returns:
        The callable.

    Raises:
        ValueError: a malformed name, a module that cannot be imported, or no callable of
            that name in it (each message names the value and the fix).
    """
    module, _, attribute = name.partition(":")
    if not module or not attribute or ":" in attribute:
        raise ValueError(f"{flag} {name!r} is not MODULE:FUNCTION; write it as e.g. "
                         f"{flag} mymodels:build (a function in mymodels.py)")
    target: Any = import_user_module(module, flag)
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{flag} {name!r}: module {module!r} has no {attribute!r}; "
                             f"define it there or fix the name")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{flag} {name!r} names a {type(target).__name__}, not a function; "
                         "name a function that builds it")
    return target
