"""Qwen3.5 (and 3.6): Qwen3-VL's vision tower without deepstack, on a hybrid text decoder.

Decoder layers follow `text_config.layer_types`: `linear_attention` layers mix tokens with a Gated
DeltaNet (layers/attention/fla), `full_attention` layers with softmax attention whose q_proj also
emits a per-head output gate (`o_proj(attn * sigmoid(gate))`), q/k RMSNorm, and interleaved M-RoPE on
only the first `rotary_dim` (head_dim * partial_rotary_factor) dims of each head. Every RMSNorm of the
decoder (input, post-attention, final, q/k) is zero-centred: it scales by `1 + weight`; only the
DeltaNet's gated output norm scales by `weight`.

State per request. Full-attention layers use the batch's attention backend (`forward_batch.attn_backend`,
a KV cache). Linear-attention layers need each request's recurrent state: the forward reads
`forward_batch.gdn_states`, one `GDNRequestState` per request in batch order (allocated from
`model.gdn_state_shape()`, zero for a new request), and updates them in place. The model runner provides
them from its state pool (mem_cache/state_pool.py), one row per request-table row; a test driver does
the same standalone (test/unit/models/qwen3_5_driver.py). Two paths (SGLANG_GDN_BACKEND, read once when
the model is built): the per-request torch path over those states, or sgl_kernel's Triton kernels, one
batched call per op, addressing the states in the pool by the batch's request-table rows
(`kernel_batch`, layers/attention/fla/pooled.py; snapshot captures from `forward_batch.gdn_captures`).
Only the kernel path can be captured in a decode CUDA graph (`gdn_uses_kernels`): a decode step's plan
reads nothing but device tensors (the slots, graph-stable under a graph: `PoolStates.slots`).
The KV pool holds only the full-attention layers: each takes its rank among them as its KV layer id.

Checkpoints carry a multi-token-prediction head (`mtp.*`); it is skipped at load (speculative decoding
is not supported), with one log line.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig, TextConfig
from sglang.srt.configs.qwen3_5_config import LINEAR_ATTENTION
from sglang.srt.configs.vit_strategy import ViTStrategy
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.environ import envs
from sglang.srt.layers.attention.fla.gated_delta_net import GatedDeltaNet
from sglang.srt.layers.attention.fla.pooled import check_backend, plan_kernel_batch, uses_kernels
from sglang.srt.mem_cache.gdn_state import GDNRequestState, GDNStateShape
from sglang.srt.layers.layernorm import ZeroCentredRMSNorm
from sglang.srt.layers.quantization import linear_method
from sglang.srt.layers.linear import QKVParallelLinear, RowParallelLinear
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import MRotaryEmbedding, apply_rotary
from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding
from sglang.srt.models.qwen2 import Qwen2MLP
from sglang.srt.models.qwen3_vl import Qwen3VisionTransformer
from sglang.srt.models.vlm_base import QwenVLForConditionalGenerationBase

logger = logging.getLogger(__name__)

MTP_PREFIX = "mtp."


class Qwen3_5Attention(nn.Module):
    """Gated full attention. q_proj's rows are [query | gate] per head, so the fused projection is
    built with 2 * heads "heads" of head_dim: a rank's share is whole (query, gate) pairs."""

    def __init__(self, config: TextConfig, layer_id: int, tp: TPInfo = SINGLE_RANK, dtype=None, quant=None,
                 prefix: str = "self_attn"):
        super().__init__()
        heads, hd = config.num_attention_heads, config.head_dim
        if heads % tp.size:
            raise ValueError(f"{heads} attention heads do not split over TP {tp.size}")
        self.head_dim = hd
        self.rotary_dim = config.hybrid.rotary_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, hd, 2 * heads, config.num_key_value_heads, bias=config.attention_bias, tp=tp,
            dtype=dtype, quant=linear_method(quant, f"{prefix}.qkv_proj", ("q_proj", "k_proj", "v_proj")))
        self.o_proj = RowParallelLinear(heads * hd, config.hidden_size, bias=config.attention_bias, tp=tp, dtype=dtype,
                                        quant=linear_method(quant, f"{prefix}.o_proj"))
        self.num_heads = heads // tp.size
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_norm = ZeroCentredRMSNorm(hd, config.rms_norm_eps, dtype)
        self.k_norm = ZeroCentredRMSNorm(hd, config.rms_norm_eps, dtype)
        # the KV pool holds only the full-attention layers: this layer's KV id is its rank among them
        kv_layer_id = config.hybrid.full_attention_layers.index(layer_id)
        self.attn = RadixAttention(self.num_heads, hd, hd**-0.5, self.num_kv_heads, kv_layer_id)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary on the leading rotary_dim dims of each head; the rest pass through."""
        r = self.rotary_dim
        return torch.cat([apply_rotary(x[..., :r], cos, sin), x[..., r:]], dim=-1)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], hidden_states: torch.Tensor, forward_batch):
        t = hidden_states.shape[0]
        q_gate, k, v = self.qkv_proj.split_qkv(self.qkv_proj(hidden_states))
        q, gate = q_gate.view(t, self.num_heads, 2, self.head_dim).unbind(2)
        q = self._rotate(self.q_norm(q), *rope)
        k = self._rotate(self.k_norm(k.view(t, self.num_kv_heads, self.head_dim)), *rope)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        out = self.attn(q, k, v, forward_batch)  # (t, heads * head_dim)
        return self.o_proj(out * torch.sigmoid(gate.reshape(t, -1)))


class Qwen3_5DecoderLayer(nn.Module):
    def __init__(self, config: TextConfig, layer_id: int, tp: TPInfo = SINGLE_RANK, dtype=None, quant=None):
        super().__init__()
        prefix = f"model.layers.{layer_id}"
        self.is_linear = config.hybrid.layer_types[layer_id] == LINEAR_ATTENTION
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(config.hidden_size, config.hybrid, config.rms_norm_eps, tp, dtype,
                                             quant=quant, prefix=f"{prefix}.linear_attn")
        else:
            self.self_attn = Qwen3_5Attention(config, layer_id, tp, dtype, quant, f"{prefix}.self_attn")
        self.quant, self.prefix = quant, prefix
        self.mlp = self.make_mlp(config, layer_id, tp, dtype)
        self.input_layernorm = ZeroCentredRMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.post_attention_layernorm = ZeroCentredRMSNorm(config.hidden_size, config.rms_norm_eps, dtype)

    def make_mlp(self, config: TextConfig, layer_id: int, tp: TPInfo, dtype) -> nn.Module:
        """The dense MLP; Qwen3.5-MoE's layer (models/qwen3_5_moe.py) builds its sparse block here."""
        return Qwen2MLP(config.hidden_size, config.intermediate_size, bias=False, tp=tp, dtype=dtype,
                        quant=self.quant, prefix=f"{self.prefix}.mlp")

    def forward(self, rope, hidden_states, residual, forward_batch, gdn=None):
        """gdn: (seq_lens, per-request layer states, per-request snapshot captures or None) for a
        linear-attention layer, else None."""
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        if self.is_linear:
            hidden_states = self.linear_attn(hidden_states, *gdn)
        else:
            hidden_states = self.self_attn(rope, hidden_states, forward_batch)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


def request_states(forward_batch) -> list[GDNRequestState]:
    """The batch's per-request DeltaNet states (see the module docstring), checked against its size; as
    given (a pool's `PoolStates` keeps its pool and rows, which the kernel path needs)."""
    states = getattr(forward_batch, "gdn_states", None)
    if states is None:
        raise RuntimeError("Qwen3.5's linear-attention layers need forward_batch.gdn_states (one GDNRequestState "
                           "per request); this runner does not provide recurrent states")
    if len(states) != forward_batch.batch_size:
        raise ValueError(f"{len(states)} recurrent states for a batch of {forward_batch.batch_size}")
    return states


def kernel_batch(backend: str, states, seq_lens: list[int], forward_batch, device: torch.device):
    """The plan of the Gated DeltaNet kernel path for this forward (layers/attention/fla/pooled.py), or None
    for the per-request torch path: `backend` (SGLANG_GDN_BACKEND) picks; the kernels address states in
    their pool, so only states from `GDNStatePool.states_for` can take them (auto falls back to torch for
    others, e.g. a test driver's standalone states; triton refuses)."""
    if not uses_kernels(backend, device):
        return None
    pool = getattr(states, "pool", None)
    if pool is None:
        if backend == "triton":
            raise RuntimeError("SGLANG_GDN_BACKEND=triton: the Gated DeltaNet kernels need forward_batch.gdn_states "
                               "from a GDNStatePool (GDNStatePool.states_for); these states are not in a pool")
        return None
    rows = states.rows
    # a captured decode batch's graph-stable slot buffer (padding rows at the pool's padding row); else the
    # pool row of a request is its request-table row, which the batch already holds on the device
    slots = states.slots
    if slots is None and rows == forward_batch.req_pool_indices_cpu:
        slots = forward_batch.req_pool_indices
    # snapshot captures come only with EXTEND batches (schedule_batch passes none to decode; the model runner
    # refuses a decode batch carrying some): a decode plan is one round without captures, host-free
    captures = forward_batch.gdn_captures if forward_batch.forward_mode.is_extend() else None
    return plan_kernel_batch(pool.conv, pool.recurrent, rows, seq_lens, captures, slots, forward_batch.qo_indptr)


class Qwen3_5TextModel(nn.Module):
    layer_cls = Qwen3_5DecoderLayer  # Qwen3.5-MoE's model swaps in its sparse layer

    def __init__(self, config: TextConfig, tp: TPInfo = SINGLE_RANK, dtype=None, quant=None):
        super().__init__()
        if config.hybrid is None:
            raise ValueError("Qwen3.5 text config without layer types / linear attention geometry")
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp, dtype)
        # shared by all full-attention layers; covers only the rotated dims
        self.rotary_emb = MRotaryEmbedding(config.hybrid.rotary_dim, config.rope_theta, config.mrope_section,
                                           config.mrope_interleaved)
        self.layers = nn.ModuleList(
            [self.layer_cls(config, i, tp, dtype, quant) for i in range(config.num_hidden_layers)])
        self.norm = ZeroCentredRMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        # decoder index -> index among the linear-attention layers (the state's layer axis)
        self.state_index = {layer: j for j, layer in enumerate(config.hybrid.linear_layers)}
        # SGLANG_GDN_BACKEND, resolved once here: which path the linear-attention layers take (fla/pooled.py)
        self.gdn_backend = check_backend(envs.SGLANG_GDN_BACKEND.get())

    def gdn_state_shape(self) -> GDNStateShape:
        first = self.layers[self.config.hybrid.linear_layers[0]].linear_attn
        return first.state_shape(len(self.state_index), self.embed_tokens.weight.dtype)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, forward_batch,
                input_embeds: torch.Tensor | None = None) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        rope = self.rotary_emb.cos_sin(positions, hidden_states.dtype)
        if forward_batch.forward_mode.is_extend():
            seq_lens = forward_batch.extend_seq_lens_cpu
        else:
            seq_lens = [1] * forward_batch.batch_size
        states = request_states(forward_batch) if self.state_index else []
        plan = kernel_batch(self.gdn_backend, states, seq_lens, forward_batch, hidden_states.device) \
            if self.state_index else None
        captures = getattr(forward_batch, "gdn_capture_states", None)
        residual = None
        for i, layer in enumerate(self.layers):
            gdn = None
            if layer.is_linear:
                j = self.state_index[i]
                if plan is not None:  # the kernel path: this layer's pool views, the batch plan
                    gdn = (seq_lens, plan.layer(j))
                else:
                    gdn = (seq_lens, [s.layer(j) for s in states],
                           [[(at, c.layer(j)) for at, c in caps] for caps in captures] if captures else None)
            hidden_states, residual = layer(rope, hidden_states, residual, forward_batch, gdn)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class Qwen3_5ForConditionalGeneration(QwenVLForConditionalGenerationBase):
    vision_tower_cls = Qwen3VisionTransformer  # built without deepstack mergers (none configured)
    text_model_cls = Qwen3_5TextModel

    def __init__(self, config: ModelConfig, tp: TPInfo = SINGLE_RANK, dtype: torch.dtype | None = None,
                 vit: ViTStrategy = ViTStrategy(), quant=None):
        if config.vision.deepstack_visual_indexes:
            raise ValueError("Qwen3.5 has no deepstack; this config lists deepstack_visual_indexes")
        super().__init__(config, tp, dtype)
        self.init_towers(dtype, vit, quant)
        self._skipped_mtp = 0

    def gdn_state_shape(self) -> GDNStateShape:
        """One request's linear-attention state on this rank (what a state pool allocates per slot)."""
        return self.model.gdn_state_shape()

    def gdn_uses_kernels(self, device: torch.device) -> bool:
        """Whether forwards on `device` take the Gated DeltaNet kernels (SGLANG_GDN_BACKEND, fla/pooled.py):
        only they read states through device slots, so only they can be captured in a decode CUDA graph."""
        return uses_kernels(self.model.gdn_backend, device)

    def skip_checkpoint_name(self, name: str) -> bool:
        if name.startswith(MTP_PREFIX):
            if not self._skipped_mtp:
                logger.info("Qwen3.5: skipping the multi-token-prediction head (%s*): speculative decoding is not "
                            "supported", MTP_PREFIX)
            self._skipped_mtp += 1
            return True
        return super().skip_checkpoint_name(name)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch):
        embeds, _ = self.embed_inputs(input_ids, forward_batch)  # no deepstack rows: the tower has none
        hidden = self.model(None, positions, forward_batch, input_embeds=embeds)
        return self.logits_processor(hidden, self.lm_head.weight, forward_batch)


EntryClass = Qwen3_5ForConditionalGeneration
