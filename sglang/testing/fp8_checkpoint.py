"""Converts an HF-format Qwen-VL checkpoint folder to the layout of Qwen's -FP8 releases, and back.

The released layout: every text decoder linear (q/k/v/o_proj, gate/up/down_proj) stores an e4m3 `weight`
and a float32 `weight_scale_inv` with one scale per 128x128 block (multiplied: W ~= weight * scale; tiny
presets: 16x16, so their scales are several blocks per axis too);
MoE experts (fused in the bf16 releases) are stored one linear per expert, `mlp.experts.<e>.{gate,up,down}_proj`,
each with its block scales, and the router `mlp.gate` stays unquantized; a shared expert's (Qwen3.5-MoE)
`mlp.shared_expert.{gate,up,down}_proj` are quantized, its one-row `mlp.shared_expert_gate` is not; the vision
tower, the embeddings and lm_head stay in the original dtype and are listed in
`quantization_config.modules_to_not_convert`; `config.json` carries

    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128], "modules_to_not_convert": [...]}

The fused expert layout differs by family (EXPERT_LAYOUTS, read from config.json's model_type): Qwen3-VL-MoE
stores gate_up [E, H, 2I] and down [E, I, H] (transposed), Qwen3.5-MoE gate_up [E, 2I, H] and down [E, H, I]
(transformers' parameter layout); both split to the same per-expert [I, H] / [H, I] linears.

`quantize_folder` rewrites a folder in place, one safetensors file at a time (make_model --quantize fp8
builds replicas of the -FP8 releases with it); `dequantize_folder` writes the float32 model an FP8
folder stands for, which transformers then runs as the reference.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sgl_kernel.quantization import dequantize_block_fp8, quantize_weight_block_fp8

BLOCK = (128, 128)
# tiny presets' widths are under 128: one scale per whole matrix would hide every block-indexing error, so
# their blocks shrink with them (the smallest group the engine's FP8 layers take), giving several per axis
TINY_BLOCK = (16, 16)
QUANT_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(BLOCK)}
# the text decoder's linears; the vision tower's own names (qkv, proj, linear_fc*, mlp.*) never match
# Qwen3.5's Gated DeltaNet: its three large projections; in_proj_a / in_proj_b (one row per value head) stay
_TEXT_LINEAR = re.compile(r"(?:^|\.)layers\.\d+\.(?:self_attn\.[qkvo]_proj"
                          r"|mlp\.(?:shared_expert\.|experts\.\d+\.)?(?:gate|up|down)_proj"
                          r"|linear_attn\.(?:in_proj_qkv|in_proj_z|out_proj))\.weight$")
_INDEX = "model.safetensors.index.json"
# the decoder layers' fused experts (the bf16 releases'): gate_up_proj and down_proj, [E, ...] each
_FUSED_EXPERTS = re.compile(r"(?:^|\.)layers\.\d+\.mlp\.experts\.(?:gate_up_proj|down_proj)$")
_EXPERT_LINEAR = re.compile(r"^(.*\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
# model_type -> whether its fused experts are transposed against a linear's [out, in]: True for Qwen3-VL-MoE's
# gate_up [E, H, 2I] / down [E, I, H], False for Qwen3.5-MoE's gate_up [E, 2I, H] / down [E, H, I]
EXPERT_LAYOUTS = {"qwen3_vl_moe": True, "qwen3_5_moe": False}


def experts_transposed(model_type: str | None) -> bool:
    """The fused expert layout of `model_type`; refused by name for a family whose layout is not known
    (a square shape would split silently wrong)."""
    if model_type not in EXPERT_LAYOUTS:
        raise ValueError(f"fused MoE experts of model_type {model_type!r}: layout unknown "
                         f"(known: {', '.join(EXPERT_LAYOUTS)})")
    return EXPERT_LAYOUTS[model_type]


def split_experts(name: str, t: torch.Tensor, transposed: bool = True) -> dict[str, torch.Tensor]:
    """A fused expert tensor as the -FP8 releases store experts: one 2-D linear per expert,
    `<...>.experts.<e>.{gate,up,down}_proj.weight` ([I, H], [I, H], [H, I]). `transposed`: the fused
    tensor is Qwen3-VL-MoE's [E, H, 2I] / [E, I, H]; else Qwen3.5-MoE's [E, 2I, H] / [E, H, I]."""
    prefix, kind = name.rsplit(".", 1)
    if t.dim() != 3:
        raise ValueError(f"{name}: a fused expert tensor is 3-D [E, ...], got {tuple(t.shape)}")
    linears = t.transpose(1, 2) if transposed else t  # [E, out, in] either way
    if kind == "gate_up_proj":
        i = linears.shape[1] // 2
        return {f"{prefix}.{e}.{part}_proj.weight": linears[e, s].contiguous()
                for e in range(t.shape[0]) for part, s in (("gate", slice(0, i)), ("up", slice(i, 2 * i)))}
    return {f"{prefix}.{e}.down_proj.weight": linears[e].contiguous() for e in range(t.shape[0])}


def fuse_experts(tensors: dict[str, torch.Tensor], transposed: bool = True) -> dict[str, torch.Tensor]:
    """The inverse of split_experts over one file's tensors (a layer's experts never span files here)."""
    groups: dict[str, dict[tuple[int, str], torch.Tensor]] = {}
    out = {}
    for name, t in tensors.items():
        m = _EXPERT_LINEAR.match(name)
        if m:
            groups.setdefault(m.group(1), {})[int(m.group(2)), m.group(3)] = t
        else:
            out[name] = t
    for prefix, parts in groups.items():
        num = 1 + max(e for e, _ in parts)
        gate_up = torch.stack([torch.cat([parts[e, "gate"], parts[e, "up"]]) for e in range(num)])
        down = torch.stack([parts[e, "down"] for e in range(num)])
        if transposed:
            gate_up, down = gate_up.transpose(1, 2).contiguous(), down.transpose(1, 2).contiguous()
        out[f"{prefix}.gate_up_proj"], out[f"{prefix}.down_proj"] = gate_up, down
    return out


def is_quantized_linear(name: str) -> bool:
    return bool(_TEXT_LINEAR.search(name)) and "visual" not in name


def _files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def _rewrite(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    tmp = path.with_name(path.name + ".partial")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path)


def _update_index(folder: Path, names_by_file: dict[str, list[str]]) -> None:
    index_path = folder / _INDEX
    if not index_path.exists():
        return
    index = json.loads(index_path.read_text())
    weight_map = {n: f for f, names in names_by_file.items() for n in names}
    total = 0
    for path in _files(folder):
        with safe_open(str(path), framework="pt") as f:
            for n in f.keys():
                t = f.get_slice(n)
                numel = 1
                for d in t.get_shape():
                    numel *= d
                total += numel * _itemsize(t.get_dtype())
    index["weight_map"] = dict(sorted(weight_map.items()))
    index.setdefault("metadata", {})["total_size"] = total
    index_path.write_text(json.dumps(index, indent=2) + "\n")


def _itemsize(st_dtype: str) -> int:
    return {"F8_E4M3": 1, "F8_E5M2": 1, "BF16": 2, "F16": 2, "F32": 4, "I64": 8, "I32": 4}[st_dtype]


def quantize_folder(folder: str | os.PathLike, block: tuple[int, int] = BLOCK) -> list[str]:
    """Rewrites `folder` in the -FP8 layout with `block`-sized scale blocks; returns the names of the
    quantized weights."""
    folder = Path(folder)
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    quantized, kept, names_by_file = [], [], {}
    for path in _files(folder):
        out: dict[str, torch.Tensor] = {}
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                if _FUSED_EXPERTS.search(name):  # MoE experts: one quantized linear per expert
                    for part, w in split_experts(name, t, experts_transposed(cfg.get("model_type"))).items():
                        q, scale = quantize_weight_block_fp8(w, block)
                        out[part], out[part[: -len("weight")] + "weight_scale_inv"] = q, scale
                    quantized.append(name)
                elif is_quantized_linear(name):
                    q, scale = quantize_weight_block_fp8(t, block)
                    out[name], out[name[: -len("weight")] + "weight_scale_inv"] = q, scale
                    quantized.append(name)
                else:
                    out[name] = t
                    if name.endswith(".weight") and t.dim() == 2 and "embed" not in name:
                        kept.append(name[: -len(".weight")])
        _rewrite(path, out)
        names_by_file[path.name] = list(out)
    if not quantized:
        raise ValueError(f"{folder}: no text decoder linear to quantize")
    _update_index(folder, names_by_file)
    cfg["quantization_config"] = {**QUANT_CONFIG, "weight_block_size": list(block), "modules_to_not_convert": sorted(kept)}
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return quantized


def dequantize_folder(src: str | os.PathLike, dst: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Path:
    """Writes to `dst` the `dtype` model that the FP8 folder `src` stands for (every weight with its
    scale multiplied in; other files copied), without quantization_config."""
    import shutil

    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file() and item.suffix != ".safetensors" and item.name != _INDEX:
            shutil.copy2(item, dst / item.name)
    src_cfg = json.loads((src / "config.json").read_text())
    block = tuple(src_cfg["quantization_config"]["weight_block_size"])
    model_type = src_cfg.get("model_type")
    names_by_file = {}
    for path in _files(src):
        out = {}
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            for name in keys:
                if name.endswith("weight_scale_inv"):
                    continue
                t = f.get_tensor(name)
                scale_name = name[: -len("weight")] + "weight_scale_inv"
                if name.endswith(".weight") and scale_name in keys:
                    t = dequantize_block_fp8(t, f.get_tensor(scale_name), block, dtype)
                out[name] = t.to(dtype) if t.is_floating_point() else t
        if any(_EXPERT_LINEAR.match(n) for n in out):  # back to the family's fused layout (a dense model has none)
            out = fuse_experts(out, experts_transposed(model_type))
        save_file(out, str(dst / path.name), metadata={"format": "pt"})
        names_by_file[path.name] = list(out)
    if (src / _INDEX).exists():
        shutil.copy2(src / _INDEX, dst / _INDEX)
        _update_index(dst, names_by_file)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.pop("quantization_config", None)
    for section in (cfg, cfg.get("text_config", {}), cfg.get("vision_config", {})):
        if "torch_dtype" in section or "dtype" in section:
            section["dtype" if "dtype" in section else "torch_dtype"] = str(dtype).removeprefix("torch.")
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return dst


def quantization_config_for(names_and_dims, block: tuple[int, int] = BLOCK) -> dict:
    """The `quantization_config` `quantize_folder` would write for a checkpoint of these (name, ndim)
    tensors, without reading any tensor (make_model --config-only --quantize fp8)."""
    kept = sorted(n[: -len(".weight")] for n, dim in names_and_dims
                  if not _FUSED_EXPERTS.search(n) and not is_quantized_linear(n)
                  and n.endswith(".weight") and dim == 2 and "embed" not in n)
    return {**QUANT_CONFIG, "weight_block_size": list(block), "modules_to_not_convert": kept}
