"""Linear layers that know their tensor-parallel shard and load full checkpoint tensors into it.

Every layer exposes `weight_loader(param, loaded_weight, shard_id=None)`: the loader hands over the
checkpoint tensor as stored on disk and the layer takes the slice that belongs to its rank.

A fused layer (q/k/v, gate/up) marks each of its loadable parameters with `required_shards`, the shard
ids the checkpoint must deliver (model_loader/loader.py refuses a checkpoint that leaves one out); a
call with shard_id None is the fused tensor, whose full shape is checked, so it fills every shard.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.distributed.communication_op import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo, divide
from sglang.srt.layers.quantization.base import LinearLayout, RowPart, column_tp_sizes
from sglang.srt.layers.checkpoint_tensor import materialize


def _copy_checked(dst: torch.Tensor, src, what: str) -> None:
    """Copies a checkpoint tensor (or a lazily read region of one) into a parameter slice."""
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"{what}: checkpoint shard shape {tuple(src.shape)} != parameter {tuple(dst.shape)}")
    dst.data.copy_(materialize(src).to(dst.dtype))


def _check_full(loaded, dim: int, expected: int, what: str) -> None:
    """A checkpoint tensor must have the full (unsharded) size before a rank cuts its slice: a wrong
    checkpoint is refused, never silently truncated."""
    if loaded.shape[dim] != expected:
        raise ValueError(f"{what}: checkpoint tensor has {loaded.shape[dim]} rows along dim {dim}, expected {expected} "
                         f"(shape {tuple(loaded.shape)})")


class LinearBase(nn.Module):
    """`quant`: a quantization method (layers/quantization) that owns the weight and the product, or
    None for a plain float weight. Subclasses set what `layout()` reads before calling this __init__."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype | None, quant=None):
        super().__init__()
        dtype = dtype or torch.get_default_dtype()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)
        self.quant_method = quant
        if quant is not None:
            quant.create_weights(self, self.layout(), self.tp_sizes_hint())
        shards = self.fused_shards()
        if shards is not None:  # after create_weights: the FP8 weight and its scale are new parameters
            for p in self.parameters(recurse=False):
                if hasattr(p, "weight_loader"):
                    p.required_shards = shards

    def fused_shards(self) -> tuple | None:
        """The shard ids a fused layer's parameters are loaded by, each required; None: one tensor each."""
        return None

    def layout(self) -> LinearLayout:
        """Where the local weight's rows and columns come from in the checkpoint matrices."""
        out = self.out_features
        return LinearLayout((RowPart(0, 0, out, out),), 0, self.in_features, self.in_features)

    def shard_index(self, shard_id) -> int | None:
        """The layout part a checkpoint tensor with this shard id fills (None: a fused tensor)."""
        return 0 if shard_id is None else None

    def tp_sizes_hint(self) -> str:
        return ""

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        _copy_checked(param, loaded, type(self).__name__)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x W^T without the bias."""
        return F.linear(x, self.weight) if self.quant_method is None else self.quant_method.apply(self, x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant_method is None:
            return F.linear(x, self.weight, self.bias)
        y = self.matmul(x)
        return y + self.bias if self.bias is not None else y


class ReplicatedLinear(LinearBase):
    def __init__(self, in_features, out_features, bias=True, dtype=None, quant=None):
        super().__init__(in_features, out_features, bias, dtype, quant)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks."""

    def __init__(self, in_features, out_features, bias=True, gather_output=False, tp: TPInfo = SINGLE_RANK, dtype=None,
                 quant=None):
        self.tp = tp
        self.gather_output = gather_output
        super().__init__(in_features, divide(out_features, tp.size), bias, dtype, quant)

    def layout(self) -> LinearLayout:
        out = self.out_features
        return LinearLayout((RowPart(0, self.tp.rank * out, out, out * self.tp.size),), 0, self.in_features,
                            self.in_features)

    def weight_loader(self, param, loaded, shard_id=None):
        size = param.shape[0]
        _check_full(loaded, 0, size * self.tp.size, type(self).__name__)
        _copy_checked(param, loaded.narrow(0, self.tp.rank * size, size), type(self).__name__)

    def forward(self, x):
        y = super().forward(x)
        return tensor_model_parallel_all_gather(y, self.tp) if self.gather_output else y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs fused in one matrix (e.g. gate_proj + up_proj).

    Each rank holds [its slice of output 0 | its slice of output 1 | ...]."""

    def __init__(self, in_features, output_sizes: list[int], bias=True, tp: TPInfo = SINGLE_RANK, dtype=None, quant=None):
        self.output_sizes = list(output_sizes)
        super().__init__(in_features, sum(output_sizes), bias, False, tp, dtype, quant)

    def layout(self) -> LinearLayout:
        local = [divide(s, self.tp.size) for s in self.output_sizes]
        parts = tuple(RowPart(sum(local[:i]), self.tp.rank * n, n, total)
                      for i, (n, total) in enumerate(zip(local, self.output_sizes)))
        return LinearLayout(parts, 0, self.in_features, self.in_features)

    def shard_index(self, shard_id) -> int | None:
        return shard_id if isinstance(shard_id, int) else None

    def fused_shards(self) -> tuple:
        return tuple(range(len(self.output_sizes)))

    def weight_loader(self, param, loaded, shard_id=None):
        if shard_id is None:
            _check_full(loaded, 0, sum(self.output_sizes), "MergedColumnParallelLinear")
            for i, chunk in enumerate(loaded.split(self.output_sizes, dim=0)):
                self.weight_loader(param, chunk, i)
            return
        _check_full(loaded, 0, self.output_sizes[shard_id], f"MergedColumnParallelLinear[{shard_id}]")
        local = [divide(s, self.tp.size) for s in self.output_sizes]
        offset = sum(local[:shard_id])
        size = local[shard_id]
        src = loaded.narrow(0, self.tp.rank * size, size)
        _copy_checked(param.data.narrow(0, offset, size), src, f"MergedColumnParallelLinear[{shard_id}]")


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection split by heads; kv heads are replicated when there are fewer than ranks."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        total_num_heads: int,
        total_num_kv_heads: int | None = None,
        bias: bool = True,
        tp: TPInfo = SINGLE_RANK,
        dtype=None,
        quant=None,
    ):
        total_num_kv_heads = total_num_kv_heads or total_num_heads
        self.head_dim = head_dim
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = divide(total_num_heads, tp.size)
        self.num_kv_heads = kv_heads_per_rank(total_num_kv_heads, tp.size)
        self.kv_replicas = divide(tp.size, total_num_kv_heads) if tp.size >= total_num_kv_heads else 1
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp.size
        super().__init__(hidden_size, out, bias, False, tp, dtype, quant)

    def layout(self) -> LinearLayout:
        q, kv, kv_src = self.q_size, self.kv_size, (self.tp.rank // self.kv_replicas) * self.kv_size
        q_total, kv_total = self.total_num_heads * self.head_dim, self.total_num_kv_heads * self.head_dim
        parts = (RowPart(0, self.tp.rank * q, q, q_total), RowPart(q, kv_src, kv, kv_total),
                 RowPart(q + kv, kv_src, kv, kv_total))
        return LinearLayout(parts, 0, self.in_features, self.in_features)

    def shard_index(self, shard_id) -> int | None:
        return {"q": 0, "k": 1, "v": 2}.get(shard_id)

    def fused_shards(self) -> tuple:
        return ("q", "k", "v")

    def weight_loader(self, param, loaded, shard_id=None):
        if shard_id is None:  # fused checkpoint tensor laid out as [q | k | v]
            kv = self.total_num_kv_heads * self.head_dim
            _check_full(loaded, 0, self.total_num_heads * self.head_dim + 2 * kv, "QKVParallelLinear")
            q, k, v = loaded.split([self.total_num_heads * self.head_dim, kv, kv], dim=0)
            for sid, part in (("q", q), ("k", k), ("v", v)):
                self.weight_loader(param, part, sid)
            return
        total = self.total_num_heads if shard_id == "q" else self.total_num_kv_heads
        _check_full(loaded, 0, total * self.head_dim, f"QKVParallelLinear[{shard_id}]")
        if shard_id == "q":
            offset, size, rank = 0, self.q_size, self.tp.rank
        else:
            offset = self.q_size + (0 if shard_id == "k" else self.kv_size)
            size, rank = self.kv_size, self.tp.rank // self.kv_replicas
        src = loaded.narrow(0, rank * size, size)
        _copy_checked(param.data.narrow(0, offset, size), src, f"QKVParallelLinear[{shard_id}]")

    def split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial products are summed with an all-reduce."""

    def __init__(self, in_features, out_features, bias=True, reduce_results=True, tp: TPInfo = SINGLE_RANK, dtype=None,
                 quant=None):
        self.tp = tp
        self.reduce_results = reduce_results
        super().__init__(divide(in_features, tp.size), out_features, bias, dtype, quant)

    def layout(self) -> LinearLayout:
        out = self.out_features
        return LinearLayout((RowPart(0, 0, out, out),), self.tp.rank * self.in_features, self.in_features,
                            self.in_features * self.tp.size)

    def tp_sizes_hint(self) -> str:
        full = self.in_features * self.tp.size
        return f"; input features {full}: TP sizes that work: {', '.join(map(str, column_tp_sizes(full, 128)))}"

    def weight_loader(self, param, loaded, shard_id=None):
        if param.dim() == 1:  # bias is added once, after the reduction
            _copy_checked(param, loaded, "RowParallelLinear.bias")
            return
        size = param.shape[1]
        _check_full(loaded, 1, size * self.tp.size, "RowParallelLinear")
        _copy_checked(param, loaded.narrow(1, self.tp.rank * size, size), "RowParallelLinear")

    def forward(self, x):
        y = self.matmul(x)
        if self.reduce_results:
            y = tensor_model_parallel_all_reduce(y, self.tp)
        elif self.tp.rank != 0:
            return y  # NOTE: the caller reduces later; the bias must enter the sum exactly once
        return y + self.bias if self.bias is not None else y


def kv_heads_per_rank(total_num_kv_heads: int, tp_size: int) -> int:
    """KV heads each rank holds: a share of them, or one replicated head when ranks outnumber them."""
    return 1 if tp_size >= total_num_kv_heads else divide(total_num_kv_heads, tp_size)
