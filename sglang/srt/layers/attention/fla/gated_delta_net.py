"""Qwen3.5's Gated DeltaNet token mixer (the `linear_attn` of its linear-attention layers).

    x -> in_proj_qkv -> causal depthwise conv + SiLU -> q, k, v per head
    x -> in_proj_b -> beta = sigmoid(b);  x -> in_proj_a -> g = -exp(A_log) * softplus(a + dt_bias)
    gated delta rule (ops.py) -> o;  x -> in_proj_z -> z;  out_proj(GatedRMSNorm(o, z))

Parameter names are the released checkpoint's (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`,
`conv1d.weight`, `A_log`, `dt_bias`, `norm.weight`, `out_proj`). Tensor parallelism splits the heads:
each rank holds Hk/tp key heads and Hv/tp value heads, the matching slices of q, k and v in the
projection and the conv channels (a value head's key head stays on its rank), and out_proj reduces.

State, two paths (the model picks one per forward: SGLANG_GDN_BACKEND, pooled.py):
- torch (ops.py): the caller passes one `GDNLayerState` per request (mem_cache/gdn_state.py); the layer
  runs each request (and each snapshot-capture piece) in turn and writes the new conv history and
  delta-rule state back in place;
- kernels (sgl_kernel.gdn): the caller passes a `GDNPoolLayer`, this layer's views of the state pool and a
  plan of the batch (slots, cu_seqlens, capture rounds); each op is one batched call (pooled.py).
The layer itself holds no per-request data.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.configs.qwen3_5_config import HybridAttentionConfig
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo, divide
from sglang.srt.layers.attention.fla.norm import GatedRMSNorm
from sglang.srt.layers.attention.fla.ops import (
    causal_conv1d,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    recurrent_gated_delta_rule,
)
from sglang.srt.layers.attention.fla.pooled import GDNPoolLayer, mix_pooled
from sglang.srt.mem_cache.gdn_state import GDNLayerState, GDNStateShape
from sglang.srt.layers.linear import ColumnParallelLinear, MergedColumnParallelLinear, RowParallelLinear
from sglang.srt.layers.checkpoint_tensor import materialize
from sglang.srt.layers.quantization import linear_method


def _head_sharded_loader(part_sizes: Sequence[int], tp: TPInfo):
    """A weight_loader for a tensor whose dim 0 is the concatenation of `part_sizes` (full sizes), each
    part split evenly over the ranks: this rank keeps [its slice of part 0 | of part 1 | ...]."""
    local = [divide(n, tp.size) for n in part_sizes]

    def load(param: nn.Parameter, loaded, shard_id=None) -> None:
        if loaded.shape[0] != sum(part_sizes) or tuple(loaded.shape[1:]) != tuple(param.shape[1:]):
            want = (sum(part_sizes), *param.shape[1:])
            raise ValueError(f"checkpoint shape {tuple(loaded.shape)} != {want}")
        start, at = 0, 0
        for full, mine in zip(part_sizes, local):
            src = materialize(loaded.narrow(0, start + tp.rank * mine, mine))
            param.data.narrow(0, at, mine).copy_(src.to(param.dtype))
            start, at = start + full, at + mine

    return load


def _sharded_param(shape: tuple[int, ...], part_sizes: Sequence[int], tp: TPInfo, dtype) -> nn.Parameter:
    p = nn.Parameter(torch.empty(shape, dtype=dtype or torch.get_default_dtype()), requires_grad=False)
    p.weight_loader = _head_sharded_loader(part_sizes, tp)
    return p


class DepthwiseConv1dWeight(nn.Module):
    """Holds `conv1d.weight` (local channels, 1, K) in the checkpoint's layout; the op is in ops.py."""

    def __init__(self, part_sizes: Sequence[int], kernel: int, tp: TPInfo, dtype):
        super().__init__()
        channels = sum(divide(n, tp.size) for n in part_sizes)
        self.weight = _sharded_param((channels, 1, kernel), part_sizes, tp, dtype)


class GatedDeltaNet(nn.Module):
    def __init__(self, hidden_size: int, cfg: HybridAttentionConfig, rms_norm_eps: float = 1e-6,
                 tp: TPInfo = SINGLE_RANK, dtype: torch.dtype | None = None, chunk_size: int = 64, quant=None,
                 prefix: str = "linear_attn"):
        """quant: the checkpoint's quantization (block FP8): each projection is quantized unless the checkpoint's
        modules_to_not_convert keeps it; the conv, A_log, dt_bias and the gated norm are never quantized."""
        super().__init__()
        hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        if hk % tp.size or hv % tp.size:
            raise ValueError(f"Gated DeltaNet heads ({hk} key, {hv} value) do not split over TP {tp.size}")
        self.num_k_heads, self.num_v_heads = hk // tp.size, hv // tp.size
        self.head_k_dim, self.head_v_dim = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.head_k_dim  # this rank's
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_kernel = cfg.linear_conv_kernel_dim
        self.chunk_size = chunk_size
        parts = [cfg.key_dim, cfg.key_dim, cfg.value_dim]  # q | k | v, in the projection and the conv
        q = lambda name: linear_method(quant, f"{prefix}.{name}")  # noqa: E731
        self.in_proj_qkv = MergedColumnParallelLinear(hidden_size, parts, bias=False, tp=tp, dtype=dtype,
                                                      quant=q("in_proj_qkv"))
        self.in_proj_z = ColumnParallelLinear(hidden_size, cfg.value_dim, bias=False, tp=tp, dtype=dtype,
                                              quant=q("in_proj_z"))
        # beta and the decay projections (one row per value head: nothing to gain from FP8) are quantized only
        # where a checkpoint stores them so; --quantization fp8 keeps them in the model dtype, as the -FP8
        # writer (sglang/testing/fp8_checkpoint.py) does
        small = q if quant is not None and quant.serialized else (lambda name: None)
        self.in_proj_b = ColumnParallelLinear(hidden_size, hv, bias=False, tp=tp, dtype=dtype, quant=small("in_proj_b"))
        self.in_proj_a = ColumnParallelLinear(hidden_size, hv, bias=False, tp=tp, dtype=dtype, quant=small("in_proj_a"))
        self.conv1d = DepthwiseConv1dWeight(parts, self.conv_kernel, tp, dtype)
        self.A_log = _sharded_param((self.num_v_heads,), [hv], tp, dtype)
        self.dt_bias = _sharded_param((self.num_v_heads,), [hv], tp, dtype)
        self.norm = GatedRMSNorm(self.head_v_dim, rms_norm_eps, dtype)
        self.out_proj = RowParallelLinear(cfg.value_dim, hidden_size, bias=False, tp=tp, dtype=dtype,
                                          quant=q("out_proj"))

    def state_shape(self, num_layers: int, dtype: torch.dtype) -> GDNStateShape:
        """What each request needs for `num_layers` layers shaped like this one (conv in `dtype`)."""
        return GDNStateShape(num_layers, 2 * self.key_dim + self.value_dim, self.conv_kernel, self.num_v_heads,
                             self.head_k_dim, self.head_v_dim, conv_dtype=dtype)

    def forward(self, hidden_states: torch.Tensor, seq_lens: Sequence[int],
                states: Sequence[GDNLayerState] | GDNPoolLayer,
                captures: Sequence[Sequence[tuple[int, GDNLayerState]]] | None = None) -> torch.Tensor:
        """hidden_states: (T, hidden), the new tokens of each request in turn (`seq_lens[i]` of request
        i, summing to T).

        The torch path: states[i] is request i's state, read and then updated in place; captures[i]:
        (k, target) pairs, 0 < k <= seq_lens[i] ascending: the state after request i's first k new
        tokens is also copied into `target` (the prefix cache's snapshots).
        The kernel path: `states` is a `GDNPoolLayer` (pooled.py): this layer's views of the state pool
        and the batch plan, which carries the slots and the captures (`captures` unused)."""
        pooled = isinstance(states, GDNPoolLayer)
        if sum(seq_lens) != hidden_states.shape[0] or (not pooled and len(seq_lens) != len(states)):
            raise ValueError(f"{hidden_states.shape[0]} tokens, seq_lens {list(seq_lens)}, "
                             f"{'a pool' if pooled else len(states)} states")
        t = hidden_states.shape[0]
        qkv = self.in_proj_qkv(hidden_states)
        z = self.in_proj_z(hidden_states)
        beta = self.in_proj_b(hidden_states).sigmoid()
        # float32 decay: in half precision exp(A_log) * softplus(.) could round to -inf in the exponent
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(hidden_states).float() + self.dt_bias.float())
        if pooled:
            out = mix_pooled(self, qkv, g, beta, states)
        else:
            out = self._mix_requests(qkv, g, beta, seq_lens, states, captures)
        o = self.norm(out.to(hidden_states.dtype).view(-1, self.head_v_dim), z.view(-1, self.head_v_dim))
        return self.out_proj(o.view(t, self.value_dim))

    def _mix_requests(self, qkv, g, beta, seq_lens, states, captures) -> torch.Tensor:
        """The torch path: one request (and one capture piece) at a time; o (T, Hv, Dv) float32."""
        out = torch.empty(qkv.shape[0], self.num_v_heads, self.head_v_dim, dtype=torch.float32, device=qkv.device)
        start = 0
        for i, (n, state) in enumerate(zip(seq_lens, states)):
            # the request's tokens in pieces ending at its capture points (one piece without any)
            cuts = [(k, target) for k, target in (captures[i] if captures else ()) if 0 < k <= n]
            done = 0
            for k, target in cuts + ([(n, None)] if not cuts or cuts[-1][0] < n else []):
                if k > done:
                    lo, hi = start + done, start + k
                    out[lo:hi] = self._mix_one(qkv[lo:hi], g[lo:hi], beta[lo:hi], state)
                    done = k
                if target is not None:
                    target.conv.copy_(state.conv)
                    target.recurrent.copy_(state.recurrent)
            start += n
        return out

    def _mix_one(self, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: GDNLayerState) -> torch.Tensor:
        """One request's n new tokens: conv, then the delta rule (the recurrent step for a single token,
        the chunked form otherwise; they agree). Writes the new state into `state`."""
        n = qkv.shape[0]
        conv = causal_conv1d_update if n == 1 else causal_conv1d
        mixed, conv_state = conv(qkv, self.conv1d.weight, state.conv)
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(n, self.num_k_heads, self.head_k_dim)
        k = k.reshape(n, self.num_k_heads, self.head_k_dim)
        v = v.reshape(n, self.num_v_heads, self.head_v_dim)
        if n == 1:
            o, recurrent = recurrent_gated_delta_rule(q, k, v, g, beta, state.recurrent)
        else:
            o, recurrent = chunk_gated_delta_rule(q, k, v, g, beta, state.recurrent, self.chunk_size)
        state.conv.copy_(conv_state)
        state.recurrent.copy_(recurrent)
        return o
