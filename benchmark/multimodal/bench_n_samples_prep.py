"""Run with PYTHONPATH=<tree>. Tokenizer-side preparation of an n=4 video chat: 4 builds (before) vs 1 build + 3 clones (after)."""
import time, uuid, statistics, os
from sglang.testing.make_model import ensure_model
from sglang.testing.sample_video import make_clip
from sglang.srt.server_args import ServerArgs
from sglang.srt.managers.request_builder import RequestBuilder
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.multimodal.transport.shm import unlink_segments
model = str(ensure_model("qwen3-vl-tiny")); media = os.environ.get("PROBE_MEDIA_DIR", "/tmp/ttft_probe_media"); os.makedirs(media, exist_ok=True)
b = RequestBuilder(ServerArgs(model_path=model, allowed_local_media_path=media, port=31999), model)
before, after = [], []
for i in range(5):
    path = f"{media}/prep{i}_{uuid.uuid4().hex[:6]}.mp4"; open(path, "wb").write(make_clip(320, 240, 4, 8, seed=200 + i))
    msgs = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": path}}, {"type": "text", "text": "Describe it."}]}]
    copies = GenerateReqInput(messages=msgs, sampling_params={"n": 4, "max_new_tokens": 4}).parallel_copies()
    t = time.perf_counter(); built = []
    for j, c in enumerate(copies):
        rid = f"b{i}-{j}"; built.append(b.build(b.check(c, rid)))
    before.append((time.perf_counter() - t) * 1e3)
    for tok, _ in built: unlink_segments(b.take_unsent_shm(tok.rid))
    t = time.perf_counter()
    first, payload = b.build(b.check(copies[0], f"a{i}-0"))
    clones = [b.clone(first, payload, f"a{i}-{j}", None) for j in (1, 2, 3)]
    after.append((time.perf_counter() - t) * 1e3)
    for tok, _ in [(first, payload), *clones]: unlink_segments(b.take_unsent_shm(tok.rid))
print("n=4 video prep, 4 builds (before):", [round(x) for x in before], "median", round(statistics.median(before)))
print("n=4 video prep, 1 build + 3 clones (after):", [round(x) for x in after], "median", round(statistics.median(after)))
b.close()
