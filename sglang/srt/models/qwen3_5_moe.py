"""Qwen3.5-MoE (Qwen3.5-35B-A3B, -122B-A10B, -397B-A17B; Qwen3.6-35B-A3B): Qwen3.5's hybrid decoder
(models/qwen3_5.py: Gated DeltaNet and gated full attention, zero-centred norms, per-request recurrent
states from `forward_batch.gdn_states`, the `mtp.*` head skipped with one log line) whose every MLP is
sparse. Each layer's MLP, as transformers 5.24 computes it:

    weights, experts = top-k of softmax(gate(x)), renormalized to sum to 1 (always: no norm_topk_prob)
    y = sum_k weights_k * expert_k(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x)

where every expert and the shared expert are SiLU-gated MLPs and shared_expert_gate is one logit per token.

Checkpoint layouts (both load to the same parameters; model_loader refuses, by name, any expert tensor or
shard a checkpoint leaves out):
* the releases: fused `mlp.experts.gate_up_proj` [E, 2I, H] (gate rows, then up) and `mlp.experts.down_proj`
  [E, H, I], which is also transformers' parameter layout (unlike Qwen3-VL-MoE's transposed one);
* one linear per expert, `mlp.experts.{e}.{gate,up,down}_proj.weight`: what transformers 5.24's
  save_pretrained writes for a model it built itself (its qwen2_moe conversion mapping reversed; a model
  it loaded is saved as it was read), and how the quantized derivatives store experts.

FP8 (layers/quantization): a -FP8 checkpoint stores each expert's linears apart in e4m3 with block scales
(`mlp.experts.{e}.{gate,up,down}_proj.weight` + `weight_scale_inv`), loaded by Fp8FusedMoE; the shared
expert's gate/up/down are FP8 linears like the dense MLP's. `--quantization fp8` quantizes the float experts
after loading (Fp8MoEMethod) and the shared expert's linears as any dense linear. The router `mlp.gate` and
`mlp.shared_expert_gate` are never quantized (E and 1 rows; the releases list them in modules_to_not_convert).

TP: attention and DeltaNet as the dense model. The router and the shared expert's gate are replicated
(E and 1 rows); the shared expert is a dense MLP over all TP ranks (column-parallel gate/up, row-parallel
down, all-reduced); the routed experts take FusedMoE's placement (expert groups with --ep-size, the
intermediate dim split inside a group), all-reduced. Each all-reduce sums partial outputs, so the per-token
sigmoid scale applies to the summed shared output, as on one rank.
"""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig, MoEConfig, TextConfig
from sglang.srt.configs.vit_strategy import ViTStrategy
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.layers.checkpoint_tensor import materialize, tensor_name
from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.layers.moe import FusedMoE, build_experts, expert_params_mapping, select_experts
from sglang.srt.models.qwen2 import Qwen2MLP
from sglang.srt.models.qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5ForConditionalGeneration, Qwen3_5TextModel

_PARTS = ("gate", "up")


class Qwen3_5MoeExperts(FusedMoE):
    """FusedMoE's parameters and placement ([E_local, 2n, H] gate rows then up rows, [E_local, H, n]) with
    Qwen3.5-MoE's checkpoint layouts. A fused tensor is only ever [E, 2I, H] / [E, H, I], so no shape is
    ambiguous (FusedMoE's Qwen3-VL reading would transpose a square one). A per-expert tensor arrives with
    shard id (expert, 0 gate | 1 up | None down) from `expert_params_mapping`.

    Completeness: each parameter requires every (expert, part) of this rank's experts (global ids; other
    ranks' experts are theirs). A fused tensor fills all of them; a per-expert tensor its own."""

    def create_weights(self, dtype) -> None:
        super().create_weights(dtype)
        mine = range(self.first_expert, self.first_expert + self.num_local_experts)
        self.gate_up_proj.required_shards = tuple((x, part) for x in mine for part in (0, 1))
        self.down_proj.required_shards = tuple((x, None) for x in mine)

    @staticmethod
    def _require(loaded, want: tuple[int, ...], what: str) -> None:
        if tuple(loaded.shape) != want:
            raise ValueError(f"{tensor_name(loaded, what)}: Qwen3.5-MoE {what} shape {tuple(loaded.shape)} != {want}")

    def _dims(self) -> tuple[int, int, int, int, int]:
        """(experts, hidden, intermediate, this rank's intermediate rows, its index in the expert group)."""
        return self.num_experts, self.hidden_size, self.intermediate_size, self.local_inter, self.tp.moe_tp_rank

    def _own(self, expert: int) -> int | None:
        """This rank's index of global expert `expert`, None when another expert group holds it."""
        local = expert - self.first_expert
        return local if 0 <= local < self.num_local_experts else None

    def _load_gate_up(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        e, h, i, n, r = self._dims()
        if shard_id is None:
            self._require(loaded, (e, 2 * i, h), "experts.gate_up_proj")
            loaded = self._local(loaded)
            for part in range(2):  # this rank's n rows of gate, then of up
                src = materialize(loaded.narrow(1, part * i + r * n, n))
                param.data[:, part * n : (part + 1) * n].copy_(src.to(param.dtype))
            return
        expert, part = shard_id
        self._require(loaded, (i, h), f"expert {_PARTS[part]}_proj")
        local = self._own(expert)
        if local is not None:
            param.data[local, part * n : (part + 1) * n].copy_(materialize(loaded.narrow(0, r * n, n)).to(param.dtype))

    def _load_down(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        e, h, i, n, r = self._dims()
        if shard_id is None:
            self._require(loaded, (e, h, i), "experts.down_proj")
            param.data.copy_(materialize(self._local(loaded).narrow(2, r * n, n)).to(param.dtype))
            return
        expert, _ = shard_id
        self._require(loaded, (h, i), "expert down_proj")
        local = self._own(expert)
        if local is not None:
            param.data[local].copy_(materialize(loaded.narrow(1, r * n, n)).to(param.dtype))


class Qwen3_5MoeSparseBlock(nn.Module):
    """Checkpoint names: `mlp.gate` (router [E, H]), `mlp.experts.*`, `mlp.shared_expert.{gate,up,down}_proj`,
    `mlp.shared_expert_gate` ([1, H]). `quant`: the model's Fp8Config or None; `prefix`: this block's
    module name (`model.layers.N.mlp`), which modules_to_not_convert is matched against."""

    def __init__(self, hidden_size: int, moe: MoEConfig, tp: TPInfo = SINGLE_RANK, dtype=None, quant=None,
                 prefix: str = "mlp"):
        super().__init__()
        self.top_k = moe.num_experts_per_tok
        self.gate = ReplicatedLinear(hidden_size, moe.num_experts, bias=False, dtype=dtype)
        self.experts = build_experts(Qwen3_5MoeExperts, moe.num_experts, hidden_size, moe.moe_intermediate_size, tp, dtype, quant,
                                     f"{prefix}.experts")
        self.shared_expert = Qwen2MLP(hidden_size, moe.shared_expert_intermediate_size, bias=False, tp=tp, dtype=dtype,
                                      quant=quant, prefix=f"{prefix}.shared_expert")
        self.shared_expert_gate = ReplicatedLinear(hidden_size, 1, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = select_experts(self.gate(x), self.top_k, renormalize=True)
        # transformers casts the routing weights to the activations' dtype before scaling
        routed = self.experts(x, weights.to(x.dtype), ids)
        return routed + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


class Qwen3_5MoeDecoderLayer(Qwen3_5DecoderLayer):
    def make_mlp(self, config: TextConfig, layer_id: int, tp: TPInfo, dtype) -> nn.Module:
        return Qwen3_5MoeSparseBlock(config.hidden_size, config.moe, tp, dtype, self.quant, f"{self.prefix}.mlp")


class Qwen3_5MoeTextModel(Qwen3_5TextModel):
    layer_cls = Qwen3_5MoeDecoderLayer


class Qwen3_5MoeForConditionalGeneration(Qwen3_5ForConditionalGeneration):
    text_model_cls = Qwen3_5MoeTextModel

    def __init__(self, config: ModelConfig, tp: TPInfo = SINGLE_RANK, dtype: torch.dtype | None = None,
                 vit: ViTStrategy = ViTStrategy(), quant=None):
        moe = config.text.moe
        if moe is None or moe.shared_expert_intermediate_size < 1:
            raise ValueError("Qwen3_5MoeForConditionalGeneration: text_config has no experts or no shared expert")
        super().__init__(config, tp, dtype, vit, quant)
        # per-expert names (transformers' save; the -FP8 checkpoints' experts and their weight_scale_inv) are
        # mapped first: the dense gate/up rule would match them too
        self.stacked_params_mapping = expert_params_mapping(moe.num_experts) + self.stacked_params_mapping


EntryClass = Qwen3_5MoeForConditionalGeneration
