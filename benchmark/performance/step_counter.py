"""Work counters for one thread over a measured span, which other load on the machine does not move
(thread CPU time does: a busy neighbour costs this thread cache misses, frequency and SMT sharing).

- `PerfCounter` / `instruction_counter()`: retired user-space instructions of the calling thread, from
  the kernel's perf_event_open (through ctypes) on a hardware counter: everything the thread executes,
  Python and C/C++ alike, excluding the kernel and the hypervisor. Needs a PMU: on a VM without a
  virtual one the open fails (ENOENT) and `CounterUnavailable` says so in one line.
- `BytecodeCounter`: Python bytecode instructions executed by this thread while it is started
  (`sys.settrace` with per-opcode events). Works anywhere, exact and repeatable for the same inputs,
  but it counts Python-level work only: time spent inside C/C++ (torch ops, list.sort, pickle) adds
  nothing, whatever its length, and counts are comparable only under one CPython version (the compiler
  decides how many instructions a line is).

Both are used as: `c0 = counter.read(); counter.start(); work(); counter.stop(); counter.read() - c0`.
Code objects named in `BytecodeCounter(exclude=...)` are left out with everything they call (a
measuring harness's own hooks).
"""

from __future__ import annotations

import collections
import ctypes
import errno
import os
import platform
import struct
import sys
import threading
from pathlib import Path
from types import CodeType, FrameType
from typing import Callable, Iterable


class CounterUnavailable(RuntimeError):
    """This machine (or process) cannot count what was asked; the message is one line naming why."""


# ------------------------------------------------------------------ perf_event_open
PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE = 0, 1
PERF_COUNT_HW_INSTRUCTIONS = 1
PERF_COUNT_SW_TASK_CLOCK = 1  # nanoseconds the thread ran: a software event, present without a PMU
_FORMAT_TIMES = 1 | 2  # PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
_EXCLUDE_KERNEL, _EXCLUDE_HV = 1 << 5, 1 << 6  # perf_event_attr flag bits
# __NR_perf_event_open; other architectures are refused rather than guessed
_SYSCALL_NR = {"x86_64": 298, "amd64": 298, "aarch64": 241, "arm64": 241, "riscv64": 241, "ppc64le": 319,
               "s390x": 331}


class _PerfEventAttr(ctypes.Structure):
    """struct perf_event_attr up to PERF_ATTR_SIZE_VER5 (112 bytes), which every kernel since 4.1 accepts."""

    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
                ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
                ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64), ("wakeup_events", ctypes.c_uint32),
                ("bp_type", ctypes.c_uint32), ("config1", ctypes.c_uint64), ("config2", ctypes.c_uint64),
                ("branch_sample_type", ctypes.c_uint64), ("sample_regs_user", ctypes.c_uint64),
                ("sample_stack_user", ctypes.c_uint32), ("clockid", ctypes.c_int32),
                ("sample_regs_intr", ctypes.c_uint64), ("aux_watermark", ctypes.c_uint32),
                ("sample_max_stack", ctypes.c_uint16), ("reserved_2", ctypes.c_uint16)]


assert ctypes.sizeof(_PerfEventAttr) == 112


def _libc_syscall(nr: int, attr: _PerfEventAttr) -> tuple[int, int]:
    """(fd or -1, errno) of perf_event_open(attr, pid=0: this thread, cpu=-1: any, group=-1, flags=0)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(ctypes.c_long(nr), ctypes.byref(attr), ctypes.c_long(0), ctypes.c_long(-1),
                      ctypes.c_long(-1), ctypes.c_ulong(0))
    return int(fd), ctypes.get_errno()


def _why(err: int) -> str:
    name = errno.errorcode.get(err, str(err))
    if err == errno.ENOENT:
        return f"{name}: the kernel knows no such event here (no hardware PMU: a VM without a virtual one)"
    if err in (errno.EACCES, errno.EPERM):
        try:
            level = Path("/proc/sys/kernel/perf_event_paranoid").read_text().strip()
        except OSError:
            level = "unknown"
        return f"{name}: not permitted (kernel.perf_event_paranoid={level}, or a seccomp filter)"
    if err == errno.ENOSYS:
        return f"{name}: this kernel has no perf_event_open"
    if err == errno.EOPNOTSUPP:
        return f"{name}: the PMU cannot count this event with the requested exclusions"
    return f"{name}: {os.strerror(err)}"


class PerfCounter:
    """One perf event counting the calling thread (the thread that made this object) in user space only:
    exclude_kernel and exclude_hv set, no inheritance to threads started later. `read()` is the running
    total (it never stops between reads; take differences). Raises CounterUnavailable when the event
    cannot be opened."""

    def __init__(self, type_: int = PERF_TYPE_HARDWARE, config: int = PERF_COUNT_HW_INSTRUCTIONS,
                 what: str = "instructions", syscall: Callable[[int, _PerfEventAttr], tuple[int, int]] = _libc_syscall):
        self.what = what
        self.thread_id = threading.get_ident()
        self.fd = -1
        nr = _SYSCALL_NR.get(platform.machine().lower())
        if sys.platform != "linux" or nr is None:
            raise CounterUnavailable(f"{what} counter unavailable: perf_event_open needs Linux on a known "
                                     f"architecture, this is {sys.platform}/{platform.machine()}")
        attr = _PerfEventAttr(type=type_, size=ctypes.sizeof(_PerfEventAttr), config=config,
                              read_format=_FORMAT_TIMES, flags=_EXCLUDE_KERNEL | _EXCLUDE_HV)
        fd, err = syscall(nr, attr)
        if fd < 0:
            raise CounterUnavailable(f"{what} counter unavailable: perf_event_open(type={type_}, config={config}) "
                                     f"failed with {_why(err)}; use --counter bytecodes")
        self.fd = fd
        self.multiplexed = False  # the event was off the PMU for part of the time (value then undercounts)

    def read(self) -> int:
        value, enabled, running = struct.unpack("QQQ", os.read(self.fd, 24))
        if running < enabled:
            self.multiplexed = True
        return value

    # the same interface as BytecodeCounter: a perf counter runs all the time
    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self):
        self.close()


def instruction_counter() -> PerfCounter:
    """Retired user-space instructions of the calling thread (PERF_COUNT_HW_INSTRUCTIONS)."""
    return PerfCounter(PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS, "instructions")


# ------------------------------------------------------------------ Python bytecodes
class BytecodeCounter:
    """Python bytecode instructions this thread executes between `start()` and `stop()`: every frame
    entered while started gets per-opcode trace events, each one adds 1. Frames already running at
    `start()` (the caller's) are not traced: start right before the call to measure. Frames of the
    `exclude` code objects, and every frame they call, add nothing. `by_code=True` also keeps the count
    per code object (`top()`), for profiling.

    Tracing slows Python down about 30-50 times: time the same work in a separate, untraced run.
    Refuses to start while another trace function (a debugger, coverage) is installed."""

    def __init__(self, exclude: Iterable[CodeType] = (), by_code: bool = False):
        self.count = 0
        self.by_code: collections.Counter = collections.Counter()
        self._exclude = frozenset(exclude)
        self._excluded_depth = 0  # > 0 while inside an excluded frame (generators: per resumption)
        self._local = self._on_event_by_code if by_code else self._on_event
        self._running = False

    def read(self) -> int:
        return self.count

    def start(self) -> None:
        if sys.gettrace() is not None:
            raise CounterUnavailable("bytecodes counter unavailable: another trace function is installed "
                                     f"({sys.gettrace()!r}: a debugger or coverage)")
        self._excluded_depth = 0
        self._running = True
        sys.settrace(self._on_call)

    def stop(self) -> None:
        sys.settrace(None)
        self._running = False

    def __enter__(self) -> "BytecodeCounter":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _on_call(self, frame: FrameType, event: str, arg):
        # the global trace function: called at each new Python frame (and generator resumption)
        if self._excluded_depth or frame.f_code is _STOP_CODE:
            return None  # inside an excluded frame: this one is untraced too; stop() is the counter's own
        frame.f_trace_lines = False
        if frame.f_code in self._exclude:
            self._excluded_depth += 1
            return self._on_excluded_event
        frame.f_trace_opcodes = True
        return self._local

    def _on_event(self, frame: FrameType, event: str, arg):
        if event == "opcode":
            self.count += 1
        return self._on_event

    def _on_event_by_code(self, frame: FrameType, event: str, arg):
        if event == "opcode":
            self.count += 1
            self.by_code[frame.f_code] += 1
        return self._on_event_by_code

    def _on_excluded_event(self, frame: FrameType, event: str, arg):
        # 'return' also ends a frame left by an exception, and a generator's yield
        if event == "return":
            self._excluded_depth -= 1
        return self._on_excluded_event

    def top(self, n: int = 20) -> list[tuple[str, int]]:
        """The n code objects with most opcodes (by_code=True): ("file:line function", count)."""
        return [(f"{_short(c.co_filename)}:{c.co_firstlineno} {c.co_qualname}", k)
                for c, k in self.by_code.most_common(n)]


_STOP_CODE = BytecodeCounter.stop.__code__


def _short(path: str) -> str:
    parts = Path(path).parts
    for anchor in ("sglang", "torch", "benchmark"):
        if anchor in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(anchor):])
    return Path(path).name


def make_counter(kind: str, exclude: Iterable[CodeType] = (), by_code: bool = False):
    """'instructions' (PerfCounter, may raise CounterUnavailable) or 'bytecodes' (BytecodeCounter)."""
    if kind == "instructions":
        return instruction_counter()
    if kind == "bytecodes":
        return BytecodeCounter(exclude, by_code)
    raise ValueError(f"unknown counter {kind!r}: instructions or bytecodes")
