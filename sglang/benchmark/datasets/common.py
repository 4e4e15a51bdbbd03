"""What every dataset shares: the request record, the tokenizer helpers, exact-length random text and the two
length rules.

Length rules for `--random-input-len n --random-output-len m --random-range-ratio r`:
- "sglang" (`random`, `random-ids`, `image`): lengths uniform in [max(int(n * r), 1), n], 0 <= r <= 1; r = 1
  gives exactly n, r = 0 anything from 1 to n.
- "vllm" (`random-mm`): lengths uniform in [floor(n * (1 - r)), ceil(n * (1 + r))], 0 <= r < 1, output length
  at least 1.
"""

from __future__ import annotations

import math
import re
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

LEN_RULES = ("sglang", "vllm")


class DatasetError(ValueError):
    """A dataset cannot be built from the given flags or file; the message is one line for the user."""


@dataclass
class SampleRequest:
    prompt: str
    prompt_len: int  # text tokens, prefix included (image placeholders and chat template excluded)
    output_len: int
    images: list[str] = field(default_factory=list)  # data URLs (or http(s) URLs for file datasets)
    image_sizes: list[tuple[int, int]] = field(default_factory=list)  # (H, W) per image, where known
    images_first: bool = False
    prompt_ids: list[int] | None = None  # `random-ids`: the prompt as token ids
    videos: list[str] = field(default_factory=list)  # data URLs of encoded clips (random-mm buckets with T > 1)
    video_sizes: list[tuple[int, int, int]] = field(default_factory=list)  # (H, W, T) per video

    def content(self) -> list[dict[str, Any]]:
        """OpenAI chat content parts in the dataset's order (videos after the images)."""
        text = [{"type": "text", "text": self.prompt}]
        imgs = [{"type": "image_url", "image_url": {"url": u}} for u in self.images]
        imgs += [{"type": "video_url", "video_url": {"url": u}} for u in self.videos]
        return imgs + text if self.images_first else text + imgs


def len_range(n: int, ratio: float) -> tuple[int, int]:
    """vLLM's inclusive range [floor(n*(1-r)), ceil(n*(1+r))]."""
    return math.floor(n * (1 - ratio)), math.ceil(n * (1 + ratio))


def sglang_len_range(n: int, ratio: float) -> tuple[int, int]:
    """SGLang's inclusive range [max(int(n*r), 1), n] (n itself at least 1)."""
    if not 0.0 <= ratio <= 1.0:
        raise DatasetError(f"--random-range-ratio must be in [0, 1], got {ratio}")
    n = max(int(n), 1)
    return max(int(n * ratio), 1), n


_CONTROL = re.compile(r"^<\|.*\|>$", re.S)
_USABLE_IDS: "weakref.WeakKeyDictionary[Any, np.ndarray]" = weakref.WeakKeyDictionary()


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def usable_token_ids(tokenizer) -> np.ndarray:
    """Ids of the real vocabulary that decode to text re-encoding to exactly themselves.

    This drops special and added tokens, `<|...|>` control/reserved entries and byte fragments of multi-byte
    characters, so random text built from these ids is stable under decode/encode. Cached per tokenizer."""
    try:
        return _USABLE_IDS[tokenizer]
    except (KeyError, TypeError):
        pass
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids = [i for i in range(int(tokenizer.vocab_size)) if i not in special]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        texts = backend.decode_batch([[i] for i in ids], skip_special_tokens=False)
    else:
        texts = [tokenizer.decode([i]) for i in ids]
    # Reserved fillers (e.g. `<|reserved_42|>`) never round-trip; skipping them before encoding saves seconds.
    kept = [(i, t) for i, t in zip(ids, texts) if not _CONTROL.match(t)]
    ids, texts = [i for i, _ in kept], [t for _, t in kept]
    if backend is not None:
        encoded = [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    else:
        encoded = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    usable = np.array([i for i, e in zip(ids, encoded) if e == [i]], dtype=np.int64)
    if usable.size == 0:
        raise ValueError("the tokenizer has no token that survives decode/encode")
    try:
        _USABLE_IDS[tokenizer] = usable
    except TypeError:
        pass
    return usable


class RandomText:
    """Random text of an exact token length: sample real-vocabulary ids, decode, re-encode, then trim or
    extend the body until the re-encoded text has the requested length."""

    MAX_ROUNDS = 32

    def __init__(self, tokenizer, rng: np.random.Generator):
        self.tokenizer = tokenizer
        self.rng = rng
        self.vocab = usable_token_ids(tokenizer)

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def _sample(self, n: int) -> list[int]:
        return self.rng.choice(self.vocab, size=max(0, n)).tolist()

    def make(self, n: int, prefix: str = "") -> tuple[str, int]:
        """`prefix` + random body whose whole text encodes to count(prefix) + n tokens.
        Returns (text, token count); the count is exact unless the loop fails to converge."""
        target = self.count(prefix) + n
        body = self._sample(n)
        text, got = prefix, target - n
        for _ in range(self.MAX_ROUNDS):
            text = prefix + self.tokenizer.decode(body)
            got = self.count(text)
            if got == target:
                break
            if got > target:
                body = body[: max(0, len(body) - (got - target))]
            else:
                body = body + self._sample(target - got)
        return text, got


@dataclass(frozen=True)
class TextLenConfig:
    input_len: int = 1024
    output_len: int = 128
    prefix_len: int = 0
    range_ratio: float = 0.0
    rule: str = "vllm"  # see LEN_RULES

    def sample(self, rng: np.random.Generator, num: int) -> tuple[list[int], list[int]]:
        """(input lengths, output lengths) for `num` requests under this config's rule."""
        if self.rule == "sglang":
            in_lo, in_hi = sglang_len_range(self.input_len, self.range_ratio)
            out_lo, out_hi = sglang_len_range(self.output_len, self.range_ratio)
            return (rng.integers(in_lo, in_hi + 1, size=num).tolist(),
                    rng.integers(out_lo, out_hi + 1, size=num).tolist())
        if self.rule != "vllm":
            raise DatasetError(f"unknown length rule {self.rule!r}; choose from {LEN_RULES}")
        if not 0.0 <= self.range_ratio < 1.0:
            raise DatasetError(f"--random-range-ratio must be in [0, 1) under vLLM's rule (random-mm), got {self.range_ratio}")
        in_lo, in_hi = len_range(self.input_len, self.range_ratio)
        out_lo, out_hi = len_range(self.output_len, self.range_ratio)
        inputs = rng.integers(max(0, in_lo), in_hi + 1, size=num)
        outputs = rng.integers(max(1, out_lo), max(1, out_hi) + 1, size=num)
        return inputs.tolist(), outputs.tolist()


def random_texts(gen: RandomText, cfg: TextLenConfig, rng: np.random.Generator, num: int, progress: bool):
    from sglang.benchmark.progress import progress_bar

    prefix, _ = gen.make(cfg.prefix_len) if cfg.prefix_len > 0 else ("", 0)
    in_lens, out_lens = cfg.sample(rng, num)
    for n, out in progress_bar(list(zip(in_lens, out_lens)), desc="dataset", disable=not progress):
        text, got = gen.make(n, prefix)
        yield text, got, out


def apply_chat_template(tokenizer, prompt: str, num_images: int = 0, images_first: bool = True,
                        num_videos: int = 0) -> str:
    """The prompt as the tokenizer's chat template renders one user turn (generation prompt added, a leading
    BOS removed since the server adds its own); images and videos become the template's own entries."""
    parts: list[dict[str, Any]] = [{"type": "image"} for _ in range(num_images)]
    parts += [{"type": "video"} for _ in range(num_videos)]
    text = [{"type": "text", "text": prompt}]
    content: Any = prompt if not parts else (parts + text if images_first else text + parts)
    out = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                        tokenize=False)
    bos = getattr(tokenizer, "bos_token", None)
    return out[len(bos):] if bos and out.startswith(bos) else out


def video_placeholder(tokenizer) -> str:
    """The text that stands for one video in a raw (untemplated) native prompt."""
    return "<|vision_start|><|video_pad|><|vision_end|>" if "<|video_pad|>" in tokenizer.get_vocab() else "<video>"


def image_placeholder(tokenizer) -> str:
    """The text that stands for one image in a raw (untemplated) native prompt."""
    vocab = tokenizer.get_vocab()
    if "<|image_pad|>" in vocab:
        return "<|vision_start|><|image_pad|><|vision_end|>"
    return "<image>"
