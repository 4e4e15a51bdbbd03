"""torch.profiler in a scheduler process, driven by /start_profile and /stop_profile (`ProfileReq`).

Every TP rank profiles its own process (the model runs there) and writes one Chrome trace,
`<output_dir>/<profile_id>-TP-<rank>.trace.json.gz`, when profiling stops: on a "stop" request or by
itself after `num_steps` forward steps. Opened with chrome://tracing or https://ui.perfetto.dev."""

from __future__ import annotations

import logging
import os

import torch

from sglang.srt.environ import envs
from sglang.srt.managers.io_struct import ProfileReq, ProfileReqOutput

logger = logging.getLogger(__name__)

ACTIVITIES = ("CPU", "GPU")  # upstream's names; GPU records CUDA kernels where there is a CUDA device


def trace_path(output_dir: str, profile_id: str, rank: int) -> str:
    return os.path.join(output_dir, f"{profile_id}-TP-{rank}.trace.json.gz")


class SchedulerProfiler:
    def __init__(self, tp_rank: int = 0):
        self.rank = tp_rank
        self._prof: torch.profiler.profile | None = None
        self._path = ""
        self._steps_left: int | None = None

    @property
    def active(self) -> bool:
        return self._prof is not None

    def handle(self, req: ProfileReq) -> ProfileReqOutput:
        if req.action == "start":
            return self.start(req)
        if req.action == "stop":
            return self.stop()
        return ProfileReqOutput(False, f"unknown profile action {req.action!r}")

    def start(self, req: ProfileReq) -> ProfileReqOutput:
        if self._prof is not None:
            return ProfileReqOutput(False, "profiling is already in progress; call /stop_profile first")
        unknown = sorted(set(req.activities) - set(ACTIVITIES))
        if unknown:
            return ProfileReqOutput(False, f"unknown profiler activities {unknown}; known: {list(ACTIVITIES)}")
        kinds = [torch.profiler.ProfilerActivity.CPU] if "CPU" in req.activities else []
        if "GPU" in req.activities and torch.cuda.is_available():
            kinds.append(torch.profiler.ProfilerActivity.CUDA)
        if not kinds:
            return ProfileReqOutput(False, f"activities {req.activities} record nothing here: there is no CUDA device")
        out_dir = req.output_dir or envs.SGLANG_TORCH_PROFILER_DIR.get()
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as e:
            return ProfileReqOutput(False, f"cannot create the profile output directory {out_dir!r}: {e}")
        if not os.access(out_dir, os.W_OK):
            return ProfileReqOutput(False, f"the profile output directory {out_dir!r} is not writable")
        prof = torch.profiler.profile(activities=kinds, with_stack=req.with_stack, record_shapes=req.record_shapes)
        prof.start()
        self._prof, self._path, self._steps_left = prof, trace_path(out_dir, req.profile_id, self.rank), req.num_steps
        logger.info("profiling started (rank %d): the trace goes to %s", self.rank, self._path)
        return ProfileReqOutput(True, "profiling started", files=[self._path])

    def stop(self) -> ProfileReqOutput:
        if self._prof is None:
            return ProfileReqOutput(False, "profiling is not in progress; call /start_profile first")
        prof, self._prof, self._steps_left = self._prof, None, None
        prof.stop()
        try:
            prof.export_chrome_trace(self._path)
        except OSError as e:
            return ProfileReqOutput(False, f"could not write the trace {self._path!r}: {e}")
        logger.info("profiling stopped (rank %d): trace written to %s", self.rank, self._path)
        return ProfileReqOutput(True, "profiling stopped", files=[self._path])

    def after_forward(self) -> None:
        """Counts a forward step; with `num_steps`, the last one stops profiling and writes the trace."""
        if self._steps_left is None:
            return
        self._steps_left -= 1
        if self._steps_left <= 0:
            out = self.stop()
            if not out.success:
                logger.error("profiling after num_steps: %s", out.message)
