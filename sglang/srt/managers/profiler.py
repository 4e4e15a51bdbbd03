"""torch.profiler in a scheduler process, driven by /start_profile and /stop_profile (`ProfileReq`).

Every TP rank profiles its own process (the model runs there) and writes one Chrome trace,
`<output_dir>/<profile_id>-TP-<rank>.trace.json.gz`, when profiling stops: on a "stop" request or by
itself after `num_steps` forward steps. Opened with chrome://tracing or https://ui.perfetto.dev.

Invariants: traces are written only under SGLANG_TORCH_PROFILER_DIR (a client's output_dir is resolved,
symlinks and `..` included, and refused outside it), and every profile stops by itself after at most
SGLANG_PROFILE_MAX_STEPS steps (SGLANG_PROFILE_NUM_STEPS when the request names none): a profile left
running grew the scheduler's memory with every step, and writing it stalled the scheduler for minutes."""

from __future__ import annotations

import logging
import os
import threading

import torch

from sglang.srt.environ import envs
from sglang.srt.managers.io_struct import ProfileReq, ProfileReqOutput

logger = logging.getLogger(__name__)

ACTIVITIES = ("CPU", "GPU")  # upstream's names; GPU records CUDA kernels where there is a CUDA device


def trace_dir(output_dir: str | None) -> str:
    """The directory a profile's traces go to: SGLANG_TORCH_PROFILER_DIR, or `output_dir` inside it (a
    relative one is taken from it). Raises ValueError naming the directory for one outside it."""
    root = os.path.realpath(envs.SGLANG_TORCH_PROFILER_DIR.get())
    if not output_dir:
        return root
    path = os.path.realpath(os.path.join(root, output_dir))
    if path != root and not path.startswith(root.rstrip(os.sep) + os.sep):
        raise ValueError(f"output_dir {output_dir!r} is outside SGLANG_TORCH_PROFILER_DIR ({root}): traces are "
                         f"written only under that directory, fixed at launch")
    return path


def profile_steps(num_steps: int | None) -> int:
    """The forward steps a profile records: `num_steps`, or SGLANG_PROFILE_NUM_STEPS when it names none.
    Raises ValueError naming the limit for more than SGLANG_PROFILE_MAX_STEPS."""
    limit = envs.SGLANG_PROFILE_MAX_STEPS.get()
    steps = envs.SGLANG_PROFILE_NUM_STEPS.get() if num_steps is None else num_steps
    if steps > limit:
        raise ValueError(f"num_steps {steps} exceeds the maximum of {limit} forward steps (SGLANG_PROFILE_MAX_STEPS)")
    return steps


def trace_path(output_dir: str, profile_id: str, rank: int) -> str:
    return os.path.join(output_dir, f"{profile_id}-TP-{rank}.trace.json.gz")


class SchedulerProfiler:
    def __init__(self, tp_rank: int = 0):
        self.rank = tp_rank
        self._prof: torch.profiler.profile | None = None
        self._path = ""
        self._steps_left: int | None = None
        self._exported = threading.Event()  # clear while a background writer exports a trace
        self._exported.set()

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
        if not self.wait_written(0):  # one profile's results in memory at a time
            return ProfileReqOutput(False, "the previous profile's trace is still being written; try again shortly")
        unknown = sorted(set(req.activities) - set(ACTIVITIES))
        if unknown:
            return ProfileReqOutput(False, f"unknown profiler activities {unknown}; known: {list(ACTIVITIES)}")
        kinds = [torch.profiler.ProfilerActivity.CPU] if "CPU" in req.activities else []
        if "GPU" in req.activities and torch.cuda.is_available():
            kinds.append(torch.profiler.ProfilerActivity.CUDA)
        if not kinds:
            return ProfileReqOutput(False, f"activities {req.activities} record nothing here: there is no CUDA device")
        try:  # checked where the request entered too; again here, where the directory is made
            out_dir, steps = trace_dir(req.output_dir), profile_steps(req.num_steps)
        except ValueError as e:
            return ProfileReqOutput(False, str(e))
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as e:
            return ProfileReqOutput(False, f"cannot create the profile output directory {out_dir!r}: {e}")
        if not os.access(out_dir, os.W_OK):
            return ProfileReqOutput(False, f"the profile output directory {out_dir!r} is not writable")
        prof = torch.profiler.profile(activities=kinds, with_stack=req.with_stack, record_shapes=req.record_shapes)
        prof.start()
        self._prof, self._path, self._steps_left = prof, trace_path(out_dir, req.profile_id, self.rank), steps
        logger.info("profiling started (rank %d): the trace goes to %s", self.rank, self._path)
        return ProfileReqOutput(True, "profiling started", files=[self._path])

    def stop(self, background: bool = False) -> ProfileReqOutput:
        """Stops recording and writes the trace; `background`: in a thread, so the scheduler loop goes on
        while it is written (writing took 4x as long as recording stopped the loop: 14 s for 256 steps)."""
        if self._prof is None:
            return ProfileReqOutput(False, "profiling is not in progress; call /start_profile first")
        prof, self._prof, self._steps_left = self._prof, None, None
        prof.stop()
        if not background:
            return self._write(prof, self._path)
        self._exported = threading.Event()
        threading.Thread(target=self._write, args=(prof, self._path, self._exported), daemon=True,
                         name=f"sglang-profile-writer-{self.rank}").start()
        return ProfileReqOutput(True, "profiling stopped; the trace is being written", files=[self._path])

    def _write(self, prof: torch.profiler.profile, path: str, exported: threading.Event | None = None
               ) -> ProfileReqOutput:
        # written beside the trace and renamed: a trace file that exists is complete. `exported` is set
        # before the rename, so whoever sees the file may start the next profile.
        partial = path.removesuffix(".json.gz") + ".partial.json.gz"  # gzipped too, as the suffix asks
        try:
            try:
                prof.export_chrome_trace(partial)
            finally:
                if exported is not None:
                    exported.set()
            os.replace(partial, path)
        except OSError as e:
            logger.error("could not write the trace %s: %s", path, e)
            return ProfileReqOutput(False, f"could not write the trace {path!r}: {e}")
        logger.info("profiling stopped (rank %d): trace written to %s", self.rank, path)
        return ProfileReqOutput(True, "profiling stopped", files=[path])

    def wait_written(self, timeout: float | None = None) -> bool:
        """True once no trace is being written in the background (its file may take a rename longer)."""
        return self._exported.wait(timeout)

    def after_forward(self) -> None:
        """Counts a forward step; the profile's last one stops profiling and writes the trace."""
        if self._steps_left is None:
            return
        self._steps_left -= 1
        if self._steps_left <= 0:
            self.stop(background=True)
