"""The typed wire form of encoder disaggregation: round trips of every item kind and of embeddings, and
every check that a hostile or broken sender meets (pickles, garbage, truncation, oversize, unknown
fields, forged or missing MACs, shapes that do not hold their bytes)."""

from __future__ import annotations

import pickle

import msgspec
import pytest
import torch

from sglang.srt.disaggregation.encode_protocol import EncodedEmbeddings, EncodeRequest
from sglang.srt.disaggregation.encode_wire import (
    MAGIC_REQUEST,
    WireError,
    content_key,
    decode_embedding_frames,
    decode_request_body,
    embedding_frames,
    encode_request_body,
    mac_key,
)
from sglang.srt.multimodal.mm_types import EncodedImage, Modality, MultimodalDataItem, PixelNorm

NORM = PixelNorm("image", 16, 2, 2, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), True, 1 / 255, True)


def _items():
    g = torch.Generator().manual_seed(0)
    return [
        MultimodalDataItem(Modality.IMAGE, EncodedImage(b"\xff\xd8jpeg-bytes", (64, 32), (1, 4, 2), 6, object()),
                           (1, 4, 2), hash=111),
        MultimodalDataItem(Modality.IMAGE, torch.randn(8, 12, generator=g), (1, 2, 4), hash=222),
        MultimodalDataItem(Modality.IMAGE, torch.randint(0, 256, (32, 64, 3), dtype=torch.uint8, generator=g),
                           (1, 2, 4), hash=333, pixel_norm=NORM),
        MultimodalDataItem(Modality.VIDEO, torch.randint(0, 256, (3, 32, 32, 3), dtype=torch.uint8, generator=g),
                           (2, 2, 2), pixel_norm=PixelNorm("video", *[getattr(NORM, f) for f in (
                               "patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std",
                               "do_rescale", "rescale_factor", "do_normalize")])),
    ]


def _body(items=None, **kw) -> bytes:
    items = items or _items()
    return encode_request_body(EncodeRequest(kw.get("rid", "r1"), list(range(len(items))), items,
                                             kw.get("reply_to", "tcp://127.0.0.1:5000")))


def test_every_item_kind_round_trips_and_no_stated_hash_survives():
    items = _items()
    req, raw = decode_request_body(_body(items), 1 << 20)
    assert (req.rid, req.item_indices, req.reply_to, req.backend) == ("r1", [0, 1, 2, 3], "tcp://127.0.0.1:5000",
                                                                      "zmq_to_scheduler")
    jpeg, f32, u8, video = req.items
    assert jpeg.feature.data == items[0].feature.data and jpeg.feature.target_hw == (64, 32)
    assert jpeg.feature.orientation == 6 and jpeg.feature.processor is None  # the encoder applies its own
    assert torch.equal(f32.feature, items[1].feature) and f32.pixel_norm is None
    assert torch.equal(u8.feature, items[2].feature) and u8.pixel_norm == NORM
    assert video.modality is Modality.VIDEO and torch.equal(video.feature, items[3].feature)
    assert all(it.hash is None for it in req.items)  # never the sender's word
    keys = [content_key(r) for r in raw]
    assert len(set(keys)) == 4
    again = decode_request_body(_body(_items()), 1 << 20)[1]
    assert [content_key(r) for r in again] == keys  # same bytes, same key
    items2 = _items()
    items2[1].feature[0, 0] += 1  # one value differs: another key, whatever hash the sender states
    assert content_key(decode_request_body(_body(items2), 1 << 20)[1][1]) != keys[1]


def test_a_pickle_is_never_unpickled():
    ran = []

    class Evil:
        def __reduce__(self):
            return (ran.append, ("executed",))

    with pytest.raises(WireError, match="bad magic"):
        decode_request_body(pickle.dumps(Evil()), 1 << 20)
    with pytest.raises(WireError):
        decode_embedding_frames([b"r1", pickle.dumps(Evil())], None, 1 << 20)
    assert ran == []


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b[:-5], "truncated"),
    (lambda b: b + b"xx", "after the last item"),
    (lambda b: b"GARBAGE!" + b[8:], "bad magic"),
    (lambda b: b[:8] + (2**31).to_bytes(4, "little") + b[12:], "header length"),
    (lambda b: b[:12] + b"{" * 10 + b[22:], "header"),
])
def test_broken_bodies_are_refused_naming_the_problem(mutate, message):
    with pytest.raises(WireError, match=message):
        decode_request_body(mutate(_body()), 1 << 20)


def _with_header(header: dict, blob: bytes = b"") -> bytes:
    h = msgspec.json.encode(header)
    return MAGIC_REQUEST + len(h).to_bytes(4, "little") + h + blob


@pytest.mark.parametrize("item, message", [
    ({"kind": "float32", "shape": [2, 3], "nbytes": 24, "extra": 1}, "unknown field"),
    ({"kind": "float32", "shape": [2, 3], "nbytes": 20}, "do not hold"),
    ({"kind": "pickle", "shape": [4], "nbytes": 4}, "kind must be"),
    ({"kind": "float32", "shape": [2, 3], "nbytes": 24, "grid_thw": [1, 0, 2]}, "grid_thw"),
    ({"kind": "uint8", "shape": [2, 2, 3], "nbytes": 12}, "need a norm"),
    ({"kind": "jpeg", "shape": [4], "nbytes": 4}, "target_hw"),
    ({"kind": "float32", "shape": [2, 3], "nbytes": 24, "modality": "audio"}, "modality"),
])
def test_item_fields_are_checked(item, message):
    base = {"index": 0, "modality": "image", "grid_thw": [1, 2, 2]}
    body = _with_header({"rid": "r", "reply_to": "tcp://127.0.0.1:1", "backend": "zmq_to_scheduler",
                         "items": [{**base, **item}]}, b"\x00" * item["nbytes"])
    with pytest.raises(WireError, match=message):
        decode_request_body(body, 1 << 20)


def test_request_level_fields_and_the_size_bound_are_checked():
    ok = {"rid": "r", "reply_to": "tcp://127.0.0.1:1", "backend": "zmq_to_scheduler", "items": []}
    for bad, message in [({"rid": ""}, "rid"), ({"reply_to": "ipc:///tmp/x"}, "reply_to"),
                         ({"backend": "mooncake"}, "backend"), ({}, "no items")]:
        with pytest.raises(WireError, match=message):
            decode_request_body(_with_header({**ok, **bad}), 1 << 20)
    body = _body()
    with pytest.raises(WireError, match="over the"):
        decode_request_body(body, len(body) - 1)


# ---------------------------------------------------------------------------------------- embeddings
def _msg(dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return EncodedEmbeddings("rid-7", [2, 0], [torch.randn(3, 8, generator=g).to(dtype),
                                               torch.randn(5, 8, generator=g).to(dtype)], 4.5, 1, "http://enc:1")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_embeddings_round_trip_bit_for_bit(dtype):
    msg = _msg(dtype)
    frames = [bytes(f) for f in embedding_frames(msg)]
    got = decode_embedding_frames(frames, None, 1 << 20)
    assert (got.rid, got.item_indices, got.encode_ms, got.cached, got.encoder) == ("rid-7", [2, 0], 4.5, 1, "http://enc:1")
    assert all(a.dtype == dtype and torch.equal(a, b) for a, b in zip(got.embeddings, msg.embeddings))


def test_the_mac_binds_every_frame_to_the_api_key():
    key = mac_key("secret")
    frames = [bytes(f) for f in embedding_frames(_msg(), key)]
    assert torch.equal(decode_embedding_frames(frames, key, 1 << 20).embeddings[1], _msg().embeddings[1])
    with pytest.raises(WireError, match="bad MAC"):
        decode_embedding_frames(frames, mac_key("other"), 1 << 20)
    tampered = list(frames)
    tampered[2] = bytes([tampered[2][0] ^ 1]) + tampered[2][1:]
    with pytest.raises(WireError, match="bad MAC"):
        decode_embedding_frames(tampered, key, 1 << 20)
    with pytest.raises(WireError, match="missing MAC"):
        decode_embedding_frames([bytes(f) for f in embedding_frames(_msg())], key, 1 << 20)


def test_broken_embedding_messages_are_refused():
    frames = [bytes(f) for f in embedding_frames(_msg())]
    cases = [
        ([b"\xff\xfe"] + frames[1:], "undecodable"),  # a non-UTF-8 rid frame
        ([b"other"] + frames[1:], "rid frame differs"),
        (frames[:-1], "counts differ"),  # one embedding frame missing
        (frames[:2] + [frames[2][:-4]] + frames[3:], "do not hold"),
        ([frames[0], b"not json"] + frames[2:], "undecodable"),
        ([b"x"], "fewer than 2 frames"),
    ]
    for bad, message in cases:
        with pytest.raises(WireError, match=message):
            decode_embedding_frames(bad, None, 1 << 20)
    with pytest.raises(WireError, match="limit"):
        decode_embedding_frames(frames, None, 100)
    header = msgspec.json.decode(frames[1])
    for field, value, message in [("dtype", "int64", "dtype"), ("item_indices", [0, 0], "repeats"),
                                  ("shapes", [[3, 8, 1], [5, 8]], "bad shape")]:
        with pytest.raises(WireError, match=message):
            decode_embedding_frames([frames[0], msgspec.json.encode({**header, field: value})] + frames[2:], None, 1 << 20)
