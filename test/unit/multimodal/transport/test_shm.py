"""A full /dev/shm is an exception the request builder handles (the request's pixels go inline), never
a SIGBUS: segments are reserved with posix_fallocate before anything is written through the mapping."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest
import torch

from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem, MultimodalInputs
from sglang.srt.multimodal.transport import shm
from sglang.srt.multimodal.transport.shm import ShmSpaceError, mm_items_to_shm, segment_prefix


def _inputs(*sizes: int) -> MultimodalInputs:
    items = [MultimodalDataItem(modality=Modality.IMAGE, feature=torch.arange(n, dtype=torch.float32),
                                image_grid_thw=(1, 1, 1)) for n in sizes]
    return MultimodalInputs(mm_items=items)


def _own(prefix: str) -> list[str]:
    return [n for n in os.listdir(shm.SHM_DIR) if n.startswith(prefix)]


def test_enospc_leaves_items_as_tensors_and_no_segment(monkeypatch):
    prefix = segment_prefix(1, pid=os.getpid()) + "full_"
    calls = {"n": 0}
    real = os.posix_fallocate

    def fallocate(fd, off, size):  # the second segment finds the tmpfs full
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, off, size)

    monkeypatch.setattr(shm.os, "posix_fallocate", fallocate)
    mm = _inputs(1000, 2000, 3000)
    before = [it.feature.clone() for it in mm.mm_items]
    with pytest.raises(ShmSpaceError):
        mm_items_to_shm(mm, prefix)
    assert _own(prefix) == []
    for item, t in zip(mm.mm_items, before):
        assert isinstance(item.feature, torch.Tensor) and torch.equal(item.feature, t)


_CHILD = r"""
import os, sys, torch
from sglang.srt.multimodal.transport.shm import ShmSpaceError, write_segment
try:
    write_segment(torch.zeros(4 << 20, dtype=torch.uint8), "sglang_mm_0_%d_" % os.getpid())
except ShmSpaceError as e:
    print("fallback", e.errno, sorted(os.listdir("/dev/shm")))
    sys.exit(0)
print("written")
"""


def test_real_small_tmpfs_raises_instead_of_sigbus():
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("unshare -m is not permitted here; the ENOSPC path is covered by the injected test")
    r = subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "$@"', "sh",
                        sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])  # a SIGBUS would be -7
    assert r.stdout.startswith(f"fallback {errno.ENOSPC} []"), r.stdout
