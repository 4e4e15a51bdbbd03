"""Our Qwen3.5-MoE against transformers 5.24's on the same random weights (float32, `qwen3.5-moe-tiny`),
through the standalone Qwen3.5 driver (qwen3_5_driver.py): prompt logits within 1e-4 relative error,
greedy tokens and every decode step's logits equal to transformers', for text and for an image; a prefill
cut into chunks equal to one shot; the shared expert's sigmoid gate computed per token as transformers
does, and far from negligible; transformers' own saves (fused, or one tensor per expert) loading to the
same logits as the released fused layout."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from qwen3_5_driver import Qwen3_5Driver, prompt as _prompt, ref_kwargs as _ref_kwargs, tiny_processor
from sglang.srt.model_loader.loader import get_model

transformers = pytest.importorskip("transformers")

PRESET = "qwen3.5-moe-tiny"
TOL = 1e-4
ROUTING_MARGIN = 1e-4  # see _ref_logits


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    path = str(tiny_model_dir(PRESET))
    transformers.logging.set_verbosity_error()
    ref = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    assert type(ref).__name__ == "Qwen3_5MoeForConditionalGeneration"
    ours = get_model(path, dtype="float32")
    return ref, ours, tiny_processor()


def _ref_logits(ref, ids, mm) -> torch.Tensor:
    """transformers' logits, checked to come from a prompt without a near-tie in any routing choice: where
    a token's k-th and (k+1)-th router logits lie within float noise of each other (the two models' router
    inputs differ by ~1e-5), either model may pick either expert, and the logits part for no fault of
    either. Such a prompt is a bad witness, not a failure; its seed is to be changed."""
    logits = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, o: logits.append(o[0]))
             for layer in ref.model.language_model.layers]
    try:
        with torch.no_grad():
            out = ref(**_ref_kwargs(ids, mm)).logits[0]
    finally:
        for h in hooks:
            h.remove()
    top = torch.cat(logits).topk(ref.config.text_config.num_experts_per_tok + 1, dim=-1).values
    assert (top[:, -2] - top[:, -1]).min() > ROUTING_MARGIN, "a near-tie in routing: pick another prompt"
    return out


def _our_logits(model, ids, mm, chunks=None) -> torch.Tensor:
    driver = Qwen3_5Driver(model)
    driver.add("r", ids, mm)
    return driver.prefill("r", chunks)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("kind", ["text", "image"])
def test_prompt_logits_match_transformers(setup, kind):
    ref, ours, proc = setup
    ids, mm = _prompt(kind, proc)
    got, want = _our_logits(ours, ids, mm), _ref_logits(ref, ids, mm)
    assert got.shape == want.shape
    assert _rel(got, want) <= TOL


@pytest.mark.parametrize("kind", ["text", "image"])
def test_decode_steps_match_transformers(setup, kind):
    """Greedy tokens equal transformers' generate; each step's logits equal transformers' one-shot
    forward over the prompt and the tokens so far (the carried states and routing right at every step)."""
    ref, ours, proc = setup
    ids, mm = _prompt(kind, proc, seed=4)
    driver = Qwen3_5Driver(ours)
    driver.add("r", ids, mm)
    tokens, step_logits = driver.greedy("r", 6)
    kw = _ref_kwargs(ids, mm)
    with torch.no_grad():
        out = ref.generate(**kw, attention_mask=torch.ones_like(kw["input_ids"]), max_new_tokens=6, min_new_tokens=6,
                           do_sample=False)
    assert tokens == out[0, len(ids):].tolist()
    want = _ref_logits(ref, out[0, :-1].tolist(), mm)[len(ids) - 1:]
    for step, (got, row) in enumerate(zip(step_logits, want)):
        assert _rel(got, row) <= TOL, step


@pytest.mark.parametrize("kind,chunks", [("text", 37), ("text", [1, 1, 2, 1, 50]), ("image", 7)])
def test_chunked_prefill_equals_one_shot(setup, kind, chunks):
    """37: the DeltaNet's 64-token chunks fall elsewhere; one-token chunks take the recurrent path (and
    route one token at a time) mid-prompt; 7 cuts the image."""
    ref, ours, proc = setup
    ids, mm = _prompt(kind, proc, seed=5)
    whole, cut = _our_logits(ours, ids, mm), _our_logits(ours, ids, mm, chunks)
    assert _rel(cut, whole) <= TOL
    assert _rel(cut, _ref_logits(ref, ids, mm)) <= TOL


def _shared_gates(ref, ours) -> list[torch.nn.Parameter]:
    return ([layer.mlp.shared_expert_gate.weight for layer in ref.model.language_model.layers]
            + [layer.mlp.shared_expert_gate.weight for layer in ours.model.layers])


def test_shared_expert_gate_is_per_token_as_in_transformers(setup):
    """Negating every shared_expert_gate (in both models) turns each token's scale s into 1 - s: the
    logits move far, and ours still match transformers'; so the gate is computed from each token's own
    hidden state and applied to the shared expert alone."""
    ref, ours, proc = setup
    ids, mm = _prompt("text", proc, seed=12)
    before = _our_logits(ours, ids, mm)
    gates = _shared_gates(ref, ours)
    with torch.no_grad():
        for w in gates:
            w.neg_()
    try:
        flipped = _our_logits(ours, ids, mm)
        assert _rel(flipped, _ref_logits(ref, ids, mm)) <= TOL
    finally:
        with torch.no_grad():
            for w in gates:
                w.neg_()  # exact: negation loses nothing
    assert _rel(flipped, before) > 100 * TOL


def test_a_block_that_dropped_the_shared_gate_would_fail_parity(setup, monkeypatch):
    """The gate is no rounding-level detail: the shared expert added unscaled (the gate dropped), or not
    at all, puts the logits far outside the parity tolerance."""
    from sglang.srt.layers.moe import select_experts
    from sglang.srt.models.qwen3_5_moe import Qwen3_5MoeSparseBlock

    ref, ours, proc = setup
    ids, mm = _prompt("text", proc, seed=13)
    want = _ref_logits(ref, ids, mm)
    assert _rel(_our_logits(ours, ids, mm), want) <= TOL

    def routed(block, x):
        weights, experts = select_experts(block.gate(x), block.top_k, True)
        return block.experts(x, weights.to(x.dtype), experts)

    monkeypatch.setattr(Qwen3_5MoeSparseBlock, "forward", lambda self, x: routed(self, x) + self.shared_expert(x))
    assert _rel(_our_logits(ours, ids, mm), want) > 100 * TOL
    monkeypatch.setattr(Qwen3_5MoeSparseBlock, "forward", routed)
    assert _rel(_our_logits(ours, ids, mm), want) > 100 * TOL


@pytest.mark.parametrize("built", ["loaded", "fresh"])
def test_transformers_save_layout_loads_to_the_same_logits(setup, tmp_path, built):
    """transformers 5.24 saves what it loaded as it was (our fused release stays fused), and a model it
    built itself with one tensor per expert (its qwen2_moe conversion mapping reversed): both load to the
    released checkpoint's parameters, so the logits are bit-identical."""
    ref, ours, proc = setup
    model = ref
    if built == "fresh":
        model = transformers.Qwen3_5MoeForConditionalGeneration(ref.config)
        model.load_state_dict(ref.state_dict())
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    experts = "model.language_model.layers.0.mlp.experts"
    per_expert = f"{experts}.7.up_proj.weight" in saved
    assert per_expert == (built == "fresh") and (f"{experts}.gate_up_proj" in saved) == (not per_expert)
    ids, mm = _prompt("text", proc, seed=9)
    assert torch.equal(_our_logits(get_model(str(tmp_path), dtype="float32"), ids, mm), _our_logits(ours, ids, mm))
