"""Client text and token ids through the tokenizer: a size bound checked before any work, and a second
lane for long inputs so one of them never holds the lock every ordinary prompt needs.

Invariants:
- Text from a client (a /generate, chat or completions prompt after its template, a /tokenize prompt)
  longer than `context_length * SGLANG_MAX_PROMPT_CHARS_PER_TOKEN` characters is refused before it is
  tokenized: no tokenizer's token is that long on average, so such a prompt cannot fit the context,
  and tokenizing it cost 13.8 s and 1.4 GiB for 16 MiB while holding the tokenizer lock. A token id
  sequence to decode is refused beyond `context_length` ids (none that long can come from this model).
- HF fast tokenizers are not safe to call concurrently (an encode borrows the tokenizer mutably to set
  truncation and padding; a decode beside it fails with "Already borrowed"), so each lane is one
  tokenizer under one lock. Inputs of at least LONG_CHARS characters (LONG_IDS ids) take the long lane, a
  private copy of the tokenizer made on first use: ordinary prompts wait at most for another ordinary one.
- Output text the event loop makes (logprob token texts, an echoed prompt) takes the output lane, a
  third copy: it never waits behind a prompt being tokenized in a worker thread, and never races one.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

from sglang.srt.errors import GenerateError

# ~50 ms of tokenizing on one core: below this an input shares the ordinary lane
LONG_CHARS = 1 << 16
LONG_IDS = 1 << 14


def check_id_count(n: int, context_length: int) -> None:
    if n > context_length:  # upstream's wording for a prompt over the context
        raise GenerateError(f"The input ({n} tokens) is longer than the model's context length ({context_length} tokens).")


class TokenizerLanes:
    def __init__(self, tokenizer: Any, context_length: int, chars_per_token: int):
        self.tokenizer = tokenizer
        self.lock = threading.Lock()  # the ordinary lane's: whoever else calls `tokenizer` takes it too
        self.context_length = context_length
        self.max_chars = context_length * chars_per_token
        self._long_lock = threading.Lock()
        self._long_tokenizer: Any = None
        self._output_lock = threading.Lock()
        self._output_tokenizer: Any = None

    def check_text(self, text: str) -> None:
        if len(text) > self.max_chars:
            raise GenerateError(
                f"The input ({len(text)} characters) is longer than the model's context length "
                f"({self.context_length} tokens) can hold: at most {self.max_chars} characters are tokenized "
                f"(SGLANG_MAX_PROMPT_CHARS_PER_TOKEN per token of context)."
            )

    def check_ids(self, ids: list[int]) -> None:
        check_id_count(len(ids), self.context_length)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        self.check_text(text)
        if len(text) < LONG_CHARS:
            with self.lock:
                return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        with self._long_lock:
            return self._long().encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        self.check_ids(ids)
        if len(ids) < LONG_IDS:
            with self.lock:
                return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        with self._long_lock:
            return self._long().decode(ids, skip_special_tokens=skip_special_tokens)

    def decode_output(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Text of output or prompt ids on the event loop (logprob texts, echo), on the output lane."""
        if len(ids) >= LONG_IDS:
            return self.decode(ids, skip_special_tokens)
        with self._output_lock:
            if self._output_tokenizer is None:
                with self.lock:  # the copy reads the tokenizer
                    self._output_tokenizer = copy.deepcopy(self.tokenizer)
            return self._output_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def _long(self) -> Any:
        # under _long_lock; a copy, so it shares no state the ordinary lane's calls touch. Copied under the
        # ordinary lock (the copy reads the tokenizer): once, about 0.3 s for Qwen's 151k vocabulary.
        if self._long_tokenizer is None:
            with self.lock:
                self._long_tokenizer = copy.deepcopy(self.tokenizer)
        return self._long_tokenizer
