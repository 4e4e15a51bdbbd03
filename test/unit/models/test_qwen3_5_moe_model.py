"""Qwen3.5-MoE's pieces beyond the end-to-end parity (test_qwen3_5_moe_parity.py): the sparse block
(router, experts, gated shared expert) against transformers' from either checkpoint layout; its TP / EP
shards summing to the whole; every layer sparse; routing that really spreads tokens; loading (the MTP
head skipped with one log line, a missing expert or shared-expert tensor refused by name in both
layouts)."""

from __future__ import annotations

import logging

import pytest
import torch
from safetensors import safe_open

from sglang.srt.configs.model_config import ModelConfig, MoEConfig

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")

PRESET = "qwen3.5-moe-tiny"
H, E, K, I, S = 64, 8, 2, 48, 80  # hidden, experts, top-k, expert width, shared expert width


# ----------------------------------------------------------------------------- the sparse block


def _ref_block() -> torch.nn.Module:
    config = transformers.Qwen3_5MoeTextConfig(hidden_size=H, num_experts=E, num_experts_per_tok=K,
                                               moe_intermediate_size=I, shared_expert_intermediate_size=S,
                                               num_hidden_layers=1, layer_types=["full_attention"], vocab_size=16)
    torch.manual_seed(0)
    block = hf.Qwen3_5MoeSparseMoeBlock(config).eval()
    with torch.no_grad():  # the experts start uninitialised, the router at zero
        for p in block.parameters():
            p.normal_(0.0, 0.3)
    return block


def _load(param, tensor, shard=None) -> None:
    param.weight_loader(param, tensor, shard)


def _our_block(ref, tp=None, layout: str = "fused"):
    """Ours, filled through the parameters' weight loaders as the model loader does: the experts from
    the fused tensors ([E, 2I, H], [E, H, I]) or from one linear per expert."""
    from sglang.srt.distributed.parallel_state import SINGLE_RANK
    from sglang.srt.models.qwen3_5_moe import Qwen3_5MoeSparseBlock

    ours = Qwen3_5MoeSparseBlock(H, MoEConfig(E, K, I, shared_expert_intermediate_size=S), tp or SINGLE_RANK)
    with torch.no_grad():
        _load(ours.gate.weight, ref.gate.weight)
        _load(ours.shared_expert_gate.weight, ref.shared_expert_gate.weight)
        _load(ours.shared_expert.gate_up_proj.weight, ref.shared_expert.gate_proj.weight, 0)
        _load(ours.shared_expert.gate_up_proj.weight, ref.shared_expert.up_proj.weight, 1)
        _load(ours.shared_expert.down_proj.weight, ref.shared_expert.down_proj.weight)
        gate_up, down = ours.experts.gate_up_proj, ours.experts.down_proj
        if layout == "fused":
            _load(gate_up, ref.experts.gate_up_proj)
            _load(down, ref.experts.down_proj)
        else:
            for e in range(E):
                _load(gate_up, ref.experts.gate_up_proj[e, :I], (e, 0))
                _load(gate_up, ref.experts.gate_up_proj[e, I:], (e, 1))
                _load(down, ref.experts.down_proj[e], (e, None))
    return ours


def _x(n: int = 23) -> torch.Tensor:
    return torch.randn(n, H, generator=torch.Generator().manual_seed(1))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("layout", ["fused", "per_expert"])
def test_sparse_block_matches_transformers(layout):
    ref = _ref_block()
    x = _x()
    with torch.no_grad():
        want = ref(x[None])[0]
        got = _our_block(ref, layout=layout)(x)
    assert _rel(got, want) <= 1e-5


@pytest.mark.parametrize("layout", ["fused", "per_expert"])
@pytest.mark.parametrize("ep", [1, 2])
def test_tensor_and_expert_parallel_shards_sum_to_the_whole(monkeypatch, layout, ep):
    """Two ranks (every all-reduce replaced by the partial sums): the shared expert's gate/up columns and
    down rows, and the experts' intermediate rows (ep 1) or whole experts (ep 2), add up to one rank."""
    import sglang.srt.layers.linear as linear
    import sglang.srt.layers.moe.fused_moe as fused_moe
    from sglang.srt.distributed.parallel_state import TPInfo

    ref = _ref_block()
    x = _x()
    with torch.no_grad():
        whole = _our_block(ref)(x)
        monkeypatch.setattr(linear, "tensor_model_parallel_all_reduce", lambda y, tp: y)
        monkeypatch.setattr(fused_moe, "tensor_model_parallel_all_reduce", lambda y, tp: y)
        ranks = [_our_block(ref, TPInfo(rank=r, size=2, ep_size=ep), layout) for r in range(2)]
        parts = [block(x) for block in ranks]
    assert ranks[0].experts.num_local_experts == E // ep
    assert _rel(parts[0] + parts[1], whole) <= 1e-5
    assert _rel(parts[0], whole) > 1e-2  # one rank alone is not the whole


def test_per_expert_tensor_of_the_wrong_shape_is_refused():
    ref = _ref_block()
    ours = _our_block(ref)
    with pytest.raises(ValueError, match="expert up_proj shape"):
        _load(ours.experts.gate_up_proj, ref.experts.gate_up_proj[3, :, :I], (3, 1))
    with pytest.raises(ValueError, match="gate_up_proj shape"):  # Qwen3-VL-MoE's transposed fused layout
        _load(ours.experts.gate_up_proj, ref.experts.gate_up_proj.transpose(1, 2))


# ----------------------------------------------------------------------------- the model


def test_every_layer_is_sparse_as_in_transformers(tiny_model_dir):
    from sglang.srt.models.qwen3_5_moe import Qwen3_5MoeForConditionalGeneration, Qwen3_5MoeSparseBlock

    cfg = ModelConfig.from_pretrained(tiny_model_dir(PRESET))
    with torch.device("meta"):
        ref = transformers.Qwen3_5MoeForConditionalGeneration(transformers.Qwen3_5MoeConfig(**cfg.raw))
        ours = Qwen3_5MoeForConditionalGeneration(cfg)
    assert all(isinstance(layer.mlp, hf.Qwen3_5MoeSparseMoeBlock) for layer in ref.model.language_model.layers)
    assert [type(layer.mlp) for layer in ours.model.layers] == [Qwen3_5MoeSparseBlock] * 4
    assert [layer.is_linear for layer in ours.model.layers] == [True, True, True, False]
    want = {n.replace("model.language_model.", "model."): tuple(p.shape) for n, p in ref.named_parameters()
            if ".experts." in n or "gate.weight" in n}
    got = {n: tuple(p.shape) for n, p in ours.named_parameters() if ".experts." in n or "gate.weight" in n}
    assert got == want and len(got) == 4 * 4  # router, shared gate, the two fused expert tensors


def test_tokens_spread_over_experts(tiny_model_dir):
    """A degenerate router (every token on the same experts) would make the parity test vacuous."""
    from qwen3_5_driver import Qwen3_5Driver
    from sglang.srt.layers.moe import select_experts
    from sglang.srt.model_loader.loader import get_model

    model = get_model(str(tiny_model_dir(PRESET)), dtype="float32")
    seen: list[torch.Tensor] = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, o: seen.append(select_experts(o, K, True)[1]))
             for layer in model.model.layers]
    try:
        driver = Qwen3_5Driver(model)
        driver.add("r", torch.randint(0, 3000, (40,), generator=torch.Generator().manual_seed(1)).tolist())
        driver.prefill("r")
    finally:
        for h in hooks:
            h.remove()
    for layer_ids in seen:
        counts = torch.bincount(layer_ids.flatten().long(), minlength=E)
        assert (counts > 0).sum() >= 6, counts.tolist()


# ----------------------------------------------------------------------------- loading


def test_mtp_head_is_skipped_with_one_log_line(tiny_model_dir, caplog):
    from sglang.srt.model_loader.loader import get_model

    path = tiny_model_dir(PRESET)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        mtp = [k for k in f.keys() if k.startswith("mtp.")]
    assert len(mtp) >= 3 * E  # the released MTP layer keeps one tensor per expert
    with caplog.at_level(logging.INFO, logger="sglang.srt.models.qwen3_5"):
        model = get_model(str(path), dtype="float32")
    lines = [r for r in caplog.records if "multi-token-prediction" in r.getMessage()]
    assert len(lines) == 1 and model._skipped_mtp == len(mtp)
    assert not any(n.startswith("mtp") for n, _ in model.named_parameters())


def _per_expert(weights):
    """The checkpoint as transformers' save lays it out: each fused expert tensor cut into one linear per
    expert (gate rows, up rows of [E, 2I, H]; down [E, H, I])."""
    from sglang.srt.model_loader.weight_utils import materialize

    for name, w in weights:
        stem = name.removesuffix("gate_up_proj").removesuffix("down_proj")
        if not name.startswith("model.") or not stem.endswith(".mlp.experts."):
            yield name, w
            continue
        w = materialize(w)
        for e in range(w.shape[0]):
            if name.endswith("gate_up_proj"):
                yield f"{stem}{e}.gate_proj.weight", w[e, :I]
                yield f"{stem}{e}.up_proj.weight", w[e, I:]
            else:
                yield f"{stem}{e}.down_proj.weight", w[e]


@pytest.mark.parametrize("layout,gone,named", [
    ("fused", "model.language_model.layers.2.mlp.experts.down_proj", r"layers\.2\.mlp\.experts\.down_proj"),
    ("fused", "model.language_model.layers.1.mlp.gate.weight", r"layers\.1\.mlp\.gate\.weight"),
    ("fused", "model.language_model.layers.3.mlp.shared_expert_gate.weight", r"layers\.3\.mlp\.shared_expert_gate"),
    ("fused", "model.language_model.layers.0.mlp.shared_expert.up_proj.weight",
     r"layers\.0\.mlp\.shared_expert\.gate_up_proj\.weight shard 1 \(model\.layers\.0\.mlp\.shared_expert\.up_proj"),
    ("per_expert", "model.language_model.layers.1.mlp.experts.5.up_proj.weight",
     r"layers\.1\.mlp\.experts\.gate_up_proj shard \(5, 1\) \(model\.layers\.1\.mlp\.experts\.5\.up_proj\.weight\)"),
    ("per_expert", "model.language_model.layers.3.mlp.experts.7.down_proj.weight",
     r"experts\.down_proj shard \(7, None\) \(model\.layers\.3\.mlp\.experts\.7\.down_proj\.weight\)"),
])
def test_missing_expert_tensor_is_refused_by_name(tiny_model_dir, layout, gone, named):
    from sglang.srt.model_loader.loader import MissingWeightsError, load_weights
    from sglang.srt.model_loader.weight_utils import iterate_weights
    from sglang.srt.models.qwen3_5_moe import Qwen3_5MoeForConditionalGeneration

    path = tiny_model_dir(PRESET)
    model = Qwen3_5MoeForConditionalGeneration(ModelConfig.from_pretrained(path))
    weights = iterate_weights(str(path))
    weights = list(_per_expert(weights) if layout == "per_expert" else weights)
    assert gone in {n for n, _ in weights}
    with pytest.raises(MissingWeightsError, match=named):
        load_weights(model, ((n, w) for n, w in weights if n != gone))


def test_per_expert_checkpoint_loads_the_same_parameters(tiny_model_dir):
    from sglang.srt.model_loader.loader import load_weights
    from sglang.srt.model_loader.weight_utils import iterate_weights
    from sglang.srt.models.qwen3_5_moe import Qwen3_5MoeForConditionalGeneration

    path = tiny_model_dir(PRESET)
    cfg = ModelConfig.from_pretrained(path)
    fused, split = Qwen3_5MoeForConditionalGeneration(cfg), Qwen3_5MoeForConditionalGeneration(cfg)
    load_weights(fused, iterate_weights(str(path)))
    load_weights(split, _per_expert(iterate_weights(str(path))))
    a, b = dict(fused.named_parameters()), dict(split.named_parameters())
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
