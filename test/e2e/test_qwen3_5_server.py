"""Qwen3.5 (hybrid Gated DeltaNet, `Qwen3_5ForConditionalGeneration`) and Qwen3.5-MoE through the real
server (`python -m sglang.launch_server`) on the tiny random-weight presets, as issue 49 asks: everything
that works for Qwen3-VL works here.

- OpenAI chat, greedy, token-equal to transformers' Qwen3.5 on the same weights: text, one image, several
  images of mixed sizes, on the default server and with 16-token prefill chunks that cut through images and
  GDN chunks (the recurrent state carried across chunks); the MoE too;
- prefix hits over HTTP: the same images with a new question resume after the images (the image-end state
  snapshot), a two-turn chat resumes where the first request ended (its prompt and answer); `cached_tokens`
  > 0 and the tokens are transformers' (a cold run); afterwards every KV slot and request row is back and a
  flush empties the cache; with a snapshot pool of 8 slots, rounds of hits keep hitting, across a flush (a
  leaked snapshot slot would starve the pool within a few rounds);
- video (alone, and with an image), token-equal to transformers, and a repeated video is a hit;
- json_schema output, tool calls (required, named) and `--reasoning-parser qwen3` on the local template's
  thinking switch;
- `sglang.Engine` with messages and images, token-equal to transformers;
- slow: TP2 (gloo) == TP1, DP2 (both replicas), EPD (encoders without DeepStack rows) == one server.
"""

from __future__ import annotations

import json
import os
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import (CASES, TEST_DEVICE, HFReference, build_case, data_url, noise_image, pid_alive, png_bytes,
                      wait_until)

MAX_NEW = 10
PARITY_CASES = ["text_only", "one_image", "three_images_mixed_sizes"]
THINK_END = 248069  # </think> in the Qwen3.5 vocabulary (the Qwen3 id moved by the same offset as <|im_end|>)


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def q35_dir(tiny_model_dir):
    return tiny_model_dir("qwen3.5-tiny")


@pytest.fixture(scope="module")
def moe_dir(tiny_model_dir):
    return tiny_model_dir("qwen3.5-moe-tiny")


@pytest.fixture(scope="module")
def q35_ref(q35_dir) -> HFReference:
    return HFReference(q35_dir)


LIMITS = ("--limit-mm-per-prompt", '{"image": 4, "video": 2}')


@pytest.fixture(scope="module")
def q35_server(launch_server, q35_dir):
    s = launch_server(*LIMITS, model=q35_dir)
    yield s
    s.close()  # stopped with the module (no child, ipc dir or shm segment left), not held to the session's end


@pytest.fixture(scope="module")
def q35_chunked(launch_server, q35_dir):
    """16-token prefill chunks (they cut inside images and inside GDN chunks) and a small snapshot pool:
    8 slots, so captures evict older snapshots with their tree nodes all the time."""
    s = launch_server(*LIMITS, "--chunked-prefill-size", "16", "--max-mamba-cache-size", "8", model=q35_dir)
    yield s
    s.close()


def openai_client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def chat(server, messages, **kw):
    kw.setdefault("max_tokens", MAX_NEW)
    kw.setdefault("temperature", 0)
    return openai_client(server).chat.completions.create(model="m", messages=messages, **kw)


def decoded(ref: HFReference, ids: list[int]) -> str:
    return ref.tokenizer.decode(ids, skip_special_tokens=True)


def server_info(server) -> dict:
    return requests.get(server.url + "/get_server_info", timeout=10).json()


def idle_and_all_free(server, total: int, rows: int | None = None) -> bool:
    info = server_info(server)
    return (info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0 and info["available_kv_tokens"] == total
            and (rows is None or info["free_req_slots"] == rows))


# ----------------------------------------------------------------------------- 1. parity over the OpenAI API
@pytest.mark.parametrize("which", ["default", "chunked16"])
@pytest.mark.parametrize("case", PARITY_CASES)
def test_chat_matches_transformers(request, q35_ref, which, case):
    server = request.getfixturevalue({"default": "q35_server", "chunked16": "q35_chunked"}[which])
    api, tmpl, images = build_case(CASES[case])
    ref = q35_ref.greedy(case, tmpl, images, MAX_NEW)
    r = chat(server, api)
    assert r.choices[0].message.content == decoded(q35_ref, ref)
    assert r.usage.completion_tokens == len(ref)
    assert r.usage.prompt_tokens == len(q35_ref.prompt(tmpl, images)[0])
    # the same request again resumes from the snapshot one token before the prompt's end
    again = chat(server, api)
    assert again.choices[0].message.content == r.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1


def test_chunks_cut_inside_images(q35_ref):
    """Guards the chunked16 variant: its 16-token chunks split the image token ranges."""
    for case in ("one_image", "three_images_mixed_sizes"):
        _, tmpl, images = build_case(CASES[case])
        _, mm = q35_ref.prompt(tmpl, images)
        assert any((s // 16) != ((e - 1) // 16) for it in mm.mm_items for s, e in it.offsets)


@pytest.fixture(scope="module")
def moe_server(launch_server, moe_dir):
    s = launch_server(*LIMITS, model=moe_dir)
    yield s
    s.close()


@pytest.fixture(scope="module")
def moe_ref(moe_dir) -> HFReference:
    return HFReference(moe_dir)


@pytest.mark.parametrize("case", ["one_image", "three_images_mixed_sizes"])
def test_moe_chat_matches_transformers(moe_server, moe_ref, case):
    assert moe_ref.model.config.architectures == ["Qwen3_5MoeForConditionalGeneration"]
    api, tmpl, images = build_case(CASES[case])
    want = moe_ref.greedy(case, tmpl, images, MAX_NEW)
    r = chat(moe_server, api)
    assert (r.choices[0].message.content, r.usage.completion_tokens) == (decoded(moe_ref, want), len(want))
    assert server_info(moe_server)["paths"]["moe"] is not None  # the routed experts ran


# ----------------------------------------------------------------------------- 2. prefix hits, 7. leaks
def test_same_images_new_question_is_a_hit(q35_server, q35_ref):
    total = server_info(q35_server)["max_total_num_tokens"]
    wait_until(lambda: idle_and_all_free(q35_server, total), 30, what="an idle server")
    rows = server_info(q35_server)["free_req_slots"]
    images = [noise_image(160, 96, 201), noise_image(64, 128, 202), noise_image(96, 96, 203)]
    tag = uuid.uuid4().hex[:8]

    def msgs(question):
        api = [{"type": "image_url", "image_url": {"url": data_url(png_bytes(im))}} for im in images]
        tmpl = [{"type": "image"} for _ in images]
        api.append({"type": "text", "text": question})
        tmpl.append({"type": "text", "text": question})
        return [{"role": "user", "content": api}], [{"role": "user", "content": tmpl}]

    first_api, first_tmpl = msgs(f"Which one is brightest? {tag}")
    second_api, second_tmpl = msgs(f"Count the shapes in each. {tag}")
    first, second = chat(q35_server, first_api), chat(q35_server, second_api)
    ids, mm = q35_ref.prompt(second_tmpl, images)
    images_end = max(e for it in mm.mm_items for _, e in it.offsets)
    assert first.usage.prompt_tokens_details.cached_tokens < mm.mm_items[0].offsets[0][0]  # cold
    # resumes after the last image (the image-end snapshot), never past where the questions differ
    assert images_end <= second.usage.prompt_tokens_details.cached_tokens < len(ids) - 8
    for resp, tmpl, key in ((first, first_tmpl, "imgs-q1"), (second, second_tmpl, "imgs-q2")):
        assert resp.choices[0].message.content == decoded(q35_ref, q35_ref.greedy(key + tag, tmpl, images, MAX_NEW))

    # nothing leaks: every KV slot and request row is back (cached slots count as available) ...
    wait_until(lambda: idle_and_all_free(q35_server, total, rows), 30, what="all KV slots and rows back")
    assert server_info(q35_server)["radix_cache_tokens"] > 0
    # ... and a flush empties the tree: every slot free, none held by the cache
    assert requests.post(q35_server.url + "/flush_cache", timeout=30).json()["success"] is True
    info = server_info(q35_server)
    assert (info["radix_cache_tokens"], info["free_kv_tokens"], info["free_req_slots"]) == (0, total, rows)


def test_two_turn_chat_is_a_hit(q35_server, q35_ref):
    """The second turn carries the first answer: it resumes from the snapshot taken when the first request
    ended, past its prompt. That needs the answer to re-tokenize as generated; the random model's free text
    rarely does, so the first answer is held to digits and spaces (a regex), whose tokens are unique."""
    tag = uuid.uuid4().hex[:8]
    img = noise_image(128, 96, 301)
    turn1_api = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(png_bytes(img))}},
                                              {"type": "text", "text": f"Give five digits. {tag}"}]}]
    turn1_tmpl = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"Give five digits. {tag}"}]}]
    first = chat(q35_server, turn1_api, max_tokens=16, extra_body={"regex": "[0-9]( [0-9]){4}"})
    answer = first.choices[0].message.content
    assert first.choices[0].finish_reason == "stop" and len(answer.split()) == 5
    follow = [{"role": "assistant", "content": answer}, {"role": "user", "content": "Say more about the colours."}]
    second = chat(q35_server, turn1_api + follow)
    turn2_tmpl = turn1_tmpl + follow
    ids, _ = q35_ref.prompt(turn2_tmpl, [img])
    assert second.usage.prompt_tokens == len(ids)
    # the first request's prompt and answer (its end token too) are the second prompt's start
    turn1_ids, _ = q35_ref.prompt(turn1_tmpl, [img])
    first_len = first.usage.prompt_tokens + first.usage.completion_tokens
    assert ids[:len(turn1_ids)] == turn1_ids and ids[first_len - 1] == q35_ref.tokenizer.convert_tokens_to_ids("<|im_end|>")
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first_len - 1 <= cached < len(ids)
    want = q35_ref.greedy("turn2" + tag, turn2_tmpl, [img], MAX_NEW)
    assert second.choices[0].message.content == decoded(q35_ref, want)


def test_snapshot_pool_keeps_serving_hits(q35_chunked, q35_ref):
    """8 snapshot slots; rounds of a new image with a question, the same request again, then the same image
    with a new question (each request captures several snapshots): every round's repeats still hit.
    Eviction frees the old rounds' slots; a slot lost per request or per round (a leak) would leave nothing
    to capture into within a few rounds. Halfway, a flush empties the tree: the slots its nodes held must
    come back too, or no later round could hit."""
    total = server_info(q35_chunked)["max_total_num_tokens"]
    for k in range(10):  # more rounds than slots: one slot lost per round would starve the pool
        if k == 4:
            wait_until(lambda: idle_and_all_free(q35_chunked, total), 30, what="an idle server")
            assert requests.post(q35_chunked.url + "/flush_cache", timeout=30).json()["success"] is True
            info = server_info(q35_chunked)
            snaps = info["paths"]["hybrid_prefix"]
            assert info["radix_cache_tokens"] == 0
            assert snaps["in_tree"] == 0 and snaps["free"] == snaps["snapshot_slots"] == 8  # a flush frees them all
        img = noise_image(96, 64 + 16 * k, 400 + k)
        url = data_url(png_bytes(img))

        def msgs(q):
            return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                 {"type": "text", "text": q}]}]

        cold = chat(q35_chunked, msgs(f"round {k}: first question"), max_tokens=3)
        # the same again: its snapshots duplicate the tree's (same positions), so they must be freed, not kept
        repeat = chat(q35_chunked, msgs(f"round {k}: first question"), max_tokens=3)
        assert repeat.usage.prompt_tokens_details.cached_tokens == repeat.usage.prompt_tokens - 1, k
        hit = chat(q35_chunked, msgs(f"round {k}: another one"), max_tokens=3)
        _, mm = q35_ref.prompt([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}], [img])
        (start, end), = mm.mm_items[0].offsets
        assert cold.usage.prompt_tokens_details.cached_tokens < start, k  # a new image: nothing of it cached
        assert hit.usage.prompt_tokens_details.cached_tokens >= end, k
    wait_until(lambda: idle_and_all_free(q35_chunked, total), 30, what="all KV slots back")
    snaps = server_info(q35_chunked)["paths"]["hybrid_prefix"]
    assert snaps["in_tree"] + snaps["free"] == snaps["snapshot_slots"]  # none left with a finished request
    assert snaps["restored"] >= 12 and snaps["captured"] > 0  # 2 hits a round after the flush, at least


# ----------------------------------------------------------------------------- 3. video
def _clip(seed: int) -> bytes:
    from sglang.testing.sample_video import make_clip

    return make_clip(96, 64, 10, 2.0, seed=seed)


def hf_video_greedy(ref: HFReference, tmpl, images, videos) -> tuple[list[int], int]:
    """transformers' greedy ids (exactly MAX_NEW: no early EOS) on our processor's ids, pixels and grids."""
    from sglang.srt.multimodal.mm_types import Modality

    torch = ref.torch
    ids, mm = ref.processor.process(ref.tokenizer.encode(ref.render(tmpl), add_special_tokens=False), images,
                                    videos=videos)
    t = torch.tensor([ids], device=TEST_DEVICE)
    kw = {"mm_token_type_ids": (t == mm.im_token_id).long() + 2 * (t == mm.video_token_id).long()}
    for modality, px, grid in ((Modality.IMAGE, "pixel_values", "image_grid_thw"),
                               (Modality.VIDEO, "pixel_values_videos", "video_grid_thw")):
        items = [it for it in mm.mm_items if it.modality == modality]
        if items:
            kw[px] = torch.cat([torch.as_tensor(it.feature) for it in items]).to(TEST_DEVICE)
            kw[grid] = torch.tensor([list(it.image_grid_thw) for it in items], device=TEST_DEVICE)
    with torch.no_grad():
        out = ref.model.generate(input_ids=t, attention_mask=torch.ones_like(t), max_new_tokens=MAX_NEW,
                                 min_new_tokens=MAX_NEW, do_sample=False, **kw)
    return out[0, len(ids):].tolist(), len(ids)


@pytest.mark.parametrize("with_image", [False, True], ids=["video_only", "video_and_image"])
def test_video_chat_matches_transformers(q35_chunked, q35_ref, with_image):
    pytest.importorskip("av")
    clip = _clip(5)
    api = [{"type": "video_url", "video_url": {"url": data_url(clip, "video/mp4")}}]
    tmpl = [{"type": "video"}]
    images = []
    if with_image:
        images = [noise_image(80, 64, 6)]
        api += [{"type": "text", "text": "and"}, {"type": "image_url", "image_url": {"url": data_url(png_bytes(images[0]))}}]
        tmpl += [{"type": "text", "text": "and"}, {"type": "image"}]
    api.append({"type": "text", "text": "What happens here?"})
    tmpl.append({"type": "text", "text": "What happens here?"})
    want, prompt_len = hf_video_greedy(q35_ref, [{"role": "user", "content": tmpl}], images, [clip])
    body = dict(max_tokens=MAX_NEW, extra_body={"min_tokens": MAX_NEW})
    r = chat(q35_chunked, [{"role": "user", "content": api}], **body)
    assert r.usage.prompt_tokens == prompt_len
    assert r.choices[0].message.content == decoded(q35_ref, want)
    again = chat(q35_chunked, [{"role": "user", "content": api}], **body)  # the same video: a hit, same answer
    assert again.usage.prompt_tokens_details.cached_tokens == prompt_len - 1
    assert again.choices[0].message.content == r.choices[0].message.content


# ----------------------------------------------------------------------------- 4. structured output, tools, reasoning
@pytest.fixture(scope="module")
def q35_tools(launch_server, q35_dir):
    # the qwen3 reasoning split; JSON whitespace runs capped (the random model pads JSON with whitespace)
    s = launch_server("--reasoning-parser", "qwen3", "--constrained-json-max-whitespace-cnt", "2", model=q35_dir)
    yield s
    s.close()


SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                           "count": {"type": "integer", "minimum": 1, "maximum": 99},
                                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 5},
                                                    "minItems": 1, "maxItems": 3}},
          "required": ["color", "count", "tags"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 999}},
       "required": ["a", "b"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 8}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": ADD}},
         {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]


def test_json_schema_output(q35_tools):
    jsonschema = pytest.importorskip("jsonschema")
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(png_bytes(noise_image(64, 64, 9)))}},
                                         {"type": "text", "text": "Describe the picture as JSON."}]}]
    free = chat(q35_tools, msgs, max_tokens=30).choices[0].message.content
    with pytest.raises(ValueError):  # the random model's own output is no JSON: only the grammar makes it so
        json.loads(free)
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
    for temperature, seed in ((0, None), (1.0, 4)):
        choice = chat(q35_tools, msgs, max_tokens=200, response_format=fmt, temperature=temperature, seed=seed).choices[0]
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content, strict=False), SCHEMA)


def test_tool_calls(q35_tools):
    jsonschema = pytest.importorskip("jsonschema")
    msgs = [{"role": "user", "content": "What is 2 plus 3?"}]
    free = chat(q35_tools, msgs, tools=TOOLS, max_tokens=30).choices[0]
    assert free.message.tool_calls is None  # tool_choice auto: the random model calls nothing by itself
    schemas = {"add": ADD, "get_weather": WEATHER}
    for choice_kw, names in ((dict(tool_choice={"type": "function", "function": {"name": "add"}}), ["add"]),
                             (dict(tool_choice="required", parallel_tool_calls=False), list(schemas))):
        choice = chat(q35_tools, msgs, tools=TOOLS, max_tokens=200, **choice_kw).choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        assert call.function.name in names and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments, strict=False), schemas[call.function.name])


def test_reasoning_parser(q35_tools, q35_ref):
    """The local Qwen3.5 template is the Qwen3-VL one with its thinking switch (enable_thinking false
    closes an empty <think> block; nothing opens one by default), so reasoning is checked as on Qwen3-VL:
    an assistant turn continued inside <think> is all reasoning; forcing </think> (the Qwen3.5 id) ends it
    and a regex then shapes the content only."""
    assert q35_ref.tokenizer.convert_tokens_to_ids("</think>") == THINK_END
    thinking = [{"role": "user", "content": "Think first."}, {"role": "assistant", "content": "<think>\nLet me see"}]

    def ask(messages=thinking, logit_bias=None, **extra):
        cont = {"continue_final_message": True} if messages is thinking else {}
        return chat(q35_tools, messages, max_tokens=16, logit_bias=logit_bias, extra_body={**cont, **extra})

    raw = ask(separate_reasoning=False).choices[0].message
    assert raw.reasoning_content is None and raw.content
    msg = ask().choices[0].message
    assert msg.content is None and msg.reasoning_content == raw.content.strip()
    ended = ask(regex="[0-9]{3}", logit_bias={str(THINK_END): 100}).choices[0]
    assert ended.finish_reason == "stop" and ended.message.reasoning_content is None
    assert ended.message.content is not None and len(ended.message.content) == 3 and ended.message.content.isdigit()
    plain = [{"role": "user", "content": "Think first."}]
    off, on = ask(plain, chat_template_kwargs={"enable_thinking": False}), ask(plain)
    assert off.usage.prompt_tokens == on.usage.prompt_tokens + len(
        q35_ref.tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False))


# ----------------------------------------------------------------------------- 5. sglang.Engine
def test_engine_messages_and_images_match_transformers(q35_dir, q35_ref):
    import sglang

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")  # read by the spawned children only; see conftest.ServerProcess
        engine = sglang.Engine(model_path=str(q35_dir), dtype="float32", device=TEST_DEVICE, log_level="warning",
                               max_total_tokens=2048)
    try:
        for case in ("text_only", "three_images_mixed_sizes"):
            _, tmpl, images = build_case(CASES[case])
            out = engine.generate(messages=tmpl, image_data=images,
                                  sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0})
            assert out["output_ids"] == q35_ref.greedy(case, tmpl, images, MAX_NEW), case
            assert out["meta_info"]["prompt_tokens"] == len(q35_ref.prompt(tmpl, images)[0])
        procs, ipc_dir = list(engine._procs), engine._port_args.ipc_dir
    finally:
        engine.shutdown()
    assert not any(pid_alive(p.pid) for p in procs) and not os.path.exists(ipc_dir)  # nothing left behind


# ----------------------------------------------------------------------------- 6. TP2, DP2, EPD (slow)
def _generate(server, text: str, images=(), max_new: int = MAX_NEW) -> dict:
    r = requests.post(server.url + "/generate", timeout=180, json={
        "text": text, "image_data": [data_url(png_bytes(im)) for im in images],
        "sampling_params": {"max_new_tokens": max_new, "temperature": 0}})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.slow
def test_tp2_equals_tp1(launch_server, q35_dir, q35_server, q35_ref):
    tp2 = launch_server("--tp-size", "2", "--chunked-prefill-size", "16", *LIMITS, model=q35_dir)
    for case in ("one_image", "three_images_mixed_sizes"):
        api, tmpl, images = build_case(CASES[case])
        want = q35_ref.greedy(case, tmpl, images, MAX_NEW)
        assert _generate(tp2, q35_ref.render(tmpl), images)["output_ids"] == want, case
        a, b = chat(q35_server, api), chat(tp2, api)
        assert (b.choices[0].message.content, b.usage.prompt_tokens) == (a.choices[0].message.content, a.usage.prompt_tokens)
    tp2.close()


@pytest.mark.slow
def test_dp2_both_replicas_serve(launch_server, q35_dir, q35_server, q35_ref):
    dp2 = launch_server("--dp-size", "2", "--load-balance-method", "total_requests", *LIMITS, model=q35_dir)
    jobs = []
    for i, case in enumerate(["one_image", "three_images_mixed_sizes", "text_only", "image_before_text"]):
        _, tmpl, images = build_case(CASES[case])
        jobs.append((q35_ref.render(tmpl), images, q35_ref.greedy(case, tmpl, images, MAX_NEW)))
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda job: _generate(dp2, job[0], job[1]), jobs * 2))
    assert [o["output_ids"] for o in outs] == [want for _, _, want in jobs * 2]
    assert {o["meta_info"]["dp_rank"] for o in outs} == {0, 1}
    total = server_info(dp2)["max_total_num_tokens"]
    wait_until(lambda: idle_and_all_free(dp2, total), 30, what="both replicas idle with every KV slot back")
    dp2.close()


@pytest.mark.slow
def test_epd_equals_one_server(launch_server, q35_dir, q35_server, q35_ref):
    assert json.loads((q35_dir / "config.json").read_text())["vision_config"]["deepstack_visual_indexes"] == []
    enc = launch_server("--encoder-only", model=q35_dir)
    lang = launch_server("--language-only", "--encoder-urls", enc.url, model=q35_dir)
    for case in ("one_image", "three_images_mixed_sizes"):
        _, tmpl, images = build_case(CASES[case])
        want = q35_ref.greedy(case, tmpl, images, MAX_NEW)
        plain = _generate(q35_server, q35_ref.render(tmpl), images)
        got = _generate(lang, q35_ref.render(tmpl), images)
        assert plain["output_ids"] == want and got["output_ids"] == want, case
        assert got["meta_info"]["prompt_tokens"] == plain["meta_info"]["prompt_tokens"]
    info = server_info(lang)
    assert info["mm_items_from_encoders"] >= 4 and info["mm_items_through_tower"] == 0
    lang.close()
    enc.close()
