"""Layering rules read from the source (ast, nothing imported): every module of `sglang/` imports only
downward in the layer order written in docs/architecture.md (section 8, "Layer order"), no modules
import each other in a circle, no folders either, sgl-kernel
never imports the engine, and only environ.py reads the process environment."""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "sglang"
SRT = PKG / "srt"
DOC = REPO / "docs" / "architecture.md"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _empty(path: Path) -> bool:
    """A package `__init__` holding nothing but a docstring: a namespace, on no layer."""
    body = ast.parse(path.read_text()).body
    return path.name == "__init__.py" and all(
        isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


@lru_cache(maxsize=None)
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py")) if not _empty(p)}


@lru_cache(maxsize=None)
def _imports(name: str) -> tuple[tuple[str, int], ...]:
    """(imported sglang module, line) for every import statement in the module, wherever it sits
    (functions and TYPE_CHECKING blocks included). `from pkg import sub` names the submodule."""
    path, mods = _modules()[name], _modules()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
            # `from pkg import sub, name`: the submodules, plus the package itself when a name is not one
            out += [(s, node.lineno) for s in subs]
            if len(subs) < len(node.names):
                out.append((base, node.lineno))
    return tuple((m, line) for m, line in out if m in mods)


@lru_cache(maxsize=None)
def _layers() -> list[list[tuple[str, ...]]]:
    """The doc's ```layers block: one list of groups per line, lowest line first."""
    m = re.search(r"```layers\n(.*?)```", DOC.read_text(), re.S)
    assert m, "docs/architecture.md has no ```layers block"
    return [[tuple(g.split()) for g in line.split("|")] for line in m.group(1).splitlines() if line.strip()]


def _place(module: str) -> tuple[int, int] | None:
    """(line, group) of the longest name matching `module`; the root `sglang` matches only itself."""
    best, where = -1, None
    for i, groups in enumerate(_layers()):
        for j, names in enumerate(groups):
            for n in names:
                hit = module == n or (n != "sglang" and module.startswith(n + "."))
                if hit and len(n) > best:
                    best, where = len(n), (i, j)
    return where


def test_every_module_has_a_layer():
    missing = [m for m in _modules() if _place(m) is None]
    assert not missing, f"add these to the ```layers block of docs/architecture.md: {missing}"


def test_imports_go_down_the_layer_order():
    bad = []
    for m in _modules():
        if _place(m) is None:
            continue  # test_every_module_has_a_layer names it
        line, group = _place(m)
        for target, lineno in _imports(m):
            t_line, t_group = _place(target)
            if t_line > line or (t_line == line and t_group != group):
                bad.append(f"{m}:{lineno} imports {target}")
    assert not bad, "\n".join(bad)


def _loops(graph: dict[str, set[str]] | dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one node: the groups that import each other."""
    index, low, on_stack, stack, loops, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                loops.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return loops


def test_no_import_cycles():
    """Every strongly connected component of the module graph is one module."""
    cycles = _loops({m: {t for t, _ in _imports(m) if t != m} for m in _modules()})
    assert not cycles, cycles


def test_models_and_layers_do_not_import_managers():
    """Implied by the layer order; kept as the rule's own name (the model side never reaches the scheduler)."""
    bad = [f"{m}: {t}" for m in _modules() if m.startswith(("sglang.srt.models", "sglang.srt.layers"))
           for t, _ in _imports(m) if t.startswith("sglang.srt.managers")]
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


def _folder(module: str) -> str:
    """The room a module lives in: its package under sglang/srt/ (or under sglang/), or the module itself
    when it is a file directly there (server_args, environ, launch_server, ...)."""
    parts = module.split(".")
    depth = 3 if module.startswith("sglang.srt.") else 2
    head = ".".join(parts[:depth])
    return head if (REPO / Path(*parts[:depth])).is_dir() else module


# Folder loops still to untie. The list may only shrink (it is empty now): a loop not listed fails, and a
# listed loop that is gone fails too, so that it is struck off here when it is untied.
KNOWN_FOLDER_LOOPS: list[list[str]] = []


def test_no_folder_imports_back_up_in_a_loop():
    graph: dict[str, set[str]] = {}
    for m in _modules():
        graph.setdefault(_folder(m), set()).update(_folder(t) for t, _ in _imports(m) if _folder(t) != _folder(m))
    loops = _loops(graph)
    assert sorted(loops) == sorted(KNOWN_FOLDER_LOOPS), f"folder loops now: {sorted(loops)}"


def test_the_kernel_package_stands_alone():
    """sgl-kernel never imports the engine (its benchmarks that compare against the engine live in the
    engine's benchmark/): the kernels can be built, tested and shipped without sglang."""
    bad = []
    for path in sorted((REPO / "sgl-kernel").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names if n.split(".")[0] == "sglang"]
    assert not bad, bad
