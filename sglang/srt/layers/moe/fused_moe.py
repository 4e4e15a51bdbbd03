"""Experts of a sparse MLP held fused, as Qwen3-VL-MoE stores them, and their product.

Each rank holds every expert with a 1/tp slice of its intermediate dim: `gate_up_proj` [E, 2*I/tp, H]
(this rank's gate rows, then its up rows: column-parallel) and `down_proj` [E, H, I/tp] (row-parallel);
each rank's partial sums are all-reduced. The product runs the sgl-kernel Triton path on CUDA and its
torch reference elsewhere."""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.distributed.communication_op import tensor_model_parallel_all_reduce
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo, divide
from sglang.srt.model_loader.weight_utils import materialize


def fused_experts(x, w13, w2, topk_weights, topk_ids) -> torch.Tensor:
    """The Triton grouped GEMM for CUDA tensors, the torch path (only the experts that received tokens)
    elsewhere: `sgl_kernel.moe.fused_experts`."""
    from sgl_kernel.moe import fused_experts as kernel

    return kernel(x, w13, w2, topk_weights, topk_ids)


class FusedMoE(nn.Module):
    """The experts of one layer. Parameter names are the checkpoint's (`mlp.experts.gate_up_proj`,
    `mlp.experts.down_proj`); `weight_loader` takes either layout a checkpoint may hold:
    the released one (gate_up [E, H, 2I], down [E, I, H]) or transformers 5's save ([E, 2I, H], [E, H, I]).
    When a shape fits both (H == 2I for gate_up, H == I for down) the released layout is assumed."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, tp: TPInfo = SINGLE_RANK,
                 dtype=None):
        super().__init__()
        dtype = dtype or torch.get_default_dtype()
        self.tp = tp
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.local_inter = divide(intermediate_size, tp.size)
        n = self.local_inter
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * n, hidden_size, dtype=dtype), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, n, dtype=dtype), requires_grad=False)
        self.gate_up_proj.weight_loader = self._load_gate_up
        self.down_proj.weight_loader = self._load_down

    def _check(self, loaded, shapes: dict[str, tuple[int, ...]], what: str) -> str:
        shape = tuple(loaded.shape)
        for layout, want in shapes.items():
            if shape == want:
                return layout
        raise ValueError(f"FusedMoE.{what}: checkpoint shape {shape} is neither the released layout "
                         f"{shapes['released']} nor transformers' {shapes['transformers']}")

    def _load_gate_up(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        e, h, i, n = self.num_experts, self.hidden_size, self.intermediate_size, self.local_inter
        layout = self._check(loaded, {"released": (e, h, 2 * i), "transformers": (e, 2 * i, h)}, "gate_up_proj")
        dim = 2 if layout == "released" else 1
        r = self.tp.rank
        for part in range(2):  # gate, then up: this rank's slice of each
            src = materialize(loaded.narrow(dim, part * i + r * n, n))
            if layout == "released":
                src = src.transpose(1, 2)
            param.data[:, part * n : (part + 1) * n].copy_(src.to(param.dtype))

    def _load_down(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        e, h, i, n = self.num_experts, self.hidden_size, self.intermediate_size, self.local_inter
        layout = self._check(loaded, {"released": (e, i, h), "transformers": (e, h, i)}, "down_proj")
        dim = 1 if layout == "released" else 2
        src = materialize(loaded.narrow(dim, self.tp.rank * n, n))
        if layout == "released":
            src = src.transpose(1, 2)
        param.data.copy_(src.to(param.dtype))

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        y = fused_experts(x, self.gate_up_proj, self.down_proj, topk_weights, topk_ids)
        return tensor_model_parallel_all_reduce(y, self.tp)
