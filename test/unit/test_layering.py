"""Layering rules read from the source (ast, nothing imported): models and layers never import the
managers (the scheduler side); only environ.py reads the process environment."""

from __future__ import annotations

import ast
from pathlib import Path

SRT = Path(__file__).resolve().parents[2] / "sglang" / "srt"


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
    return out


def test_models_and_layers_do_not_import_managers():
    bad = []
    for pkg in ("models", "layers"):
        for path in sorted((SRT / pkg).rglob("*.py")):
            bad += [f"{path.relative_to(SRT)}: {m}" for m in _imports(path) if m.startswith("sglang.srt.managers")]
    assert not bad, bad


def test_only_environ_reads_the_environment():
    bad = []
    for path in sorted(SRT.parent.rglob("*.py")):
        if path == SRT / "environ.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv") \
                    and isinstance(node.value, ast.Name) and node.value.id == "os":
                bad.append(f"{path.relative_to(SRT.parent)}:{node.lineno} os.{node.attr}")
    assert not bad, bad
