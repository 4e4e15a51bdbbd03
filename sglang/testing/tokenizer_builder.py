"""Build a small, deterministic Qwen-compatible byte-level BPE tokenizer.

The tokenizer is trained with the ``tokenizers`` library on the corpus from
:mod:`sglang.testing.corpus` (well under a second).  It uses the same normalizer /
pre-tokenizer / decoder pipeline as Qwen2 tokenizers (NFC, the Qwen2 split regex followed
by a byte-level mapping, byte-level decoding), and places the real Qwen special tokens at
their real ids (``<|endoftext|>`` = 151643, ``<|im_start|>`` = 151644, ...).

Id layout, mirroring the real Qwen vocabulary:

* ``0 .. N-1``: the trained byte-level BPE vocabulary (256 byte symbols + merges);
* ``N .. 151642``: filler entries ``<|reserved_{id}|>`` in the BPE vocabulary.  No merge
  produces them, so encoding never emits them; decoding them yields their literal text;
* ``151643 ..``: the Qwen added tokens (special and non-special), exactly as in Qwen.

Family ``qwen3_5`` keeps this layout with Qwen3.5's larger vocabulary: the fillers run up to 248043 and
the same added tokens, in the same order, start at ``<|endoftext|>`` = 248044 (``<|im_end|>`` 248046,
``<|vision_start|>`` 248053, ``<|image_pad|>`` 248056, ...), the ids of Qwen3.5's config; its
pre-tokenizer is Qwen3.5's regex (letters with their combining marks). The trained BPE is shared.

No transformers import is needed to build or write the files.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

from sglang.testing.chat_template import chat_template as _chat_template

# Same pre-tokenization regex as the Qwen2 family (public tokenizer.json).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

TOKENIZER_VERSION = 1
TRAINED_VOCAB_SIZE = 4096  # target; the corpus saturates a bit below this
FIRST_SPECIAL_ID = 151643

# (id, content, special) — the real Qwen added tokens.
_QWEN_ADDED_TOKENS_COMMON: tuple[tuple[int, str, bool], ...] = (
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
)
_QWEN3_EXTRA_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (151665, "<tool_response>", False),
    (151666, "</tool_response>", False),
    (151667, "<think>", False),
    (151668, "</think>", False),
)

SPECIAL_TOKEN_IDS: dict[str, int] = {c: i for i, c, _ in _QWEN_ADDED_TOKENS_COMMON + _QWEN3_EXTRA_TOKENS}

# Qwen3.5 (Qwen/Qwen3.5-4B config.json: <|endoftext|> 248044 ... <|video_pad|> 248057): the Qwen3 added
# tokens moved up by one offset. Ids past <|video_pad|> follow the same offset (not checked against a
# released tokenizer.json).
QWEN3_5_FIRST_SPECIAL_ID = 248044
_QWEN3_5_ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = tuple(
    (i - FIRST_SPECIAL_ID + QWEN3_5_FIRST_SPECIAL_ID, c, special)
    for i, c, special in _QWEN_ADDED_TOKENS_COMMON + _QWEN3_EXTRA_TOKENS
)
# Qwen3.5's pre-tokenization regex (transformers' Qwen3_5Tokenizer): \p{M} joins letters and marks.
QWEN3_5_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Special tokens listed as "additional" special tokens (as in the real Qwen configs).
ADDITIONAL_SPECIAL_TOKENS: tuple[str, ...] = tuple(
    c for i, c, special in _QWEN_ADDED_TOKENS_COMMON if special and c != ENDOFTEXT
)


def added_tokens(family: str = "qwen3_vl") -> tuple[tuple[int, str, bool], ...]:
    """The Qwen added tokens (id, content, special) for ``family``."""
    if family == "qwen3_vl":
        return _QWEN_ADDED_TOKENS_COMMON + _QWEN3_EXTRA_TOKENS
    if family == "qwen2_5_vl":
        return _QWEN_ADDED_TOKENS_COMMON
    if family == "qwen3_5":
        return _QWEN3_5_ADDED_TOKENS
    raise ValueError(f"unknown model family {family!r}")


def first_special_id(family: str = "qwen3_vl") -> int:
    """The id of ``<|endoftext|>``: the fillers end just below it."""
    return QWEN3_5_FIRST_SPECIAL_ID if family == "qwen3_5" else FIRST_SPECIAL_ID


def _template_family(family: str) -> str:
    """Qwen3.5 checkpoints here take the Qwen3-VL template (same markers, thinking switch)."""
    return "qwen3_vl" if family == "qwen3_5" else family


def reserved_token(token_id: int) -> str:
    return f"<|reserved_{token_id}|>"


@lru_cache(maxsize=1)
def _trained_model_json() -> str:
    """Train the byte-level BPE on the shipped corpus; returns the trained tokenizer JSON."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE

    from sglang.testing.corpus import corpus_lines

    tok = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _qwen2_pre_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=TRAINED_VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    lines = corpus_lines()
    tok.train_from_iterator(lines, trainer, length=len(lines))
    return tok.to_str()


def _qwen2_pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )


@lru_cache(maxsize=4)
def tokenizer_json(family: str = "qwen3_vl") -> str:
    """The complete ``tokenizer.json`` text (deterministic) for ``family``."""
    trained = json.loads(_trained_model_json())
    model = trained["model"]
    vocab: dict[str, int] = model["vocab"]
    n = len(vocab)
    if sorted(vocab.values()) != list(range(n)):
        raise RuntimeError("trained BPE vocabulary is not contiguous")
    first_special = first_special_id(family)
    regex = QWEN3_5_PRETOKENIZE_REGEX if family == "qwen3_5" else QWEN2_PRETOKENIZE_REGEX
    if n >= first_special:
        raise RuntimeError("trained vocabulary too large")
    full_vocab = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    for i in range(n, first_special):
        name = reserved_token(i)
        assert name not in full_vocab
        full_vocab[name] = i

    added = [
        {
            "id": tid,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": special,
        }
        for tid, content, special in added_tokens(family)
    ]
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": regex},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": full_vocab,
            "merges": model["merges"],
        },
    }
    # Compact (one line): the filler vocabulary makes an indented file needlessly large.
    return json.dumps(doc, ensure_ascii=False) + "\n"


def build_tokenizer(family: str = "qwen3_vl"):
    """Return a ``tokenizers.Tokenizer`` (the same object ``tokenizer.json`` describes)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json(family))
    # Sanity: the added tokens must land on their real ids.
    for tid, content, _ in added_tokens(family):
        got = tok.token_to_id(content)
        if got != tid:
            raise RuntimeError(f"{content} got id {got}, expected {tid}")
    return tok


def trained_vocab_size() -> int:
    """Number of real (trained) BPE entries; ids at and above this up to the first special id are fillers."""
    return len(json.loads(_trained_model_json())["model"]["vocab"])


def tokenizer_config(family: str = "qwen3_vl", model_max_length: int = 32768) -> dict:
    """The ``tokenizer_config.json`` dict (chat template included)."""
    added_decoder = {
        str(tid): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for tid, content, special in added_tokens(family)
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added_decoder,
        "additional_special_tokens": list(ADDITIONAL_SPECIAL_TOKENS),
        "bos_token": None,
        "chat_template": _chat_template(_template_family(family)),
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": int(model_max_length),
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def special_tokens_map() -> dict:
    def tok(content: str) -> dict:
        return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}

    return {
        "additional_special_tokens": list(ADDITIONAL_SPECIAL_TOKENS),
        "eos_token": tok(IM_END),
        "pad_token": tok(ENDOFTEXT),
    }


def _write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def write_tokenizer_files(out_dir: str | os.PathLike, family: str = "qwen3_vl", model_max_length: int = 32768) -> list[Path]:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json and
    chat_template.jinja into ``out_dir``.  Returns the written paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "tokenizer.json": tokenizer_json(family),
        "tokenizer_config.json": json.dumps(tokenizer_config(family, model_max_length), indent=2, ensure_ascii=False) + "\n",
        "special_tokens_map.json": json.dumps(special_tokens_map(), indent=2, ensure_ascii=False) + "\n",
        "chat_template.jinja": _chat_template(_template_family(family)),
    }
    written = []
    for name, text in files.items():
        _write_text(out / name, text)
        written.append(out / name)
    return written


def chat_template(family: str = "qwen3_vl") -> str:
    return _chat_template(_template_family(family))


__all__ = [
    "ADDITIONAL_SPECIAL_TOKENS",
    "SPECIAL_TOKEN_IDS",
    "added_tokens",
    "build_tokenizer",
    "chat_template",
    "special_tokens_map",
    "tokenizer_config",
    "tokenizer_json",
    "trained_vocab_size",
    "write_tokenizer_files",
]
