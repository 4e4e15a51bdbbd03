"""`sglang.Engine` with upstream's RL-facing calls, on seed-1 weights: generate with a custom logit processor
(one prompt, and a batch mixing it with a plain prompt), and update_weights_from_disk to seed 0 and back
(a bad path leaves the weights; the round trip gives the first output again)."""

from __future__ import annotations

import pytest

import sglang
from conftest import TEST_DEVICE
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor
from sglang.testing.make_model import make_model

_FORCE = """
class ForceToken(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        for i, params in enumerate(custom_param_list):
            logits[i, :] = -float("inf")
            logits[i, params["token_id"]] = 0.0
        return logits
"""
PARAMS = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def seed1(tmp_path_factory):
    return make_model("qwen3-vl-tiny", tmp_path_factory.mktemp("seed1") / "model", seed=1, progress=False)


@pytest.fixture(scope="module")
def engine(seed1):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        e = sglang.Engine(model_path=str(seed1), dtype="float32", device=TEST_DEVICE, log_level="warning",
                          max_total_tokens=1024, enable_custom_logit_processor=True)
    yield e
    e.shutdown()


def test_custom_logit_processor(engine):
    ns = {"__name__": "__main__", "CustomLogitProcessor": CustomLogitProcessor}
    exec(_FORCE, ns)  # a client script's class
    proc = ns["ForceToken"]().to_str()
    forced = {**PARAMS, "custom_params": {"token_id": 77}}
    assert engine.generate("Hello", sampling_params=forced, custom_logit_processor=proc)["output_ids"] == [77] * 6
    plain = engine.generate("Hello", sampling_params=PARAMS)["output_ids"]
    batch = engine.generate(["Hello", "Hello"], sampling_params=[forced, PARAMS], custom_logit_processor=[proc, None])
    assert [b["output_ids"] for b in batch] == [[77] * 6, plain]


def test_update_weights_round_trip(engine, model_dir, seed1):
    first = engine.generate("Hello", sampling_params=PARAMS)["output_ids"]
    ok, message, paused = engine.update_weights_from_disk(str(model_dir) + "-missing")
    assert not ok and "Failed to update weights" in message and paused == 0
    assert engine.generate("Hello", sampling_params=PARAMS)["output_ids"] == first
    ok, _, _ = engine.update_weights_from_disk(str(model_dir), weight_version="seed0")
    out = engine.generate("Hello", sampling_params=PARAMS)
    assert ok and out["output_ids"] != first and out["meta_info"]["weight_version"] == "seed0"
    assert engine.update_weights_from_disk(str(seed1))[0]
    assert engine.generate("Hello", sampling_params=PARAMS)["output_ids"] == first
