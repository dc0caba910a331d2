"""The house rules of the package, kept by a test: modules and functions of a reader's size
(soft limits that flag, a hard ceiling at twice them: cohesion decides a module's extent,
not a line count), imports
that only point down (no circles, no lower layer importing a higher one), method names in
one module, error-feedback rules one per module, and no study figures in the code (the
studies live in studies/, the package loads the figures it needs from data files)."""

from __future__ import annotations

import ast
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent.parent / "gssgd"
#: Sizes past which a module or function is flagged (a warning: read it, merge or split by
#: meaning); twice them fails.
SOFT_MODULE_LINES, SOFT_FUNCTION_LINES = 800, 80


def _modules() -> dict[str, Path]:
    return {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports (anywhere in it, deferred imports included)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            # ``from pkg import sub`` depends on the module pkg.sub; ``from pkg import Name``
            # on pkg itself
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def test_no_module_or_function_is_far_too_long() -> None:
    long, too_long = [], []
    for name, path in _modules().items():
        text = path.read_text()
        sizes = [(name, len(text.splitlines()), SOFT_MODULE_LINES)]
        sizes += [(f"{name}.{node.name}", node.end_lineno - node.lineno + 1,  # type: ignore[operator]
                   SOFT_FUNCTION_LINES) for node in ast.walk(ast.parse(text))
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for what, lines, soft in sizes:
            if lines > 2 * soft:
                too_long.append(f"{what}: {lines} lines")
            elif lines > soft:
                long.append(f"{what}: {lines} lines")
    if long:
        warnings.warn("long (read them: one reader's unit, or two?): " + "; ".join(long),
                      stacklevel=1)
    assert not too_long, "split these into their steps: " + "; ".join(too_long)


def _nodes(paths: Iterable[Path], but: Path) -> Iterator[tuple[Path, ast.AST]]:
    """Every syntax node of the files ``paths`` (sorted) but ``but``, with its file: what a
    rule "only one module does X" walks."""
    for path in sorted(paths):
        if path != but:
            for node in ast.walk(ast.parse(path.read_text())):
                yield path, node


def test_no_import_circles() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    circles = set()
    for start in graph:  # depth-first from every module; a route back to it is a circle
        stack, seen = [(start, [start])], {start}
        while stack:
            node, route = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    circles.add(" -> ".join([*route, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*route, nxt]))
    assert not circles, "import circles (move the shared piece to a lower module): " + "; ".join(
        sorted(set(circles))[:5])


#: The layers of the package, bottom first: a module may import its own layer and the ones
#: below it, never one above (a layer is a subpackage or a top-level module of gssgd;
#: ``gssgd`` itself, the package's ``__init__``, only hands names on). A new top-level
#: module or subpackage takes its place here.
LAYERS = (
    "validate", "target", "log", "plots", "kernels", "transport", "simulated", "selection",
    "sketch", "comm",
    "aggregators", "optim", "lr_schedule", "amp", "methods", "local_steps", "recipes", "ddp", "train",
    "costmodel", "study", "gssgd", "cli",
)


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_imports_point_down_the_layers() -> None:
    modules = _modules()
    unplaced = sorted({_layer(n) for n in modules} - set(LAYERS))
    assert not unplaced, f"give these a place in LAYERS (bottom first): {unplaced}"
    upward = [
        f"{name} imports {target}"
        for name, path in modules.items()
        for target in _imports(name, path, set(modules))
        if LAYERS.index(_layer(target)) > LAYERS.index(_layer(name))
    ]
    assert not upward, ("a lower layer imports a higher one (move the shared piece down): "
                        + "; ".join(sorted(upward)[:8]))


def test_the_cost_model_does_not_import_the_trainer() -> None:
    """The cost model and advise stand beside the trainer, not on it: model shapes come
    from its own architecture table (:mod:`gssgd.costmodel.architectures`) or its caller,
    the target rule from :mod:`gssgd.target`."""
    modules = _modules()
    found = sorted(f"{name} imports {target}" for name, path in modules.items()
                   if _layer(name) == "costmodel"
                   for target in _imports(name, path, set(modules)) if _layer(target) == "train")
    assert not found, found


#: The one module that lists the methods (the registry); an aggregator names only itself.
REGISTRY = PACKAGE / "methods.py"


def test_method_names_are_listed_and_compared_in_one_module() -> None:
    """Only the registry lists methods (a tuple, list, set or dict of two or more of their
    names) or branches on one (``method == "gs"``, ``"dense" in runs``); every other module
    asks it (:attr:`~gssgd.methods.Method.uncompressed`, ``by_shape``, ``ddp_hook``,
    :data:`~gssgd.methods.REFERENCE_METHOD`, ...), so a new method is one registration, not
    an edit in each module that lists or tests for them."""
    from gssgd.methods import BENCH_VARIANTS, METHODS

    names = set(METHODS) | set(BENCH_VARIANTS)
    found = []
    for path, node in _nodes(PACKAGE.rglob("*.py"), but=REGISTRY):
        if isinstance(node, ast.Compare):
            items, least = [node.left, *node.comparators], 1
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items, least = node.elts, 2
        elif isinstance(node, ast.Dict):
            items, least = [key for key in node.keys if key is not None], 2
        else:
            continue
        named = [i.value for i in items if isinstance(i, ast.Constant) and i.value in names]
        if len(named) >= least:
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {named}")
    assert not found, f"method names listed or compared outside gssgd/methods.py: {found}"


LAB = PACKAGE.parent / "lab" / "gssgd_lab"
#: The one module that says whether a value reached dense's target (``Metric.reaches``).
TARGET_RULE = PACKAGE / "target.py"


def test_one_rule_says_whether_a_run_reached_the_target() -> None:
    """Whether a run reached dense's target is decided by one rule
    (:class:`gssgd.target.Metric`): no other module, in the wheel or the lab,
    compares a value with a target (``acc >= target``, ``gap <= target_gap``); checking
    a target's range (``0 < target <= 1``) is not a rule."""
    found = []
    for path, node in _nodes([*PACKAGE.rglob("*.py"), *LAB.rglob("*.py")], but=TARGET_RULE):
        if not (isinstance(node, ast.Compare) and any(
                isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in node.ops)):
            continue
        operands = [node.left, *node.comparators]
        targets = [o for o in operands
                   if not isinstance(o, ast.Constant) and "target" in ast.unparse(o).lower()]
        others = [o for o in operands if o not in targets and not isinstance(o, ast.Constant)]
        if targets and others:
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, f"a target compared outside {TARGET_RULE.name}'s Metric: {found}"


def _private_names(tree: ast.AST) -> set[str]:
    """The private names a module defines: functions, classes, attributes it assigns
    (``self._x = ...``, ``_X = ...``) and class-level fields."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_module_reaches_into_another_modules_private_members() -> None:
    """A name with a leading underscore is its module's own: no ``from m import _x``, no
    ``obj._x`` of a member only another module defines (a method a reader can find in the
    owner's module replaces it). The lab (lab/gssgd_lab) holds to the same rule and imports
    no private gssgd module either."""
    paths = sorted(PACKAGE.rglob("*.py")) + sorted(LAB.rglob("*.py"))
    trees = {path: ast.parse(path.read_text()) for path in paths}
    defined = {path: _private_names(tree) for path, tree in trees.items()}
    everywhere = set().union(*defined.values())
    reaches = []
    for path, tree in trees.items():
        where = path.relative_to(PACKAGE.parent)
        in_lab = LAB in path.parents
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gssgd"):
                private = [a.name for a in node.names if a.name.startswith("_")
                           and not a.name.startswith("__")]
                if in_lab and any(p.startswith("_") for p in node.module.split(".")[1:]):
                    private.append(node.module)
                reaches += [f"{where}:{node.lineno}: imports {name}" for name in private]
            elif (isinstance(node, ast.Attribute) and node.attr in everywhere
                  and node.attr not in defined[path]
                  and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                reaches.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    assert not reaches, "private members used outside their module: " + "; ".join(reaches)


def test_the_wheel_never_imports_the_lab() -> None:
    """The lab builds on the package; the package (the wheel) stands without it."""
    found = [f"{path.relative_to(PACKAGE.parent)}" for path in sorted(PACKAGE.rglob("*.py"))
             if "gssgd_lab" in path.read_text()]
    assert not found, f"the wheel names the lab: {found}"


#: The most package modules ``import gssgd.ddp`` may load: what a user of the DDP hook
#: imports is the hook and what it runs (aggregators, sketch, comm), not the trainer,
#: the studies or the simulated world.
DDP_IMPORT_MODULES = 35


def test_the_ddp_hook_imports_only_what_it_runs() -> None:
    import subprocess
    import sys

    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, gssgd.ddp; print(' '.join(sorted(m for m in "
         "sys.modules if m == 'gssgd' or m.startswith('gssgd.'))))"],
        capture_output=True, text=True, check=True).stdout.split()
    assert len(loaded) <= DDP_IMPORT_MODULES, (
        f"import gssgd.ddp loads {len(loaded)} package modules (at most "
        f"{DDP_IMPORT_MODULES}): {loaded}")
    assert not [m for m in loaded if m.startswith(("gssgd.train", "gssgd.study", "gssgd.cli",
                                                   "gssgd.costmodel"))], loaded


#: The most package files one gs gradient's path through the DDP hook may cross (in a
#: steady compressed iteration): a reader follows it in a few rooms.
GS_PATH_FILES = 15


def test_one_gs_gradient_through_the_ddp_hook_crosses_few_files() -> None:
    """The files whose functions run while two simulated ranks' DDP hooks average one gs
    gradient (the third iteration: past the dense warm-up and the aggregator's building),
    the simulated world and the test's buckets aside (real ranks cross transport.py)."""
    import sys
    import threading

    import torch

    from gssgd.ddp import HookState, comm_hook
    from gssgd.simulated import SimulatedWorld
    from gssgd.train.ddp_buckets import DDPBuckets

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(100, 100), torch.nn.Linear(100, 10))
    params = list(model.parameters())
    world = SimulatedWorld(2)
    states = [HookState("gs", density=0.05, start_iter=1, group=world.rank(r), model=model)
              for r in range(2)]
    buckets = DDPBuckets(params, None)
    crossed: set[str] = set()

    def watch(frame: Any, event: str, arg: Any) -> None:
        path = Path(frame.f_code.co_filename)
        if PACKAGE in path.parents:
            crossed.add(str(path.relative_to(PACKAGE)))

    def step(rank: Any) -> list[torch.Tensor]:
        grad = torch.randn(sum(p.numel() for p in params))
        return [f.wait() for f in [comm_hook(states[rank.rank], b)  # type: ignore[arg-type]
                                   for b in buckets.split(grad)]]

    for iteration in range(3):
        buckets.start_iteration()
        if iteration == 2:
            sys.setprofile(watch)
            threading.setprofile(watch)
        try:
            world.run(step)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
    crossed -= {"simulated.py", "train/ddp_buckets.py"}
    assert "aggregators/gs.py" in crossed and "sketch/count_sketch.py" in crossed, crossed
    assert len(crossed) <= GS_PATH_FILES, (
        f"one gs gradient crosses {len(crossed)} files (at most {GS_PATH_FILES}): "
        f"{sorted(crossed)}")


#: The one module that says what an integer or a number is (``True`` is neither).
CHECKER = PACKAGE / "validate.py"


def test_one_checker_says_what_an_integer_is() -> None:
    """``isinstance(v, bool) or not isinstance(v, int)`` written by hand is a second
    checker: every module asks :mod:`gssgd.validate` (``is_int``, ``check_int``,
    ``is_number``, ``check_number``), so every setting's message reads the same."""
    found = []
    for path, node in _nodes(PACKAGE.rglob("*.py"), but=CHECKER):
        if isinstance(node, ast.BoolOp):
            text = ast.unparse(node).replace(" ", "")
            if ",bool)" in text and "notisinstance(" in text and "int" in text:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, f"an integer or number checked by hand, not by gssgd.validate: {found}"


def test_each_error_feedback_rule_is_its_own_class_that_the_aggregators_ask() -> None:
    from gssgd.aggregators.feedback import RULES, ErrorFeedback, QuantisedFeedback

    rules = [*RULES.values(), QuantisedFeedback]
    assert len(set(rules)) == len(rules), f"one class per rule: {rules}"
    assert all(rule.__module__ == "gssgd.aggregators.feedback" for rule in rules), rules
    assert all(issubclass(rule, ErrorFeedback) for rule in rules)
    # the aggregators (streaming gs included) ask their rule; only the options' checks and
    # the traffic formulas (a message pattern) compare the feedback's name
    allowed = {"__post_init__", "resolved", "traffic", "message_traffic"}
    switching = []
    for path in [*(PACKAGE / "aggregators").glob("*.py"), PACKAGE / "ddp" / "streaming_gs.py"]:
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef) or function.name in allowed:
                continue
            for node in ast.walk(function):
                if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute)
                        and node.left.attr in ("feedback", "_feedback")):
                    switching.append(f"{path.name}:{node.lineno} ({function.name})")
    assert not switching, f"feedback modes switched on outside their rules: {switching}"


def test_no_study_figure_in_a_module() -> None:
    """Docstrings say what the code does; measurements, dates and links to the lab notebook
    live in studies/ (and the figures the package needs in its data files)."""
    import re

    notebook = re.compile(r"docs/study\.md|docs/results|\b20\d\d-\d\d-\d\d\b|"
                          r"\b[Mm]easured on\b")
    found = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()[:70]}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if notebook.search(line)
    ]
    assert not found, "study write-ups in the package (move them to the study's README): " + (
        "; ".join(found[:8]))


ROOT = PACKAGE.parent
#: What docs/ and studies/ commit stays small: summaries and web-sized plots; the raw runs
#: stay in runs/ (git-ignored) and are remade by each study's run script. (280 files: the
#: equal-budget study's cells, three files each, grew it from 260; the lr-grid cells, four
#: files each with their spec, from 270; 4.6 MB: the lr-grid cell and the one-call study's
#: third CNN and longer horizon, from 4.5.)
MAX_RESULT_FILES, MAX_RESULT_BYTES = 280, 4_600_000


def _result_files() -> list[Path]:
    """The files docs/ and studies/ ship: git's list in a checkout (so a stray local file
    or the API reference's local build does not count), else every file there but builds
    and caches."""
    import subprocess

    listed = subprocess.run(["git", "ls-files", "docs", "studies"], cwd=ROOT,
                            capture_output=True, text=True, check=False)
    if listed.returncode == 0 and listed.stdout.strip():
        return [ROOT / line for line in listed.stdout.splitlines() if (ROOT / line).is_file()]
    return [p for top in ("docs", "studies") for p in (ROOT / top).rglob("*")
            if p.is_file() and "_build" not in p.parts and "__pycache__" not in p.parts]


def test_docs_and_study_results_stay_small() -> None:
    files = _result_files()
    size = sum(p.stat().st_size for p in files)
    assert len(files) <= MAX_RESULT_FILES, (
        f"docs/ and studies/ hold {len(files)} files (at most {MAX_RESULT_FILES}): commit "
        "summaries and the plots a page shows; leave the rest in runs/ "
        "(PLOTS=0 tools/publish_results.sh)")
    assert size <= MAX_RESULT_BYTES, (
        f"docs/ and studies/ hold {size:,} bytes (at most {MAX_RESULT_BYTES:,}): size plots "
        "with studies/_lib/report.py's shrink_png")


def test_committed_plots_are_web_sized() -> None:
    """Every plot is a palette PNG (shrink_png's output), not matplotlib's full-colour one."""
    from PIL import Image

    full = [str(p.relative_to(ROOT)) for p in _result_files() if p.suffix == ".png"
            and Image.open(p).mode != "P"]
    assert not full, f"plots not sized for the web (run shrink_png on them): {full}"
