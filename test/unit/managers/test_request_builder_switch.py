"""SGLANG_MM_SHM_TRANSPORT in the request builder: with the switch on (the default, under
`--mm-feature-transport cpu`) the pixels of a built request are in a /dev/shm segment and the message that
crosses to the scheduler carries a pointer only; switch off (the baseline) the pixels are pickled into
the message. Outputs are the same either way, so the bytes are what tells the paths apart."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.request_builder import RequestBuilder
from sglang.srt.multimodal.transport.shm import SHM_DIR, ShmPointerMMData
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.network import pick_unused_port

PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def model_path(tiny_model_dir):
    return str(tiny_model_dir("qwen3-vl-tiny"))


def _build(model_path, monkeypatch, shm: str | None):
    if shm is None:
        monkeypatch.delenv("SGLANG_MM_SHM_TRANSPORT", raising=False)  # the default: on
    else:
        monkeypatch.setenv("SGLANG_MM_SHM_TRANSPORT", shm)
    monkeypatch.delenv("SGLANG_MM_UINT8_PIXELS", raising=False)
    # a port of its own: the segment names carry it, so no running server's segments are touched
    builder = RequestBuilder(ServerArgs(model_path=model_path, port=pick_unused_port(), mm_feature_transport="cpu"),
                             model_path)
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (256, 256, 3), dtype=np.uint8))
    obj = GenerateReqInput(text="look " + PLACEHOLDER, image_data=[img], sampling_params={"max_new_tokens": 2})
    try:
        tokenized, payload = builder.build(builder.check(obj, "rid-shm"))
        names = builder.take_unsent_shm("rid-shm")
        existed = [os.path.exists(os.path.join(SHM_DIR, n)) for n in names]
    finally:
        builder.close()  # unlinks this instance's segments
    return tokenized.mm_inputs.mm_items[0].feature, len(payload), names, existed


def test_shm_transport_moves_the_pixels_out_of_the_message(model_path, monkeypatch):
    feature, payload, names, existed = _build(model_path, monkeypatch, None)
    assert isinstance(feature, ShmPointerMMData), type(feature)
    assert names == [feature.name] and existed == [True]
    assert feature.nbytes > 500_000
    assert payload < feature.nbytes / 20, (payload, feature.nbytes)  # the pixels did not travel in the message

    base, base_payload, base_names, _ = _build(model_path, monkeypatch, "0")
    assert not isinstance(base, ShmPointerMMData) and base_names == []
    assert base_payload > base.numel() * base.element_size() >= feature.nbytes  # baseline: pickled inline
