"""One mutant per switchable path: a small edit that makes the path silently not run while its switch
still says "on", and the tests that claim to notice. `scripts/check_switches.py` applies each mutant to a
temporary copy of the checkout and runs its tests; a mutant whose tests still pass is a survivor: a
switch no test proves.

Each edit's `find` must occur exactly once in its file (the default suite checks that every mutant still
applies, so a refactor that moves the code updates the mutant beside it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    switch: str  # the flag or variable that claims the path
    path: str  # file to edit, relative to the repository root
    find: str
    replace: str
    tests: tuple[str, ...]  # pytest node ids that must fail on the mutant
    slow: bool = False  # its tests are in the slow target


MUTANTS: tuple[Mutant, ...] = (
    Mutant("fp8-kv-scales-not-folded", "--kv-cache-dtype fp8_e4m3 (+ scales)",
           "sglang/srt/layers/attention/base_attn_backend.py",
           "ks, vs = scales(layer.layer_id) if scales is not None else (1.0, 1.0)", "ks, vs = 1.0, 1.0",
           ("test/unit/models/test_fp8_parity.py::test_non_unit_kv_scales_fold_back_into_attention",)),
    Mutant("ep-size-not-passed", "--ep-size", "sglang/srt/managers/scheduler.py",
           "            server_args.ep_size,\n", "            1,\n",
           ("test/e2e/test_switch_proofs.py::test_expert_parallelism_through_the_server",), slow=True),
    Mutant("vit-graph-runner-bypassed", "SGLANG_VIT_ENABLE_CUDA_GRAPH", "sglang/srt/models/vlm_base.py",
           "out = (self.vit_graph or self.visual)(", "out = (self.visual)(",
           ("test/e2e/test_switch_proofs.py::test_the_vit_graph_runner_runs_when_its_switch_is_on",)),
    Mutant("llguidance-served-by-xgrammar", "--grammar-backend llguidance", "sglang/srt/constrained/backends.py",
           "    return BACKENDS[name](tokenizer", "    return XGrammarBackend(tokenizer",
           ("test/e2e/test_llguidance_server.py::test_llguidance_is_what_compiled_the_grammars",)),
    Mutant("update-keeps-vision-embeddings", "/update_weights_from_disk",
           "sglang/srt/managers/scheduler_update_weights_mixin.py",
           "self.worker.clear_mm_cache()", "pass",
           ("test/e2e/test_switch_proofs.py::test_an_image_chat_after_a_weight_update_is_the_new_models",)),
    Mutant("strict-json-strings-off", "json_schema (RFC 8259 strings)", "sglang/srt/constrained/xgrammar_backend.py",
           "    return _NEGATED_CLASS.sub(strict, ebnf)", "    return ebnf",
           ("test/unit/constrained/test_strict_json.py",)),
    Mutant("epd-cache-trusts-stated-hash", "--encoder-only (cache key)", "sglang/srt/entrypoints/encode_server.py",
           "            item.hash = content_key(r)\n", "            item.hash = 42\n",
           ("test/unit/disaggregation/test_encoder_trust.py::test_a_stated_hash_cannot_poison_the_cache",)),
)
