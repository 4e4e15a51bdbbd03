"""bench_serving datasets: exact text lengths, length and item-count ranges, bucket frequencies, image
size/format/content, ordering and seeding."""

from __future__ import annotations

import base64
import io
import os
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from sglang.benchmark import datasets as ds


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from sglang.testing.tokenizer_builder import write_tokenizer_files

    out = tmp_path_factory.mktemp("tok")
    write_tokenizer_files(out)
    return AutoTokenizer.from_pretrained(str(out))


def _decode(url: str) -> Image.Image:
    head, data = url.split(",", 1)
    assert head.startswith("data:image/") and head.endswith(";base64")
    return Image.open(io.BytesIO(base64.b64decode(data)))


def _ntok(tok, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False))


def test_usable_ids_round_trip_and_exclude_specials(tok):
    ids = ds.usable_token_ids(tok)
    assert len(ids) > 500 and ids.max() < tok.vocab_size
    assert not set(ids.tolist()) & set(tok.all_special_ids)
    for i in ids[:: max(1, len(ids) // 200)].tolist():
        assert tok.encode(tok.decode([i]), add_special_tokens=False) == [i]


@pytest.mark.parametrize("n", [0, 1, 7, 64, 333])
def test_random_text_has_exact_token_length(tok, n):
    gen = ds.RandomText(tok, np.random.default_rng(n))
    prefix, plen = gen.make(25)
    assert plen == _ntok(tok, prefix) == 25
    text, got = gen.make(n, prefix)
    assert text.startswith(prefix) and got == _ntok(tok, text) == 25 + n


def test_random_mm_lengths_items_and_order(tok):
    cfg = ds.RandomMMConfig(ds.TextLenConfig(40, 10, 5, 0.5), base_items_per_request=2, num_mm_items_range_ratio=0.5,
                            limit_mm_per_prompt={"image": 3, "video": 0}, bucket_config={(16, 24, 1): 1.0})
    reqs = ds.sample_random_mm(tok, 60, cfg, seed=3)
    assert len(reqs) == 60
    for r in reqs:
        assert r.prompt_len == _ntok(tok, r.prompt)
        assert 5 + 20 <= r.prompt_len <= 5 + 60 and 5 <= r.output_len <= 15
        assert 1 <= len(r.images) <= 3 and r.image_sizes == [(16, 24)] * len(r.images)
        kinds = [p["type"] for p in r.content()]
        assert kinds == ["text"] + ["image_url"] * len(r.images)
    assert {len(r.images) for r in reqs} == {1, 2, 3}
    shared = os.path.commonprefix([r.prompt for r in reqs])
    assert _ntok(tok, shared) >= 5  # the 5-token prefix is shared


def test_random_mm_videos_respect_each_modality_limit(tok):
    """Buckets with T > 1 are mp4 videos of T frames (2 fps); once a modality's limit is used up the
    remaining items come from the other modality's buckets, as vLLM draws them."""
    av = pytest.importorskip("av")
    import base64
    import io

    cfg = ds.RandomMMConfig(ds.TextLenConfig(20, 4, 0, 0.0), base_items_per_request=3,
                            limit_mm_per_prompt={"image": 2, "video": 1},
                            bucket_config={(16, 24, 1): 0.5, (32, 48, 4): 0.5})
    reqs = ds.sample_random_mm(tok, 12, cfg, seed=1)
    for r in reqs:
        assert len(r.images) + len(r.videos) == 3 and len(r.videos) <= 1 and len(r.images) <= 2
        assert r.video_sizes == [(32, 48, 4)] * len(r.videos)
        assert [p["type"] for p in r.content()] == ["text"] + ["image_url"] * len(r.images) + ["video_url"] * len(r.videos)
    url = next(r.videos[0] for r in reqs if r.videos)
    with av.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as c:
        s = c.streams.video[0]
        assert (s.frames, s.average_rate, s.codec_context.width, s.codec_context.height) == (4, 2, 48, 32)


def test_text_len_ranges_follow_vllm():
    rng = np.random.default_rng(0)
    ins, outs = ds.TextLenConfig(100, 3, 0, 0.5).sample(rng, 4000)
    assert (min(ins), max(ins)) == (50, 150)
    assert (min(outs), max(outs)) == (1, 5)  # floor(1.5) = 1, ceil(4.5) = 5; output length at least 1
    ins, outs = ds.TextLenConfig(100, 10, 0, 0.0).sample(rng, 50)
    assert set(ins) == {100} and set(outs) == {10}
    with pytest.raises(ValueError):
        ds.TextLenConfig(100, 10, 0, 1.0).sample(rng, 1)


def test_item_count_range_clamped_to_limit_and_errors(tok):
    text = ds.TextLenConfig(4, 2)
    cfg = ds.RandomMMConfig(text, 2, 1.0, {"image": 3}, {(8, 8, 1): 1.0})
    counts = Counter(len(r.images) for r in ds.sample_random_mm(tok, 200, cfg, seed=1))
    assert set(counts) == {0, 1, 2, 3}  # [floor(0), ceil(4)] capped at the limit 3
    with pytest.raises(ValueError, match="exceeds"):
        ds.sample_random_mm(tok, 1, ds.RandomMMConfig(text, 4, 0.0, {"image": 3}, {(8, 8, 1): 1.0}))
    with pytest.raises(ValueError):
        ds.sample_random_mm(tok, 1, ds.RandomMMConfig(text, 1, 1.5, {"image": 3}, {(8, 8, 1): 1.0}))


def test_bucket_frequencies_follow_config(tok):
    buckets = {(8, 8, 1): 0.25, (12, 20, 1): 0.75, (720, 1280, 16): 0.0}
    cfg = ds.RandomMMConfig(ds.TextLenConfig(2, 1), 1, 0.0, {"image": 1}, buckets)
    reqs = ds.sample_random_mm(tok, 800, cfg, seed=5)
    sizes = Counter(s for r in reqs for s in r.image_sizes)
    assert set(sizes) == {(8, 8), (12, 20)}
    assert abs(sizes[(8, 8)] / 800 - 0.25) < 0.05
    img = _decode(reqs[0].images[0])
    assert img.format == "JPEG" and img.size[::-1] == reqs[0].image_sizes[0]


def test_parse_bucket_config():
    got = ds.parse_bucket_config("{(256, 256, 1): 1, (720, 1280, 1): 3, (720, 1280, 16): 0.0}")
    assert got == {(256, 256, 1): 0.25, (720, 1280, 1): 0.75}
    assert ds.parse_bucket_config("{(64, 48, 8): 1.0}") == {(64, 48, 8): 1.0}  # a video bucket
    for bad in ["{(256, 256): 1.0}", "{(1, 1, 1): -1}", "{(1, 1, 1): 0}", "[1]",
                "__import__('os')"]:
        with pytest.raises((ValueError, SyntaxError)):
            ds.parse_bucket_config(bad)
    assert ds.parse_limit_mm('{"image": 3, "video": 0}') == {"image": 3, "video": 0}
    with pytest.raises(ValueError):
        ds.parse_limit_mm('{"image": -1}')


def test_seed_determinism(tok):
    cfg = ds.RandomMMConfig(ds.TextLenConfig(30, 5, 0, 0.3), 2, 0.5, {"image": 4}, {(8, 8, 1): 0.5, (16, 8, 1): 0.5})
    a, b, c = (ds.sample_random_mm(tok, 10, cfg, seed=s) for s in (7, 7, 8))
    key = lambda rs: [(r.prompt, r.output_len, r.images) for r in rs]  # noqa: E731
    assert key(a) == key(b) and key(a) != key(c)
    icfg = ds.ImageDatasetConfig(ds.TextLenConfig(10, 3), image_count=2, image_resolution="8x8")
    assert key(ds.sample_image_dataset(tok, 3, icfg, 1)) == key(ds.sample_image_dataset(tok, 3, icfg, 1))


def test_resolutions():
    assert ds.parse_image_resolution("4k") == (2160, 3840)
    assert ds.parse_image_resolution("1080p") == (1080, 1920)
    assert ds.parse_image_resolution("720p") == (720, 1280)
    assert ds.parse_image_resolution("360p") == (360, 640)
    assert ds.parse_image_resolution("300x500") == (300, 500)
    for bad in ("720", "0x5", "axb", "1x2x3"):
        with pytest.raises(ValueError):
            ds.parse_image_resolution(bad)


@pytest.mark.parametrize("fmt,content", [("jpeg", "random"), ("png", "random"), ("png", "blank")])
def test_image_dataset_images_first_size_format_content(tok, fmt, content):
    cfg = ds.ImageDatasetConfig(ds.TextLenConfig(20, 4), image_count=3, image_resolution="30x50",
                                image_format=fmt, image_content=content)
    reqs = ds.sample_image_dataset(tok, 4, cfg, seed=0)
    for r in reqs:
        assert len(r.images) == 3 and r.prompt_len == _ntok(tok, r.prompt) == 20
        assert [p["type"] for p in r.content()] == ["image_url"] * 3 + ["text"]
        img = _decode(r.images[0])
        assert img.format == fmt.upper() and img.size == (50, 30)
        pixels = np.asarray(img.convert("RGB"))
        if content == "blank":
            assert not pixels.any()
        else:
            assert pixels.std() > 50  # uniform noise
    assert len({r.images[0] for r in reqs}) == (1 if content == "blank" else 4)


def test_random_image_count_spans_one_to_count(tok):
    cfg = ds.ImageDatasetConfig(ds.TextLenConfig(2, 1), image_count=4, random_image_count=True,
                                image_resolution="4x4")
    counts = Counter(len(r.images) for r in ds.sample_image_dataset(tok, 120, cfg, seed=2))
    assert set(counts) == {1, 2, 3, 4}
    with pytest.raises(ValueError):
        ds.sample_image_dataset(tok, 1, ds.ImageDatasetConfig(image_format="gif", image_resolution="4x4"))
