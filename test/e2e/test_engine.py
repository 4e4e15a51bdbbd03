"""The offline `sglang.Engine` in this process: generate (single, batch, stream, images), errors,
control calls, and a shutdown that leaves no child process or ipc directory behind."""

from __future__ import annotations

import asyncio

import os

import pytest

import sglang
from conftest import CASES, TEST_DEVICE, build_case, pid_alive, wait_until
from sglang.srt.errors import GenerateError

MAX_NEW = 12


@pytest.fixture(scope="module")
def engine(model_dir):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")  # read by the spawned children only; see conftest.ServerProcess
        e = sglang.Engine(model_path=str(model_dir), dtype="float32", device=TEST_DEVICE, log_level="warning",
                          max_total_tokens=1024)
    yield e
    e.shutdown()


@pytest.mark.parametrize("case", ["text_only", "three_images_mixed_sizes"])
def test_generate_messages_match_transformers(engine, hf_ref, case):
    _, tmpl, images = build_case(CASES[case])
    out = engine.generate(messages=tmpl, image_data=images, sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0})
    assert out["output_ids"] == hf_ref.greedy(case, tmpl, images, MAX_NEW)
    assert out["meta_info"]["prompt_tokens"] == len(hf_ref.prompt(tmpl, images)[0])


def test_batch_stream_and_early_stop(engine):
    params = {"max_new_tokens": 6, "temperature": 0}
    batch = engine.generate(["Hello there", "General Kenobi"], sampling_params=params)
    singles = [engine.generate(p, sampling_params=params) for p in ["Hello there", "General Kenobi"]]
    assert [b["output_ids"] for b in batch] == [s["output_ids"] for s in singles]
    chunks = list(engine.generate("Hello there", sampling_params=params, stream=True))
    assert chunks[-1]["text"] == singles[0]["text"] and chunks[-1]["meta_info"]["finish_reason"] is not None
    stream = engine.generate("Hello there", sampling_params={"max_new_tokens": 1000, "ignore_eos": True}, stream=True)
    next(stream)
    stream.close()  # aborts the request in the scheduler
    info = engine.get_server_info()
    assert info["num_running_reqs"] + info["num_waiting_reqs"] <= 1
    assert engine.flush_cache() in (True, False)


def test_stream_of_a_batch_and_of_n_samples_tags_each_chunk_with_its_request(engine):
    params = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    prompts = ["Hello there", "General Kenobi"]
    finals = {}
    for chunk in engine.generate(prompts, sampling_params=params, stream=True):
        finals[chunk["index"]] = chunk  # cumulative: the last chunk of each index holds its whole output
    assert sorted(finals) == [0, 1]
    for i, p in enumerate(prompts):
        assert finals[i]["output_ids"] == engine.generate(p, sampling_params=params)["output_ids"]
        assert finals[i]["meta_info"]["finish_reason"] is not None
    sampled = {**params, "n": 2, "temperature": 1.0, "sampling_seed": 3}
    by_index = {}
    for chunk in engine.generate("Hello there", sampling_params=sampled, stream=True):
        by_index[chunk["index"]] = chunk["output_ids"]
    assert [by_index[0], by_index[1]] == [o["output_ids"] for o in engine.generate("Hello there", sampling_params=sampled)]


def test_async_generate_from_the_callers_event_loop(engine):
    params = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    prompts = ["Hello there", "General Kenobi"]

    async def main():
        beat = 0

        async def heartbeat():  # the caller's loop keeps running while the engine works
            nonlocal beat
            while True:
                beat += 1
                await asyncio.sleep(0.001)

        hb = asyncio.ensure_future(heartbeat())
        one, both = await asyncio.gather(engine.async_generate(prompts[0], sampling_params=params),
                                         engine.async_generate(prompts, sampling_params=params))
        chunks = [c async for c in await engine.async_generate(prompts[1], sampling_params=params, stream=True)]
        early = await engine.async_generate(prompts[0], sampling_params={"max_new_tokens": 1000, "ignore_eos": True},
                                            stream=True)
        await early.__anext__()
        await early.aclose()  # aborts the request
        hb.cancel()
        return one, both, chunks, beat

    one, both, chunks, beat = asyncio.run(main())
    singles = [engine.generate(p, sampling_params=params)["output_ids"] for p in prompts]
    assert one["output_ids"] == singles[0] and [b["output_ids"] for b in both] == singles
    assert chunks[-1]["output_ids"] == singles[1] and chunks[-1]["meta_info"]["finish_reason"] is not None
    assert beat > 1

    def idle():
        info = engine.get_server_info()
        return info["num_running_reqs"] + info["num_waiting_reqs"] == 0

    wait_until(idle, 30, what="the abandoned stream's request to end")


def test_upstream_logprob_keywords(engine):
    out = engine.generate("Hello there", sampling_params={"max_new_tokens": 2, "temperature": 0},
                          return_logprob=True, logprob_start_len=1, top_logprobs_num=2)
    meta = out["meta_info"]
    assert len(meta["output_token_logprobs"]) == 2 and len(meta["output_top_logprobs"][0]) == 2
    whole = engine.generate("Hello there", sampling_params={"max_new_tokens": 1}, return_logprob=True,
                            logprob_start_len=0)["meta_info"]["input_token_logprobs"]
    assert whole[0][0] is None and len(meta["input_token_logprobs"]) == len(whole) - 1
    for (lp, tok, _), (ref_lp, ref_tok, _) in zip(meta["input_token_logprobs"], whole[1:]):
        assert tok == ref_tok and abs(lp - ref_lp) < 1e-5


def test_bad_input_raises_with_status(engine):
    with pytest.raises(GenerateError, match="temperature") as e:
        engine.generate("hi", sampling_params={"temperature": -1})
    assert e.value.status_code == 400
    with pytest.raises(GenerateError, match="placeholder"):
        engine.generate("no placeholder here", image_data=build_case(CASES["one_image"])[2])
    with pytest.raises(GenerateError, match="KV cache holds 1024"):
        engine.generate(input_ids=[100] * 1500)


def test_priority_and_image_settings_as_on_generate(engine):
    """Engine.generate takes /generate's priority and image settings: priority without priority
    scheduling is refused naming it; images_config / mm_processor_kwargs max_pixels shrinks the image's
    tokens; both at once are refused."""
    with pytest.raises(GenerateError, match="priority"):
        engine.generate("hi", sampling_params={"max_new_tokens": 1}, priority=3)
    messages, _, _ = build_case(CASES["one_image"])
    full = engine.generate(messages=messages, sampling_params={"max_new_tokens": 1})["meta_info"]
    for key in ("images_config", "mm_processor_kwargs"):
        small = engine.generate(messages=messages, sampling_params={"max_new_tokens": 1},
                                **{key: {"max_pixels": 64 * 64}})["meta_info"]
        assert small["prompt_tokens"] < full["prompt_tokens"], key
    with pytest.raises(ValueError, match="not both"):
        engine.generate(messages=messages, images_config={}, mm_processor_kwargs={})


def test_generate_with_video_data(engine, hf_ref):
    """video_data on Engine.generate: an encoded clip (bytes), a RawVideo (decoded frames + rate) and a
    list of frames, mixed with an image; greedy tokens equal transformers' on our processor's tensors."""
    pytest.importorskip("av")
    from sglang.srt.multimodal.mm_types import Modality
    from sglang.srt.multimodal.video_io import RawVideo
    from sglang.testing.sample_video import bar_frames, make_clip
    from conftest import noise_image

    torch = hf_ref.torch
    videos = [make_clip(64, 48, 10, 1.5, seed=5), RawVideo(bar_frames(40, 32, 6, seed=6), 4.0),
              [noise_image(32, 32, s) for s in range(3)]]
    image = noise_image(48, 64, 7)
    tmpl = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "and"}, {"type": "image"},
                                         {"type": "video"}, {"type": "video"}, {"type": "text", "text": "?"}]}]
    out = engine.generate(messages=tmpl, image_data=[image], video_data=videos,
                          sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0})
    ids = hf_ref.tokenizer.encode(hf_ref.render(tmpl), add_special_tokens=False)
    ids, mm = hf_ref.processor.process(ids, [image], videos=videos)
    assert out["meta_info"]["prompt_tokens"] == len(ids)
    t = torch.tensor([ids], device=hf_ref.model.device)
    vids = [it for it in mm.mm_items if it.modality == Modality.VIDEO]
    imgs = [it for it in mm.mm_items if it.modality == Modality.IMAGE]
    kw = {"mm_token_type_ids": (t == mm.im_token_id).long() + 2 * (t == mm.video_token_id).long(),
          "pixel_values": torch.cat([it.feature for it in imgs]).to(t.device),
          "image_grid_thw": torch.tensor([list(it.image_grid_thw) for it in imgs], device=t.device),
          "pixel_values_videos": torch.cat([it.feature for it in vids]).to(t.device),
          "video_grid_thw": torch.tensor([list(it.image_grid_thw) for it in vids], device=t.device)}
    with torch.no_grad():
        ref = hf_ref.model.generate(input_ids=t, attention_mask=torch.ones_like(t), max_new_tokens=MAX_NEW,
                                    min_new_tokens=MAX_NEW, do_sample=False, **kw)[0, len(ids):].tolist()
    assert out["output_ids"] == ref


def test_shutdown_leaves_nothing(engine):
    procs, ipc_dir = list(engine._procs), engine._port_args.ipc_dir
    assert all(p.is_alive() for p in procs) and os.path.isdir(ipc_dir)
    engine.shutdown()
    engine.shutdown()  # idempotent
    assert not any(pid_alive(p.pid) for p in procs)
    assert not os.path.exists(ipc_dir)
    with pytest.raises(RuntimeError, match="shut down"):
        engine.generate("hi")


def test_launch_failure_is_reported_and_cleaned_up(tmp_path, monkeypatch):
    import tempfile

    from conftest import child_pids

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where PortArgs puts the ipc directory
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # a directory the children cannot load a model from
    with pytest.raises(RuntimeError, match="sglang-(sched0|detok).*(failed to start|exited)"):
        sglang.Engine(model_path=str(broken), dtype="float32", device="cpu", log_level="error")
    assert not [pid for pid, name in child_pids(os.getpid()).items() if name.startswith("sglang-") and pid_alive(pid)]
    assert list(tmp_path.glob("sglang-ipc-*")) == []


def test_missing_model_path_is_refused_before_any_process_starts(tmp_path):
    from sglang.srt.model_loader.model_path import ModelPathError

    with pytest.raises(ModelPathError, match="no-such-model"):
        sglang.Engine(model_path=str(tmp_path / "no-such-model"), dtype="float32", device="cpu", log_level="error")
