"""Mutation check of the switches: for each mutant of `scripts/switch_mutants.py`, copy the checkout
(tracked and unignored files, as they are now) into a temporary directory, apply the mutant's edit, run
its tests there and report whether they failed (killed) or passed (a survivor: nothing proves that
switch). Exit status 1 when any mutant survives or no longer applies.

  python scripts/check_switches.py [--list] [--only NAME ...] [--skip-slow] [--json OUT]

The copy is run with its own PYTHONPATH first, so the mutant is what every spawned server imports.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from switch_mutants import MUTANTS, Mutant  # noqa: E402


def applies(m: Mutant, root: Path = REPO) -> str | None:
    """None when the mutant's edit applies to `root` (its text found exactly once), else why not."""
    path = root / m.path
    if not path.is_file():
        return f"{m.path} does not exist"
    n = path.read_text().count(m.find)
    return None if n == 1 else f"{m.path} holds the text to edit {n} times (must be once)"


def _copy_checkout(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout.split(b"\0")
    for raw in filter(None, files):
        rel = raw.decode()
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def run_mutant(m: Mutant, timeout_s: float) -> dict:
    why = applies(m)
    if why is not None:
        return {"name": m.name, "switch": m.switch, "result": "does not apply", "why": why}
    with tempfile.TemporaryDirectory(prefix=f"mutant-{m.name}-") as tmp:
        root = Path(tmp)
        _copy_checkout(root)
        target = root / m.path
        target.write_text(target.read_text().replace(m.find, m.replace, 1))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not gpu",
                               *m.tests], cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s)
        took = time.monotonic() - start
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
    # pytest: 0 all passed (the mutant survived), 1 a test failed (killed); anything else is an error
    result = {0: "SURVIVED", 1: "killed"}.get(proc.returncode, f"error (pytest exit {proc.returncode})")
    return {"name": m.name, "switch": m.switch, "result": result, "seconds": round(took, 1), "pytest": tail[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the mutants and whether each still applies")
    ap.add_argument("--only", nargs="+", default=None, help="run only these mutants")
    ap.add_argument("--skip-slow", action="store_true", help="leave out mutants whose tests are in the slow target")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTANTS if (args.only is None or m.name in args.only) and not (args.skip_slow and m.slow)]
    if args.list:
        for m in chosen:
            print(f"{m.name:36s} {m.switch:40s} {applies(m) or 'applies'}")
        return 0 if all(applies(m) is None for m in chosen) else 1
    rows = []
    for k, m in enumerate(chosen, 1):
        print(f"[{k}/{len(chosen)}] {m.name} ...", flush=True)
        rows.append(run_mutant(m, args.timeout))
        print(f"    {rows[-1]['result']}  {rows[-1].get('pytest') or rows[-1].get('why', '')}", flush=True)
    survivors = [r["name"] for r in rows if r["result"] != "killed"]
    print(f"{len(rows) - len(survivors)} killed, {len(survivors)} not: {', '.join(survivors) or 'none'}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
