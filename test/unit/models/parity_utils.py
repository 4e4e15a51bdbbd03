"""Shared helpers for comparing our models with transformers on the same weights."""

from __future__ import annotations

import json
import os

import numpy as np
import torch
from PIL import Image

from sglang.srt.environ import envs
from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig
from sglang.srt.model_executor.static_batch import StaticBatchRunner, StaticSeq
from sglang.srt.multimodal.mm_types import Modality
from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor

IMAGE_PAD, VISION_START, VISION_END, VIDEO_PAD = 151655, 151652, 151653, 151656
PLACEHOLDER = [VISION_START, IMAGE_PAD, VISION_END]
# SGLANG_TEST_DEVICE=cuda runs the parity tests on the GPU: ours and transformers on the same device.
TEST_DEVICE = envs.SGLANG_TEST_DEVICE.get()
# Float32 parity means float32 on both sides: on CUDA, cuDNN convolutions (transformers' Conv3d patch
# embedding) default to TF32, about 1e-3 relative over a vision tower (seen on an H200, 2026-11-26).
torch.backends.cudnn.allow_tf32 = False


def noise_image(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def small_processor(model_path: str, patch: int, mean, std) -> QwenVLProcessor:
    """Tight pixel limits so images stay a few dozen tokens on CPU (a thin strip still hits min)."""
    factor = patch * 2
    ip = QwenVLImageProcessor(
        patch_size=patch, image_mean=mean, image_std=std, min_pixels=4 * factor * factor, max_pixels=48 * factor * factor
    )
    with open(os.path.join(model_path, "config.json")) as f:
        cfg = json.load(f)
    return QwenVLProcessor(None, ip, model_type=cfg["model_type"])


def hf_inputs(hf_model, input_ids: list[int], items) -> dict:
    """transformers' forward/generate inputs on the reference model's device and dtype."""
    dev = hf_model.device
    ids = torch.tensor([input_ids], device=dev)
    kwargs = {"input_ids": ids, "mm_token_type_ids": (ids == IMAGE_PAD).long()}
    if items:
        kwargs["pixel_values"] = torch.cat([torch.as_tensor(it.feature) for it in items]).to(dev, hf_model.dtype)
        kwargs["image_grid_thw"] = torch.tensor([list(it.image_grid_thw) for it in items], device=dev)
    return kwargs


def hf_kwargs(hf, ids, mm) -> dict:
    """transformers' inputs for a prompt with images and videos (float32 pixel values: the baseline's items)."""
    dev = hf.device
    t = torch.tensor([ids], device=dev)
    kw = {"input_ids": t, "mm_token_type_ids": (t == IMAGE_PAD).long() + 2 * (t == VIDEO_PAD).long()}
    imgs = [it for it in mm.mm_items if it.modality == Modality.IMAGE]
    vids = [it for it in mm.mm_items if it.modality == Modality.VIDEO]
    if imgs:
        kw["pixel_values"] = torch.cat([torch.as_tensor(it.feature) for it in imgs]).to(dev, hf.dtype)
        kw["image_grid_thw"] = torch.tensor([list(it.image_grid_thw) for it in imgs], device=dev)
    if vids:
        kw["pixel_values_videos"] = torch.cat([it.feature for it in vids]).to(dev, hf.dtype)
        kw["video_grid_thw"] = torch.tensor([list(it.image_grid_thw) for it in vids], device=dev)
        if "qwen2" in hf.config.model_type:
            kw["second_per_grid_ts"] = torch.tensor([it.model_specific_data["second_per_grid_t"] for it in vids],
                                                    device=dev)
    return kw


def hf_logits(hf_model, input_ids: list[int], items) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(**hf_inputs(hf_model, input_ids, items)).logits[0].float().cpu()


def make_runner(model_path: str, dtype: str = "float32", device: str = TEST_DEVICE,
                quantization: str | None = None, kv_cache_dtype: str = "auto") -> tuple[ModelRunner, StaticBatchRunner]:
    # Triton attention on CUDA takes float32 dots as TF32 by default (--attention-fp32-precision); the
    # 1e-4 parity bound needs exact float32 dots
    runner = ModelRunner(
        ModelRunnerConfig(model_path=model_path, dtype=dtype, device=device, max_total_tokens=4096, max_running_requests=8,
                          context_length=2048, quantization=quantization, kv_cache_dtype=kv_cache_dtype,
                          attention_fp32_precision="ieee")
    )
    return runner, StaticBatchRunner(runner)


def our_logits(sb: StaticBatchRunner, prompts, chunk_size: int | None = None) -> list[torch.Tensor]:
    seqs = [StaticSeq(ids, mm) for ids, mm in prompts]
    try:
        _, full = sb.extend(seqs, chunk_size=chunk_size, return_all_logits=True)
    finally:
        sb.release(seqs)
    return full


def our_greedy(sb: StaticBatchRunner, ids: list[int], mm, n: int = 8) -> list[int]:
    """Our greedy continuation of one prompt, n tokens (its KV slots released after)."""
    seq = StaticSeq(ids, mm)
    try:
        return sb.generate_greedy([seq], max_new_tokens=n)[0]
    finally:
        sb.release([seq])


def hf_greedy(hf_model, kwargs: dict, n: int = 8) -> list[int]:
    """transformers' greedy `generate` from `kwargs` (hf_inputs / hf_kwargs): exactly n new tokens."""
    with torch.no_grad():
        out = hf_model.generate(**kwargs, attention_mask=torch.ones_like(kwargs["input_ids"]), max_new_tokens=n,
                                min_new_tokens=n, do_sample=False)
    return out[0, kwargs["input_ids"].shape[1]:].tolist()


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    ours, ref = ours.float().cpu(), ref.float().cpu()
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def runners_with_switch(path: str, env_var: str) -> dict:
    """{False: runner with `env_var`=0, True: runner with it =1} on the same checkpoint (switches are
    read when the model is built)."""
    import pytest

    runners = {}
    for on in (False, True):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(env_var, "1" if on else "0")
            runners[on] = make_runner(path)
    return runners


def fp8_float_activations(self, layer, x):
    """Fp8LinearMethod.apply with the activations left unquantized (monkeypatched in): an FP8 model then
    equals the float model its checkpoint stands for, every weight and block scale in its place."""
    from sgl_kernel.quantization import dequantize_block_fp8

    w = dequantize_block_fp8(layer.weight, layer.weight_scale_inv, layer.fp8_block)
    return (x.float() @ w.t()).to(x.dtype)
