"""Text-only synthetic datasets: `random`, `random-ids` and `generated-shared-prefix`.

- `random`: random real-vocabulary token ids decoded to text, re-encoded to exactly the sampled length;
  input and output lengths follow SGLang's rule (see `common`). `--random-prefix-len` tokens of shared random
  text start every prompt.
- `random-ids`: the same lengths, but the prompt is sent as token ids where the API takes them (`input_ids`
  for `sglang`, a token array `prompt` for the completions backends; chat backends get the decoded text).
- `generated-shared-prefix`: `--gsp-num-groups` random system prompts of `--gsp-system-prompt-len` tokens,
  each followed (after a blank line) by `--gsp-prompts-per-group` random questions of `--gsp-question-len`
  tokens; every request asks for `--gsp-output-len` tokens; the requests are shuffled. `--num-prompts` is
  not used: the run has groups x prompts-per-group requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sglang.benchmark.datasets.common import (DatasetError, RandomText, SampleRequest, TextLenConfig,
                                              random_texts, usable_token_ids)
from sglang.benchmark.progress import progress_bar


def sample_random(tokenizer, num: int, cfg: TextLenConfig, seed: int = 0, progress: bool = False
                  ) -> list[SampleRequest]:
    rng = np.random.default_rng(seed)
    gen = RandomText(tokenizer, rng)
    return [SampleRequest(text, plen, olen) for text, plen, olen in random_texts(gen, cfg, rng, num, progress)]


def sample_random_ids(tokenizer, num: int, cfg: TextLenConfig, seed: int = 0) -> list[SampleRequest]:
    rng = np.random.default_rng(seed)
    vocab = usable_token_ids(tokenizer)
    prefix = rng.choice(vocab, size=max(0, cfg.prefix_len)).tolist()
    in_lens, out_lens = cfg.sample(rng, num)
    out = []
    for n, olen in zip(in_lens, out_lens):
        ids = prefix + rng.choice(vocab, size=n).tolist()
        out.append(SampleRequest(tokenizer.decode(ids), len(ids), olen, prompt_ids=ids))
    return out


@dataclass(frozen=True)
class GSPConfig:
    num_groups: int = 64
    prompts_per_group: int = 16
    system_prompt_len: int = 2048
    question_len: int = 128
    output_len: int = 256


def sample_generated_shared_prefix(tokenizer, cfg: GSPConfig, seed: int = 0, progress: bool = False
                                   ) -> list[SampleRequest]:
    for name in ("num_groups", "prompts_per_group", "output_len"):
        if getattr(cfg, name) < 1:
            raise DatasetError(f"--gsp-{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}")
    for name in ("system_prompt_len", "question_len"):
        if getattr(cfg, name) < 0:
            raise DatasetError(f"--gsp-{name.replace('_', '-')} must be >= 0, got {getattr(cfg, name)}")
    rng = np.random.default_rng(seed)
    gen = RandomText(tokenizer, rng)
    out = []
    for _ in progress_bar(range(cfg.num_groups), desc="dataset", disable=not progress):
        system, _ = gen.make(cfg.system_prompt_len)
        for _ in range(cfg.prompts_per_group):
            question, _ = gen.make(cfg.question_len)
            prompt = f"{system}\n\n{question}"
            out.append(SampleRequest(prompt, gen.count(prompt), cfg.output_len))
    order = rng.permutation(len(out))
    return [out[i] for i in order]
