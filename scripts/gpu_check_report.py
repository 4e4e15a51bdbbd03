"""The runtime half of scripts/gpu_check.sh's helper: the stage summary written after every step (and its
table), and the reaping of processes a step left behind. `gpu_check_plan.py` exposes both on its command
line (`summary`, `reap`); the plan itself (stages, steps, budgets, lists) stays there."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path


# ----------------------------------------------------------------------------- summary


def write_summary(records: Path, out: Path, stage: str, stage_budget: int, planned: int,
                  elapsed: int, complete: bool) -> dict:
    steps = []
    if records.exists():
        for line in records.read_text(encoding="utf-8").splitlines():
            if not line:
                continue
            name, rc, secs, budget, given, counts, status = line.split("\t")
            steps.append({"name": name, "status": status, "rc": int(rc), "seconds": int(secs),
                          "budget": int(budget), "given": int(given), "counts": int(counts),
                          "timed_out": status.startswith("timed out")})
    failed = int(any(s["counts"] and s["rc"] != 0 for s in steps))
    summary = {"stage": stage, "complete": complete, "failed": failed, "stage_budget_s": stage_budget,
               "planned_s": planned, "elapsed_s": elapsed, "steps": steps}
    tmp = out.with_name(f".{out.name}.part")
    tmp.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out)
    return summary


def format_table(summary: dict) -> str:
    lines = []
    for s in summary["steps"]:
        status = s["status"] if s["status"] == "ok" else f"{s['status']} (rc={s['rc']})"
        if s["status"] != "ok" and not s["counts"]:
            status += ", not counted"
        lines.append(f"{s['name'][:64]:<64} {s['seconds']:4d}/{s['given']:<4d}s  {status}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- processes


def reap(tag: str, rounds: int = 5) -> list[int]:
    """SIGKILL every process (but this one) whose environment holds exactly ``tag`` (KEY=VALUE)."""
    want = tag.encode()
    me = os.getpid()
    killed: list[int] = []
    for _ in range(rounds):
        found = []
        try:
            pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        except OSError:
            return killed
        for pid in pids:
            if pid == me:
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read()
            except OSError:
                continue
            if want in env.split(b"\0"):
                try:
                    os.kill(pid, signal.SIGKILL)
                    found.append(pid)
                except OSError:
                    pass
        if not found:
            break
        killed += found
        time.sleep(0.05)  # let the killed ones go before looking for children they started
    return killed
