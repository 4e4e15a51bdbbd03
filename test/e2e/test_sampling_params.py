"""Upstream's sampling parameters through the server (tiny model): n choices, logprobs (chat,
completions, /generate), penalties, min_new_tokens / min_tokens, sampling_seed."""

from __future__ import annotations

import json
import math
import time
from collections import Counter

import requests

from conftest import wait_until

MSG = [{"role": "user", "content": "Count: one two three"}]


def generate(server, **body):
    r = requests.post(server.url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_n_choices_are_distinct_samples_with_summed_usage(client):
    resp = client.chat.completions.create(model="default", messages=MSG, n=3, max_tokens=8, temperature=1.0, seed=7)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert len({c.message.content for c in resp.choices}) > 1
    single = client.chat.completions.create(model="default", messages=MSG, max_tokens=8, temperature=1.0, seed=7)
    assert resp.choices[0].message.content == single.choices[0].message.content  # copy 0 keeps the seed
    assert resp.usage.prompt_tokens == single.usage.prompt_tokens
    assert 3 <= resp.usage.completion_tokens <= 3 * 8  # summed over the choices


def test_chat_n_streams_every_choice_to_its_finish(client):
    stream = client.chat.completions.create(model="default", messages=MSG, n=2, max_tokens=6, temperature=0.8,
                                            seed=3, stream=True, stream_options={"include_usage": True})
    text, finished, usage = {0: "", 1: ""}, set(), None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1} and usage is not None and usage.completion_tokens > 0
    full = client.chat.completions.create(model="default", messages=MSG, n=2, max_tokens=6, temperature=0.8, seed=3)
    assert [full.choices[i].message.content for i in (0, 1)] == [text[0], text[1]]


def test_chat_logprobs_match_greedy_choice_and_are_sorted(client):
    # special tokens kept in the text: a logprob entry names every generated token, skipped ones included
    resp = client.chat.completions.create(model="default", messages=MSG, max_tokens=5, temperature=0,
                                          logprobs=True, top_logprobs=3,
                                          extra_body={"ignore_eos": True, "skip_special_tokens": False})
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens == 5
    for pos in content:
        assert pos.logprob <= 0.0 and len(pos.top_logprobs) == 3
        tops = [t.logprob for t in pos.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert math.isclose(pos.logprob, tops[0], abs_tol=1e-5)  # greedy: the chosen token is the top one
    assert "".join(p.token for p in content) == resp.choices[0].message.content


def test_completion_logprobs_and_generate_return_logprob_agree(client, server):
    comp = client.completions.create(model="default", prompt="The sky is", max_tokens=4, temperature=0, logprobs=2,
                                     extra_body={"ignore_eos": True})
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    gen = generate(server, text="The sky is", return_logprob=True, top_logprobs_num=2,
                   sampling_params={"max_new_tokens": 4, "temperature": 0, "ignore_eos": True})
    meta = gen["meta_info"]
    assert [t[1] for t in meta["output_token_logprobs"]] == gen["output_ids"]
    assert all(math.isclose(a, b[0], abs_tol=1e-5) for a, b in zip(lp.token_logprobs, meta["output_token_logprobs"]))
    assert all(len(alts) == 2 for alts in meta["output_top_logprobs"])


def test_generate_n_and_sampling_seed(server):
    out = generate(server, text="Once upon", sampling_params={"n": 2, "max_new_tokens": 6, "temperature": 1.0,
                                                               "sampling_seed": 11})
    assert isinstance(out, list) and len(out) == 2
    again = generate(server, text="Once upon", sampling_params={"max_new_tokens": 6, "temperature": 1.0, "seed": 11})
    assert out[0]["output_ids"] == again["output_ids"]


def stream_generate(server, **body) -> dict[int, list[dict]]:
    """index -> that request's chunks, in order, from a streamed /generate."""
    chunks: dict[int, list[dict]] = {}
    with requests.post(server.url + "/generate", json={**body, "stream": True}, stream=True, timeout=60) as r:
        assert r.status_code == 200, r.text
        lines = [line[len(b"data: "):] for line in r.iter_lines() if line.startswith(b"data: ")]
    assert lines[-1] == b"[DONE]"
    for raw in lines[:-1]:
        chunk = json.loads(raw)
        assert "error" not in chunk, chunk
        chunks.setdefault(chunk["index"], []).append(chunk)
    return chunks


def test_generate_streams_n_samples_tagged_by_index(server):
    params = {"n": 3, "max_new_tokens": 6, "temperature": 1.0, "sampling_seed": 5, "ignore_eos": True}
    chunks = stream_generate(server, text="Once upon", sampling_params=params)
    assert sorted(chunks) == [0, 1, 2]
    whole = generate(server, text="Once upon", sampling_params=params)
    for i, got in chunks.items():
        final = got[-1]
        assert final["meta_info"]["finish_reason"] is not None
        assert all(c["meta_info"]["finish_reason"] is None for c in got[:-1])
        assert final["output_ids"] == whole[i]["output_ids"] and final["text"] == whole[i]["text"]
    assert len({tuple(got[-1]["output_ids"]) for got in chunks.values()}) > 1  # distinct samples


def test_generate_streams_a_batch_tagged_by_index(server):
    params = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    chunks = stream_generate(server, text=["The sky is", "Count: one"], sampling_params=params)
    assert sorted(chunks) == [0, 1]
    for i, prompt in enumerate(["The sky is", "Count: one"]):
        assert chunks[i][-1]["output_ids"] == generate(server, text=prompt, sampling_params=params)["output_ids"]


def test_leaving_a_multi_request_stream_aborts_every_request(server):
    """Three samples of one streamed request; the client reads a few chunks of each, checks all three
    run, then leaves: only the aborts can free them this soon.

    The line iterator is kept in a variable: a `for` over a temporary `r.iter_lines()` drops the last
    reference at `break`, the generator is closed and urllib3 closes the connection right there, so the
    server was already aborting the samples when the running count was read (3, 2 or 0 by timing: this
    test failed on a loaded machine)."""
    budget = 4000

    def info():
        return requests.get(server.url + "/get_server_info", timeout=10).json()

    def idle():
        i = info()
        return i["num_running_reqs"] == 0 and i["num_waiting_reqs"] == 0 and i["available_kv_tokens"] == total

    total = info()["max_total_num_tokens"]
    wait_until(idle, 30, what="an idle server")
    body = {"text": "never stop", "stream": True,
            "sampling_params": {"n": 3, "max_new_tokens": budget, "temperature": 1.0, "ignore_eos": True}}
    with requests.post(server.url + "/generate", json=body, stream=True, timeout=60) as r:
        assert r.status_code == 200, r.text
        chunks, tokens, finished = Counter(), {}, {}
        start = None
        lines = r.iter_lines()  # stays open after the break below: the connection lives until `with` ends
        for line in lines:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[len(b"data: "):])
            chunks[chunk["index"]] += 1
            tokens[chunk["index"]] = len(chunk["output_ids"])
            if chunk["meta_info"].get("finish_reason"):
                finished[chunk["index"]] = chunk["meta_info"]["finish_reason"]
            if start is None:
                start = time.monotonic()
            if len(chunks) == 3 and min(chunks.values()) >= 4:
                break
        assert not finished and len(chunks) == 3, (chunks, finished)
        rate = sum(tokens.values()) / max(time.monotonic() - start, 1e-3)  # tokens per second, all three
        now = info()
        assert (now["num_running_reqs"], now["num_waiting_reqs"]) == (3, 0), (now["num_running_reqs"], tokens)
    closed = time.monotonic()
    wait_until(idle, 60, what="all three requests aborted and their KV freed")
    # thousands of tokens left on each: only aborts free all three this soon
    assert time.monotonic() - closed < 0.5 * (3 * budget - sum(tokens.values())) / rate


def test_min_new_tokens_holds_back_eos(server):
    eos_early = generate(server, text="hi", sampling_params={"max_new_tokens": 12, "temperature": 0,
                                                             "stop_token_ids": [], "min_new_tokens": 0})
    first = eos_early["output_ids"][0]
    # make the first greedy token a stop token: without min_new_tokens generation ends at once
    stopped = generate(server, text="hi", sampling_params={"max_new_tokens": 12, "temperature": 0,
                                                           "stop_token_ids": [first]})
    assert stopped["meta_info"]["completion_tokens"] == 1
    held = generate(server, text="hi", sampling_params={"max_new_tokens": 12, "temperature": 0,
                                                        "stop_token_ids": [first], "min_new_tokens": 5})
    assert held["meta_info"]["completion_tokens"] >= 5 and first not in held["output_ids"][:4]


def test_penalties_change_greedy_repetition(server):
    base = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    plain = generate(server, text="a a a a", sampling_params=base)["output_ids"]
    pen = generate(server, text="a a a a", sampling_params={**base, "frequency_penalty": 2.0,
                                                            "repetition_penalty": 2.0})["output_ids"]
    assert len(set(pen)) >= len(set(plain)) and pen != plain
    present = generate(server, text="a a a a", sampling_params={**base, "presence_penalty": 2.0})["output_ids"]
    assert len(present) == 24


def test_logit_bias_forces_and_forbids_tokens(server, client):
    base = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    plain = generate(server, text="The sky is", sampling_params=base)["output_ids"]
    forced = generate(server, text="The sky is", sampling_params={**base, "logit_bias": {"42": 100}})["output_ids"]
    assert forced == [42] * 4
    banned = generate(server, text="The sky is", sampling_params={**base, "logit_bias": {str(plain[0]): -100}})
    assert banned["output_ids"][0] != plain[0]
    chat = client.chat.completions.create(model="default", messages=MSG, max_tokens=3, temperature=0,
                                          logit_bias={"42": 100}, extra_body={"ignore_eos": True})
    comp = client.completions.create(model="default", prompt="The sky is", max_tokens=3, temperature=0,
                                     logit_bias={"42": 100}, extra_body={"ignore_eos": True})
    forced_text = generate(server, text="x", sampling_params={**base, "max_new_tokens": 3, "logit_bias": {"42": 100}})["text"]
    assert chat.choices[0].message.content == comp.choices[0].text == forced_text
    assert chat.usage.completion_tokens == comp.usage.completion_tokens == 3


def test_return_text_in_logprobs_names_every_token(server):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(server.model_dir)
    out = generate(server, text="The sky is", return_logprob=True, return_text_in_logprobs=True, logprob_start_len=0,
                   top_logprobs_num=2, sampling_params={"max_new_tokens": 3, "temperature": 0, "ignore_eos": True})
    meta = out["meta_info"]
    for lp, tid, text in meta["output_token_logprobs"] + meta["input_token_logprobs"]:
        assert text == tok.decode([tid])
    assert all(text == tok.decode([tid]) for alts in meta["output_top_logprobs"] for _, tid, text in alts)
    plain = generate(server, text="The sky is", return_logprob=True,
                     sampling_params={"max_new_tokens": 3, "temperature": 0, "ignore_eos": True})
    assert all(e[2] is None for e in plain["meta_info"]["output_token_logprobs"])


def test_stop_regex_cuts_at_the_first_match_and_names_the_pattern(client):
    """The greedy output without stop_regex is the oracle: with a pattern taken from its middle, the
    output is that text cut before the first match, finish_reason stop, matched_stop the pattern;
    no_stop_trim keeps the match (and the rest of its last token); a stream sends the same text (a match in progress is held back)."""
    import regex

    base = dict(model="default", prompt="Count: one two three", max_tokens=24, temperature=0)
    full = client.completions.create(**base, extra_body={"ignore_eos": True}).choices[0].text
    pattern = regex.escape(full[len(full) // 2 : len(full) // 2 + 2])
    cut = full[: regex.search(pattern, full).start()]
    choice = client.completions.create(**base, extra_body={"ignore_eos": True, "stop_regex": pattern}).choices[0]
    assert (choice.text, choice.finish_reason, choice.matched_stop) == (cut, "stop", pattern)
    kept = client.completions.create(**base, extra_body={"ignore_eos": True, "stop_regex": [pattern], "no_stop_trim": True})
    kept_text = kept.choices[0].text  # up to the end of the token that completed the match
    assert kept_text.startswith(cut + regex.search(pattern, full).group(0)) and full.startswith(kept_text)
    streamed = client.completions.create(**base, stream=True, extra_body={"ignore_eos": True, "stop_regex": pattern})
    assert "".join(c.choices[0].text for c in streamed if c.choices) == cut


def test_bad_stop_regex_is_a_400_naming_it(server):
    for body in ({"stop_regex": "a("}, {"stop_regex": ".*"}):
        r = requests.post(server.url + "/v1/completions", json={"prompt": "hi", **body}, timeout=30)
        assert r.status_code == 400 and "stop_regex" in r.json()["error"]["message"], r.text
    assert requests.post(server.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}},
                         timeout=30).status_code == 200


def test_n_samples_of_an_image_prompt_share_one_build_and_leave_no_shared_memory(client, server):
    """The image is decoded and written to shared memory once; each sample carries hard-linked names
    of its own (sampling seed + i), and every name is unlinked once all samples were received."""
    from conftest import data_url, noise_image, png_bytes, shm_sglang_entries

    def own():  # this server's segments (its port leads their names)
        return {n for n in shm_sglang_entries() if n.startswith(f"sglang_mm_{server.port}_")}

    msg = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(png_bytes(noise_image(64, 48, 5)))}},
                                        {"type": "text", "text": "Describe it."}]}]
    resp = client.chat.completions.create(model="default", messages=msg, n=3, max_tokens=6, temperature=1.0, seed=11)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    for i in (1, 2):  # sample i is the single request with seed + i
        single = client.chat.completions.create(model="default", messages=msg, max_tokens=6, temperature=1.0, seed=11 + i)
        assert resp.choices[i].message.content == single.choices[0].message.content
    wait_until(lambda: not own(), 10, what="every sample's shared memory unlinked")
