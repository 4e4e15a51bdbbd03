"""Weight updates through the scheduler, the parts beyond the weights: an FP8 KV cache's scales are reloaded
from the new checkpoint with its weights, refused (old weights and scales kept) when not finite, not > 0 or
absurdly large, and restored by a rollback; a commit flushes the prefix cache whose entries hold the old
scales even with flush_cache false; and a load whose commit or rollback never came is undone before the next
load, so rolling the next one back leaves the weights from before both."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from scheduler_utils import InProcessScheduler, model_weights as _weights, same_weights as _same, update_phase as _phase
from sglang.testing.make_model import make_model

PROMPT = list(range(30, 70))
NUM_LAYERS = 3  # qwen3-vl-tiny's text layers


@pytest.fixture(scope="module")
def paths(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("kv_scales_update")
    new = Path(make_model("qwen3-vl-tiny", root / "seed1", seed=1, progress=False))
    assert not (new / "model.safetensors.index.json").exists()  # every *.safetensors file is read

    def with_scales(name: str, k: float, v: float, bad_layer: int | None = None, bad: float = 0.0) -> str:
        out = root / name
        shutil.copytree(new, out)
        tensors = {}
        for i in range(NUM_LAYERS):
            ks = bad if i == bad_layer else k
            tensors[f"model.language_model.layers.{i}.self_attn.k_scale"] = torch.tensor(ks)
            tensors[f"model.language_model.layers.{i}.self_attn.v_scale"] = torch.tensor(v)
        save_file(tensors, str(out / "kv_scales.safetensors"))
        return str(out)

    return {"old": str(tiny_model_dir("qwen3-vl-tiny")), "new": str(new),
            "scaled": with_scales("scaled", 0.5, 2.0),
            "inf": with_scales("inf", 0.5, 2.0, bad_layer=1, bad=float("inf")),
            "zero": with_scales("zero", 0.5, 2.0, bad_layer=2, bad=0.0),
            "huge": with_scales("huge", 0.5, 2.0, bad_layer=0, bad=1e5)}


def _greedy(s: InProcessScheduler) -> list[int]:
    rid = s.submit(PROMPT, max_new_tokens=8, ignore_eos=True)
    s.run_until_idle()
    return s.outputs[rid]


def _scales(s: InProcessScheduler) -> list[tuple[float, float]]:
    return list(s.sched.worker.model_runner.token_to_kv_pool.scales)


def test_fp8_kv_scales_are_reloaded_with_the_weights_and_refused_when_unusable(paths):
    s = InProcessScheduler(paths["old"], kv_cache_dtype="fp8_e4m3")
    old_w, old_scales = _weights(s), _scales(s)
    assert old_scales == [(1.0, 1.0)] * NUM_LAYERS

    for bad, words in (("inf", "non-finite"), ("zero", "layer 2 k_scale 0.0"), ("huge", "layer 0 k_scale 100000.0")):
        reply = _phase(s, "load", paths[bad])
        assert not reply.success and words in reply.message, (bad, reply.message)
        assert _same(_weights(s), old_w) and _scales(s) == old_scales

    assert _phase(s, "load", paths["scaled"]).success
    assert _scales(s) == [(0.5, 2.0)] * NUM_LAYERS and not _same(_weights(s), old_w)
    assert _phase(s, "rollback").success  # another replica failed: the old scales come back with the weights
    assert _scales(s) == old_scales and _same(_weights(s), old_w)

    _greedy(s)
    assert s.sched.tree.total_size() > 0  # KV stored under scales 1.0
    assert _phase(s, "load", paths["scaled"]).success
    assert _phase(s, "commit", flush_cache=False).success
    assert _scales(s) == [(0.5, 2.0)] * NUM_LAYERS
    assert s.sched.tree.total_size() == 0  # those entries would now be read under 0.5 / 2.0
    assert len(_greedy(s)) == 8
    s.assert_no_leak()


def test_a_load_never_committed_or_rolled_back_is_undone_before_the_next_load(paths):
    s = InProcessScheduler(paths["old"])
    old_out, old_w = _greedy(s), _weights(s)
    assert _phase(s, "load", paths["new"]).success  # its commit or rollback is lost
    # the next update loads and rolls back: every rank must be back on the weights from before both loads
    assert _phase(s, "load", paths["scaled"]).success and _phase(s, "rollback").success
    assert _same(_weights(s), old_w) and _greedy(s) == old_out
    assert _phase(s, "load", paths["new"]).success
    assert not _phase(s, "load", "/nonexistent/model").success
    assert _same(_weights(s), old_w)
    assert _phase(s, "load", paths["new"]).success and _phase(s, "commit").success
    assert _greedy(s) == _greedy(InProcessScheduler(paths["new"]))
    s.assert_no_leak()
