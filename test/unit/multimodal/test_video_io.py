"""Video decoding with PyAV: the sampled frames are the right ones (the sweeping bar sits where the
clip generator put it), every source form loads, and each kind of bad video is a VideoLoadError naming
the reason."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

av = pytest.importorskip("av")

from PIL import Image  # noqa: E402

from sglang.srt.multimodal.image_io import ImageLoadError  # noqa: E402
from sglang.srt.multimodal.processors.qwen_video import QwenVLVideoProcessor  # noqa: E402
from sglang.srt.multimodal.video_io import VideoLimits, VideoLoadError, decode_video, load_video  # noqa: E402
from sglang.testing.sample_video import bar_frames, clip_data_url, make_clip  # noqa: E402

ALL = lambda total, fps: np.arange(total)  # noqa: E731


def bar_x(frame: np.ndarray) -> int:
    """Column of the white bar: the brightest column (noise columns average ~127)."""
    return int(np.argmax(frame.astype(np.int32).sum(axis=(0, 2))))


@pytest.mark.parametrize("container,w,h,fps,seconds", [("mp4", 67, 45, 5, 1.0), ("mkv", 131, 97, 30, 2.0),
                                                       ("webm", 64, 48, 12, 2.5), ("avi", 66, 44, 25, 1.2)])
def test_sampled_frames_are_the_indexed_ones(container, w, h, fps, seconds):
    data = make_clip(w, h, fps, seconds, container)
    cfg = QwenVLVideoProcessor.defaults("qwen3")
    video = decode_video(data, cfg.sample_indices)
    total = int(round(fps * seconds))
    assert video.total_frames == total and video.fps == pytest.approx(fps)
    assert video.indices.tolist() == cfg.sample_indices(total, fps).tolist()
    ref = bar_frames(w, h, total)
    assert video.frames.shape == (len(video.indices), h, w, 3)
    got, want = [bar_x(f) for f in video.frames], [bar_x(ref[i]) for i in video.indices]
    assert all(abs(a - b) <= 2 for a, b in zip(got, want)), (got, want)  # lossy codecs blur the bar's edge


def test_every_source_form_loads_the_same_frames(tmp_path):
    data = make_clip(48, 32, 10, 1.0)
    (tmp_path / "a.mp4").write_bytes(data)
    ref = decode_video(data, ALL).frames
    for src in (data, bytearray(data), base64.b64encode(data).decode(), clip_data_url(data),
                str(tmp_path / "a.mp4"), f"file://{tmp_path / 'a.mp4'}"):
        got = load_video(src, ALL, allowed_local_media_path=str(tmp_path))
        assert np.array_equal(got.frames, ref)


def test_frames_given_as_images():
    frames = [Image.fromarray(f) for f in bar_frames(40, 30, 5)]
    video = load_video(frames, ALL)
    assert video.frames.shape == (5, 30, 40, 3) and video.fps is None and video.indices.tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(VideoLoadError, match="all frames must have one size"):
        load_video(frames + [Image.new("RGB", (41, 30))], ALL)


def _audio_only() -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as out:
        s = out.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16", layout="mono")
        frame.sample_rate = 8000
        for p in s.encode(frame):
            out.mux(p)
        for p in s.encode():
            out.mux(p)
    return buf.getvalue()


def _image(fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (0, 128, 0)).save(buf, fmt, **kw)
    return buf.getvalue()


@pytest.mark.parametrize("data,reason", [
    (b"not a video at all", "not a readable video file"),
    (lambda: _audio_only(), "no video stream"),
    (lambda: _image("PNG"), "still image"),
    (lambda: _image("GIF", save_all=True, append_images=[Image.new("RGB", (32, 32))]), "animated GIF"),
    (lambda: make_clip(64, 48, 10, 1.0)[:2000], "not a readable video file"),
])
def test_bad_videos_name_the_reason(data, reason):
    data = data() if callable(data) else data
    with pytest.raises(VideoLoadError, match=reason) as e:
        decode_video(data, ALL)
    assert isinstance(e.value, ImageLoadError)  # the API layer's 400


def test_truncated_stream_keeps_what_decodes_or_names_the_frame():
    """A clip cut mid-stream (the header promises more frames than arrive) is sampled from the frames that
    are there; if nothing decodes the error says so."""
    data = make_clip(64, 48, 10, 2.0, "mkv")
    cut = data[: len(data) * 2 // 3]
    try:
        video = decode_video(cut, ALL)
    except VideoLoadError as e:
        assert "decode" in str(e) or "frame" in str(e)
    else:
        assert 0 < video.total_frames < 20 and len(video.frames) == video.total_frames


def test_limits_refuse_large_and_long_videos():
    """Each refusal names the limit and the variable that raises it."""
    data = make_clip(64, 48, 10, 2.0)
    with pytest.raises(VideoLoadError, match="too large.*3008 pixels per frame.*SGLANG_VIDEO_MAX_FRAME_PIXELS"):
        decode_video(data, ALL, VideoLimits(max_frame_pixels=64 * 47))
    with pytest.raises(VideoLoadError, match="too long.*1.5 s.*SGLANG_VIDEO_MAX_SECONDS"):
        decode_video(data, ALL, VideoLimits(max_duration_s=1.5))
    with pytest.raises(VideoLoadError, match="MiB.*SGLANG_VIDEO_MAX_BYTES"):
        decode_video(data, ALL, VideoLimits(max_sampled_bytes=64 * 48 * 3 * 4 * 19))
    frames = [Image.fromarray(f) for f in bar_frames(64, 48, 3)]
    with pytest.raises(VideoLoadError, match="frame 0.*too large.*SGLANG_VIDEO_MAX_FRAME_PIXELS"):
        load_video(frames, ALL, limits=VideoLimits(max_frame_pixels=64 * 47))


class CountingFit:
    """The Qwen3-VL processor's frame size and resize, counting the full-size frames it is handed and
    checking that the previous one is gone by the time the next arrives."""

    def __init__(self):
        self.cfg, self.calls, self.prev = QwenVLVideoProcessor.defaults("qwen3"), 0, None

    def resized_size(self, n, h, w):
        return self.cfg.resized_size(n, h, w)

    def resize_frame(self, frame, size):
        import weakref

        assert self.prev is None or self.prev() is None, "two full-size frames alive at once"
        self.calls += 1
        self.prev = weakref.ref(frame)
        return self.cfg.resize_frame(frame, size)


def _png(arr) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("form", ["mkv", "png_list"])
def test_frames_are_kept_at_the_models_size_one_full_frame_at_a_time(form):
    """What is kept is what the model sees: each sampled frame is resized as it is decoded, and only one
    full-size frame exists at a time (the memory a clip holds does not grow with its full size)."""
    w, h, n = 640, 360, 12
    src = make_clip(w, h, 6, 2.0, "mkv") if form == "mkv" else [_png(f) for f in bar_frames(w, h, n)]
    fit = CountingFit()
    video = load_video(src, fit.cfg.sample_indices if form == "mkv" else ALL, fit=fit)
    k = len(video.indices)
    assert video.resized and video.frames.shape == (k, *fit.cfg.resized_size(k, h, w), 3)
    assert video.frames.shape[1] * video.frames.shape[2] < h * w
    assert fit.calls == k


def test_byte_budget_counts_model_size_frames_and_refuses_before_decoding():
    """The budget is checked once the header says the count and size: a clip whose model-size frames fit
    is accepted even though its full-size frames would not; one byte less is refused before any frame is
    decoded (an encoded file) or after the first (a list of frames, whose size its first frame says)."""
    w, h = 1280, 720
    data = make_clip(w, h, 6, 2.0, "mkv")
    fit = CountingFit()
    n = len(fit.cfg.sample_indices(12, 6.0))
    rh, rw = fit.cfg.resized_size(n, h, w)
    need = n * rh * rw * 3 * 4  # float32 pixel values
    assert n * h * w * 3 * 4 > 2 * need
    kept = decode_video(data, fit.cfg.sample_indices, VideoLimits(max_sampled_bytes=need), fit).frames
    assert kept.nbytes * 4 == need
    fit = CountingFit()
    with pytest.raises(VideoLoadError, match=f"{n} sampled frames of {rw}x{rh}.*SGLANG_VIDEO_MAX_BYTES"):
        decode_video(data, fit.cfg.sample_indices, VideoLimits(max_sampled_bytes=need - 1), fit)
    assert fit.calls == 0


def test_a_frame_list_over_the_budget_is_refused_after_its_first_frame(monkeypatch):
    import sglang.srt.multimodal.video_io as video_io

    decoded = []
    real = video_io.load_image
    monkeypatch.setattr(video_io, "load_image", lambda src, **kw: decoded.append(1) or real(src, **kw))
    frames = [_png(f) for f in bar_frames(320, 240, 12)]
    fit = CountingFit()
    rh, rw = fit.cfg.resized_size(12, 240, 320)
    with pytest.raises(VideoLoadError, match="12 sampled frames.*SGLANG_VIDEO_MAX_BYTES"):
        load_video(frames, ALL, limits=VideoLimits(max_sampled_bytes=12 * rh * rw * 3 * 4 - 1), fit=fit)
    assert len(decoded) == 1 and fit.calls == 0


def test_local_files_outside_the_allowed_root_are_refused(tmp_path):
    (tmp_path / "a.mp4").write_bytes(make_clip(32, 32, 5, 1.0))
    with pytest.raises(VideoLoadError, match="outside the allowed"):
        load_video(str(tmp_path / "a.mp4"), ALL, allowed_local_media_path=str(tmp_path / "sub"))
    with pytest.raises(VideoLoadError, match="not found"):
        load_video(str(tmp_path / "missing.mp4"), ALL, allowed_local_media_path=str(tmp_path))
    with pytest.raises(VideoLoadError, match="video/"):
        load_video("data:image/png;base64,AAAA", ALL)
    with pytest.raises(VideoLoadError, match="http"):
        load_video("https://example.com/a.mp4", ALL)


def test_raw_video_is_sampled_like_a_file():
    """A decoded clip with its rate (RawVideo) takes the same frames a file of those frames would."""
    from sglang.srt.multimodal.video_io import RawVideo

    cfg = QwenVLVideoProcessor.defaults("qwen2")
    frames = bar_frames(66, 44, 30)
    raw = load_video(RawVideo(frames, 25.0), cfg.sample_indices)
    enc = decode_video(make_clip(66, 44, 25, 1.2, "avi"), cfg.sample_indices)
    assert raw.indices.tolist() == enc.indices.tolist() and raw.fps == enc.fps == 25.0
    assert np.array_equal(raw.frames, frames[raw.indices])
    with pytest.raises(VideoLoadError, match="uint8"):
        load_video(RawVideo(frames.astype(np.float32), 25.0), ALL)


def test_a_decoded_file_is_hashed_by_its_bytes_and_config_not_its_pixels():
    """The hash of a video decoded from a file stands on the file's digest and the processing config: the
    pixels are never read (they may run to hundreds of MB); the same file under another config, or other
    bytes, hash differently; frames given decoded are hashed by their pixels."""
    import dataclasses

    from sglang.srt.multimodal.hashing import item_hash
    from sglang.srt.multimodal.processors.qwen_video import expand_video, load_and_process_video
    from sglang.srt.multimodal.video_io import RawVideo

    cfg = QwenVLVideoProcessor.defaults("qwen2")
    data = make_clip(64, 48, 10, 1.0)

    def item(src, c=cfg):
        return expand_video(load_and_process_video(src, c), [], 2, 1, 2, 3, None)

    a, b = item(data), item(data)
    a.feature = None  # not read
    assert item_hash(a, "xxh3_128") == item_hash(b, "xxh3_128") and item_hash(a, "blake3") == item_hash(b, "blake3")
    assert item_hash(item(data, dataclasses.replace(cfg, fps=4.0)), "xxh3_128") != item_hash(b, "xxh3_128")
    assert item_hash(item(make_clip(64, 48, 10, 1.0, seed=1)), "xxh3_128") != item_hash(b, "xxh3_128")
    raw = item(RawVideo(bar_frames(64, 48, 10), 10.0))
    assert "source_key" not in raw.model_specific_data
    raw2 = item(RawVideo(bar_frames(64, 48, 10), 10.0))
    assert item_hash(raw, "xxh3_128") == item_hash(raw2, "xxh3_128")
