"""The request builder with `--mm-processor-worker-num 2`: the image work of a chat runs in the workers (the
builder's own processor never touches a pixel) and the built request equals the in-process build (ids, M-RoPE
positions, pixels, hash, pad value); a segment written by a worker has exactly one owner, a request (one image
given twice gets a link of its own; concurrent requests with one image share one job, each with its own name);
a request that fails leaves no segment; a worker killed under a request fails that request alone with a 500
naming the worker, and the builder serves again once it is restarted."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from media_gate import MediaGate, png
from worker_test_utils import TIMEOUT, build, in_thread, make_builder, own_segments, wait_until
from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.multimodal.transport.shm import SHM_DIR, ShmPointerMMData, unlink_segments

PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"

@pytest.fixture(scope="module")
def builders(tiny_model_dir):
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    base = make_builder(path, 0)
    try:
        with_workers = make_builder(path, 2)
        try:
            yield with_workers, base
        finally:
            with_workers.close()
    finally:
        base.close()


def _req(*images, text: str = "look ") -> GenerateReqInput:
    return GenerateReqInput(text=text + PLACEHOLDER * len(images), image_data=list(images),
                            sampling_params={"max_new_tokens": 1})


def _jobs_done(builder) -> int:
    return sum(w["jobs_done"] for w in builder.mm_pool.stats()["workers"])


def test_a_request_built_by_the_workers_equals_the_in_process_build(builders, monkeypatch):
    workers, base = builders

    def no_pixels_here(*args, **kwargs):
        raise AssertionError("the tokenizer manager's process decoded an image")

    monkeypatch.setattr(workers.processor, "load_and_process_image", no_pixels_here)
    obj = lambda: _req(png(1), png(2, 160, 96))  # noqa: E731
    done = _jobs_done(workers)
    a, names = build(workers, obj(), "w1")
    b, base_names = build(base, obj(), "b1")
    try:
        assert _jobs_done(workers) == done + 2
        assert a.input_ids == b.input_ids
        assert torch.equal(a.mm_inputs.mrope_positions, b.mm_inputs.mrope_positions)
        assert names == [it.feature.name for it in a.mm_inputs.mm_items]  # registered: sent or released
        for x, y in zip(a.mm_inputs.mm_items, b.mm_inputs.mm_items):
            assert isinstance(x.feature, ShmPointerMMData)
            assert x.feature.name.startswith(workers.shm_prefix)
            assert torch.equal(x.feature.materialize(), y.feature.materialize())
            assert (x.hash, x.pad_value, x.image_grid_thw, x.offsets) == (y.hash, y.pad_value, y.image_grid_thw, y.offsets)
    finally:
        unlink_segments(names + base_names)


def test_one_image_twice_in_a_request_is_one_job_and_two_names(builders):
    workers, _ = builders
    done = _jobs_done(workers)
    t, names = build(workers, _req(png(3), png(3)), "w2")
    try:
        assert _jobs_done(workers) == done + 1
        assert len(set(names)) == 2
        assert len({os.stat(os.path.join(SHM_DIR, n)).st_ino for n in names}) == 1  # one segment, two owners
    finally:
        unlink_segments(names)


def test_concurrent_requests_with_the_same_image_share_one_job(builders):
    """Single-flight across workers: the first request's job is held mid-fetch until the two others have joined
    its flight; then one job answers all three, each with a name of its own."""
    workers, _ = builders
    flight = workers.image_loader.flight
    before, done, joined = workers.image_loader.stats(), _jobs_done(workers), flight.joined
    gate = MediaGate()
    try:
        url = f"{gate.url}/gate/same"
        threads = [in_thread(build, workers, _req(url), f"w3-{i}") for i in range(3)]
        assert flight.wait_joined(joined + 2, TIMEOUT), "the requests never met in flight"
        gate.release()
        for t, _ in threads:
            t.join(TIMEOUT)
    finally:
        gate.close()
    results = [out[0] for _, out in threads]
    names = [n for r in results if not isinstance(r, BaseException) for n in r[1]]
    try:
        assert not [r for r in results if isinstance(r, BaseException)], results
        assert gate.arrived == ["/gate/same"] and _jobs_done(workers) == done + 1
        after = workers.image_loader.stats()
        assert after["mm_images_processed"] - before["mm_images_processed"] == 1
        assert after["mm_images_shared"] - before["mm_images_shared"] == 2
        assert len(set(names)) == 3  # one segment, three owners
        assert len({os.stat(os.path.join(SHM_DIR, n)).st_ino for n in names}) == 1
        assert len({r[0].mm_inputs.mm_items[0].hash for r in results}) == 1
    finally:
        unlink_segments(names)


def test_a_failed_request_leaves_no_segment(builders, monkeypatch):
    workers, _ = builders
    before = own_segments(workers)
    with pytest.raises(GenerateError) as e:
        build(workers, _req(png(5), b"not an image"), "w4")
    assert e.value.status_code == 400 and "image 1" in e.value.message
    assert own_segments(workers) == before  # the good image's segment went with the request

    def refuse(*args, **kwargs):
        raise GenerateError("refused after the images were built")

    monkeypatch.setattr(workers, "_grammar_start_after", refuse)
    with pytest.raises(GenerateError):
        build(workers, _req(png(6)), "w5")
    assert own_segments(workers) == before


def test_a_killed_worker_fails_its_request_with_a_500_naming_it(builders):
    workers, _ = builders
    gate = MediaGate()
    try:
        jobs = [in_thread(build, workers, _req(f"{gate.url}/gate/{i}"), f"w6-{i}") for i in range(2)]
        assert gate.wait_arrived(2), "the workers never fetched"
        stats = workers.mm_pool.stats()["workers"]
        assert [w["jobs_in_flight"] for w in stats] == [1, 1]
        os.kill(stats[0]["pid"], signal.SIGKILL)
        wait_until(lambda: any(out for _, out in jobs), "the killed worker's request to fail")
        (_, out), (other, other_out) = sorted(jobs, key=lambda j: not j[1])
        err = out[0]
        assert isinstance(err, GenerateError) and err.status_code == 500, out
        assert "sglang-mmproc0" in err.message and "died" in err.message
        assert not other_out  # the other request is still being served by sglang-mmproc1
        gate.release()
        other.join(TIMEOUT)
        tokenized, names = other_out[0]
        assert isinstance(tokenized.mm_inputs.mm_items[0].feature, ShmPointerMMData)
        unlink_segments(names)
    finally:
        gate.close()
    wait_until(lambda: workers.mm_pool.stats()["workers"][0]["ready"], "sglang-mmproc0 to be restarted")
    assert workers.mm_pool.stats()["workers"][0]["restarts"] == 1
    again = [build(workers, _req(png(10 + i)), f"w7-{i}")[1] for i in range(2)]
    unlink_segments([n for names in again for n in names])
