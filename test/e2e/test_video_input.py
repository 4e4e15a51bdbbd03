"""Videos through the launched server (tiny Qwen3-VL, --chunked-prefill-size 16, so chunks cut through
every video): through the openai client the greedy answer equals transformers' generate on the same
weights fed our processor's video tensors (video only, video + images, two videos), from data URLs,
http(s) URLs and allowed local files; /generate takes video_data (a list of frames too); the same video
is a prefix-cache hit; bad videos and too many videos are 400s naming the reason, with nothing left behind
(shared memory, KV) and the server still serving."""

from __future__ import annotations

import base64

import pytest
import requests

from conftest import data_url, noise_image, png_bytes, wait_until

av = pytest.importorskip("av")

from sglang.srt.multimodal.mm_types import Modality  # noqa: E402
from sglang.testing.sample_video import bar_frames, make_clip  # noqa: E402

MAX_NEW = 6
CLIPS = {"a": (96, 64, 10, 2.0, 1), "b": (67, 45, 8, 1.5, 2), "c": (64, 64, 24, 1.0, 3)}


def clip(name: str) -> bytes:
    w, h, fps, sec, seed = CLIPS[name]
    return make_clip(w, h, fps, sec, seed=seed)


@pytest.fixture(scope="module")
def video_server(launch_server, tmp_path_factory):
    media = tmp_path_factory.mktemp("videos")
    (media / "a.mp4").write_bytes(clip("a"))
    s = launch_server("--chunked-prefill-size", "16", "--limit-mm-per-prompt", '{"image": 3, "video": 2}',
                      "--allowed-local-media-path", str(media), "--allowed-media-domains", "127.0.0.1",
                      "--enable-vlm-stage-timer", "--enable-metrics")
    s.media = media
    return s


@pytest.fixture(scope="module")
def oai(video_server):
    import openai

    return openai.OpenAI(base_url=video_server.url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def video_media_server():
    from conftest import MediaServer

    s = MediaServer({"a.mp4": clip("a")}, slow_s=1.0)
    yield s
    s.close()


def hf_greedy(hf_ref, template_messages, images, videos, video_config=None) -> str:
    """transformers' greedy continuation (decoded text) on our processor's prompt ids and tensors."""
    torch = hf_ref.torch
    ids = hf_ref.tokenizer.encode(hf_ref.render(template_messages), add_special_tokens=False)
    ids, mm = hf_ref.processor.process(ids, images, videos=videos, video_config=video_config)
    dev = hf_ref.model.device
    t = torch.tensor([ids], device=dev)
    kw = {"mm_token_type_ids": (t == mm.im_token_id).long() + 2 * (t == mm.video_token_id).long()}
    imgs = [it for it in mm.mm_items if it.modality == Modality.IMAGE]
    vids = [it for it in mm.mm_items if it.modality == Modality.VIDEO]
    if imgs:
        kw["pixel_values"] = torch.cat([torch.as_tensor(it.feature) for it in imgs]).to(dev)
        kw["image_grid_thw"] = torch.tensor([list(it.image_grid_thw) for it in imgs], device=dev)
    if vids:
        kw["pixel_values_videos"] = torch.cat([it.feature for it in vids]).to(dev)
        kw["video_grid_thw"] = torch.tensor([list(it.image_grid_thw) for it in vids], device=dev)
        if "qwen2" in hf_ref.model.config.model_type:
            kw["second_per_grid_ts"] = torch.tensor([it.model_specific_data["second_per_grid_t"] for it in vids])
    with torch.no_grad():
        out = hf_ref.model.generate(input_ids=t, attention_mask=torch.ones_like(t), max_new_tokens=MAX_NEW,
                                    min_new_tokens=MAX_NEW, do_sample=False, **kw)
    return hf_ref.tokenizer.decode(out[0, len(ids):].tolist(), skip_special_tokens=True), len(ids)


def build(parts):
    """parts: ("text", str), ("image", (w, h, seed)) or ("video", name) -> API content, template content,
    PIL images, encoded videos."""
    api, tmpl, images, videos = [], [], [], []
    for kind, v in parts:
        if kind == "text":
            api.append({"type": "text", "text": v})
            tmpl.append({"type": "text", "text": v})
        elif kind == "image":
            img = noise_image(*v)
            images.append(img)
            api.append({"type": "image_url", "image_url": {"url": data_url(png_bytes(img))}})
            tmpl.append({"type": "image"})
        else:
            videos.append(clip(v))
            api.append({"type": "video_url", "video_url": {"url": data_url(videos[-1], "video/mp4")}})
            tmpl.append({"type": "video"})
    return [{"role": "user", "content": api}], [{"role": "user", "content": tmpl}], images, videos


CASES = {
    "video_only": [("video", "a"), ("text", "What happens in this clip?")],
    "video_and_images": [("image", (64, 96, 4)), ("text", "then"), ("video", "b"), ("image", (80, 64, 5)),
                         ("text", "compare.")],
    "two_videos": [("text", "First"), ("video", "c"), ("text", "second"), ("video", "a"), ("text", "differences?")],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_chat_with_videos_matches_transformers(oai, hf_ref, case):
    messages, tmpl, images, videos = build(CASES[case])
    ref_text, prompt_len = hf_greedy(hf_ref, tmpl, images, videos)
    r = oai.chat.completions.create(model="m", messages=messages, max_tokens=MAX_NEW, temperature=0)
    assert r.usage.prompt_tokens == prompt_len  # every video's placeholder tokens (and timestamps) are there
    assert r.choices[0].message.content == ref_text


def test_video_urls_and_allowed_files(oai, hf_ref, video_server, video_media_server):
    _, tmpl, _, videos = build(CASES["video_only"])
    ref_text, _ = hf_greedy(hf_ref, tmpl, [], videos)
    for url in (video_media_server.url + "/a.mp4", str(video_server.media / "a.mp4"),
                f"file://{video_server.media / 'a.mp4'}"):
        msgs = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                             {"type": "text", "text": "What happens in this clip?"}]}]
        r = oai.chat.completions.create(model="m", messages=msgs, max_tokens=MAX_NEW, temperature=0)
        assert r.choices[0].message.content == ref_text, url
    import openai

    missing = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": video_media_server.url + "/no.mp4"}}]}]
    with pytest.raises(openai.BadRequestError, match="fetching video .* failed: HTTP 404"):
        oai.chat.completions.create(model="m", messages=missing, max_tokens=1)


def test_generate_takes_video_data_and_frames(video_server, hf_ref):
    frames = [noise_image(48, 32, s) for s in range(4)]
    text = "<|vision_start|><|video_pad|><|vision_end|>and<|vision_start|><|video_pad|><|vision_end|>"
    b64 = base64.b64encode(clip("b")).decode()
    frames_b64 = [base64.b64encode(png_bytes(f)).decode() for f in frames]
    r = requests.post(video_server.url + "/generate", timeout=120, json={
        "text": text, "video_data": [b64, frames_b64], "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    assert r.status_code == 200, r.text
    ids = hf_ref.tokenizer.encode(text, add_special_tokens=False)
    expected, _ = hf_ref.processor.process(ids, [], videos=[clip("b"), frames])
    assert r.json()["meta_info"]["prompt_tokens"] == len(expected)


def test_chunked_video_is_encoded_once_and_timed(video_server):
    """A video spanning many 16-token chunks goes through the ViT once (the per-item cache keeps its rows
    across chunks); the stage timer reports its decode and preprocess; /metrics counts video items."""
    text = "Look: <|vision_start|><|video_pad|><|vision_end|> now."
    r = requests.post(video_server.url + "/generate", timeout=120, json={
        "text": text, "video_data": base64.b64encode(make_clip(96, 64, 10, 2.0, seed=77)).decode(),  # unseen
        "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    assert meta["prompt_tokens"] > 2 * 16  # the video crosses chunk boundaries
    assert meta["vit_encoded_images"] == 1
    assert meta["stage_timings_ms"]["video_decode"] > 0 and meta["stage_timings_ms"]["video_preprocess"] > 0
    metrics = requests.get(video_server.url + "/metrics", timeout=10).text
    line = next(ln for ln in metrics.splitlines() if ln.startswith("sglang:mm_items_total") and 'modality="video"' in ln)
    assert float(line.rsplit(" ", 1)[1]) >= 1
    frames = next(ln for ln in metrics.splitlines() if ln.startswith("sglang:video_frames_total"))
    assert float(frames.rsplit(" ", 1)[1]) >= 4


def test_same_video_is_a_prefix_cache_hit(oai, hf_ref):
    messages, *_ = build([("video", "c"), ("text", "cache me")])
    first = oai.chat.completions.create(model="m", messages=messages, max_tokens=2, temperature=0)
    again = oai.chat.completions.create(model="m", messages=messages, max_tokens=2, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
    other, tmpl, _, videos = build([("video", "b"), ("text", "cache me")])
    third = oai.chat.completions.create(model="m", messages=other, max_tokens=2, temperature=0)
    ids = hf_ref.tokenizer.encode(hf_ref.render(tmpl), add_special_tokens=False)
    _, mm = hf_ref.processor.process(ids, [], videos=videos)
    first_video_token = mm.mm_items[0].offsets[0][0]
    # a different video: the cache matches the text before it at most, never into the video
    assert third.usage.prompt_tokens_details.cached_tokens <= first_video_token


def _gif() -> bytes:
    import io

    buf = io.BytesIO()
    noise_image(32, 32, 1).save(buf, "GIF", save_all=True, append_images=[noise_image(32, 32, 2)])
    return buf.getvalue()


@pytest.mark.parametrize("url,reason", [
    (lambda: data_url(b"\x00" * 64, "video/mp4"), "not a readable video file"),
    (lambda: data_url(make_clip(64, 48, 10, 1.0)[:1500], "video/mp4"), "not a readable video file"),
    (lambda: data_url(_gif(), "video/gif"), "animated GIF"),
    (lambda: data_url(png_bytes(noise_image(32, 32, 1)), "image/png"), "video/"),
    (lambda: "/etc/hostname", "outside the allowed"),
])
def test_bad_videos_are_400s_and_leave_nothing(oai, video_server, url, reason):
    import openai

    from conftest import shm_sglang_entries

    before = {n for n in shm_sglang_entries() if n.startswith(f"sglang_mm_{video_server.port}_")}
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(png_bytes(noise_image(64, 64, 1)))}},
                                         {"type": "video_url", "video_url": {"url": url()}}]}]
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="m", messages=msgs, max_tokens=2)
    assert reason in str(e.value)
    wait_until(lambda: {n for n in shm_sglang_entries() if n.startswith(f"sglang_mm_{video_server.port}_")} <= before,
               10, what="no new shared-memory segment")
    info = requests.get(video_server.url + "/get_server_info", timeout=10).json()
    assert oai.chat.completions.create(model="m", messages=build(CASES["video_only"])[0], max_tokens=1).choices
    assert info is not None


def test_too_many_videos_names_the_limit(oai):
    import openai

    messages, *_ = build([("video", "a"), ("video", "b"), ("video", "c")])
    with pytest.raises(openai.BadRequestError, match="too many videos: 3 given, at most 2"):
        oai.chat.completions.create(model="m", messages=messages, max_tokens=2)


def test_request_fps_changes_the_sampling(oai):
    messages, *_ = build(CASES["video_only"])
    base = oai.chat.completions.create(model="m", messages=messages, max_tokens=1)
    dense = oai.chat.completions.create(model="m", messages=messages, max_tokens=1,
                                        extra_body={"mm_processor_kwargs": {"fps": 4}})
    assert dense.usage.prompt_tokens > base.usage.prompt_tokens
    import openai

    with pytest.raises(openai.BadRequestError, match="mm_processor_kwargs.fps"):
        oai.chat.completions.create(model="m", messages=messages, max_tokens=1,
                                    extra_body={"mm_processor_kwargs": {"fps": -1}})


def test_bar_clip_frames_reach_the_model_unchanged_in_order():
    """Guard for the fixture itself: the clip generator's frames decode back in order (the e2e cases
    above would still pass on a generator that wrote one frame repeated)."""
    from sglang.srt.multimodal.video_io import decode_video
    import numpy as np

    w, h, fps, sec, seed = CLIPS["a"]
    got = decode_video(clip("a"), lambda n, f: np.arange(n)).frames
    ref = bar_frames(w, h, int(fps * sec), seed)
    cols = lambda fr: [int(np.argmax(f.astype(np.int32).sum(axis=(0, 2)))) for f in fr]  # noqa: E731
    assert all(abs(a - b) <= 2 for a, b in zip(cols(got), cols(ref)))


@pytest.mark.slow
def test_tp2_answers_like_tp1(launch_server, oai):
    """--tp-size 2 (gloo on CPU) gives the same greedy answers to video prompts as the TP=1 server."""
    import openai

    tp2 = launch_server("--tp-size", "2", "--chunked-prefill-size", "16")
    oai2 = openai.OpenAI(base_url=tp2.url + "/v1", api_key="none", max_retries=0, timeout=180)
    for case in ("video_and_images", "two_videos"):
        messages, *_ = build(CASES[case])
        a = oai.chat.completions.create(model="m", messages=messages, max_tokens=MAX_NEW, temperature=0)
        b = oai2.chat.completions.create(model="m", messages=messages, max_tokens=MAX_NEW, temperature=0)
        assert (b.choices[0].message.content, b.usage.prompt_tokens) == (a.choices[0].message.content,
                                                                          a.usage.prompt_tokens), case


def test_media_io_kwargs_video_settings(oai):
    """vLLM's media_io_kwargs {"video": {...}} sets the same video sampling as mm_processor_kwargs; other
    modalities and conflicting values are 400s naming them."""
    import openai

    messages, *_ = build(CASES["video_only"])
    via_mm = oai.chat.completions.create(model="m", messages=messages, max_tokens=1,
                                         extra_body={"mm_processor_kwargs": {"num_frames": 6}})
    via_io = oai.chat.completions.create(model="m", messages=messages, max_tokens=1,
                                         extra_body={"media_io_kwargs": {"video": {"num_frames": 6}}})
    base = oai.chat.completions.create(model="m", messages=messages, max_tokens=1)
    assert via_io.usage.prompt_tokens == via_mm.usage.prompt_tokens != base.usage.prompt_tokens
    for body, word in (({"media_io_kwargs": {"image": {"mode": "L"}}}, "media_io_kwargs.image"),
                       ({"media_io_kwargs": {"video": {"fps": 1}}, "mm_processor_kwargs": {"fps": 2}},
                        "media_io_kwargs.video.fps"),
                       ({"media_io_kwargs": {"video": {"fps": 0}}}, "media_io_kwargs.video.fps")):
        with pytest.raises(openai.BadRequestError, match=word):
            oai.chat.completions.create(model="m", messages=messages, max_tokens=1, extra_body=body)


def test_qwen25_server_time_steps_reach_mrope_and_the_cache_key(tiny_model_dir, tmp_path):
    """Qwen2.5-VL served: the answer equals transformers' with our second_per_grid_ts; the same frames
    given at another rate (fps of a frame list) have identical prompt ids and pixels but other M-RoPE
    time steps, so they must not hit the first request's cached KV, and answer like transformers again."""
    from conftest import HFReference, ServerProcess

    path = tiny_model_dir("qwen2.5-vl-tiny")
    server = ServerProcess(path, tmp_path, ["--chunked-prefill-size", "16"]).wait_healthy()
    try:
        hf = HFReference(path)
        frames = [noise_image(56, 56, s) for s in range(4)]
        tmpl = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "what changes?"}]}]
        frames_b64 = [base64.b64encode(png_bytes(f)).decode() for f in frames]
        outs = []
        for fps in (1.0, 4.0):
            _, vcfg = hf.processor.media_config({"fps": fps})
            ref_text, n = hf_greedy(hf, tmpl, [], [frames], vcfg)
            r = requests.post(server.url + "/generate", timeout=120, json={
                "text": hf.render(tmpl), "video_data": [frames_b64], "mm_processor_kwargs": {"fps": fps},
                "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "min_new_tokens": MAX_NEW}})
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["meta_info"]["prompt_tokens"] == n
            assert out["text"] == ref_text
            outs.append(out)
        ids = hf.tokenizer.encode(hf.render(tmpl), add_special_tokens=False)
        _, mm = hf.processor.process(ids, [], videos=[frames])
        assert outs[1]["meta_info"]["cached_tokens"] <= mm.mm_items[0].offsets[0][0]
    finally:
        server.close()
