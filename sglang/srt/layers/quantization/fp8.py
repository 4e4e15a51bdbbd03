"""Block FP8 linears: Qwen's -FP8 checkpoints (e4m3 weights, one float32 `weight_scale_inv` per 128x128
block, activations quantized per token and 128 columns at run time) and `--quantization fp8` (a float
checkpoint's text linears quantized the same way while loading).

A TP shard or a fused part (q/k/v, gate/up) may start inside a 128-row block: the layer then keeps its
scales per `row_granularity` rows (a divisor of 128 at which every part starts), each a copy of its
checkpoint block's scale, and the GEMM reads them at that granularity. Columns likewise for row-parallel
shards (the activation groups follow). Below 16 columns a group is refused: the kernels need 16."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from sglang.srt.layers.quantization.base import MIN_GROUP, LinearLayout, QuantizationError
from sglang.srt.layers.checkpoint_tensor import materialize, tensor_name

FP8_DTYPE = torch.float8_e4m3fn


def normalize_module_name(name: str) -> str:
    """A checkpoint module name as our text modules are named (`model.language_model.` -> `model.`)."""
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    return name


@dataclass(frozen=True)
class Fp8Config:
    block: tuple[int, int] = (128, 128)
    serialized: bool = True  # the checkpoint holds e4m3 weights and their scales
    not_convert: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def from_checkpoint(cls, qc: dict[str, Any]) -> "Fp8Config":
        fmt = str(qc.get("fmt", "e4m3")).lower()
        if fmt != "e4m3":
            raise QuantizationError(f"FP8 checkpoint with fmt {fmt!r}: only e4m3 weights are supported")
        scheme = str(qc.get("activation_scheme", "dynamic")).lower()
        if scheme != "dynamic":
            raise QuantizationError(f"FP8 checkpoint with activation_scheme {scheme!r}: only dynamic (per-token-group) "
                                    "activation scales are supported")
        wbs = qc.get("weight_block_size")
        if not wbs:
            raise QuantizationError("per-tensor FP8 checkpoint (no weight_block_size): only block FP8 "
                                    "(weight_block_size [128, 128], Qwen's -FP8 releases) is supported")
        if len(wbs) != 2 or not all(isinstance(b, int) and b >= MIN_GROUP for b in wbs):
            raise QuantizationError(f"FP8 weight_block_size {wbs!r}: expected two block sizes >= {MIN_GROUP}")
        skip = qc.get("modules_to_not_convert") or qc.get("ignored_layers") or []
        return cls((wbs[0], wbs[1]), True, frozenset(normalize_module_name(str(m)) for m in skip))

    @classmethod
    def online(cls) -> "Fp8Config":
        return cls((128, 128), False, frozenset())

    def _skipped(self, name: str) -> bool:
        return any(name == m or name.startswith(m + ".") for m in self.not_convert)

    def method_for(self, prefix: str, parts: tuple[str, ...] = ()) -> "Fp8LinearMethod | None":
        """The method for our module `prefix` made of the checkpoint modules `prefix.<part>` (fused) or
        `prefix` itself; None when the checkpoint keeps them unquantized (modules_to_not_convert)."""
        parent = prefix.rsplit(".", 1)[0]
        names = [f"{parent}.{p}" for p in parts] if parts else [prefix]
        skipped = [self._skipped(n) for n in names]
        if all(skipped):
            return None
        if any(skipped):
            raise QuantizationError(f"modules_to_not_convert keeps part of the fused {prefix} unquantized "
                                    f"({', '.join(n for n, s in zip(names, skipped) if s)}): not supported")
        return Fp8LinearMethod(self)

    def describe(self) -> str:
        how = "e4m3 checkpoint" if self.serialized else "quantized at load"
        return f"fp8 ({how}, {self.block[0]}x{self.block[1]} blocks)"


class Fp8LinearMethod:
    """Owns a linear layer's `weight` (e4m3) and `weight_scale_inv` (float32) and computes x W^T."""

    def __init__(self, config: Fp8Config):
        self.config = config

    def create_weights(self, layer: nn.Module, layout: LinearLayout, tp_sizes_hint: str = "") -> None:
        bn, bk = self.config.block
        rows, cols = layer.weight.shape
        if self.config.serialized:
            gn, gk = layout.row_granularity(bn), layout.col_granularity(bk)
        else:  # quantized from the local weight itself: blocks of the local tensor
            gn, gk = bn, bk
        if gk < MIN_GROUP:
            raise QuantizationError(f"{type(layer).__name__}: this TP size cuts the {bk}-column FP8 blocks into "
                                    f"groups of {gk} columns (the kernels need >= {MIN_GROUP}){tp_sizes_hint}")
        layer.fp8_block = (gn, gk)
        if self.config.serialized:
            layer.weight = nn.Parameter(torch.empty(rows, cols, dtype=FP8_DTYPE), requires_grad=False)
            layer.weight.weight_loader = layer.weight_loader
        scale = torch.empty(-(-rows // gn), -(-cols // gk), dtype=torch.float32)
        layer.weight_scale_inv = nn.Parameter(scale, requires_grad=False)
        if self.config.serialized:
            layer.weight_scale_inv.weight_loader = lambda param, loaded, shard_id=None: self.load_scale(
                layer, layout, param, loaded, shard_id)
        else:
            layer.weight_scale_inv.loaded_by_process = True  # filled by process_weights_after_loading

    def load_scale(self, layer: nn.Module, layout: LinearLayout, param: nn.Parameter, loaded, shard_id) -> None:
        """Copies the checkpoint block scales of this rank's part `shard_id` at the layer's granularity."""
        bn, bk = self.config.block
        gn, gk = layer.fp8_block
        index = layer.shard_index(shard_id)
        if index is None and shard_id is None and self._load_fused_scale(layer, layout, param, loaded):
            return
        if index is None:
            raise QuantizationError(f"{type(layer).__name__}: a fused checkpoint scale tensor is not supported; "
                                    "store q/k/v and gate/up separately")
        part = layout.parts[index]
        # an oversized grid would be indexed without complaint and a short one fails obscurely: refuse both
        want = layout.scale_shape(index, self.config.block)
        if tuple(loaded.shape) != want:
            name = tensor_name(loaded, f"{type(layer).__name__}[{shard_id}] weight_scale_inv")
            raise QuantizationError(f"{name}: FP8 block scale shape {tuple(loaded.shape)} != {want}, the "
                                    f"{bn}x{bk}-block grid of its {part.total}x{layout.total_cols} weight")
        full = materialize(loaded).float()
        rows = torch.arange(0, part.size, gn)
        cols = torch.arange(0, layout.cols, gk)
        src = full[(part.src + rows) // bn][:, (layout.col_src + cols) // bk]
        if part.dst % gn:
            raise QuantizationError(f"{type(layer).__name__}: part {shard_id} starts off its scale grid")
        param.data[part.dst // gn: part.dst // gn + len(rows)].copy_(src)

    def _load_fused_scale(self, layer: nn.Module, layout: LinearLayout, param: nn.Parameter, loaded) -> bool:
        """A fused checkpoint tensor's scales (Qwen3.5's `in_proj_qkv`: [q | k | v] in one matrix): split
        by part when every part starts on a block row; False when the layer has no parts or they do not."""
        shards = tuple(layer.fused_shards()) if hasattr(layer, "fused_shards") else ()
        bn = self.config.block[0]
        totals = [layout.parts[layer.shard_index(s)].total for s in shards]
        if not shards or any(t % bn for t in totals) or loaded.shape[0] != sum(totals) // bn:
            return False
        start = 0
        for s, total in zip(shards, totals):
            self.load_scale(layer, layout, param, loaded.narrow(0, start, total // bn), s)
            start += total // bn
        return True

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.config.serialized:
            return
        from sgl_kernel.quantization import quantize_weight_block_fp8

        q, scale = quantize_weight_block_fp8(layer.weight.data, layer.fp8_block)
        layer.weight = nn.Parameter(q, requires_grad=False)
        layer.weight_scale_inv.data.copy_(scale)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x (*, K) -> x W^T (*, N) in x's dtype, no bias: activations quantized per token and `gk`
        columns, then the block-FP8 GEMM (Triton on CUDA, the float32 torch reference elsewhere)."""
        from sgl_kernel.quantization import per_token_group_quant_fp8, w8a8_block_fp8_matmul

        gn, gk = layer.fp8_block
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        q, s = per_token_group_quant_fp8(x2, gk)
        y = w8a8_block_fp8_matmul(q, s, layer.weight, layer.weight_scale_inv, (gn, gk), out_dtype=x.dtype)
        return y.reshape(*lead, y.shape[-1])
