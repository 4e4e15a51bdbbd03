"""Encoder disaggregation (EPD) start-up: the flag combinations refused with one clear line, and the two
halves of a model (`ViTStrategy.towers`): the language half loads no vision weight, the encoder half only
vision weights, and its embeddings are the full model's."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.configs.vit_strategy import ViTStrategy
from sglang.srt.server_args import ServerArgs


@pytest.mark.parametrize("argv, message", [
    (["--encoder-only", "--language-only", "--encoder-urls", "http://e:1"], "either the vision encoder or the language"),
    (["--language-only"], "--language-only needs --encoder-urls"),
    (["--encoder-urls", "http://e:1"], "--encoder-urls is for --language-only"),
    (["--language-only", "--encoder-urls", "e:1"], "each must be an http(s)://host:port URL"),
    (["--language-only", "--encoder-urls", "http://e:1", "--encoder-transfer-backend", "mooncake"],
     "mooncake: the Mooncake transfer engine is not built"),
    (["--encoder-only", "--encoder-transfer-backend", "mooncake"], "mooncake"),
    (["--encoder-only", "--tp-size", "2"], "--encoder-only runs one vision tower per process"),
    (["--encoder-only", "--dp-size", "2"], "--encoder-only runs one vision tower per process"),
    (["--language-only", "--encoder-urls", "http://e:1", "--mm-enable-dp-encoder"], "belong on the encoders"),
])
def test_bad_combinations_stop_start_up_naming_the_flags(argv, message, capsys):
    with pytest.raises(SystemExit):
        ServerArgs.from_argv(argv)
    assert message in capsys.readouterr().err


def test_good_combinations_parse():
    a = ServerArgs.from_argv(["--language-only", "--encoder-urls", "http://a:1", "http://b:2/",
                              "--encoder-transfer-backend", "zmq_to_tokenizer"])
    assert a.encoder_urls == ("http://a:1", "http://b:2/") and a.encoder_transfer_backend == "zmq_to_tokenizer"
    assert ServerArgs.from_argv(["--language-only", "--encoder-urls", "http://a:1,http://b:2"]).encoder_urls == (
        "http://a:1", "http://b:2")
    plain = ServerArgs()
    assert (plain.encoder_only, plain.language_only, plain.encoder_urls) == (False, False, ())
    assert plain.encoder_transfer_backend == "zmq_to_scheduler"
    assert ServerArgs.from_argv(["--encoder-only"]).encoder_only
    # an encoder's /encode bodies carry pixels: a larger default body limit there, the flag still wins
    assert ServerArgs.from_argv(["--encoder-only"]).max_payload_size == 1 << 30
    assert ServerArgs.from_argv(["--encoder-only", "--max-payload-size", "1Mi"]).max_payload_size == 1 << 20
    assert plain.max_payload_size == 64 << 20


def test_engine_refuses_encoder_only():
    from sglang.srt.entrypoints.engine import launch_subprocesses

    with pytest.raises(ValueError, match="launch_server --encoder-only"):
        launch_subprocesses(ServerArgs(encoder_only=True))


def test_towers_value_is_checked():
    with pytest.raises(ValueError, match="towers"):
        ViTStrategy(towers="decoder")


@pytest.mark.parametrize("preset", ["qwen3-vl-tiny", "qwen2.5-vl-tiny"])
def test_each_half_loads_only_its_weights_and_encodes_as_the_whole(tiny_model_dir, preset):
    from sglang.srt.model_loader.loader import get_model
    from sglang.srt.multimodal.processors.base import get_processor_class
    import numpy as np
    from PIL import Image

    path = str(tiny_model_dir(preset))
    whole = get_model(path, "float32", "cpu", vit=ViTStrategy(towers="all"))
    text = get_model(path, "float32", "cpu", vit=ViTStrategy(towers="text"))
    vision = get_model(path, "float32", "cpu", vit=ViTStrategy(towers="vision"))
    names = {n for n, _ in whole.named_parameters()}
    text_names = {n for n, _ in text.named_parameters()}
    vision_names = {n for n, _ in vision.named_parameters()}
    assert text.visual is None and not any(n.startswith("visual.") for n in text_names)
    assert vision_names and all(n.startswith("visual.") for n in vision_names)
    assert text_names | vision_names == names and not text_names & vision_names
    assert sum(p.numel() for p in vision.parameters()) < sum(p.numel() for p in whole.parameters())

    from transformers import AutoTokenizer

    proc = get_processor_class(whole.config.raw.get("architectures"), whole.config.raw.get("model_type"))
    processor = proc.from_pretrained(path, AutoTokenizer.from_pretrained(path))
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in ((64, 96), (128, 64))]
    pad = processor.image_token_id if hasattr(processor, "image_token_id") else 151655
    _, mm = processor.process([151652, pad, 151653, 151652, pad, 151653], images)
    with torch.no_grad():
        ref = whole.get_image_feature(mm.mm_items)
        got = vision.get_image_feature(mm.mm_items)
    for a, b in zip(ref, got):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="without its vision tower"):
        text.get_image_feature(mm.mm_items)
