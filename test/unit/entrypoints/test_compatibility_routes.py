"""docs/compatibility.md's endpoint rows match the app: every route it calls same or different is
served with the methods it names, and every route it calls missing is not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_http_routes import FakeTM, _app

DOC = Path(__file__).resolve().parents[3] / "docs" / "compatibility.md"


def _endpoint_rows() -> list[tuple[list[tuple[str, str]], str]]:
    """(method, path) pairs of each row and its status; a path without a method takes the row's last one."""
    section = DOC.read_text().split("## Endpoints", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[1] not in ("same", "different", "missing"):
            continue
        pairs, method = [], "GET"
        for m in re.finditer(r"`(?:([A-Z]+(?:/[A-Z]+)*) )?(/[^`\s]*)`", cells[0]):
            method = m.group(1) or method
            pairs += [(verb, m.group(2)) for verb in method.split("/")]
        if pairs:
            rows.append((pairs, cells[1]))
    return rows


def _served() -> set[tuple[str, str]]:
    app = _app(FakeTM())
    return {(verb, route.path.replace(":path}", "}")) for route in app.routes if hasattr(route, "methods")
            for verb in route.methods}


def test_doc_lists_endpoints():
    assert len(_endpoint_rows()) > 15


@pytest.mark.parametrize("pairs,status", _endpoint_rows())
def test_endpoint_status_matches_the_app(pairs, status):
    served = _served()
    for verb, path in pairs:
        if status == "missing":
            assert not any(p == path for _, p in served), f"{path} is served now: update docs/compatibility.md"
        else:
            assert (verb, path) in served, f"{verb} {path} is documented as {status} but the app does not serve it"
