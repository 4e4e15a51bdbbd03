"""The tokenizer-side seed series on Qwen3.5, through the real request path: `RequestBuilder` (the tokenizer
manager's worker side: chat text, the checkpoint's processor, hashing, shared memory) builds each request
under the switches, its pickled payload is what the scheduler receives, the scheduler unwraps it as
`recv_requests` does and serves it (chunked prefill of 7 cutting both images, the hybrid prefix cache on).

- SGLANG_MM_SHM_TRANSPORT: the message carries pointers only, the pixels in /dev/shm until the scheduler
  maps them and unlinks the names;
- SGLANG_MM_UINT8_PIXELS: the items reach the scheduler as uint8 with their PixelNorm;
- SGLANG_MM_COMPACT_STILL_IMAGES: still images patchified as one temporal frame;
- SGLANG_MM_PRECOMPUTE_HASH: the items arrive hashed (the baseline hashes in the scheduler).

Each switch alone, and all four together, gives transformers' greedy tokens (on the baseline's float32
pixels) for two requests, the second with the same images and a new question, which resumes from the
snapshot at the end of the images (its cached_tokens equal to the baseline's) and encodes nothing."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import pytest
import torch

from scheduler_utils import InProcessScheduler
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.request_builder import RequestBuilder
from sglang.srt.multimodal.transport.shm import SHM_DIR, ShmPointerMMData
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.network import pick_unused_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from qwen3_5_driver import noise_image, ref_kwargs  # noqa: E402

transformers = pytest.importorskip("transformers")

SHM, UINT8, HASH, COMPACT = ("SGLANG_MM_SHM_TRANSPORT", "SGLANG_MM_UINT8_PIXELS", "SGLANG_MM_PRECOMPUTE_HASH",
                             "SGLANG_MM_COMPACT_STILL_IMAGES")
CASES = {"baseline": set(), "shm": {SHM}, "uint8": {UINT8}, "compact": {COMPACT}, "precompute_hash": {HASH},
         "all": {SHM, UINT8, HASH, COMPACT}}
PH = "<|vision_start|><|image_pad|><|vision_end|>"
TEXTS = ["Look at " + PH + " and then " + PH + ": what differs?", "Look at " + PH + " and then " + PH + ": which is darker?"]
IMAGES = [noise_image(1, 96, 64), noise_image(2, 64, 128)]
NEW = 5


@pytest.fixture(scope="module")
def path(tiny_model_dir):
    return str(tiny_model_dir("qwen3.5-tiny"))


def _serve(path: str, monkeypatch, on: set[str]) -> list[dict]:
    """Both requests, one after the other, through one builder and one scheduler with the switches in `on`
    (the others off); per request: what the message carried, what the scheduler made of it, the output."""
    for name in (SHM, UINT8, HASH, COMPACT):
        monkeypatch.setenv(name, "1" if name in on else "0")
    # a port of its own: the segment names carry it, so no running server's segments are touched
    builder = RequestBuilder(ServerArgs(model_path=path, port=pick_unused_port(), mm_feature_transport="cpu"), path)
    rows = []
    try:
        s = InProcessScheduler(path, chunked_prefill_size=7)
        for k, text in enumerate(TEXTS):
            obj = GenerateReqInput(text=text, image_data=list(IMAGES),
                                   sampling_params={"max_new_tokens": NEW, "temperature": 0.0, "ignore_eos": True})
            rid = f"{'-'.join(sorted(on)) or 'base'}-{k}"
            tokenized, payload = builder.build(builder.check(obj, rid))
            names = builder.take_unsent_shm(rid)  # sent: the scheduler's to unlink from here on
            msg = pickle.loads(payload)  # what the scheduler's socket receives
            items = msg.mm_inputs.mm_items
            row = {"ids": msg.input_ids, "payload": len(payload), "names": names,
                   "pointers": [isinstance(it.feature, ShmPointerMMData) for it in items],
                   "pointer_bytes": sum(it.feature.nbytes for it in items if isinstance(it.feature, ShmPointerMMData)),
                   "hashed": [it.hash is not None for it in items]}
            s.sched._unwrap_shm_features([msg])  # as recv_requests does after the broadcast
            row["left_in_shm"] = [n for n in names if os.path.exists(os.path.join(SHM_DIR, n))]
            row["items"] = items
            s.sched.process_input_requests([msg])
            s.outputs[rid] = []
            s.run_until_idle()
            row.update(tokens=s.outputs[rid], cached=s.meta[rid]["cached_tokens"],
                       encoded=s.meta[rid]["vit_encoded_images"])
            rows.append(row)
        s.assert_no_leak()
    finally:
        builder.close()  # unlinks whatever this instance still owns
    return rows


@pytest.fixture(scope="module")
def baseline(path):
    with pytest.MonkeyPatch.context() as mp:
        return _serve(path, mp, CASES["baseline"])


@pytest.fixture(scope="module")
def reference(path, baseline):
    """transformers' greedy tokens for each request, on the baseline's ids and float32 pixel values."""
    transformers.logging.set_verbosity_error()
    ref = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    for row in baseline:
        kw = ref_kwargs(row["ids"], type("MM", (), {"mm_items": row["items"]}))
        with torch.no_grad():
            gen = ref.generate(**kw, attention_mask=torch.ones_like(kw["input_ids"]), max_new_tokens=NEW,
                               min_new_tokens=NEW, do_sample=False)
        out.append(gen[0, len(row["ids"]):].tolist())
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_switches_give_transformers_tokens_and_resume_after_the_images(path, baseline, reference, monkeypatch, case):
    on = CASES[case]
    rows = baseline if case == "baseline" else _serve(path, monkeypatch, on)
    patch = 16  # qwen3.5-tiny's vision patch: a full row is 3 * 2 * 16 * 16 values, a compact one half that
    for row, base in zip(rows, baseline):
        assert row["ids"] == base["ids"]
        assert all(any(a < c < b for c in range(7, b, 7)) for it in row["items"] for a, b in it.offsets), \
            "a prefill chunk must end inside each image"
        # the switches took their paths
        assert all(row["pointers"]) == (SHM in on) and any(row["pointers"]) == (SHM in on)
        if SHM in on:
            assert row["payload"] < row["pointer_bytes"] / 2, "the pixels travelled in the message"
            assert len(row["names"]) == len(row["items"]) and row["left_in_shm"] == [], "not unlinked once mapped"
        assert all(row["hashed"]) == (HASH in on) and any(row["hashed"]) == (HASH in on)
        for it in row["items"]:
            assert isinstance(it.feature, torch.Tensor)  # materialized by the scheduler
            assert (it.feature.dtype == torch.uint8 and it.pixel_norm is not None) == (UINT8 in on)
            frames = it.pixel_norm.temporal_patch_size if UINT8 in on else it.feature.shape[1] // (3 * patch**2)
            assert frames == (1 if COMPACT in on else 2)
    assert [r["tokens"] for r in rows] == reference
    first, second = rows
    assert first["cached"] == 0 and first["encoded"] == 2
    # the same images with a new question: resumed from the snapshot at the end of the second image
    last_image_end = second["items"][-1].offsets[-1][1]
    assert second["cached"] == baseline[1]["cached"] == last_image_end and second["encoded"] == 0
