"""The image preprocessing worker pool (`multimodal/mm_worker_pool.py`, `mm_worker.py`) on its own: two spawned
workers named `sglang-mmproc{k}` preprocess exactly as the in-process path does and hand the pixels back in a
shared-memory segment (only metadata on the pipe); a bad image is the worker's ValueError; concurrent jobs go to
different workers; a worker killed mid-job fails only its own job (naming it), its segments are unlinked and it
is started again; `share` gives each request of a flight a name of its own; `close` leaves no process and no
segment. Jobs are held mid-fetch by a local HTTP gate, so "mid-job" is a condition, never a sleep."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from media_gate import MediaGate, png
from worker_test_utils import TIMEOUT, in_thread, wait_until
from sglang.srt.errors import ServerUnhealthyError
from sglang.srt.multimodal.hashing import item_hash
from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem
from sglang.srt.multimodal.mm_worker_pool import MMProcessorPool, MMWorkerError, RemoteMediaError
from sglang.srt.multimodal.processor_spec import ProcessorSpec
from sglang.srt.multimodal.transport.shm import SHM_DIR, ShmPointerMMData, segment_prefix, unlink_segments
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.network import pick_unused_port

HASH = "xxh3_128"


def _spec(path: str) -> ProcessorSpec:
    args = ServerArgs(model_path=path, allow_private_media_urls=True, media_fetch_timeout=120)
    return ProcessorSpec.from_server_args(args, path)


@pytest.fixture(scope="module")
def model_path(tiny_model_dir) -> str:
    return str(tiny_model_dir("qwen3-vl-tiny"))


@pytest.fixture(scope="module")
def pool(model_path):
    p = MMProcessorPool(_spec(model_path), 2, 2, segment_prefix(pick_unused_port()), HASH).start()
    try:
        p.wait_ready(TIMEOUT)
        yield p
    finally:
        p.close()


@pytest.fixture()
def gate():
    g = MediaGate()
    yield g
    g.close()


def _segments(prefix: str) -> list[str]:
    return [n for n in os.listdir(SHM_DIR) if n.startswith(prefix)]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _worker(pool, index: int) -> dict:
    return pool.stats()["workers"][index]


def test_workers_are_named_processes_that_preprocess_as_the_in_process_path(pool, model_path):
    for k, w in enumerate(pool.stats()["workers"]):
        assert Path(f"/proc/{w['pid']}/comm").read_text().strip() == f"sglang-mmproc{k}"
    data = png(1)
    pim = pool.load_image(data)
    ptr = pim.pixel_values
    try:
        assert isinstance(ptr, ShmPointerMMData) and ptr.name.startswith(pool.shm_prefix)
        local = _spec(model_path).build(None).load_and_process_image(data)
        assert tuple(pim.grid_thw) == tuple(local.grid_thw)
        assert torch.equal(ptr.materialize(), torch.from_numpy(local.pixel_values))
        item = MultimodalDataItem(Modality.IMAGE, local.pixel_values, tuple(local.grid_thw))
        assert pim.hash == item_hash(item, HASH)  # computed in the worker, the hash the item would get here
        # a request's own config travels with the job
        processor = _spec(model_path).build(None)
        cfg = processor.image_config({"max_pixels": 64 * 64})
        small = pool.load_image(data, cfg)
        assert tuple(small.grid_thw) == tuple(processor.load_and_process_image(data, cfg).grid_thw)
        assert small.grid_thw != pim.grid_thw
        unlink_segments([small.pixel_values.name])
    finally:
        unlink_segments([ptr.name])


def test_a_bad_image_is_the_workers_value_error(pool, model_path):
    with pytest.raises(ValueError) as local:
        _spec(model_path).build(None).load_and_process_image(b"not an image at all")
    with pytest.raises(RemoteMediaError) as remote:
        pool.load_image(b"not an image at all")
    assert str(remote.value) == str(local.value)
    assert all(w["jobs_in_flight"] == 0 for w in pool.stats()["workers"])


def test_concurrent_jobs_go_to_different_workers(pool, gate):
    jobs = [in_thread(pool.load_image, f"{gate.url}/gate/{i}") for i in range(2)]
    assert gate.wait_arrived(2), "the workers never fetched"
    assert [w["jobs_in_flight"] for w in pool.stats()["workers"]] == [1, 1]
    gate.release()
    for t, out in jobs:
        t.join(TIMEOUT)
        assert isinstance(out[0].pixel_values, ShmPointerMMData), out
        unlink_segments([out[0].pixel_values.name])


def test_a_killed_worker_fails_only_its_job_and_is_restarted(pool, gate):
    jobs = [in_thread(pool.load_image, f"{gate.url}/gate/k{i}") for i in range(2)]
    assert gate.wait_arrived(2)
    victim = next(k for k in range(2) if _worker(pool, k)["jobs_in_flight"] == 1)
    old = _worker(pool, victim)
    slot = pool._slots[victim]
    job_id = next(iter(slot.inflight))
    orphan = Path(SHM_DIR, f"{slot.prefix}{job_id}_written-before-the-kill")  # what a worker leaves mid-write
    orphan.write_bytes(b"x")
    os.kill(old["pid"], signal.SIGKILL)
    wait_until(lambda: any(out for _, out in jobs), "the killed worker's job to fail")
    (t, out), (other, other_out) = sorted(jobs, key=lambda j: not j[1])
    assert not other_out  # the other worker's job is still held at the gate
    assert isinstance(out[0], MMWorkerError), out
    assert f"sglang-mmproc{victim}" in str(out[0]) and "killed by signal 9" in str(out[0])
    assert not orphan.exists()
    gate.release()
    other.join(TIMEOUT)
    out = other_out
    assert isinstance(out[0].pixel_values, ShmPointerMMData), out  # the other worker's job went on
    unlink_segments([out[0].pixel_values.name])
    wait_until(lambda: _worker(pool, victim)["ready"], "the worker to be restarted")
    new = _worker(pool, victim)
    assert new["restarts"] == old["restarts"] + 1 and new["pid"] != old["pid"]
    assert Path(f"/proc/{new['pid']}/comm").read_text().strip() == f"sglang-mmproc{victim}"
    again = [pool.load_image(png(7)) for _ in range(2)]  # both workers serve again
    unlink_segments([p.pixel_values.name for p in again])


def test_share_gives_every_caller_a_name_of_its_own(pool):
    pim = pool.load_image(png(2))
    parts = pool.share(pim, 3)
    names = [p.pixel_values.name for p in parts]
    try:
        assert names[0] == pim.pixel_values.name and len(set(names)) == 3
        assert len({os.stat(os.path.join(SHM_DIR, n)).st_ino for n in names}) == 1  # one segment, three names
        assert all(torch.equal(p.pixel_values.materialize(), parts[0].pixel_values.materialize()) for p in parts)
    finally:
        unlink_segments(names)


def test_close_fails_jobs_in_flight_and_leaves_no_process_or_segment(model_path, gate):
    prefix = segment_prefix(pick_unused_port())
    pool = MMProcessorPool(_spec(model_path), 1, 1, prefix, HASH).start()
    pool.wait_ready(TIMEOUT)
    pid = _worker(pool, 0)["pid"]
    kept = pool.load_image(png(3))  # delivered: the caller owns it, close leaves it alone
    t, out = in_thread(pool.load_image, f"{gate.url}/gate/c")
    assert gate.wait_arrived(1)
    slot = pool._slots[0]
    orphan = Path(SHM_DIR, f"{slot.prefix}{next(iter(slot.inflight))}_in-flight")
    orphan.write_bytes(b"x")
    pool.close()
    t.join(TIMEOUT)
    assert isinstance(out[0], ServerUnhealthyError) and out[0].status_code == 503, out
    assert not _alive(pid)
    assert _segments(prefix) == [kept.pixel_values.name]
    unlink_segments([kept.pixel_values.name])
    with pytest.raises(ServerUnhealthyError):
        pool.load_image(png(3))


def test_a_worker_that_cannot_start_fails_the_start_with_its_reason(model_path, tmp_path):
    import dataclasses

    from sglang.srt.errors import StartupError

    prefix = segment_prefix(pick_unused_port())
    spec = dataclasses.replace(_spec(model_path), tokenizer_path=str(tmp_path / "no-tokenizer-here"))
    pool = MMProcessorPool(spec, 1, 1, prefix, HASH).start()
    try:
        with pytest.raises(StartupError, match="sglang-mmproc0 failed to start: .*no-tokenizer-here"):
            pool.wait_ready(TIMEOUT)
    finally:
        pool.close()
    assert not _alive(pool.stats()["workers"][0]["pid"])  # its restart is stopped with the pool
