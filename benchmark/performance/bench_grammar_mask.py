"""Cost of constrained decoding per step and per grammar, at the real Qwen vocabulary (151,936, the tiny
model's tokenizer): the worker's grammar work in one decode step (fill one bitmask row per constrained
request, apply them to the (B, vocab) float32 logits on CPU) for batches with k of B rows constrained, and
the compile time of a JSON schema, a regex and an EBNF grammar (cold: what the first request with a
grammar waits for; later ones hit the cache).

    python benchmark/performance/bench_grammar_mask.py --batch-sizes 1,32,128 --steps 50 --json out.json

Each constrained row decodes a JSON object of a small schema from the start, advancing its matcher
with the first allowed token of its bitmask row each step (a matcher in the middle of a string, a
number, a key: the states decoding goes through). Times are this thread's CPU time per step
(`time.thread_time`), the mean over `--steps` steps; k = 0 is the unconstrained batch (no grammar work).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

from sglang.srt.constrained.matcher import RequestGrammar, apply_grammar_bitmask
from sglang.srt.constrained.xgrammar_backend import XGrammarBackend

SCHEMA = json.dumps({
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array",
                                                                                   "items": {"type": "string"}}},
    "required": ["name", "age", "tags"],
})


def step_cost(backend: XGrammarBackend, compiled, bs: int, k: int, steps: int) -> float:
    vocab = backend.vocab_size
    grammars = [RequestGrammar(backend.matcher(compiled)) if i < k else None for i in range(bs)]
    outputs: list[list[int]] = [[] for _ in range(bs)]
    logits = torch.randn(bs, vocab)
    total = 0.0
    for _ in range(steps):
        work = logits.clone()
        t0 = time.thread_time()
        rows = apply_grammar_bitmask(work, grammars, outputs, vocab)
        total += time.thread_time() - t0
        for i in rows:  # advance: the first allowed token (its choice is not timed)
            tok = int(torch.isfinite(work[i]).nonzero()[0])
            if grammars[i].accept(tok):
                outputs[i].append(tok)
            if grammars[i].is_terminated():
                grammars[i] = RequestGrammar(backend.matcher(compiled))
                outputs[i] = []
    return total / steps * 1e3


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-sizes", default="1,32,128")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    from sglang.testing.make_model import make_model

    with tempfile.TemporaryDirectory() as tmp:
        path = make_model("qwen3-vl-tiny", f"{tmp}/model", seed=0, progress=False)
        backend = XGrammarBackend(path, 151936)
        t0 = time.perf_counter()
        backend.tokenizer_info  # noqa: B018 (built once per process)
        results: dict = {"tokenizer_info_s": round(time.perf_counter() - t0, 3), "compile_ms": {}, "step_ms": {}}
        for key in (("json_schema", SCHEMA), ("regex", r"[A-Z][a-z]{2,8}-[0-9]{3}"),
                    ("ebnf", 'root ::= "answer: " ("yes" | "no") "."')):
            t0 = time.perf_counter()
            compiled = backend.compile(key)
            results["compile_ms"][key[0]] = round((time.perf_counter() - t0) * 1e3, 2)
        compiled = backend.compile(("json_schema", SCHEMA))
        for bs in (int(b) for b in args.batch_sizes.split(",")):
            row = {}
            for k in sorted({0, 1, bs // 2, bs} - {-1}):
                row[str(k)] = round(step_cost(backend, compiled, bs, k, args.steps), 3)
            results["step_ms"][str(bs)] = row
    print(f"TokenizerInfo (once per process): {results['tokenizer_info_s']} s")
    print("compile (cold), ms: " + ", ".join(f"{k} {v}" for k, v in results["compile_ms"].items()))
    print("grammar work per decode step, ms (batch size: {constrained rows: ms}):")
    for bs, row in results["step_ms"].items():
        print(f"  {bs:>4}: " + ", ".join(f"{k} -> {v}" for k, v in row.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
