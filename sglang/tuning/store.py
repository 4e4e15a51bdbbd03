"""The results file: `<output-dir>/results.jsonl`, one JSON line per finished run, appended and flushed as
soon as the run ends, so an interrupted or crashed sweep loses at most the run in flight.

A line: `{"fingerprint", "config" (the grid point as a dict), "key" (its text), "concurrency", "status"
("ok" or "failed"), "error", "server_argv", "env", "start_s", "wall_s", "peak_rss_mb", "peak_gpu_mem_mb",
"server_info", "metrics" (bench_serving's record)}`.

Resuming: a run whose (fingerprint, key, concurrency) already has a line is skipped; failed runs too unless
`--retry-failed` (the later line wins). Lines of another fingerprint (another workload, model or common
server flags) stay in the file and are ignored by this sweep and its report.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

RESULTS = "results.jsonl"


def run_id(fingerprint: str, key: str, concurrency: int | None) -> tuple[str, str, int | None]:
    return fingerprint, key, concurrency


class ResultsStore:
    def __init__(self, output_dir: str | Path):
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / RESULTS

    def load(self) -> list[dict[str, Any]]:
        """Every readable line; a torn last line (a crash mid-write) is skipped."""
        if not self.path.exists():
            return []
        out = []
        for raw in self.path.read_text().splitlines():
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "key" in rec:
                out.append(rec)
        return out

    def latest(self, fingerprint: str) -> dict[tuple, dict[str, Any]]:
        """(fingerprint, key, concurrency) -> the last line of this fingerprint."""
        done: dict[tuple, dict[str, Any]] = {}
        for rec in self.load():
            if rec.get("fingerprint") == fingerprint:
                done[run_id(fingerprint, rec["key"], rec.get("concurrency"))] = rec
        return done

    def pending(self, fingerprint: str, runs: Iterable[tuple[str, int | None]], retry_failed: bool = False
                ) -> list[tuple[str, int | None]]:
        done = self.latest(fingerprint)
        out = []
        for key, conc in runs:
            rec = done.get(run_id(fingerprint, key, conc))
            if rec is None or (retry_failed and rec.get("status") != "ok"):
                out.append((key, conc))
        return out

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, default=_jsonable) + "\n"
        with open(self.path, "a") as f:
            if f.tell() > 0 and not _ends_with_newline(self.path):
                f.write("\n")  # after a torn line, start clean
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _jsonable(obj: Any):
    try:
        import numpy as np

        if isinstance(obj, np.generic):
            return obj.item()
    except ImportError:
        pass
    return str(obj)
