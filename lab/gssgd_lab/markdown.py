"""Rewrite generated blocks inside a hand-written markdown file."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

__all__ = ["splice_markdown"]


def splice_markdown(path: str | Path, blocks: Mapping[str, str]) -> list[str]:
    """Replace, in the markdown file ``path``, the text between ``<!-- BEGIN name -->`` and
    ``<!-- END name -->`` with ``blocks[name]`` (the prose around the markers is kept).

    Returns:
        The names whose markers the file lacks (left unwritten).
    """
    path = Path(path)
    text = path.read_text()
    missing = []
    for name, body in blocks.items():
        pattern = re.compile(rf"(<!-- BEGIN {re.escape(name)} -->\n).*?(<!-- END {re.escape(name)} -->)", re.S)
        if not pattern.search(text):
            missing.append(name)
            continue
        text = pattern.sub(lambda m, body=body: m[1] + body.rstrip() + "\n" + m[2], text)
    path.write_text(text)
    return missing
