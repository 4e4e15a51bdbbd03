"""Per-request options the request builder honours or refuses, never ignores: `priority` (only under
priority scheduling) and the image processor settings of `mm_processor_kwargs` / `images_config`."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.request_builder import RequestBuilder
from sglang.srt.managers.request_validation import check_priority
from sglang.srt.server_args import ServerArgs

PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def model_path(tiny_model_dir):
    return str(tiny_model_dir("qwen3-vl-tiny"))


@pytest.fixture
def build(model_path, monkeypatch):
    monkeypatch.setenv("SGLANG_MM_SHM_TRANSPORT", "0")  # pixels inline: no segments without a scheduler
    builders = []

    def run(obj: GenerateReqInput, **server):
        builder = RequestBuilder(ServerArgs(model_path=model_path, **server), model_path)
        builders.append(builder)
        return builder.build(builder.check(obj, "rid-1"))[0]

    yield run
    for b in builders:
        b.close()


def _image(w=640, h=480):
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _req(**kw) -> GenerateReqInput:
    return GenerateReqInput(text="see " + PLACEHOLDER, image_data=[_image()], sampling_params={"max_new_tokens": 2},
                            **kw)


def test_a_requests_max_pixels_shrinks_its_images_and_only_its_own(build):
    full = build(_req())
    small = build(_req(mm_processor_kwargs={"max_pixels": 128 * 128}))
    (_, gh, gw), (_, sh, sw) = full.mm_inputs.mm_items[0].image_grid_thw, small.mm_inputs.mm_items[0].image_grid_thw
    assert sh * sw < gh * gw and sh * sw * 16 * 16 <= 128 * 128
    assert len(small.input_ids) < len(full.input_ids)  # fewer image tokens in the prompt
    again = build(_req(mm_processor_kwargs={"max_pixels": 128 * 128}, mm_kwargs_name="images_config"))
    assert again.mm_inputs.mm_items[0].image_grid_thw == (1, sh, sw)
    assert build(_req()).mm_inputs.mm_items[0].image_grid_thw == (1, gh, gw)  # the server's config untouched


@pytest.mark.parametrize("obj, phrase", [
    (_req(mm_processor_kwargs={"max_pixels": 128 * 128, "do_resize": False}, mm_kwargs_name="images_config"),
     "images_config.do_resize is not supported"),
    (_req(mm_processor_kwargs={"min_pixels": -1}), "mm_processor_kwargs.min_pixels must be a positive integer"),
    (GenerateReqInput(text="no images here", mm_processor_kwargs={"num_crops": 1}), "mm_processor_kwargs.num_crops is not supported"),
    (GenerateReqInput(text="no images here", mm_processor_kwargs={"fps": 0}), "mm_processor_kwargs.fps must be"),
    (_req(priority=3), "priority is not honoured by this server: start it with --enable-priority-scheduling"),
])
def test_what_cannot_be_honoured_is_a_400_naming_it(build, obj, phrase):
    with pytest.raises(GenerateError) as e:
        build(obj)
    assert phrase in e.value.message and e.value.status_code == 400


def test_priority_reaches_the_scheduler_message_under_priority_scheduling(build):
    assert build(_req(priority=7), enable_priority_scheduling=True).priority == 7
    assert build(_req(priority=-2), schedule_policy="priority").priority == -2
    assert build(_req(), enable_priority_scheduling=True).priority == 0  # none given: the default level


@pytest.mark.parametrize("value", ["high", 1.5, True])
def test_priority_must_be_an_integer(value):
    with pytest.raises(GenerateError, match="priority must be an integer"):
        check_priority(value, ServerArgs(enable_priority_scheduling=True))
