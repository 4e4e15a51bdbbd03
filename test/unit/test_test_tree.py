"""The test tree has no package __init__ files, so pytest imports each test module by its basename:
two test files with one basename break collection of the whole suite."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_test_module_basenames_are_unique():
    seen: dict[str, list[str]] = defaultdict(list)
    for tree in ("test", "sgl-kernel/tests"):
        for path in (ROOT / tree).rglob("*.py"):
            if path.name.startswith("test_") or path.name == "conftest.py":
                seen[path.name].append(str(path.relative_to(ROOT)))
    dupes = {name: paths for name, paths in seen.items() if len(paths) > 1 and name != "conftest.py"}
    assert not dupes, dupes


def test_only_the_root_and_e2e_have_a_conftest():
    """test/e2e's tests import helpers with `from conftest import ...`, which resolves to whichever module named
    `conftest` was imported last: a conftest.py in any other folder of test/ shadows it mid-session (it broke
    13 e2e tests once). Shared fixtures go in test/conftest.py, helpers in a uniquely named module."""
    found = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "test").rglob("conftest.py"))
    assert found == ["test/conftest.py", "test/e2e/conftest.py"], found
