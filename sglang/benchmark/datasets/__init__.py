"""Benchmark datasets. `get_dataset(args, ...)` builds the one `--dataset-name` asks for:

random, random-ids, generated-shared-prefix (`text`); random-mm, image (`synthetic_mm`); sharegpt, mmmu from a
local `--dataset-path` (`files`). Each module's docstring gives its rules.
"""

from __future__ import annotations

import argparse

from sglang.benchmark.datasets.common import (LEN_RULES, DatasetError, RandomText, SampleRequest, TextLenConfig,
                                              apply_chat_template, image_placeholder, video_placeholder, len_range, load_tokenizer,
                                              random_texts, sglang_len_range, usable_token_ids)
from sglang.benchmark.datasets.files import (check_dataset_path, mmmu_prompt, read_records, sample_mmmu, sample_sharegpt,
                                             sharegpt_pair)
from sglang.benchmark.datasets.synthetic_mm import (DEFAULT_BUCKETS, DEFAULT_LIMIT_MM, IMAGE_FORMATS, RESOLUTIONS,
                                                    ImageDatasetConfig, RandomMMConfig, encode_image, make_image,
                                                    parse_bucket_config, parse_image_resolution, parse_limit_mm,
                                                    sample_image_dataset, sample_random_mm)
from sglang.benchmark.datasets.text import (GSPConfig, sample_generated_shared_prefix, sample_random,
                                            sample_random_ids)

DATASETS = ("sharegpt", "random", "random-ids", "generated-shared-prefix", "image", "random-mm", "mmmu")
# Datasets whose requests carry images (chat backends or the native `sglang` one only).
IMAGE_DATASETS = ("image", "random-mm", "mmmu")

__all__ = [
    "DATASETS", "DEFAULT_BUCKETS", "DEFAULT_LIMIT_MM", "DatasetError", "GSPConfig", "IMAGE_DATASETS",
    "IMAGE_FORMATS", "ImageDatasetConfig", "LEN_RULES", "RESOLUTIONS", "RandomMMConfig", "RandomText",
    "SampleRequest", "TextLenConfig", "apply_chat_template", "check_dataset_path", "encode_image", "get_dataset", "image_placeholder",
    "len_range", "load_tokenizer", "make_image", "mmmu_prompt", "parse_bucket_config", "parse_image_resolution",
    "parse_limit_mm", "random_texts", "read_records", "sample_generated_shared_prefix", "sample_image_dataset",
    "sample_mmmu", "sample_random", "sample_random_ids", "sample_random_mm", "sample_sharegpt", "sglang_len_range",
    "sharegpt_pair", "usable_token_ids", "video_placeholder",
]


def get_dataset(args: argparse.Namespace, tokenizer, num: int, seed: int) -> list[SampleRequest]:
    """The requests of `args.dataset_name` (bench_serving's flags), `num` of them where the dataset is sized
    by --num-prompts."""
    name = args.dataset_name
    progress = not args.disable_tqdm and num > 1

    def text(rule: str) -> TextLenConfig:
        return TextLenConfig(args.random_input_len, args.random_output_len, args.random_prefix_len,
                             args.random_range_ratio, rule)

    if name == "random":
        return sample_random(tokenizer, num, text("sglang"), seed, progress)
    if name == "random-ids":
        return sample_random_ids(tokenizer, num, text("sglang"), seed)
    if name == "generated-shared-prefix":
        cfg = GSPConfig(args.gsp_num_groups, args.gsp_prompts_per_group, args.gsp_system_prompt_len,
                        args.gsp_question_len, args.gsp_output_len)
        return sample_generated_shared_prefix(tokenizer, cfg, seed, progress)
    if name == "sharegpt":
        return sample_sharegpt(tokenizer, num, args.dataset_path, args.sharegpt_output_len,
                               args.sharegpt_context_len, seed)
    if name == "mmmu":
        return sample_mmmu(tokenizer, num, args.dataset_path, args.random_output_len, seed)
    if name == "random-mm":
        cfg = RandomMMConfig(text("vllm"), args.random_mm_base_items_per_request,
                             args.random_mm_num_mm_items_range_ratio, args.random_mm_limit_mm_per_prompt,
                             args.random_mm_bucket_config)
        return sample_random_mm(tokenizer, num, cfg, seed, progress)
    if name == "image":
        cfg = ImageDatasetConfig(text("sglang"), args.image_count, args.random_image_count,
                                 args.image_resolution, args.image_format, args.image_content)
        return sample_image_dataset(tokenizer, num, cfg, seed, progress)
    raise DatasetError(f"unknown --dataset-name {name!r}; choose from {DATASETS}")
