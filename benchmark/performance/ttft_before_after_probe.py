"""Interleaved TTFT probe of two servers (before / after trees), one request at a time, alternating:
a new JSON schema's time to first token, and an n=4 video chat's (a fresh clip each time).
Usage: python benchmark/performance/ttft_before_after_probe.py BEFORE_TREE AFTER_TREE (ROUNDS=6 by default)
ONLY=schema skips the video rounds; SCHEMA_PROPS=N makes each round's schema N patterned string
properties (a heavier compile) instead of 12 plain ones; WARM_GRAMMAR=1 warms each server with one constrained request first
(xgrammar's vocabulary view, built once per process, then stays out of every round)."""
import json, os, subprocess, sys, time, uuid, statistics, signal
import requests
trees = {"before": sys.argv[1], "after": sys.argv[2]}
sys.path.insert(0, trees["after"])
from sglang.testing.make_model import ensure_model
from sglang.testing.sample_video import make_clip
model = str(ensure_model("qwen3-vl-tiny"))
media = os.environ.get("PROBE_MEDIA_DIR", "/tmp/ttft_probe_media"); os.makedirs(media, exist_ok=True)
procs, urls = {}, {}
for i, (name, tree) in enumerate(trees.items()):
    port = int(os.environ.get("PROBE_PORT", "31900")) + i
    log = open(f"{media}/server_{name}.log", "w")
    procs[name] = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--port", str(port),
                                    "--allowed-local-media-path", media], env=dict(os.environ, PYTHONPATH=tree), cwd=tree,
                                   stdout=log, stderr=subprocess.STDOUT)
    urls[name] = f"http://127.0.0.1:{port}"
for name, url in urls.items():
    t0 = time.time()
    while True:
        try:
            if requests.get(url + "/health", timeout=1).status_code == 200: break
        except Exception: pass
        if procs[name].poll() is not None or time.time() - t0 > 300: sys.exit(name + " did not start")
        time.sleep(0.5)

def ttft(url, body):
    t = time.perf_counter()
    with requests.post(url + "/v1/chat/completions", json={**body, "stream": True}, stream=True, timeout=300) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                d = json.loads(line[6:])
                if any(c.get("delta", {}).get("content") for c in d.get("choices", [])):
                    return (time.perf_counter() - t) * 1e3
    return (time.perf_counter() - t) * 1e3

res = {n: {"schema": [], "video": []} for n in trees}
try:
    for url in urls.values():
        ttft(url, {"model": "m", "messages": [{"role": "user", "content": "warm"}], "max_tokens": 2})
        if os.environ.get("WARM_GRAMMAR") == "1":
            ttft(url, {"model": "m", "messages": [{"role": "user", "content": "warm"}], "max_tokens": 2,
                       "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}})
    for i in range(int(os.environ.get("ROUNDS", "6"))):
        big = int(os.environ.get("SCHEMA_PROPS", "0"))  # N: N patterned string properties (a compile of ~N ms)
        props = ({f"p{uuid.uuid4().hex[:8]}_{k}": {"type": "string", "pattern": f"[a-z]{{1,{k % 7 + 2}}}[0-9]{{2}}"}
                  for k in range(big)} if big else
                 {f"p{uuid.uuid4().hex[:8]}_{k}": {"type": ["string", "integer", "boolean"][k % 3]} for k in range(12)})
        schema = {"type": "object", "properties": props, "required": list(props)}
        path = f"{media}/clip{i}_{uuid.uuid4().hex[:6]}.mp4"
        open(path, "wb").write(make_clip(320, 240, 4, 8, seed=100 + i))
        order = list(urls) if i % 2 == 0 else list(urls)[::-1]
        for name in order:  # the same schema is new to each server; the same clip too
            res[name]["schema"].append(ttft(urls[name], {"model": "m", "messages": [{"role": "user", "content": f"json {i}"}],
                "max_tokens": 4, "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}))
        for name in order if os.environ.get("ONLY") != "schema" else ():
            res[name]["video"].append(ttft(urls[name], {"model": "m", "n": 4, "max_tokens": 4, "messages": [{"role": "user", "content": [
                {"type": "video_url", "video_url": {"url": path}}, {"type": "text", "text": "Describe it."}]}]}))
    for name in trees:
        for k, v in res[name].items():
            if not v: continue
            print(name, k, [round(x) for x in v], "median", round(statistics.median(v)), "min", round(min(v)))
finally:
    for p in procs.values():
        p.send_signal(signal.SIGTERM)
    for p in procs.values():
        p.wait(30)
