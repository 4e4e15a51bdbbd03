"""Experts of a sparse MLP held fused, as Qwen3-VL-MoE stores them, and their product.

Without expert parallelism each rank holds every expert with a 1/tp slice of its intermediate dim:
`gate_up_proj` [E, 2*I/tp, H] (this rank's gate rows, then its up rows: column-parallel) and `down_proj`
[E, H, I/tp] (row-parallel). With --ep-size ep (TPInfo.ep_size) a rank holds the E/ep experts of its
expert group, [ep_rank * E/ep, (ep_rank + 1) * E/ep), whole at ep == tp or with I split over the
tp/ep ranks of the group, as upstream's FusedMoE does.

Dispatch and combine: every TP rank already has every token (attention is TP-replicated on the token
dim), so a rank runs only its own experts' (token, slot) rows (ids of other ranks' experts become -1)
and one all-reduce over the whole TP group sums the partial outputs, expert groups and intermediate
shards alike. This is upstream's path without an all-to-all backend (--moe-a2a-backend none: each
rank's experts, then the MoE block's tensor_model_parallel_all_reduce); DeepEP's token all-to-all is
not built. The product runs the sgl-kernel Triton path on CUDA and its torch reference elsewhere."""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.distributed.communication_op import tensor_model_parallel_all_reduce
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo, divide
from sglang.srt.layers.checkpoint_tensor import materialize


def fused_experts(x, w13, w2, topk_weights, topk_ids, has_remote: bool = False) -> torch.Tensor:
    """The Triton grouped GEMM for CUDA tensors, the torch path (only the experts that received tokens)
    elsewhere: `sgl_kernel.moe.fused_experts`. Ids of -1 (has_remote) are other ranks' experts."""
    from sgl_kernel.moe import fused_experts as kernel

    return kernel(x, w13, w2, topk_weights, topk_ids, has_remote=has_remote)


class FusedMoE(nn.Module):
    """The experts of one layer. Parameter names are the checkpoint's (`mlp.experts.gate_up_proj`,
    `mlp.experts.down_proj`); `weight_loader` takes either layout a checkpoint may hold:
    the released one (gate_up [E, H, 2I], down [E, I, H]) or transformers 5's save ([E, 2I, H], [E, H, I]).
    When a shape fits both (H == 2I for gate_up, H == I for down) the released layout is assumed.

    `quant_method`: None for float experts, or `--quantization fp8`'s method (layers/moe/fp8_moe.py
    Fp8MoEMethod), which quantizes the loaded float experts once loading is done (model_loader calls its
    process_weights_after_loading) and computes the product from then on."""

    quant_method = None

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, tp: TPInfo = SINGLE_RANK,
                 dtype=None):
        super().__init__()
        dtype = dtype or torch.get_default_dtype()
        self.tp = tp
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        if num_experts % tp.ep_size:
            raise ValueError(f"FusedMoE: {num_experts} experts cannot be split over --ep-size {tp.ep_size}")
        self.num_local_experts = num_experts // tp.ep_size
        self.first_expert = tp.moe_ep_rank * self.num_local_experts
        self.local_inter = divide(intermediate_size, tp.moe_tp_size)
        self.create_weights(dtype)

    def create_weights(self, dtype) -> None:
        e, n, h = self.num_local_experts, self.local_inter, self.hidden_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * n, h, dtype=dtype), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(e, h, n, dtype=dtype), requires_grad=False)
        self.gate_up_proj.weight_loader = self._load_gate_up
        self.down_proj.weight_loader = self._load_down

    def _check(self, loaded, shapes: dict[str, tuple[int, ...]], what: str) -> str:
        shape = tuple(loaded.shape)
        for layout, want in shapes.items():
            if shape == want:
                return layout
        raise ValueError(f"FusedMoE.{what}: checkpoint shape {shape} is neither the released layout "
                         f"{shapes['released']} nor transformers' {shapes['transformers']}")

    def _local(self, loaded):
        """This rank's experts of a fused [E, ...] checkpoint tensor (a lazy slice: read on materialize)."""
        return loaded.narrow(0, self.first_expert, self.num_local_experts) if self.tp.ep_size > 1 else loaded

    def _load_gate_up(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        e, h, i, n = self.num_experts, self.hidden_size, self.intermediate_size, self.local_inter
        layout = self._check(loaded, {"released": (e, h, 2 * i), "transformers": (e, 2 * i, h)}, "gate_up_proj")
        dim = 2 if layout == "released" else 1
        r = self.tp.moe_tp_rank
        loaded = self._local(loaded)
        for part in range(2):  # gate, then up: this rank's slice of each
            src = materialize(loaded.narrow(dim, part * i + r * n, n))
            if layout == "released":
                src = src.transpose(1, 2)
            param.data[:, part * n : (part + 1) * n].copy_(src.to(param.dtype))

    def _load_down(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        e, h, i, n = self.num_experts, self.hidden_size, self.intermediate_size, self.local_inter
        layout = self._check(loaded, {"released": (e, i, h), "transformers": (e, h, i)}, "down_proj")
        dim = 1 if layout == "released" else 2
        src = materialize(self._local(loaded).narrow(dim, self.tp.moe_tp_rank * n, n))
        if layout == "released":
            src = src.transpose(1, 2)
        param.data.copy_(src.to(param.dtype))

    def local_ids(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """Global expert ids -> this rank's (0 .. E/ep - 1), -1 for experts other ranks hold."""
        if self.tp.ep_size == 1:
            return topk_ids
        local = topk_ids - self.first_expert
        return torch.where((local >= 0) & (local < self.num_local_experts), local, -1).to(topk_ids.dtype)

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        ids = self.local_ids(topk_ids)
        if self.quant_method is not None:
            y = self.quant_method.apply(self, x, topk_weights, ids)
        else:
            y = fused_experts(x, self.gate_up_proj, self.down_proj, topk_weights, ids, has_remote=self.tp.ep_size > 1)
        return tensor_model_parallel_all_reduce(y, self.tp)
