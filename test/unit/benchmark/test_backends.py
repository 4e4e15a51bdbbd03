"""bench_serving's request bodies per backend, the --extra-request-body merge, and the prompt a non-chat
backend sends (token ids, chat template, image placeholders)."""

from __future__ import annotations

import pytest

from sglang import bench_serving
from sglang.benchmark import backends as bk
from sglang.benchmark.datasets import SampleRequest


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from sglang.testing.tokenizer_builder import write_tokenizer_files

    out = tmp_path_factory.mktemp("tok")
    write_tokenizer_files(out)
    return AutoTokenizer.from_pretrained(str(out))


REQ = SampleRequest("hello there", 2, 7)
IMG = SampleRequest("what is this", 3, 5, ["data:image/png;base64,AAAA"], [(4, 4)], images_first=True)


def test_routes_and_default_ports():
    assert {n: (b.api, b.default_port) for n, b in bk.BACKENDS.items()} == {
        "sglang": ("generate", 30000), "sglang-oai": ("completions", 30000), "sglang-oai-chat": ("chat", 30000),
        "vllm": ("completions", 8000), "vllm-chat": ("chat", 8000), "openai": ("completions", 30000),
        "openai-chat": ("chat", 30000)}
    assert bk.api_url("http://h:1/", "sglang") == "http://h:1/generate"
    assert bk.api_url("http://h:1", "vllm") == "http://h:1/v1/completions"
    assert bk.api_url("http://h:1", "openai-chat") == "http://h:1/v1/chat/completions"
    with pytest.raises(ValueError, match="unknown backend"):
        bk.get_backend("tgi")


def test_native_generate_body():
    body = bk.build_body("sglang", None, REQ, bk.Prompt("hello there", 2))
    assert body == {"text": "hello there", "stream": True,
                    "sampling_params": {"temperature": 0.0, "max_new_tokens": 7, "ignore_eos": True}}
    ids = bk.build_body("sglang", None, REQ, bk.Prompt([5, 6, 7], 3), ignore_eos=False, stream=False)
    assert ids["input_ids"] == [5, 6, 7] and "text" not in ids and ids["stream"] is False
    assert ids["sampling_params"]["ignore_eos"] is False
    img = bk.build_body("sglang", None, IMG, bk.Prompt("<img>what is this", 3))
    assert img["image_data"] == IMG.images


@pytest.mark.parametrize("backend,ext", [("sglang-oai", True), ("vllm", True), ("openai", False)])
def test_completions_body(backend, ext):
    body = bk.build_body(backend, "m", REQ, bk.Prompt("hello there", 2))
    want = {"model": "m", "prompt": "hello there", "max_tokens": 7, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    if ext:
        want["ignore_eos"] = True
    assert body == want
    plain = bk.build_body(backend, "m", REQ, bk.Prompt([1, 2], 2), ignore_eos=False, stream=False)
    assert plain["prompt"] == [1, 2] and "stream_options" not in plain and "ignore_eos" not in plain


@pytest.mark.parametrize("backend,ext", [("sglang-oai-chat", {"ignore_eos": True, "min_tokens": 7}),
                                         ("vllm-chat", {"ignore_eos": True}), ("openai-chat", {})])
def test_chat_body(backend, ext):
    body = bk.build_body(backend, "m", REQ)
    assert body == {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 7,
                    "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}, **ext}
    parts = bk.build_body(backend, "m", IMG)["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["image_url", "text"] and parts[1]["text"] == "what is this"


def test_extra_request_body_merge():
    extra = bench_serving.parse_json_object('{"top_p": 0.5, "sampling_params": {"top_k": 3, "temperature": 0.7},'
                                            ' "stream_options": {"continuous_usage_stats": true}}')
    native = bk.build_body("sglang", None, REQ, bk.Prompt("x", 1), extra=extra)
    assert native["top_p"] == 0.5
    assert native["sampling_params"] == {"temperature": 0.7, "max_new_tokens": 7, "ignore_eos": True, "top_k": 3}
    chat = bk.build_body("vllm-chat", "m", REQ, extra={"temperature": 1.0, "stream_options": {"x": 1}})
    assert chat["temperature"] == 1.0 and chat["stream_options"] == {"include_usage": True, "x": 1}
    args = bench_serving.build_parser().parse_args(["--extra-request-body", '{"seed": 3}'])
    assert args.extra_request_body == {"seed": 3}
    for bad in ("[1]", "{nope"):
        with pytest.raises(SystemExit):
            bench_serving.build_parser().parse_args(["--extra-request-body", bad])


def test_prepare_prompt(tok):
    assert bk.prepare_prompt(REQ, "completions") == bk.Prompt("hello there", 2)
    ids = SampleRequest("a b", 3, 4, prompt_ids=[11, 12, 13])
    assert bk.prepare_prompt(ids, "generate") == bk.Prompt([11, 12, 13], 3)
    templ = bk.prepare_prompt(REQ, "completions", tok, chat_template=True)
    assert templ.value == "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"
    assert templ.text_len == len(tok.encode(templ.value, add_special_tokens=False))
    img = bk.prepare_prompt(IMG, "generate", tok)
    assert img.value == "<|vision_start|><|image_pad|><|vision_end|>what is this"
    assert img.text_len == len(tok.encode("what is this", add_special_tokens=False))
    both = bk.prepare_prompt(IMG, "generate", tok, chat_template=True)
    assert both.value.count("<|image_pad|>") == 1 and both.value.startswith("<|im_start|>user\n<|vision_start|>")
    with pytest.raises(ValueError, match="completions API takes no images"):
        bk.prepare_prompt(IMG, "completions", tok)
