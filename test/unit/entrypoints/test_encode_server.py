"""The encoder server (`--encoder-only`): its HTTP app in a thread on the tiny model, items as the language
server's processor leaves them (PNG pixel values, a JPEG still compressed) in the typed wire form,
embeddings pushed over ZMQ equal to the whole model's vision tower, the per-image cache keyed by the
encoder's own hash of what it received, pushes only to registered endpoints, and a corrupt image
answered 400 (not an encoder failure)."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
import requests
import torch
import zmq
from PIL import Image

from sglang.srt.disaggregation.encode_protocol import ENCODE_PATH, REGISTER_PATH, EncodeRequest
from sglang.srt.disaggregation.encode_wire import decode_embedding_frames, encode_request_body


def _image_bytes(w: int, h: int, seed: int, fmt: str) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def encoder(tiny_model_dir):
    from encoder_app import encoder_in_thread

    with encoder_in_thread(str(tiny_model_dir("qwen3-vl-tiny"))) as served:
        yield served


@pytest.fixture(scope="module")
def items(tiny_model_dir):
    """Three items as a --language-only tokenizer builds them: deferred JPEG, PNG pixel values, hashed."""
    from transformers import AutoTokenizer

    from sglang.srt.multimodal.hashing import precompute_item_hashes
    from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor

    path = str(tiny_model_dir("qwen3-vl-tiny"))
    proc = QwenVLProcessor.from_pretrained(path, AutoTokenizer.from_pretrained(path))
    proc.deferred_jpeg = True
    pad = 151655
    imgs = [_image_bytes(96, 64, 1, "JPEG"), _image_bytes(64, 128, 2, "PNG"), _image_bytes(80, 80, 3, "PNG")]
    _, mm = proc.process([151652, pad, 151653] * 3, imgs)
    precompute_item_hashes(mm, "xxh3_128")
    return mm.mm_items


def _post(url: str, req: EncodeRequest, register: bool = True):
    if register:
        r = requests.post(url + REGISTER_PATH, json={"reply_to": req.reply_to}, timeout=10)
        assert r.status_code == 200, r.text
    return requests.post(url + ENCODE_PATH, data=encode_request_body(req), timeout=60)


def _received(sink) -> "EncodedEmbeddings":  # noqa: F821
    assert sink.poll(10_000)
    return decode_embedding_frames(sink.recv_multipart(), None, 1 << 30)


def test_encode_pushes_the_whole_models_embeddings_and_caches_by_hash(encoder, items, tiny_model_dir):
    from sglang.srt.configs.vit_strategy import ViTStrategy
    from sglang.srt.model_loader.loader import get_model
    from sglang.srt.multimodal.mm_types import EncodedImage

    engine, url = encoder
    assert isinstance(items[0].feature, EncodedImage)  # a plain JPEG travels compressed
    ctx = zmq.Context(1)
    sink = ctx.socket(zmq.PULL)
    port = sink.bind_to_random_port("tcp://127.0.0.1")
    try:
        r = _post(url, EncodeRequest("r1", [0, 2, 5], items, f"tcp://127.0.0.1:{port}"))
        assert r.status_code == 200, r.text
        assert r.json()["cached"] == 0 and r.json()["items"] == 3
        msg = _received(sink)
        assert msg.rid == "r1" and msg.item_indices == [0, 2, 5]
        whole = get_model(str(tiny_model_dir("qwen3-vl-tiny")), "float32", "cpu", vit=ViTStrategy())
        with torch.no_grad():
            ref = whole.get_image_feature(items)
        for a, b in zip(ref, msg.embeddings):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        # the same images again, under another request: all three from the encoder's cache
        r = _post(url, EncodeRequest("r2", [0, 1, 2], items, f"tcp://127.0.0.1:{port}"))
        assert r.status_code == 200 and r.json()["cached"] == 3
        again = _received(sink)
        assert again.rid == "r2" and all(torch.equal(a, b) for a, b in zip(again.embeddings, msg.embeddings))
        info = requests.get(url + "/get_server_info", timeout=10).json()
        assert info["num_encoded_items"] >= 3 and info["num_cached_items"] >= 3
    finally:
        ctx.destroy(linger=0)


def test_a_corrupt_jpeg_is_a_400_and_the_encoder_serves_on(encoder, items):
    import copy

    _, url = encoder
    assert requests.get(url + "/health", timeout=10).status_code == 200
    bad = copy.deepcopy(items[0])
    data = bytearray(bad.feature.data)
    cut = len(data) // 3
    data[cut:] = b"\x00" * (len(data) - cut)  # header intact, entropy-coded data destroyed
    bad.feature.data = bytes(data[: cut + 16])
    bad.hash = 12345
    r = _post(url, EncodeRequest("bad", [0], [bad], "tcp://127.0.0.1:9"))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert requests.post(url + ENCODE_PATH, data=b"not an encode request", timeout=10).status_code == 400
    assert requests.get(url + "/health", timeout=10).status_code == 200


def test_an_unreachable_reply_to_is_a_500_not_a_stuck_encoder(encoder, items):
    from sglang.srt.utils.network import pick_unused_port

    engine, url = encoder
    engine.push_timeout_ms = 300
    t0 = time.monotonic()
    r = _post(url, EncodeRequest("lost", [0], [items[1]], f"tcp://127.0.0.1:{pick_unused_port()}"))
    assert r.status_code == 500 and "could not push the embeddings" in r.text, r.text
    assert time.monotonic() - t0 < 8  # the 300 ms push timeout, not the 10 s default (nor a hang)
    assert requests.get(url + "/health", timeout=10).status_code == 200


def test_requests_queued_together_share_one_tower_call_and_fail_alone(encoder, items):
    import copy

    engine, _ = encoder
    engine.cache.clear()
    calls = []
    tower = engine.model.get_image_feature
    engine.model.get_image_feature = lambda its: calls.append(len(its)) or tower(its)
    try:
        bad = copy.deepcopy(items[0])
        bad.feature.data = bad.feature.data[: len(bad.feature.data) // 3] + b"\x00" * 32
        bad.hash = 777
        reqs = [EncodeRequest("x", [0, 1], [items[0], items[1]], ""),
                EncodeRequest("bad", [0], [bad], ""),
                EncodeRequest("y", [3, 4], [items[1], items[2]], "")]
        x, err, y = engine.encode_batch(reqs)
        assert calls == [3]  # items 0, 1, 2 once each: item 1 is shared by x and y
        assert isinstance(err, ValueError)
        assert x.rid == "x" and y.rid == "y" and x.cached == y.cached == 0
        assert torch.equal(x.embeddings[1], y.embeddings[0])
        alone = [engine.encode(EncodeRequest("z", [0], [it], "")) for it in items]  # now all cached
        assert calls == [3] and all(a.cached == 1 for a in alone)
        assert torch.equal(alone[2].embeddings[0], y.embeddings[1])
    finally:
        engine.model.get_image_feature = tower


def test_compact_still_images_fit_the_tower_and_compact_videos_do_not():
    """SGLANG_MM_COMPACT_STILL_IMAGES on a language server: still images arrive with one frame per patch row
    (float32 rows of C*P*P, or a uint8 recipe of one temporal frame) and are accepted; a video never is."""
    from types import SimpleNamespace

    from sglang.srt.disaggregation.encode_wire import WireError
    from sglang.srt.entrypoints.encode_server import check_item
    from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem, PixelNorm

    vcfg = SimpleNamespace(patch_size=16, temporal_patch_size=2, spatial_merge_size=2)
    norm = PixelNorm("image", 16, 1, 2, (0.5,) * 3, (0.5,) * 3, True, 1 / 255, True)
    ok = [MultimodalDataItem(Modality.IMAGE, torch.zeros(16, w), (1, 4, 4)) for w in (1536, 768)]
    ok.append(MultimodalDataItem(Modality.IMAGE, torch.zeros(64, 64, 3, dtype=torch.uint8), (1, 4, 4), pixel_norm=norm))
    for k, item in enumerate(ok):
        check_item(k, item, vcfg)
    bad = [MultimodalDataItem(Modality.VIDEO, torch.zeros(16, 768), (1, 4, 4)),
           MultimodalDataItem(Modality.IMAGE, torch.zeros(32, 768), (2, 4, 4))]
    for k, item in enumerate(bad):
        with pytest.raises(WireError, match="pixel_values of shape"):
            check_item(k, item, vcfg)
