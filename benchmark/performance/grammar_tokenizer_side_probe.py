"""What the tokenizer side spends on a new JSON schema before the request can be sent (so what it adds
to the schema's time to first token), in the tree TREE (this one, or an export of an older commit):
with `sglang.srt.constrained.validation` (before issue 35) the SamplingParams checks plus the
validator's compile; without it only the checks (size, JSON parse, the grammar key). Wall ms per new
schema (each round a fresh one), median and min of ROUNDS, for 12 plain properties and 200 patterned ones.

    python benchmark/performance/grammar_tokenizer_side_probe.py TREE [ROUNDS]"""
import asyncio, json, statistics, sys, time, uuid
tree = sys.argv[1]
sys.path.insert(0, tree)
from types import SimpleNamespace
from sglang.testing.make_model import ensure_model
from sglang.srt.sampling.sampling_params import SamplingParams
model = str(ensure_model("qwen3-vl-tiny"))
def schema(n):
    if n:
        props = {f"p{uuid.uuid4().hex[:8]}_{k}": {"type": "string", "pattern": f"[a-z]{{1,{k % 7 + 2}}}[0-9]{{2}}"} for k in range(n)}
    else:
        props = {f"p{uuid.uuid4().hex[:8]}_{k}": {"type": ["string", "integer", "boolean"][k % 3]} for k in range(12)}
    return json.dumps({"type": "object", "properties": props, "required": list(props)})
try:
    from sglang.srt.constrained.validation import GrammarValidator
    args = SimpleNamespace(grammar_backend="xgrammar", constrained_json_disable_any_whitespace=False, constrained_json_max_whitespace_cnt=None)
    v = GrammarValidator(args, model, 151936)
    asyncio.run(v.check(("json_schema", schema(0))))  # the vocabulary view (once per process) built first
except ImportError:
    v = None
for n in (0, 200):
    wall = []
    for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 10):  # each round a new schema: no cache hit
        t = time.perf_counter()
        sp = SamplingParams(json_schema=schema(n))
        sp.verify()
        if v is not None:
            asyncio.run(v.check(sp.grammar_key()))
        wall.append((time.perf_counter() - t) * 1e3)
    print(tree, "12 plain props" if not n else f"{n} patterned props", "median ms", round(statistics.median(wall), 2), "min", round(min(wall), 2))
