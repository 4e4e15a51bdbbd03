"""docs/architecture.md's switch table matches the registry, and every flag and module path it names
exists, so the page cannot drift from the code unnoticed."""

from __future__ import annotations

import re
from pathlib import Path

from sglang.srt.environ import envs
from sglang.srt.server_args import ServerArgs

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "architecture.md").read_text()
# lines about what is not built yet may name flags and files that do not exist yet
BUILT = "\n".join(line for line in DOC.splitlines() if "NOT YET" not in line and "(proposed)" not in line)


def _section(title: str) -> str:
    start = DOC.index(f"## {title}")
    end = DOC.find("\n## ", start + 1)
    return DOC[start:end if end > 0 else None]


def test_switch_table_lists_exactly_the_registered_variables():
    table = {m for m in re.findall(r"^\| `(SGLANG_[A-Z0-9_]+)`", _section("7. Switches"), re.M)}
    registered = {v.name for v in envs.all()}
    assert table == registered, f"missing from the doc: {registered - table}; not registered: {table - registered}"


def test_every_flag_named_in_the_doc_exists():
    flags = set(re.findall(r"`(--[a-z][a-z0-9-]+)", BUILT))
    import argparse

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    known = {opt for action in parser._actions for opt in action.option_strings}  # aliases included
    assert flags - known == set(), sorted(flags - known)


def test_every_module_path_in_the_module_map_exists():
    missing = []
    for path in re.findall(r"`((?:sglang|sgl-kernel|benchmark|scripts|docs|test)/[\w./-]+)`", BUILT):
        if "<" in path or "*" in path:
            continue
        if not (REPO / path.rstrip("/")).exists():
            missing.append(path)
    assert not missing, missing
