"""Process-tree reading from /proc: a spawned child and grandchild are found, with their memory."""

from __future__ import annotations

import os
import subprocess
import sys

from sglang.srt.utils.process_tree import (
    child_pids,
    cpu_seconds,
    memory_status,
    ppid_map,
    process_tree,
    rss_bytes,
    tree_rss_bytes,
)


def test_tree_finds_children_and_grandchildren_and_sums_their_memory():
    code = "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); print(p.pid, flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(child.stdout.readline())
        assert ppid_map()[child.pid] == os.getpid()
        assert child.pid in child_pids(os.getpid())
        tree = process_tree(os.getpid())
        assert child.pid in tree and grandchild in tree
        total = tree_rss_bytes(child.pid)
        assert total > 0 and rss_bytes(grandchild) > 0  # both live processes are read (sizes move while they start)
    finally:
        child.kill()
        child.wait()
        os.kill(grandchild, 9)


# A child that maps and touches a fresh 64 MiB anonymous region when told to, then unmaps it. Measured in a
# child, on a region it maps itself: in a long-lived process (the full suite's) a `bytes` ballast can
# land in memory the allocator already holds resident, and RssAnon does not move at all.
_BALLAST_CHILD = """
import mmap, sys
print("ready", flush=True)
sys.stdin.readline()
region = mmap.mmap(-1, 64 * 2**20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for off in range(0, len(region), mmap.PAGESIZE):
    region[off] = 1
print("touched", flush=True)
sys.stdin.readline()
region.close()
print("unmapped", flush=True)
sys.stdin.readline()
"""


def test_memory_status_splits_resident_memory_into_its_parts():
    m = memory_status(os.getpid())
    assert set(m) == {"VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"}
    assert m["RssAnon"] > 0 and m["RssFile"] > 0
    assert m["VmHWM"] >= m["VmRSS"]  # the peak so far
    # the parts are read a moment apart from the whole, and the kernel counts them per page: allow a little
    assert abs(m["VmRSS"] - (m["RssAnon"] + m["RssFile"] + m["RssShmem"])) < 2**20


def test_memory_status_sees_a_touched_anonymous_region_and_remembers_its_peak():
    child = subprocess.Popen([sys.executable, "-c", _BALLAST_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        def step(expect: str) -> None:
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == expect

        assert child.stdout.readline().strip() == "ready"
        before = memory_status(child.pid)
        step("touched")
        # every page written, so resident and private; the rest of the child is idle while it waits
        assert rss_bytes(child.pid, "RssAnon") > before["RssAnon"] + 48 * 2**20
        step("unmapped")
        after = memory_status(child.pid)
        assert after["RssAnon"] < before["RssAnon"] + 16 * 2**20  # unmapping returns the pages at once
        assert after["VmHWM"] >= before["VmRSS"] + 48 * 2**20  # the peak remembers the region
    finally:
        child.kill()
        child.wait()


def test_a_vanished_process_counts_as_nothing():
    assert memory_status(2**22 + 12345) == {}
    assert rss_bytes(2**22 + 12345) == 0
    assert process_tree(2**22 + 12345) == [2**22 + 12345]
    assert cpu_seconds(2**22 + 12345) == 0.0


def test_cpu_seconds_follow_a_busy_child_and_never_go_back():
    """A child that spins until told to stop: its CPU seconds only grow, and reach what it reports having
    used of its own (os.times, read at its end) within the clock tick."""
    child = subprocess.Popen([sys.executable, "-c", "import os, sys\nwhile sys.stdin.read(1) != 'q':\n"
                              "    sum(range(200000))\nt = os.times()\nprint(t.user + t.system, flush=True)"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        seen = []
        for _ in range(3):
            child.stdin.write("x")
            child.stdin.flush()
            seen.append(cpu_seconds(child.pid))
        assert seen == sorted(seen)
        child.stdin.write("q")
        child.stdin.flush()
        own = float(child.stdout.readline())
        final = cpu_seconds(child.pid)  # still alive: it has not been waited for
        assert final >= seen[-1] and abs(final - own) <= 0.05
    finally:
        child.kill()
        child.wait()
