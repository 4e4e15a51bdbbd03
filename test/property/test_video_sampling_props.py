"""Property tests: for any frame count, stream rate and request setting, our video frame sampling equals
transformers' own `sample_frames` (Qwen3-VL and Qwen2-VL, compiled from the installed sources), indices
stay inside the stream and ascend, and Qwen3-VL's clip-wide resize equals
transformers' `smart_resize`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

transformers = pytest.importorskip("transformers")

from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as hf_qwen3_smart_resize  # noqa: E402
from transformers.video_utils import VideoMetadata  # noqa: E402

from sglang.srt.multimodal.processors.base import MultimodalInputError  # noqa: E402
from sglang.srt.multimodal.processors.qwen_video import QwenVLVideoProcessor  # noqa: E402
from sglang.testing.hf_video import QWEN2_VIDEO, QWEN3_VIDEO, hf_processor_self, hf_video_method  # noqa: E402

HF_SAMPLE = {"qwen3": hf_video_method(QWEN3_VIDEO, "sample_frames"), "qwen2": hf_video_method(QWEN2_VIDEO, "sample_frames")}

totals = st.integers(min_value=2, max_value=6000)
rates = st.floats(min_value=1.0, max_value=120.0, allow_nan=False)
request = st.fixed_dictionaries({}, optional={"fps": st.floats(min_value=0.1, max_value=8.0),
                                              "max_frames": st.integers(4, 64)})


@settings(max_examples=300, deadline=None)
@given(family=st.sampled_from(["qwen3", "qwen2"]), total=totals, video_fps=rates, req=request)
def test_sampling_equals_transformers(family, total, video_fps, req):
    ours = QwenVLVideoProcessor.defaults(family).for_request(req, "kw")
    try:
        idx = ours.sample_indices(total, video_fps)
    except MultimodalInputError:
        assume(False)  # too few frames for a pair: refused by us, an error in transformers too
    ref = np.asarray(HF_SAMPLE[family](hf_processor_self(**req), VideoMetadata(total_num_frames=total, fps=video_fps)))
    # transformers' float32 arange can overshoot past the last frame (its indexing then fails); we drop that index
    assert idx.tolist() == ref[ref < total].tolist()
    assert len(idx) >= 1 and idx.min() >= 0 and idx.max() < total and (np.diff(idx) >= 0).all()
    assert len(idx) <= ours.max_frames


@settings(max_examples=300, deadline=None)
@given(n=st.integers(2, 200), h=st.integers(1, 4000), w=st.integers(1, 4000))
def test_qwen3_clip_resize_equals_transformers(n, h, w):
    assume(max(h, w) / min(h, w) <= 150)
    ours = QwenVLVideoProcessor.defaults("qwen3")
    ref = hf_qwen3_smart_resize(n, h, w, temporal_factor=2, factor=32, min_pixels=ours.min_pixels,
                                max_pixels=ours.max_pixels)
    assert ours.resized_size(n, h, w) == ref
    t, gh, gw = ours.grid_thw(n, h, w)
    assert t == (n + 1) // 2 and gh % 2 == 0 and gw % 2 == 0
