"""Block-FP8 experts, as the -FP8 Qwen3-VL-MoE releases store them: one 2-D linear per expert,
`mlp.experts.{e}.{gate,up,down}_proj.weight` (e4m3) with `weight_scale_inv` (float32, one per 128x128
block; W ~= weight * scale), the router `mlp.gate` left unquantized. The layer holds them fused like
FusedMoE (`gate_up_proj` [E_local, 2n, H], `down_proj` [E_local, H, n], e4m3) beside their scales
(`gate_up_proj_scale_inv`, `down_proj_scale_inv`), under the same TP/EP placement.

Scale granularity (the dense FP8 linears' rule, layers/quantization/fp8.py): this rank's n = I / (tp/ep)
rows of gate and of up start at r*n in the checkpoint and at 0 / n here, so gate_up keeps one scale per
gcd(128, n) rows (each a copy of its checkpoint block's); down's columns start at r*n, so it keeps one per
gcd(128, r*n) columns, which must be >= MIN_GROUP (the start-up check names the TP sizes that work).

Completeness: each fused parameter is filled expert by expert, so it declares `required_shards`, every
(expert, part) of this rank's experts (model_loader/loader.py refuses a checkpoint that leaves one out);
each expert's weight and scale is checked against its checkpoint shape (I x H, H x I; their 128x128 grids).

`--quantization fp8` (Fp8MoEMethod): a float experts layer loads as usual (any layout its own loaders
read), then each expert's local gate_up and down are quantized in blocks of the local tensors; the layer
then holds the same four tensors, with the same granularity rule for gate_up, and computes the same product."""

from __future__ import annotations

from math import gcd

import torch
from torch import nn

from sglang.srt.distributed.communication_op import tensor_model_parallel_all_reduce
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.layers.moe.fused_moe import FusedMoE
from sglang.srt.layers.quantization.base import MIN_GROUP, QuantizationError
from sglang.srt.layers.checkpoint_tensor import materialize, tensor_name

FP8_DTYPE = torch.float8_e4m3fn


def expert_params_mapping(num_experts: int) -> list[tuple[str, str, tuple[int, int | None]]]:
    """(our fragment, checkpoint fragment, shard id (expert, 0 gate / 1 up / None down)) for the model's
    stacked_params_mapping; `.weight_scale_inv` names map to `<param>_scale_inv` by the same replace."""
    out = []
    for e in range(num_experts):
        out += [(".experts.gate_up_proj", f".experts.{e}.gate_proj.weight", (e, 0)),
                (".experts.gate_up_proj", f".experts.{e}.up_proj.weight", (e, 1)),
                (".experts.down_proj", f".experts.{e}.down_proj.weight", (e, None))]
    return out


class Fp8FusedMoE(FusedMoE):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, tp: TPInfo = SINGLE_RANK,
                 dtype=None, block: tuple[int, int] = (128, 128)):
        self.block = block
        super().__init__(num_experts, hidden_size, intermediate_size, tp, dtype)

    def create_weights(self, dtype) -> None:
        bn, bk = self.block
        e, n, h = self.num_local_experts, self.local_inter, self.hidden_size
        col_src = self.tp.moe_tp_rank * n
        self.block13 = (gcd(bn, n), bk)  # gate_up rows per scale; H is whole: the checkpoint's column blocks
        self.block2 = (bn, gcd(bk, col_src))  # down: H rows whole; its columns start at col_src
        if self.block2[1] < MIN_GROUP:
            raise QuantizationError(f"FP8 experts: moe_intermediate_size {self.intermediate_size} over "
                                    f"{self.tp.moe_tp_size} ranks starts rank {self.tp.rank}'s down_proj columns inside "
                                    f"a {bk}-column scale block on a {self.block2[1]}-column grid (need >= {MIN_GROUP})")
        cdiv = lambda a, b: -(-a // b)  # noqa: E731
        self.dtype = dtype
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * n, h, dtype=FP8_DTYPE), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(e, h, n, dtype=FP8_DTYPE), requires_grad=False)
        self.gate_up_proj_scale_inv = nn.Parameter(
            torch.empty(e, 2 * n // self.block13[0], cdiv(h, bk), dtype=torch.float32), requires_grad=False)
        self.down_proj_scale_inv = nn.Parameter(
            torch.empty(e, cdiv(h, bn), cdiv(n, self.block2[1]), dtype=torch.float32), requires_grad=False)
        self.gate_up_proj.weight_loader = self._load_fp8_gate_up
        self.down_proj.weight_loader = self._load_fp8_down
        self.gate_up_proj_scale_inv.weight_loader = self._load_gate_up_scale
        self.down_proj_scale_inv.weight_loader = self._load_down_scale
        # global expert ids, as expert_params_mapping passes them; other ranks' experts are theirs to require
        mine = range(self.first_expert, self.first_expert + e)
        gate_up = tuple((x, part) for x in mine for part in (0, 1))
        self.gate_up_proj.required_shards = self.gate_up_proj_scale_inv.required_shards = gate_up
        self.down_proj.required_shards = self.down_proj_scale_inv.required_shards = tuple((x, None) for x in mine)

    def _checkpoint_shape(self, part) -> tuple[int, int]:
        """One expert's checkpoint linear: gate/up [I, H], down [H, I]."""
        i, h = self.intermediate_size, self.hidden_size
        return (h, i) if part is None else (i, h)

    def _check_shape(self, loaded, part, scale: bool) -> None:
        rows, cols = self._checkpoint_shape(part)
        bn, bk = self.block
        want = (-(-rows // bn), -(-cols // bk)) if scale else (rows, cols)
        if tuple(loaded.shape) != want:
            what = f"{'down' if part is None else ('gate', 'up')[part]}_proj {'scale' if scale else 'weight'}"
            name = tensor_name(loaded, f"Fp8FusedMoE {what}")
            grid = f", the {bn}x{bk}-block grid of its {rows}x{cols} weight" if scale else ""
            raise QuantizationError(f"{name}: expert {what} shape {tuple(loaded.shape)} != {want}{grid}")

    def _expert(self, shard_id, what: str) -> tuple[int | None, int | None]:
        """(this rank's index of the expert or None when another rank holds it, part)."""
        if not isinstance(shard_id, tuple):
            raise QuantizationError(f"Fp8FusedMoE.{what}: expected one expert's 2-D tensor "
                                    "(mlp.experts.<e>.<gate|up|down>_proj), got a fused one")
        e, part = shard_id
        local = e - self.first_expert
        return (local if 0 <= local < self.num_local_experts else None), part

    def _load_fp8_gate_up(self, param, loaded, shard_id=None) -> None:
        le, part = self._expert(shard_id, "gate_up_proj")
        self._check_shape(loaded, part, scale=False)
        if le is None:
            return
        n = self.local_inter
        rows = materialize(loaded.narrow(0, self.tp.moe_tp_rank * n, n))
        param.data[le, part * n : (part + 1) * n].copy_(rows)

    def _load_fp8_down(self, param, loaded, shard_id=None) -> None:
        le, part = self._expert(shard_id, "down_proj")
        self._check_shape(loaded, part, scale=False)
        if le is not None:
            n = self.local_inter
            param.data[le].copy_(materialize(loaded.narrow(1, self.tp.moe_tp_rank * n, n)))

    def _load_gate_up_scale(self, param, loaded, shard_id=None) -> None:
        le, part = self._expert(shard_id, "gate_up_proj scale")
        self._check_shape(loaded, part, scale=True)
        if le is None:
            return
        n, g, bn = self.local_inter, self.block13[0], self.block[0]
        full = materialize(loaded).float()
        groups = (self.tp.moe_tp_rank * n + torch.arange(0, n, g)) // bn  # checkpoint row block of each group
        param.data[le, part * (n // g) : (part + 1) * (n // g)].copy_(full[groups])

    def _load_down_scale(self, param, loaded, shard_id=None) -> None:
        le, part = self._expert(shard_id, "down_proj scale")
        self._check_shape(loaded, part, scale=True)
        if le is None:
            return
        n, g, bk = self.local_inter, self.block2[1], self.block[1]
        full = materialize(loaded).float()
        param.data[le].copy_(full[:, (self.tp.moe_tp_rank * n + torch.arange(0, n, g)) // bk])

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        y = fp8_experts_product(self, x, topk_weights, self.local_ids(topk_ids))
        return tensor_model_parallel_all_reduce(y, self.tp)


def fp8_experts_product(layer: FusedMoE, x: torch.Tensor, topk_weights: torch.Tensor,
                        local_ids: torch.Tensor) -> torch.Tensor:
    """This rank's partial sum over its block-FP8 experts (ids already local; -1 for other ranks')."""
    from sgl_kernel.moe import fused_experts_fp8

    return fused_experts_fp8(x, layer.gate_up_proj, layer.gate_up_proj_scale_inv, layer.down_proj,
                             layer.down_proj_scale_inv, topk_weights, local_ids, layer.block13, layer.block2,
                             has_remote=layer.tp.ep_size > 1)


def _quantize_experts(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, rows, cols] float -> (e4m3 [E, rows, cols], float32 scales [E, ceil(rows/bn), ceil(cols/bk)])."""
    from sgl_kernel.quantization import quantize_weight_block_fp8

    pairs = [quantize_weight_block_fp8(w[e], block) for e in range(w.shape[0])]
    return torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])


class Fp8MoEMethod:
    """`--quantization fp8` for a float experts layer (FusedMoE or a subclass with its own checkpoint
    layout): set as the layer's `quant_method`, it quantizes the loaded experts in place of their float
    parameters, then computes the block-FP8 product.

    Blocks are of the local tensors (each rank quantizes what it holds, so no TP size is refused): gate_up
    keeps one scale per gcd(bn, n) rows, so no scale spans the gate/up boundary and the grid is the one a
    -FP8 checkpoint loads to (the same GPU kernel configurations apply); down one per bn x bk block."""

    def __init__(self, block: tuple[int, int] = (128, 128)):
        self.block = block

    def process_weights_after_loading(self, layer: FusedMoE) -> None:
        bn, bk = self.block
        layer.block13, layer.block2 = (gcd(bn, layer.local_inter), bk), (bn, bk)
        for name, block in (("gate_up_proj", layer.block13), ("down_proj", layer.block2)):
            q, scale = _quantize_experts(getattr(layer, name).data, block)
            setattr(layer, name, nn.Parameter(q, requires_grad=False))  # the float tensor is freed here
            setattr(layer, f"{name}_scale_inv", nn.Parameter(scale, requires_grad=False))

    def apply(self, layer: FusedMoE, x: torch.Tensor, topk_weights: torch.Tensor, local_ids: torch.Tensor):
        return fp8_experts_product(layer, x, topk_weights, local_ids)


def build_experts(cls: type[FusedMoE], num_experts: int, hidden_size: int, intermediate_size: int, tp, dtype,
                  quant, prefix: str) -> FusedMoE:
    """A MoE block's experts: float `cls` (a FusedMoE with the model's checkpoint layout), a -FP8 checkpoint's
    (one e4m3 linear per expert: Fp8FusedMoE), or float `cls` quantized after loading (--quantization fp8:
    Fp8MoEMethod). `quant`: the model's Fp8Config or None; experts whose `prefix` (`model.layers.N.mlp.experts`)
    a checkpoint lists in modules_to_not_convert stay float."""
    if quant is None or quant.method_for(prefix) is None:
        return cls(num_experts, hidden_size, intermediate_size, tp, dtype)
    if quant.serialized:
        return Fp8FusedMoE(num_experts, hidden_size, intermediate_size, tp, dtype, quant.block)
    experts = cls(num_experts, hidden_size, intermediate_size, tp, dtype)
    experts.quant_method = Fp8MoEMethod(quant.block)
    return experts
