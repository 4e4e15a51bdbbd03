"""The encoder's trust boundary, against its real HTTP app on the tiny model: `--api-key` and the body limit
guard it as they guard a server, it pushes only to endpoints registered from their own address, its cache
cannot be poisoned by a stated hash, and a language server refuses an encoder that serves another model."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import requests
import torch
import zmq

from sglang.srt.disaggregation.encode_protocol import ENCODE_PATH, REGISTER_PATH, EncodeRequest
from sglang.srt.managers.encode_receiver import EncodeDispatcher, EncoderMismatch
from sglang.srt.disaggregation.encode_wire import decode_embedding_frames, encode_request_body, mac_key
from sglang.srt.disaggregation.model_identity import identity_mismatch, model_identity
from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem

KEY = "s3cret"


@pytest.fixture(scope="module")
def encoder(tiny_model_dir):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "entrypoints"))
    from encoder_app import encoder_in_thread

    with encoder_in_thread(str(tiny_model_dir("qwen3-vl-tiny")), api_key=KEY, max_payload_size=1 << 20) as served:
        yield served


AUTH = {"Authorization": f"Bearer {KEY}"}


def _pixels(seed: int, hash_: int) -> MultimodalDataItem:
    """A float32 item of grid (1, 4, 4) for the tiny Qwen3-VL tower (patch 16, temporal 2: 1536 columns)."""
    g = torch.Generator().manual_seed(seed)
    return MultimodalDataItem(Modality.IMAGE, torch.randn(16, 3 * 2 * 16 * 16, generator=g), (1, 4, 4), hash=hash_)


def test_api_key_guards_every_route_but_health(encoder):
    _, url = encoder
    assert requests.get(url + "/health", timeout=10).status_code == 200
    for method, path in [("post", ENCODE_PATH), ("post", REGISTER_PATH), ("get", "/get_server_info")]:
        r = getattr(requests, method)(url + path, timeout=10)
        assert r.status_code == 401, (path, r.text)
        r = getattr(requests, method)(url + path, headers={"Authorization": "Bearer wrong"}, timeout=10)
        assert r.status_code == 401
    assert requests.get(url + "/get_server_info", headers=AUTH, timeout=10).status_code == 200


def test_bodies_past_the_limit_are_413_unread(encoder):
    _, url = encoder
    r = requests.post(url + ENCODE_PATH, data=b"\x00" * (2 << 20), headers=AUTH, timeout=30)
    assert r.status_code == 413, r.text


def test_reply_to_must_be_registered_from_its_own_address(encoder):
    _, url = encoder
    body = encode_request_body(EncodeRequest("u1", [0], [_pixels(0, 1)], "tcp://127.0.0.1:9"))
    r = requests.post(url + ENCODE_PATH, data=body, headers=AUTH, timeout=30)
    assert r.status_code == 409 and "not registered" in r.text  # nothing is pushed anywhere
    for reply_to, status in [("tcp://10.1.2.3:9", 403), ("tcp://203.0.113.5:9", 403), ("http://127.0.0.1:9", 400),
                             ("tcp://localhost-but-a-name:9", 400)]:
        r = requests.post(url + REGISTER_PATH, json={"reply_to": reply_to}, headers=AUTH, timeout=10)
        assert r.status_code == status, (reply_to, r.text)
    r = requests.post(url + REGISTER_PATH, json={"reply_to": "tcp://127.0.0.1:9"}, headers=AUTH, timeout=10)
    assert r.status_code == 200 and r.json()["identity"]["architecture"] == "Qwen3VLForConditionalGeneration"


def test_a_stated_hash_cannot_poison_the_cache(encoder):
    """Image Y sent under image X's hash: later asks for X still get X's embeddings (on a018ab2, Y's)."""
    engine, url = encoder
    ctx = zmq.Context(1)
    sink = ctx.socket(zmq.PULL)
    reply_to = f"tcp://127.0.0.1:{sink.bind_to_random_port('tcp://127.0.0.1')}"
    key = mac_key(KEY)
    try:
        assert requests.post(url + REGISTER_PATH, json={"reply_to": reply_to}, headers=AUTH, timeout=10).ok
        x, y = _pixels(1, 42), _pixels(2, 42)  # different pixels, the same stated hash
        got = []
        for rid, item in [("y", y), ("x", x)]:
            r = requests.post(url + ENCODE_PATH, headers=AUTH, timeout=60,
                              data=encode_request_body(EncodeRequest(rid, [0], [item], reply_to)))
            assert r.status_code == 200, r.text
            assert sink.poll(10_000)
            got.append(decode_embedding_frames(sink.recv_multipart(), key, 1 << 30).embeddings[0])
        with torch.no_grad():
            want_y, want_x = (t.cpu() for t in engine.model.get_image_feature([y, x]))
        torch.testing.assert_close(got[0], want_y, rtol=0, atol=0)
        torch.testing.assert_close(got[1], want_x, rtol=0, atol=0)
        assert not torch.equal(got[0], got[1])
        # an unsigned push is not what the encoder sends when it has a key
        with pytest.raises(ValueError):
            decode_embedding_frames([b"x", b"{}"], key, 1 << 30)
    finally:
        ctx.destroy(linger=0)


def test_an_item_that_does_not_fit_the_tower_is_a_400(encoder):
    _, url = encoder
    assert requests.post(url + REGISTER_PATH, json={"reply_to": "tcp://127.0.0.1:9"}, headers=AUTH, timeout=10).ok
    bad = MultimodalDataItem(Modality.IMAGE, torch.zeros(16, 100), (1, 4, 4))  # 100 columns, not 1536
    r = requests.post(url + ENCODE_PATH, headers=AUTH, timeout=30,
                      data=encode_request_body(EncodeRequest("b1", [0], [bad], "tcp://127.0.0.1:9")))
    assert r.status_code == 400 and "pixel_values of shape (16, 100)" in r.text
    assert requests.get(url + "/health", timeout=10).status_code == 200


def test_identity_tells_checkpoints_and_architectures_apart(tiny_model_dir, tmp_path):
    from sglang.testing.make_model import make_model

    a = model_identity(str(tiny_model_dir("qwen3-vl-tiny")))
    assert model_identity(str(tiny_model_dir("qwen3-vl-tiny"))) == a and identity_mismatch(a, dict(a)) is None
    other_seed = model_identity(str(make_model("qwen3-vl-tiny", tmp_path / "s1", seed=1, progress=False)))
    assert identity_mismatch(a, other_seed) == "it serves another checkpoint (differs in vision_weights)"
    q25 = model_identity(str(tiny_model_dir("qwen2.5-vl-tiny")))
    assert "another architecture ('Qwen2_5_VLForConditionalGeneration'" in identity_mismatch(a, q25)
    assert identity_mismatch(a, None) == "the encoder sent no model identity"


def test_a_language_server_refuses_an_encoder_of_another_model(encoder, tiny_model_dir, tmp_path):
    from sglang.testing.make_model import make_model

    _, url = encoder
    same = str(tiny_model_dir("qwen3-vl-tiny"))
    other = str(make_model("qwen3-vl-tiny", tmp_path / "other", seed=3, progress=False))

    async def run(model_dir, api_key=KEY):
        d = EncodeDispatcher([url], "zmq_to_scheduler", "tcp://127.0.0.1:9", api_key=api_key,
                             identity=lambda: model_identity(model_dir))
        try:
            return await d.register_all(), d
        finally:
            await d.close()

    mismatches, d = asyncio.run(run(same))
    assert mismatches == [] and d.pool.usable() == [url]
    mismatches, d = asyncio.run(run(other))
    assert len(mismatches) == 1 and "another checkpoint" in mismatches[0] and url in mismatches[0]
    assert d.pool.usable() == [] and "refused" in d.pool.stats()[url]

    async def encode_through(dispatcher):
        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
        from sglang.srt.managers.io_struct import MultimodalInputs
        from sglang.srt.sampling.sampling_params import SamplingParams

        req = TokenizedGenerateReqInput("m1", [1], SamplingParams(), MultimodalInputs([_pixels(0, 1)]))
        try:
            await dispatcher.encode(req)
        finally:
            await dispatcher.close()

    from sglang.srt.errors import GenerateError

    with pytest.raises(GenerateError) as e:
        asyncio.run(encode_through(d))
    assert e.value.status_code == 503 and "another checkpoint" in e.value.message
    with pytest.raises(EncoderMismatch):
        async def direct():
            d2 = EncodeDispatcher([url], "zmq_to_scheduler", "tcp://127.0.0.1:9", api_key=KEY,
                                  identity=lambda: model_identity(other))
            try:
                await d2.register(url)
            finally:
                await d2.close()

        asyncio.run(direct())
