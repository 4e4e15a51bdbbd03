"""A process's own name as Linux shows it (/proc/<pid>/comm, ps, top): the schedulers are `sglang-sched{rank}`,
the image preprocessing workers `sglang-mmproc{k}`."""

from __future__ import annotations


def set_process_name(name: str) -> None:
    """PR_SET_NAME (15 bytes at most); a no-op where prctl is not available."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass
