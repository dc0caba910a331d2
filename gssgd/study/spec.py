"""A study's spec file (TOML): what to train, the target, and each method's search space.

Example (``examples/user_model_study.toml`` and ``studies/equal_budget/specs/`` are real ones)::

    name = "mnist-p16"
    dataset = "mnist"              # or MODULE:FUNCTION, as --dataset
    model = "cnn"                  # optional; or MODULE:FUNCTION, as --model
    workers = 16
    global_batch = 256             # or batch_size = 16 (per worker)
    steps = 800
    lr_schedule = "cosine"         # every method's lr: warm-up, then a half cosine to 0
    lr_warmup_steps = 80           #   (default: constant, no warm-up)
    eval_every = 50
    simulate = true                # the simulated world (default); false: real processes
    budget = 6                     # trials per method: every method gets the same
    seeds = [0, 1, 2]              # each method's best setting is re-run at every seed
    sampler = "tpe"                # Optuna's TPE (seeded), "grid", "random", "lhs" (a
                                   # Latin hypercube: each knob spread over the budget), or
                                   # "lr-grid" (below)

    [target]
    metric = "accuracy"            # or "loss"
    margin = 0.005                 # dense - 0.5 point (a loss: dense * (1 + margin))
    reference = "dense"            # the method whose best run sets the target
    window = 3                     # a run's end value: the mean of its last 3 evaluations;
                                   # a method reaches when its seeds' mean end value does

    [methods.dense]
    lr = [0.02, 0.05, 0.1, 0.2]                   # a list: one of these values

    [methods.gs]
    lr = { low = 0.05, high = 0.4, log = true }   # a range (floats; ints give an int range)
    density = [0.001, 0.003]
    warmup_density = [0.005, 0.02, 0.25]          # any option of the method, by name
    fixed = { momentum = 0.9 }                    # set, not searched

    [methods.dense16]                             # a label; ``method`` names the method
    method = "dense"
    fixed = { payload_dtype = "float16" }
    lr = [0.05, 0.1]

With ``sampler = "lr-grid"`` every method's learning rate walks one shared log grid and a
best on an edge of it extends the grid (:class:`LrGrid`; the design a method's optimum can
be trusted from): ``budget`` is then the grid's, each method's other knobs are lists
crossed with every learning rate (or ``fixed``), and no method gives its own ``lr``::

    sampler = "lr-grid"
    lr_grid = { low = 0.0125, points = 6, factor = 2, extend = 2 }

Every knob is a :class:`~gssgd.train.config.TrainConfig` setting (``lr``, ``momentum``,
``optimizer``, ``local_steps``, ...), a named option flag (``density``, ``powersgd_rank``,
...) or an option of the method by its field name; the config checks them all when a
trial is built, so a typo fails before the study trains anything (:func:`check_spec`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from gssgd.validate import bad_value, check_number, is_int, is_number

__all__ = ["Knob", "MethodSpace", "StudySpec", "load_spec", "parse_spec"]

#: The run settings a spec sets at its top level (the same for every trial).
RUN_KEYS = ("dataset", "model", "workers", "global_batch", "batch_size", "steps",
            "eval_every", "simulate", "optimizer", "seq_len", "plugins", "threads",
            "lr_schedule", "lr_warmup_steps")
STUDY_KEYS = ("name", "budget", "seeds", "sampler", "target", "methods", "lr_grid")
SAMPLERS = ("tpe", "grid", "random", "lhs", "lr-grid")
METRICS = ("accuracy", "loss")
#: The evaluations a run's end value averages by default (``target.window``): a method
#: reaches the target when the seeds' mean of its last three evaluations does, and its
#: bytes count to where it reached the target and stayed.
DEFAULT_WINDOW = 3


@dataclass(frozen=True)
class Knob:
    """One searched setting: a list of ``choices``, or a range ``low..high`` (``log``:
    sampled on a log scale; ``integer``: whole numbers)."""

    name: str
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False

    @classmethod
    def parse(cls, label: str, name: str, value: Any) -> Knob:
        """A knob from the spec's value: a list, or a table ``{low, high[, log]}``.

        Raises:
            ValueError: an empty list, or a range without ``low < high`` (the message
                names the method, the knob and the fix).
        """
        where = f"methods.{label}.{name}"
        if isinstance(value, list):
            if not value or len(set(map(repr, value))) != len(value):
                raise bad_value(where, value, "it must list distinct values",
                                f"For example {name} = [0.05, 0.1].")
            return cls(name, choices=tuple(value))
        if isinstance(value, dict):
            extra = set(value) - {"low", "high", "log"}
            low, high = value.get("low"), value.get("high")
            if extra or not all(is_number(v) for v in (low, high)) or not low < high:
                raise bad_value(where, value, "a range is { low = A, high = B[, log = true] } "
                                "with numbers A < B", f"For example {name} = "
                                "{ low = 0.05, high = 0.4, log = true }.")
            if value.get("log") and low <= 0:
                raise bad_value(where, value, "a log range needs low > 0", "Raise low.")
            return cls(name, low=float(low), high=float(high), log=bool(value.get("log")),
                       integer=is_int(low) and is_int(high))
        raise bad_value(where, value, "a searched knob is a list of values or a range",
                        f"Put a single value in methods.{label}.fixed instead.")

    @property
    def grid_size(self) -> int | None:
        """The number of values a grid walks (None for a range of floats)."""
        if self.choices is not None:
            return len(self.choices)
        return int(self.high - self.low) + 1 if self.integer else None


@dataclass(frozen=True)
class LrGrid:
    """The learning rates every method of an ``lr-grid`` study is tried at: ``points``
    rates ``factor`` apart from ``low`` (each rounded to 6 significant digits), crossed
    with each method's other knobs. Where a method's best sits on the lowest or highest
    rate it tried, its search adds the next rate past it (for that best setting), up to
    ``extend`` rates beyond each end of the grid; the summary reports each extension and
    any best still on an edge at the cap.

    Raises:
        ValueError: ``low`` not > 0, fewer than 5 points, a factor not above 1, or a
            negative extension (the message names the value and the fix).
    """

    low: float
    points: int = 5
    factor: float = 2.0
    extend: int = 2

    def __post_init__(self) -> None:
        checks = (("low", self.low > 0 if is_number(self.low) else False, "a number > 0"),
                  ("points", is_int(self.points) and self.points >= 5, "an integer >= 5"),
                  ("factor", self.factor > 1 if is_number(self.factor) else False,
                   "a number > 1 (2: each rate twice the last)"),
                  ("extend", is_int(self.extend) and self.extend >= 0, "an integer >= 0"))
        for name, ok, valid in checks:
            if not ok:
                raise bad_value(f"lr_grid.{name}", getattr(self, name), f"it must be {valid}",
                                "For example lr_grid = { low = 0.0125, points = 6, "
                                "factor = 2, extend = 2 }.")

    @property
    def values(self) -> tuple[float, ...]:
        """The grid's rates, lowest first."""
        return tuple(self.beyond(self.low, i) for i in range(self.points))

    def beyond(self, lr: float, steps: int) -> float:
        """The rate ``steps`` grid points from ``lr`` (negative: below)."""
        return float(f"{lr * self.factor ** steps:.6g}")

    @classmethod
    def parse(cls, value: Any) -> LrGrid:
        """The ``lr_grid`` table of a spec."""
        if not isinstance(value, dict) or set(value) - {"low", "points", "factor", "extend"} \
                or "low" not in value:
            raise bad_value("lr_grid", value, "it takes low (and points, factor, extend)",
                            "For example lr_grid = { low = 0.0125, points = 6 }.")
        return cls(**value)


@dataclass(frozen=True)
class MethodSpace:
    """A method's row in the study: its label, the method, fixed settings and knobs."""

    label: str
    method: str
    fixed: dict[str, Any]
    knobs: tuple[Knob, ...]

    @property
    def grid_size(self) -> int | None:
        """The number of settings a grid walks (None: a float range has no grid)."""
        size = 1
        for knob in self.knobs:
            if knob.grid_size is None:
                return None
            size *= knob.grid_size
        return size


@dataclass(frozen=True)
class StudySpec:
    """A parsed and checked spec (see the module doc)."""

    name: str
    run: dict[str, Any]
    budget: int
    seeds: tuple[int, ...]
    sampler: str
    metric: str
    margin: float
    reference: str
    methods: tuple[MethodSpace, ...]
    source: dict[str, Any] = field(default_factory=dict, compare=False)
    lr_grid: LrGrid | None = None
    window: int = 3  # the last evaluations a run's end value averages (target.window)

    def budget_of(self, row: MethodSpace) -> int:
        """The trials ``row``'s search plans: the spec's budget, or with an lr grid its
        points times the combinations of the method's other knobs (extensions come on
        top)."""
        if self.lr_grid is None:
            return self.budget
        return self.lr_grid.points * (row.grid_size or 1)

    def method(self, label: str) -> MethodSpace:
        """The method row labelled ``label``."""
        return next(m for m in self.methods if m.label == label)

    @property
    def trials(self) -> int:
        """Every run the study plans: the budget per method, then each best's other seeds
        (an lr grid's extensions come on top)."""
        return sum(self.budget_of(row) + len(self.seeds) - 1 for row in self.methods)


def load_spec(path: Path | str) -> StudySpec:
    """Read and check a spec file (:func:`parse_spec`).

    Raises:
        FileNotFoundError: no file there. ValueError: not TOML, or a bad value.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"study spec {path}: no such file; give the path of a .toml "
                                "spec (studies/specs/ has examples)")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"study spec {path} is not valid TOML ({err}); fix the line named") from None
    raw.setdefault("name", path.stem)
    return parse_spec(raw)


def parse_spec(raw: dict[str, Any]) -> StudySpec:
    """A :class:`StudySpec` from the spec's mapping.

    Raises:
        ValueError: an unknown key, a budget below 1, no seeds, an unknown sampler or
            metric, no methods, a reference that is not one of them, a method without a
            knob, or a grid smaller than the budget (each message names the value, the
            valid range and the fix).
    """
    unknown = sorted(set(raw) - set(RUN_KEYS) - set(STUDY_KEYS))
    if unknown:
        raise ValueError(f"study spec: unknown keys {unknown}; a spec takes "
                         f"{', '.join(STUDY_KEYS + RUN_KEYS)}")
    budget, seeds, sampler = raw.get("budget", 6), raw.get("seeds", [0, 1, 2]), raw.get(
        "sampler", "tpe")
    if not is_int(budget) or budget < 1:
        raise bad_value("budget", budget, "it must be an integer >= 1 (trials per method)",
                        "For example budget = 6.")
    if (not isinstance(seeds, list) or not seeds or not all(is_int(s) and s >= 0 for s in seeds)
            or len(set(seeds)) != len(seeds)):
        raise bad_value("seeds", seeds, "it must list distinct integers >= 0",
                        "For example seeds = [0, 1, 2].")
    if sampler not in SAMPLERS:
        raise bad_value("sampler", sampler, f"it must be one of {', '.join(SAMPLERS)}")
    metric, margin, reference, window = _target(raw.get("target", {}))
    lr_grid = _lr_grid(raw, sampler)
    methods = _methods(raw.get("methods"), budget, sampler)
    if reference not in {m.label for m in methods}:
        raise bad_value("target.reference", reference, "it must be one of the spec's methods "
                        f"({', '.join(m.label for m in methods)})", "Add it under [methods].")
    run = {k: raw[k] for k in RUN_KEYS if k in raw}
    run["simulate"] = run.get("simulate", True)
    return StudySpec(str(raw.get("name", "study")), run, budget, tuple(seeds), sampler, metric,
                     margin, reference, methods, raw, lr_grid, window)


def _lr_grid(raw: dict[str, Any], sampler: str) -> LrGrid | None:
    """The spec's learning-rate grid: required by the ``lr-grid`` sampler, refused by the
    others (their ``lr`` is each method's knob)."""
    if sampler != "lr-grid":
        if "lr_grid" in raw:
            raise bad_value("lr_grid", raw["lr_grid"], 'it goes with sampler = "lr-grid"',
                            'Set sampler = "lr-grid", or give each method an lr knob.')
        return None
    if "budget" in raw:
        raise bad_value("budget", raw["budget"], "an lr-grid study's budget is its grid "
                        "(points x each method's knob combinations)", "Remove budget.")
    return LrGrid.parse(raw.get("lr_grid"))


def _target(target: Any) -> tuple[str, float, str, int]:
    if not isinstance(target, dict) or set(target) - {"metric", "margin", "reference",
                                                      "window"}:
        raise bad_value("target", target, "it takes metric, margin, reference and window",
                        'For example [target] metric = "accuracy", margin = 0.005.')
    window = target.get("window", DEFAULT_WINDOW)
    if not is_int(window) or window < 1:
        raise bad_value("target.window", window, "it must be an integer >= 1 (the last "
                        "evaluations a run's end value averages)", "For example window = 3.")
    metric = target.get("metric", "accuracy")
    if metric not in METRICS:
        raise bad_value("target.metric", metric, f"it must be one of {', '.join(METRICS)}")
    margin = target.get("margin", 0.005 if metric == "accuracy" else 0.03)
    check_number("target.margin", margin, "in [0, 1)", lambda v: 0 <= v < 1,
                 "0.005 is half a point of accuracy; 0.03 is 3 % of a loss.")
    return metric, float(margin), str(target.get("reference", "dense")), int(window)


def _methods(table: Any, budget: int, sampler: str) -> tuple[MethodSpace, ...]:
    if not isinstance(table, dict) or not table:
        raise bad_value("methods", table, "a spec needs at least one [methods.NAME] table",
                        "For example [methods.dense] lr = [0.05, 0.1].")
    rows = []
    for label, body in table.items():
        if not isinstance(body, dict):
            raise bad_value(f"methods.{label}", body, "it must be a table of knobs")
        body = dict(body)
        method, fixed = body.pop("method", label), body.pop("fixed", {})
        if not isinstance(fixed, dict):
            raise bad_value(f"methods.{label}.fixed", fixed, "it must be a table of settings")
        knobs = tuple(Knob.parse(label, name, value) for name, value in body.items())
        row = MethodSpace(str(label), str(method), dict(fixed), knobs)
        if sampler == "lr-grid":
            _check_lr_grid_row(row, body)
            rows.append(row)
            continue
        if not knobs:
            raise bad_value(f"methods.{label}", body, "it has no knob to search, so its "
                            "budget would train one setting again and again",
                            "Give it at least one, e.g. lr = [0.05, 0.1].")
        size = row.grid_size
        if (size is not None and size < budget) or (sampler == "grid" and size is None):
            raise bad_value(f"methods.{label}", body, f"its {size or 'float'} distinct settings"
                            f" cannot fill the budget of {budget} trials (every method gets "
                            "the same)", "Give it more values or a range, or lower the budget"
                            + (" (a grid needs lists)." if sampler == "grid" else "."))
        rows.append(row)
    return tuple(rows)


def _check_lr_grid_row(row: MethodSpace, body: dict[str, Any]) -> None:
    """An ``lr-grid`` method: its lr comes from the shared grid, its other knobs are lists
    crossed with it (never one value at one rate)."""
    for knob in row.knobs:
        if knob.name == "lr":
            raise bad_value(f"methods.{row.label}.lr", body["lr"], "an lr-grid study tries "
                            "every method at the shared lr_grid's rates", "Remove it.")
        if knob.choices is None:
            raise bad_value(f"methods.{row.label}.{knob.name}", body[knob.name],
                            "an lr-grid study crosses each knob's list with every rate",
                            "Give a list of values, or put one value in fixed.")
