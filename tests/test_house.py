"""The house rules of the package, kept by a test: small modules, small functions, and
imports that only point down (no module reaches back to one that imports it)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gssgd"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80


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


def test_no_module_or_function_is_too_long() -> None:
    too_long = []
    for name, path in _modules().items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {length} lines")
    assert not too_long, "split these into their steps: " + "; ".join(too_long)


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


DOCS = PACKAGE.parent / "docs"
#: docs/ holds summaries and web-sized plots only (issue #38): what remakes them is in
#: scripts/, the raw runs under runs/ (git-ignored).
MAX_DOCS_FILES, MAX_DOCS_BYTES = 149, 4_000_000


def _docs_files() -> list[Path]:
    """The files docs/ ships: git's list in a checkout (so a stray local file or the API
    reference's local build does not count), else every file but docs/api/_build."""
    import subprocess

    listed = subprocess.run(["git", "ls-files", "docs"], cwd=DOCS.parent, capture_output=True,
                            text=True, check=False)
    if listed.returncode == 0 and listed.stdout.strip():
        return [DOCS.parent / line for line in listed.stdout.splitlines()
                if (DOCS.parent / line).is_file()]
    return [p for p in DOCS.rglob("*") if p.is_file() and "_build" not in p.parts
            and "__pycache__" not in p.parts]


def test_docs_stay_small() -> None:
    files = _docs_files()
    size = sum(p.stat().st_size for p in files)
    assert len(files) <= MAX_DOCS_FILES, (
        f"docs/ holds {len(files)} files (at most {MAX_DOCS_FILES}): commit summaries and the "
        "plots a page shows; leave the rest in runs/ (PLOTS=0 scripts/publish_results.sh)")
    assert size <= MAX_DOCS_BYTES, (
        f"docs/ holds {size:,} bytes (at most {MAX_DOCS_BYTES:,}): size plots with "
        "scripts/lib/report.py's shrink_png")


def test_committed_plots_are_web_sized() -> None:
    """Every plot is a palette PNG (shrink_png's output), not matplotlib's full-colour one."""
    from PIL import Image

    full = [str(p.relative_to(DOCS)) for p in _docs_files() if p.suffix == ".png"
            and Image.open(p).mode != "P"]
    assert not full, f"plots not sized for the web (run shrink_png on them): {full}"
