"""docs/compatibility.md stays true: flags it calls same/different exist, flags it calls missing do not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sglang.srt.server_args import ServerArgs

DOC = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"


def _flag_rows() -> list[tuple[list[str], str]]:
    text = DOC.read_text()
    section = text.split("## Launch flags", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[1] in ("same", "different", "missing"):
            rows.append((re.findall(r"`(--[a-z0-9-]+)`", cells[0]), cells[1]))
    return rows


def _accepted_flags() -> set[str]:
    import argparse

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return {opt for action in parser._actions for opt in action.option_strings}


def test_doc_lists_flags():
    assert len(_flag_rows()) > 20


@pytest.mark.parametrize("flags,status", _flag_rows())
def test_flag_status_matches_the_parser(flags, status):
    accepted = _accepted_flags()
    for flag in flags:
        if status == "missing":
            assert flag not in accepted, f"{flag} is accepted now: update docs/compatibility.md"
        else:
            assert flag in accepted, f"{flag} is documented as {status} but the parser does not know it"
