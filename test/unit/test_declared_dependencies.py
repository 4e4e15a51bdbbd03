"""Every third-party import in the repository is covered by a distribution that a pyproject declares.

A fresh machine gets exactly what `pyproject.toml` (and sgl-kernel's) declare, so an import that is
only present on the developer's machine passes here and fails there. This reads the sources with `ast`
(nothing is imported) and names each module no declared distribution provides.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TREES = ["sglang", "sgl-kernel", "test", "benchmark", "scripts"]
PYPROJECTS = [REPO / "pyproject.toml", REPO / "sgl-kernel" / "pyproject.toml"]

# Import name -> distribution name, where the two differ.
IMPORT_TO_DIST = {
    "PIL": "pillow",
    "zmq": "pyzmq",
    "sgl_kernel": "sglang-kernel",
    "yaml": "pyyaml",
}

# Imports that need no declaration, each with the reason. Every one of them is guarded at its import
# site (ImportError / find_spec), and the test below checks that the guard is there.
OPTIONAL_GUARDED = {
    "triton": "GPU kernels; CPU machines run the torch paths (declared as the `triton` extra, not required)",
    "flashinfer": "optional GPU attention backend; its wheel cannot be installed on CPU machines",
    "torchvision": "nvJPEG decode on GPU machines only; its PyPI builds break transformers on CPU",
}


def _declared_distributions() -> set[str]:
    names: set[str] = set()
    for path in PYPROJECTS:
        project = tomllib.loads(path.read_text())["project"]
        names.add(_norm(project["name"]))
        reqs = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            reqs += extra
        for req in reqs:
            names.add(_norm(re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0]))
    return names


def _norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _local_modules() -> set[str]:
    """Top-level names importable from the repository itself: packages, test helpers next to tests."""
    local = {"sglang", "sgl_kernel"}
    for tree in TREES:
        for p in (REPO / tree).rglob("*.py"):
            local.add(p.stem)
        for p in (REPO / tree).rglob("__init__.py"):
            local.add(p.parent.name)
    return local


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(top-level module, line, guarded) for each absolute import; guarded = inside a try that
    catches ImportError, or in a module that checks the name with importlib.util.find_spec."""
    tree = ast.parse(path.read_text(), filename=str(path))
    guarded_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            for stmt in node.body:
                for sub in ast.walk(stmt):
                    guarded_lines.add(getattr(sub, "lineno", -1))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.append((alias.name.split(".")[0], node.lineno, node.lineno in guarded_lines))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module.split(".")[0], node.lineno, node.lineno in guarded_lines))
    return out


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = [handler.type] if not isinstance(handler.type, ast.Tuple) else list(handler.type.elts)
    return any(isinstance(n, ast.Name) and n.id in {"ImportError", "ModuleNotFoundError", "Exception"} for n in names)


def _third_party_imports():
    local = _local_modules()
    for tree in TREES:
        for path in sorted((REPO / tree).rglob("*.py")):
            for mod, line, guarded in _imports(path):
                if mod in sys.stdlib_module_names or mod in local or mod == "__future__":
                    continue
                yield path.relative_to(REPO), line, mod, guarded


def test_every_third_party_import_is_declared():
    declared = _declared_distributions()
    missing: dict[str, str] = {}
    for path, line, mod, _ in _third_party_imports():
        if mod not in OPTIONAL_GUARDED and _norm(IMPORT_TO_DIST.get(mod, mod)) not in declared:
            missing.setdefault(mod, f"{mod} (first at {path}:{line})")
    missing = sorted(missing.values())
    assert not missing, "imports not covered by any declared distribution: " + ", ".join(missing)


def test_optional_imports_are_guarded():
    """An optional module imported without a guard would make its absence a crash, not a fallback.
    Kernel files (`*_triton.py`) import triton directly; they in turn may only be imported lazily,
    from inside a function, after the caller checked that triton imports."""
    unguarded = []
    for path, line, mod, guarded in _third_party_imports():
        if path.stem.endswith("_triton"):
            continue
        if mod in OPTIONAL_GUARDED and not guarded and not _checked_with_find_spec(REPO / path, mod):
            unguarded.append(f"{mod} at {path}:{line}")
    assert not unguarded, "optional imports without an ImportError guard: " + ", ".join(unguarded)


def test_kernel_modules_are_imported_lazily():
    eager = []
    for tree in TREES:
        for path in sorted((REPO / tree).rglob("*.py")):
            module = ast.parse(path.read_text())
            for node in module.body:  # top level only: imports inside functions are lazy
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[-1].endswith("_triton"):
                    eager.append(f"{node.module} at {path.relative_to(REPO)}:{node.lineno}")
                if isinstance(node, ast.Import) and any(a.name.split(".")[-1].endswith("_triton") for a in node.names):
                    eager.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not eager, "kernel modules imported at module level (triton would become required): " + ", ".join(eager)


def _checked_with_find_spec(path: Path, mod: str) -> bool:
    text = path.read_text()
    return f'find_spec("{mod}")' in text or "pytest.importorskip" in text or "skipif" in text


@pytest.mark.parametrize("mod", sorted(OPTIONAL_GUARDED))
def test_optional_modules_are_not_declared_as_runtime_dependencies(mod):
    project = tomllib.loads(PYPROJECTS[0].read_text())["project"]
    runtime = {_norm(re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0]) for r in project["dependencies"]}
    assert _norm(mod) not in runtime


def test_the_checker_flags_an_undeclared_import(tmp_path, monkeypatch):
    """The scanner really sees imports: a file importing an undeclared module is reported."""
    src = tmp_path / "m.py"
    src.write_text("import definitely_not_declared_pkg\ntry:\n    import triton\nexcept ImportError:\n    triton = None\n")
    found = {(mod, guarded) for mod, _, guarded in _imports(src)}
    assert ("definitely_not_declared_pkg", False) in found
    assert ("triton", True) in found
    assert _norm("definitely_not_declared_pkg") not in _declared_distributions()
