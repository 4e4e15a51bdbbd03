"""Our video preprocessing against transformers' own video processors, whole tensors: prompt token ids,
pixel_values_videos, video_grid_thw and (Qwen2.5-VL) second_per_grid_ts for clips of odd sizes and
rates. transformers' video processors need torchvision, which is never installed on CPU machines (its
index builds are CUDA-only and break transformers' image processors there): this runs where torchvision
imports, i.e. the GPU machines' `gpu_check.sh --stage tests`, and is skipped elsewhere. Frames are
generated arrays (RawVideo), so PyAV is not needed; decoding is tested on its own (test_video_io.py).

Qwen2.5-VL is asked to sample at 2 fps (`do_sample_frames=True, fps=2`): transformers' Qwen2-VL video
processor samples nothing by default, and this engine samples at 2 fps (docs/video.md)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")
pytest.importorskip("torchvision")

from transformers.video_utils import VideoMetadata  # noqa: E402

from sglang.srt.multimodal.mm_types import Modality  # noqa: E402
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor  # noqa: E402
from sglang.srt.multimodal.video_io import RawVideo  # noqa: E402
from sglang.testing.sample_video import bar_frames  # noqa: E402

# (frames, fps, width, height)
CLIPS = [(25, 10.0, 131, 97), (30, 30.0, 67, 45), (48, 12.0, 200, 120), (9, 5.0, 33, 181)]
MODELS = ("qwen3-vl-tiny", "qwen2.5-vl-tiny")


def _hf_call_kwargs(name: str, hf_processor) -> dict:
    kw = {"return_tensors": "pt", "do_sample_frames": True}
    if "qwen2" in name:
        kw["fps"] = 2.0
    vp = getattr(hf_processor, "video_processor", hf_processor)
    if hasattr(type(vp), "cap_pixels_per_frame"):  # transformers >= 5.20: keep the uncapped default explicit
        kw["cap_pixels_per_frame"] = False
    return kw


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("n,fps,w,h", CLIPS)
def test_prompt_ids_and_video_tensors_equal_transformers(tiny_model_dir, name, n, fps, w, h):
    path = str(tiny_model_dir(name))
    hf = transformers.AutoProcessor.from_pretrained(path)
    tok = hf.tokenizer
    frames = bar_frames(w, h, n, seed=n)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "clip:"}, {"type": "video"},
                                         {"type": "text", "text": "what moves?"}]}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ref = hf(text=[text], videos=[frames], video_metadata=[VideoMetadata(total_num_frames=n, fps=fps)],
             **_hf_call_kwargs(name, hf))

    ours = QwenVLProcessor.from_pretrained(path, tok)
    ids, mm = ours.process(tok.encode(text, add_special_tokens=False), [], videos=[RawVideo(frames, fps)])
    (video,) = [it for it in mm.mm_items if it.modality == Modality.VIDEO]

    assert ids == ref["input_ids"][0].tolist()
    assert list(video.image_grid_thw) == ref["video_grid_thw"][0].tolist()
    theirs = ref["pixel_values_videos"].float()
    assert video.feature.shape == theirs.shape
    diff = (video.feature - theirs).abs()
    step = 1 / 255 / min(ours.video_processor.image_std)  # one uint8 level after normalization
    print(f"\n{name} {n}@{fps} {w}x{h}: max |diff| {diff.max().item():.2e}, "
          f"{(diff > 1e-5).float().mean().item():.2%} of values differ")
    assert diff.max().item() <= 1.01 * step  # resampling may round one level apart, never more
    assert (diff > 1e-5).float().mean().item() < 0.01
    if "qwen2" in name:
        assert video.model_specific_data["second_per_grid_t"] == pytest.approx(float(ref["second_per_grid_ts"][0]))
