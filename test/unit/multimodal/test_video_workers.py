"""Videos through the preprocessing workers (`--mm-processor-worker-num`, `video_job.py`): a request with a video
(and with a video and an image) built with one worker equals the in-process build in token ids, M-RoPE positions,
pixel values, grids, time steps, timestamps and hashes, while the builder's own process decodes no video; the
video's pixels come back in a segment the request owns; a corrupt video is the same 400 either way and leaves no
segment; the video limits refuse the same clip with the same words; a worker killed while it holds a video
fails that request alone with a 500 naming it, and the pool restarts it. Jobs are held mid-fetch by a local HTTP
gate (the worker fetches the URL), so "mid-video" is a condition, never a sleep."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch

from media_gate import MediaGate, png
from worker_test_utils import TIMEOUT, build, make_builder, own_segments, wait_until
from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.multimodal.transport.shm import ShmPointerMMData, unlink_segments
from sglang.testing.sample_video import clip_data_url, make_clip

VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"

@pytest.fixture(scope="module")
def builders(tiny_model_dir):
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    with pytest.MonkeyPatch.context() as mp:  # video limits both sides resolve (the worker's from the spec)
        mp.setenv("SGLANG_VIDEO_MAX_SECONDS", "5")
        mp.setenv("SGLANG_VIDEO_MAX_FRAME_PIXELS", str(100 * 100))
        base = make_builder(path, 0, mm_io_worker_num=2)
        try:
            with_worker = make_builder(path, 1, mm_io_worker_num=2)
        except BaseException:
            base.close()
            raise
    try:
        yield with_worker, base
    finally:
        with_worker.close()
        base.close()


@pytest.fixture(scope="module")
def clip() -> bytes:
    return make_clip(96, 64, 4.0, 2.0)  # 8 frames, sampled at 2 fps: 4 frames, 2 temporal patches


def _req(videos, images=(), kwargs=None) -> GenerateReqInput:
    return GenerateReqInput(text="watch " + VIDEO * len(videos) + IMAGE * len(images), video_data=list(videos),
                            image_data=list(images) or None, mm_processor_kwargs=kwargs,
                            sampling_params={"max_new_tokens": 1})


def _jobs_done(builder) -> int:
    return sum(w["jobs_done"] for w in builder.mm_pool.stats()["workers"])


def _pixels(item) -> torch.Tensor:
    f = item.feature
    return f.materialize() if isinstance(f, ShmPointerMMData) else f


def _no_video_here(monkeypatch):
    """From here on this process neither decodes a video nor hashes an item: the worker did both."""
    def refuse(*args, **kwargs):
        raise AssertionError("the tokenizer manager's process decoded a video or hashed an item")

    monkeypatch.setattr("sglang.srt.multimodal.processors.qwen_vl.load_and_process_video", refuse)
    monkeypatch.setattr("sglang.srt.multimodal.hashing.item_hash", refuse)


@pytest.fixture(scope="module")
def clip_server(clip):
    gate = MediaGate(body=clip)  # paths outside /gate/ answer at once
    yield gate
    gate.close()


@pytest.mark.parametrize("case", ["bytes", "data-url", "url", "with-image", "request-config"])
def test_a_video_request_built_by_the_worker_equals_the_in_process_build(builders, clip, clip_server, monkeypatch,
                                                                          case):
    workers, base = builders
    videos = [clip_data_url(clip) if case == "data-url" else f"{clip_server.url}/clip.mp4" if case == "url" else clip]
    if case == "url":  # the URL itself is the worker's job (the request builder's own fetch skipped, as proposed)
        monkeypatch.setattr(workers, "_fetch_video_if_url", lambda src: src)
    images = [png(7, 128, 96)] if case == "with-image" else []
    kwargs = {"fps": 4, "max_pixels": 64 * 64} if case == "request-config" else None
    fetched = clip_server.arrived.count("/clip.mp4")
    b, base_names = build(base, _req(videos, images, kwargs), f"vb-{case}")
    _no_video_here(monkeypatch)  # from here the builder's process decodes no video
    done = _jobs_done(workers)
    a, names = build(workers, _req(videos, images, kwargs), f"vw-{case}")
    try:
        assert _jobs_done(workers) == done + 1 + len(images)
        assert clip_server.arrived.count("/clip.mp4") - fetched == (2 if case == "url" else 0)  # once each way
        assert a.input_ids == b.input_ids
        assert torch.equal(a.mm_inputs.mrope_positions, b.mm_inputs.mrope_positions)
        assert a.mm_inputs.mrope_position_delta == b.mm_inputs.mrope_position_delta
        assert sorted(names) == sorted(it.feature.name for it in a.mm_inputs.mm_items)  # every segment owned
        assert [it.modality for it in a.mm_inputs.mm_items] == [it.modality for it in b.mm_inputs.mm_items]
        for x, y in zip(a.mm_inputs.mm_items, b.mm_inputs.mm_items):
            assert isinstance(x.feature, ShmPointerMMData) and x.feature.name.startswith(workers.shm_prefix)
            assert torch.equal(_pixels(x), _pixels(y))
            assert (x.hash, x.pad_value, x.image_grid_thw, x.offsets) == (y.hash, y.pad_value, y.image_grid_thw,
                                                                          y.offsets)
            same = ("second_per_grid_t", "num_frames", "source_key")
            assert {k: x.model_specific_data.get(k) for k in same} == {k: y.model_specific_data.get(k) for k in same}
        video = a.mm_inputs.mm_items[0]
        assert video.image_grid_thw[0] == (4 if case == "request-config" else 2)
    finally:
        unlink_segments(names + base_names)


def test_a_corrupt_video_is_the_same_400_either_way_and_leaves_no_segment(builders, clip):
    workers, base = builders
    before = own_segments(workers)
    bad = b"\x00\x00\x00\x18ftypmp42" + b"\x17" * 4000
    errors, done = [], _jobs_done(workers)
    for builder, rid in ((base, "cb"), (workers, "cw")):
        with pytest.raises(GenerateError) as e:
            build(builder, _req([bad]), rid)
        errors.append(e.value)
    assert _jobs_done(workers) == done + 1  # the worker's answer, not a decode in this process
    assert [e.status_code for e in errors] == [400, 400]
    assert errors[0].message == errors[1].message and "not a readable video" in errors[1].message
    # a good video and a good image are built by the worker, then the bad video fails the request
    for builder, rid in ((base, "cb2"), (workers, "cw2")):
        with pytest.raises(GenerateError) as e:
            build(builder, _req([clip, bad], [png(8)]), rid)
        errors.append(e.value)
    assert errors[2].message == errors[3].message and errors[3].message.startswith("video 1: ")
    assert own_segments(workers) == before


@pytest.mark.parametrize("case", ["duration", "frame-pixels"])
def test_the_video_limits_refuse_the_same_clip_with_the_same_words(builders, case):
    workers, base = builders
    clip, var = ((make_clip(64, 64, 2.0, 6.0), "SGLANG_VIDEO_MAX_SECONDS") if case == "duration"
                 else (make_clip(128, 96, 4.0, 1.0), "SGLANG_VIDEO_MAX_FRAME_PIXELS"))
    before, errors, done = own_segments(workers), [], _jobs_done(workers)
    for builder, rid in ((base, f"lb-{case}"), (workers, f"lw-{case}")):
        with pytest.raises(GenerateError) as e:
            build(builder, _req([clip]), rid)
        errors.append(e.value)
    assert _jobs_done(workers) == done + 1  # refused by the worker's own limits
    assert [e.status_code for e in errors] == [400, 400]
    assert errors[0].message == errors[1].message and var in errors[1].message
    assert own_segments(workers) == before


def test_a_worker_killed_mid_video_fails_that_request_with_a_500_and_is_restarted(builders, clip, monkeypatch):
    workers, _ = builders
    # the worker fetches the URL itself (a video URL is the worker's job); the gate holds it mid-fetch
    monkeypatch.setattr(workers, "_fetch_video_if_url", lambda src: src)
    gate = MediaGate(body=clip)
    before = own_segments(workers)
    restarts = workers.mm_pool.stats()["workers"][0]["restarts"]
    out: list = []

    def run():
        try:
            out.append(build(workers, _req([f"{gate.url}/gate/clip.mp4"]), "k1"))
        except BaseException as e:  # noqa: BLE001  collected for the assertions
            out.append(e)

    t = threading.Thread(target=run)
    t.start()
    try:
        assert gate.wait_arrived(1), "the worker never fetched the video"
        stats = workers.mm_pool.stats()["workers"][0]
        assert stats["jobs_in_flight"] == 1
        os.kill(stats["pid"], signal.SIGKILL)
        t.join(TIMEOUT)
    finally:
        gate.close()
    err = out[0]
    assert isinstance(err, GenerateError) and err.status_code == 500, out
    assert "sglang-mmproc0" in err.message and "died" in err.message
    assert own_segments(workers) == before
    wait_until(lambda: workers.mm_pool.stats()["workers"][0]["ready"], "sglang-mmproc0 to be restarted")
    assert workers.mm_pool.stats()["workers"][0]["restarts"] == restarts + 1
    again, names = build(workers, _req([clip]), "k2")  # served again by the new incarnation
    try:
        assert isinstance(again.mm_inputs.mm_items[0].feature, ShmPointerMMData)
    finally:
        unlink_segments(names)
    assert own_segments(workers) == before


def _pil_images():
    """An RGB photo, an RGBA one (composited onto white) and one with an EXIF rotation (applied first)."""
    import io

    from PIL import Image

    rgb = Image.open(io.BytesIO(png(11, 160, 96))).convert("RGB")
    rgba = rgb.convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize(rgb.size))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise: a 160x96 picture is 96x160 to the model
    buf = io.BytesIO()
    rgb.save(buf, "JPEG", exif=exif)
    rotated = Image.open(io.BytesIO(buf.getvalue()))
    return [rgb, rgba, rotated]


def test_pil_images_go_to_the_worker_as_shared_rgb_and_build_the_same_request(builders, monkeypatch):
    """The Engine path: PIL images are handed to the worker as raw RGB in a segment (never pickled), and the
    request equals the in-process build; the hand-off segments are gone once the request is built."""
    workers, base = builders
    images = _pil_images()
    obj = lambda: GenerateReqInput(text="look " + IMAGE * len(images), image_data=list(images),  # noqa: E731
                                   sampling_params={"max_new_tokens": 1})
    b, base_names = build(base, obj(), "pb")
    sent = []
    real_send = workers.mm_pool._run

    def spy(kind, source, cfg):
        sent.append((kind, type(source).__name__))
        return real_send(kind, source, cfg)

    monkeypatch.setattr(workers.mm_pool, "_run", spy)
    monkeypatch.setattr(workers.processor, "load_and_process_image", lambda *a, **k: pytest.fail("decoded here"))
    before, done = own_segments(workers), _jobs_done(workers)
    a, names = build(workers, obj(), "pw")
    try:
        assert sent == [("pixels", "ShmPointerMMData")] * 3 and _jobs_done(workers) == done + 3
        assert own_segments(workers) == before | set(names)  # only the request's own pixels remain
        assert a.input_ids == b.input_ids
        assert torch.equal(a.mm_inputs.mrope_positions, b.mm_inputs.mrope_positions)
        for x, y in zip(a.mm_inputs.mm_items, b.mm_inputs.mm_items):
            assert isinstance(x.feature, ShmPointerMMData)
            assert torch.equal(_pixels(x), _pixels(y))
            assert (x.hash, x.image_grid_thw, x.offsets) == (y.hash, y.image_grid_thw, y.offsets)
        assert a.mm_inputs.mm_items[2].image_grid_thw[1] > a.mm_inputs.mm_items[2].image_grid_thw[2]  # rotated
    finally:
        unlink_segments(names + base_names)


def test_a_bad_pil_image_is_the_same_400_and_leaves_no_segment(builders):
    from PIL import Image

    workers, base = builders
    broken = Image.new("RGB", (64, 48))
    broken.load = lambda: (_ for _ in ()).throw(OSError("truncated"))  # load() fails, as a truncated file's does
    before, errors = own_segments(workers), []
    for builder, rid in ((base, "pbb"), (workers, "pbw")):
        with pytest.raises(GenerateError) as e:
            build(builder, GenerateReqInput(text="look " + IMAGE * 2, image_data=[_pil_images()[0], broken],
                                             sampling_params={"max_new_tokens": 1}), rid)
        errors.append(e.value)
    assert [e.status_code for e in errors] == [400, 400]
    assert errors[0].message == errors[1].message and "image 1" in errors[1].message
    assert own_segments(workers) == before


def test_uint8_videos_hashed_by_their_pixels_are_the_same_through_the_worker(tiny_model_dir, clip):
    """SGLANG_MM_UINT8_PIXELS (the frames travel as uint8 with their recipe) and the sha256 baseline hash, which
    reads the pixels (not the file's digest): the worker's video item equals the in-process one."""
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SGLANG_MM_UINT8_PIXELS", "1")
        mp.setenv("SGLANG_MM_HASH_ALGO", "sha256")
        base = make_builder(path, 0, mm_io_worker_num=2)
        try:
            workers = make_builder(path, 1, mm_io_worker_num=2)
        except BaseException:
            base.close()
            raise
        try:
            b, base_names = build(base, _req([clip], [png(9)]), "u8b")
            mp.setattr("sglang.srt.multimodal.hashing.item_hash", lambda *a, **k: pytest.fail("hashed here"))
            a, names = build(workers, _req([clip], [png(9)]), "u8w")
            try:
                assert _jobs_done(workers) == 2
                assert a.input_ids == b.input_ids
                for x, y in zip(a.mm_inputs.mm_items, b.mm_inputs.mm_items):
                    assert x.pixel_norm is not None and x.pixel_norm == y.pixel_norm
                    assert _pixels(x).dtype == torch.uint8 and torch.equal(_pixels(x), _pixels(y))
                    assert (x.hash, x.pad_value) == (y.hash, y.pad_value) and x.hash is not None
                assert "source_key" in a.mm_inputs.mm_items[0].model_specific_data  # sha256 ignored it: pixels
            finally:
                unlink_segments(names + base_names)
        finally:
            workers.close()
            base.close()
