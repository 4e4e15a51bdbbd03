"""scripts/check_switches.py: every declared mutant still applies to the code (default suite: a refactor
that moves the edited line must move its mutant too), and in the slow target every mutant is killed by
the tests that claim its switch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "scripts"))

import check_switches  # noqa: E402
from switch_mutants import MUTANTS  # noqa: E402


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_every_mutant_applies_and_names_existing_tests(mutant):
    assert check_switches.applies(mutant) is None, check_switches.applies(mutant)
    for node in mutant.tests:
        path, _, name = node.partition("::")
        assert (REPO / path).is_file(), node
        assert not name or f"def {name.split('[')[0]}(" in (REPO / path).read_text(), node


def test_a_mutant_that_does_not_apply_is_reported(tmp_path):
    from switch_mutants import Mutant

    ghost = Mutant("ghost", "none", "sglang/srt/environ.py", "this text is not in the file", "x", ("test",))
    assert "0 times" in check_switches.applies(ghost)
    assert check_switches.run_mutant(ghost, 10)["result"] == "does not apply"


@pytest.mark.slow
def test_no_mutant_survives():
    """Each mutant in a copy of the checkout, its tests run there (minutes: servers start per mutant)."""
    rows = [check_switches.run_mutant(m, 1200) for m in MUTANTS]
    assert all(r["result"] == "killed" for r in rows), rows
