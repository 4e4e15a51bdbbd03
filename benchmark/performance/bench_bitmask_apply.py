"""CPU cost of applying constrained decoding's token bitmask to float32 logits at the real vocabulary
(151,936): the dense unpack (every row unpacked to vocab booleans, a masked fill: `apply_bitmask_torch`,
the torch reference of the Triton kernel), the sparse op the CPU path takes (`apply_bitmask_sparse_cpu`:
only the minority of tokens written) and xgrammar's own CPU op, on real rows of a JSON-schema grammar.

    python benchmark/performance/bench_bitmask_apply.py --rows 1,16,64 --repeats 20 --json out.json

Row kinds, as decoding meets them: "between" (a matcher between JSON tokens: a few hundred tokens
allowed, the rest banned), "string" (inside a JSON string: almost every token allowed), and the mix of
both. Times are this thread's CPU time (`time.thread_time`, torch on one thread) per apply, the median
over --repeats runs, each on fresh logits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SCHEMA = json.dumps({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]})


def real_rows(model_path: str, vocab: int) -> dict[str, torch.Tensor]:
    """One bitmask row of each kind, filled by xgrammar for the tiny model's tokenizer."""
    import xgrammar as xg

    from sglang.srt.constrained.xgrammar_backend import XGrammarBackend

    backend = XGrammarBackend(model_path, vocab, stop_token_ids=[151645])
    compiled = backend.compile(("json_schema", SCHEMA))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    out = {}
    for kind, prefix in (("between", '{"name"'), ("string", '{"name": "Al')):
        m = backend.matcher(compiled)
        for t in tok.encode(prefix, add_special_tokens=False):
            assert m.accept_token(t), (prefix, t)
        bm = xg.allocate_token_bitmask(1, vocab)
        m.fill_next_token_bitmask(bm)
        out[kind] = bm[0].clone()
    return out


def timed(fn, logits: torch.Tensor, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        x = logits.clone()
        t0 = time.thread_time()
        fn(x)
        times.append(time.thread_time() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,16,64")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--model-path", default=None, help="default: the tiny Qwen3-VL (generated on first use)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import xgrammar as xg

    from sglang.srt.constrained.matcher import apply_bitmask_sparse_cpu, apply_bitmask_torch
    from sglang.testing.make_model import ensure_model

    torch.set_num_threads(1)
    vocab = 151936
    rows_of = real_rows(args.model_path or str(ensure_model("qwen3-vl-tiny")), vocab)
    allowed = {k: int(((v.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).sum()) for k, v in rows_of.items()}
    print(f"vocab {vocab}; allowed tokens per row: {allowed}; thread CPU ms per apply (median of {args.repeats})")
    print(f"{'rows':>5} {'kind':<8} {'dense unpack':>13} {'sparse':>9} {'xgrammar':>9}")
    results = {"allowed": allowed}
    gen = torch.Generator().manual_seed(0)
    for n in [int(x) for x in args.rows.split(",")]:
        for kind in ("between", "string", "mixed"):
            picks = [("between", "string")[i % 2] if kind == "mixed" else kind for i in range(n)]
            bitmask = torch.stack([rows_of[p] for p in picks])
            rows = list(range(n))
            logits = torch.randn(n, vocab, generator=gen)
            dense = timed(lambda x: apply_bitmask_torch(x, bitmask, rows, vocab), logits, args.repeats)
            sparse = timed(lambda x: apply_bitmask_sparse_cpu(x, bitmask, rows, vocab), logits, args.repeats)
            xgr = timed(lambda x: xg.apply_token_bitmask_inplace(x, bitmask, vocab_size=vocab, indices=rows),
                        logits, args.repeats)
            results[f"{n}/{kind}"] = {"dense_ms": round(dense, 3), "sparse_ms": round(sparse, 3),
                                      "xgrammar_ms": round(xgr, 3)}
            print(f"{n:>5} {kind:<8} {dense:>13.3f} {sparse:>9.3f} {xgr:>9.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
