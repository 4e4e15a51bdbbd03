"""One step of a ``scripts/gpu_check.sh`` stage, and the error a bad plan raises (standard library only).

Shared by ``gpu_check_stages.py`` (the built-in stages' steps) and ``gpu_check_plan.py`` (the plan, the
benchmark lists and the CLI); it imports neither, so no two of them import each other.
"""

from __future__ import annotations

from dataclasses import dataclass


class PlanError(ValueError):
    pass


@dataclass
class Step:
    name: str
    budget: int
    command: str  # run by `bash -c` from the repository root (shell functions of gpu_check.sh included)
    counts: bool = True  # a failure fails the stage
    fatal: bool = False  # a failure stops the stage (nothing after it could work)
    pytest: bool = False  # exit status 5 (nothing collected) counts as passed
    outputs: tuple[str, ...] = ()  # files the step writes directly under $OUT
    display: str = ""

    def tsv(self) -> str:
        cells = [str(self.budget), str(int(self.counts)), str(int(self.fatal)), str(int(self.pytest)),
                 self.name, self.command]
        for cell in cells:
            if "\t" in cell or "\n" in cell:
                raise PlanError(f"tab or newline in step {self.name!r}")
        return "\t".join(cells)
