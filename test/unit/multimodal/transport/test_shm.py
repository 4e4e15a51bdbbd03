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


def test_linked_copies_own_their_names_and_share_the_pages():
    """`n` samples of one prompt: each copy gets a hard-linked name of its own, so each name is unlinked
    exactly once by whoever receives it, and the pixels stay readable until the last name and mapping go."""
    import pickle

    from sglang.srt.multimodal.transport.shm import link_mm_items, materialize_mm_features, unlink_segments

    prefix = segment_prefix(1, pid=os.getpid()) + "link_"
    mm = _inputs(8, 5)
    first = mm_items_to_shm(mm, prefix)
    copy = pickle.loads(pickle.dumps(mm))
    linked = link_mm_items(copy, prefix)
    assert len(linked) == 2 and not set(linked) & set(first)
    assert sorted(_own(prefix)) == sorted(first + linked)
    unlink_segments(first)  # the first sample arrived and was unlinked: the copy still maps its own names
    msg = type("Msg", (), {"mm_inputs": copy})()
    assert materialize_mm_features([msg]) == linked
    assert torch.equal(copy.mm_items[0].feature, torch.arange(8, dtype=torch.float32))
    unlink_segments(linked)
    assert _own(prefix) == []


def test_a_failed_link_leaves_no_new_name(monkeypatch):
    import pickle

    from sglang.srt.multimodal.transport.shm import link_mm_items, unlink_segments

    prefix = segment_prefix(1, pid=os.getpid()) + "linkfail_"
    mm = _inputs(4, 4)
    first = mm_items_to_shm(mm, prefix)
    copy = pickle.loads(pickle.dumps(mm))
    calls = []
    real_link = os.link

    def link_once(src, dst):
        if calls:
            raise OSError(errno.EMLINK, "too many links")
        calls.append(dst)
        real_link(src, dst)

    monkeypatch.setattr(shm.os, "link", link_once)
    with pytest.raises(OSError):
        link_mm_items(copy, prefix)
    assert sorted(_own(prefix)) == sorted(first)  # the one link made was removed again
    assert [i.feature.name for i in copy.mm_items] == first  # the copy keeps the pointers it had
    unlink_segments(first)
