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
    Mutant("mm-hash-left-to-scheduler", "SGLANG_MM_PRECOMPUTE_HASH", "sglang/srt/managers/request_builder.py",
           "self.precompute_hash = precompute_hash_enabled() or epd", "self.precompute_hash = epd",
           ("test/unit/multimodal/test_mm_hash_precompute.py::test_build_precomputes_what_the_scheduler_would_compute",
            "test/unit/entrypoints/test_engine_n_samples.py::test_n_samples_build_the_image_once")),
    Mutant("shm-transport-sends-inline", "SGLANG_MM_SHM_TRANSPORT", "sglang/srt/managers/request_builder.py",
           "segment_prefix(server_args.port) if use_shm_transport(server_args) and not epd else None",
           "segment_prefix(server_args.port) if False else None",
           ("test/unit/managers/test_request_builder_switch.py"
            "::test_shm_transport_moves_the_pixels_out_of_the_message",)),
    Mutant("gdn-kernels-bypassed", "SGLANG_GDN_BACKEND", "sglang/srt/models/qwen3_5.py",
           "                if plan is not None:  # the kernel path", "                if False:  # the kernel path",
           ("test/unit/models/test_qwen3_5_gdn_backend.py::test_triton_kernels_equal_the_torch_path",)),
    Mutant("mm-admission-unbounded", "--mm-max-in-flight-per-request", "sglang/srt/multimodal/bounded_fanout.py",
           "    window = n if not limit or limit >= n else int(limit)", "    window = n",
           ("test/unit/multimodal/test_bounded_admission.py"
            "::test_run_bounded_keeps_at_most_k_submitted_and_returns_results_in_order",)),
    Mutant("mm-single-flight-ignored", "SGLANG_MM_SINGLE_FLIGHT", "sglang/srt/managers/request_builder.py",
           "shared=envs.SGLANG_MM_SINGLE_FLIGHT.get()", "shared=True",
           ("test/unit/multimodal/test_single_flight_switch.py"
            "::test_single_flight_off_processes_every_image_and_builds_the_same_requests",)),
    Mutant("mm-data-url-decoded-in-tokenizer", "SGLANG_MM_DATA_URL_TEXT_KEY", "sglang/srt/managers/request_builder.py",
           "data_url_text_key=envs.SGLANG_MM_DATA_URL_TEXT_KEY.get()", "data_url_text_key=False",
           ("test/unit/multimodal/test_single_flight_switch.py"
            "::test_a_data_url_is_keyed_by_its_text_and_decoded_by_the_worker",)),
    Mutant("vit-chunk-encodes-whole-request", "SGLANG_VIT_CHUNK_PER_IMAGE", "sglang/srt/multimodal/embedder.py",
           "return cls(envs.SGLANG_VIT_CHUNK_PER_IMAGE.get(),", "return cls(False,",
           ("test/unit/managers/test_vit_chunk_per_image.py::test_request_sharing_31_of_32_images",)),
    Mutant("patch-embed-stays-conv3d", "SGLANG_VIT_PATCH_EMBED_LINEAR", "sglang/srt/layers/vision_blocks.py",
           "cls = LinearPatchEmbed if linear else Conv3dPatchEmbed", "cls = Conv3dPatchEmbed",
           ("test/unit/configs/test_vit_strategy.py::test_get_model_passes_the_strategy_down",
            "test/unit/models/test_vit_patch_embed_switch.py::test_switch_selects_the_module")),
    Mutant("pos-embed-recomputed", "SGLANG_VIT_FAST_POS_EMBED", "sglang/srt/models/vlm_base.py",
           "fast_pos_embed=vit.fast_pos_embed, sp=sp)", "fast_pos_embed=False, sp=sp)",
           ("test/unit/models/test_vit_pos_embed_switch.py::test_switch_selects_the_path",)),
    Mutant("jpeg-decoded-in-tokenizer", "SGLANG_GPU_IMAGE_DECODE", "sglang/srt/multimodal/processor_spec.py",
           "deferred = server_args.language_only or deferred_decode_enabled(server_args.resolved_device())",
           "deferred = server_args.language_only",
           ("test/e2e/test_gpu_image_decode_server.py::test_tokenizer_defers_scheduler_decodes_png_falls_back",)),
    Mutant("images-sent-as-float32", "SGLANG_MM_UINT8_PIXELS", "sglang/srt/multimodal/processors/qwen_vl.py",
           "            uint8=self.uint8_pixels,\n", "            uint8=False,\n",
           ("test/unit/multimodal/transport/test_uint8_wire.py"
            "::test_item_bytes_are_an_eighth_for_images_a_quarter_for_videos",)),
    Mutant("still-images-sent-as-pairs", "SGLANG_MM_COMPACT_STILL_IMAGES", "sglang/srt/multimodal/processors/qwen_vl.py",
           "        if self.compact_still_images:  # one temporal frame per patch row, on every path below\n",
           "        if False:\n",
           ("test/unit/multimodal/test_compact_still_images.py::test_the_request_builder_reads_the_switch",
            "test/unit/models/test_compact_still_images_parity.py::test_compact_prompt_logits_match_transformers")),
    Mutant("dp-encoder-every-rank-encodes-all", "--mm-enable-dp-encoder", "sglang/srt/models/vlm_base.py",
           "        if self.vision_dp is None:\n", "        if True:\n",
           ("test/unit/models/test_vlm_base_switch.py::test_dp_encoder_runs_only_this_ranks_share",)),
    Mutant("ulysses-every-rank-runs-all-tokens", "--enable-vit-ulysses-sp", "sglang/srt/models/qwen3_vl.py",
           "        if self.sp is not None:\n", "        if False:\n",
           ("test/unit/models/test_qwen3_vl_switch.py::test_ulysses_tower_takes_the_sequence_parallel_forward",)),
    Mutant("stage-timer-flag-ignored", "--enable-vlm-stage-timer", "sglang/srt/metrics/stage_timer.py",
           'return bool(getattr(server_args, "enable_vlm_stage_timer", False)) or envs.SGLANG_VLM_STAGE_TIMER.get()',
           "return envs.SGLANG_VLM_STAGE_TIMER.get()",
           ("test/unit/metrics/test_stage_timer.py::test_stages_in_meta_info_and_log_lines",)),
    Mutant("stage-timer-env-ignored", "SGLANG_VLM_STAGE_TIMER", "sglang/srt/metrics/stage_timer.py",
           'return bool(getattr(server_args, "enable_vlm_stage_timer", False)) or envs.SGLANG_VLM_STAGE_TIMER.get()',
           'return bool(getattr(server_args, "enable_vlm_stage_timer", False))',
           ("test/unit/metrics/test_stage_timer.py::test_env_switch_turns_it_on",)),
    Mutant("mm-images-preprocessed-in-process", "--mm-processor-worker-num", "sglang/srt/managers/request_builder.py",
           "remote=self.mm_pool)", "remote=None)",
           ("test/unit/multimodal/test_request_builder_workers.py"
            "::test_a_request_built_by_the_workers_equals_the_in_process_build",)),
)
