"""The tokenizer manager's text-only services (`/tokenize`, `/detokenize`): the server's tokenizer, bounded and
laned as prompts are (tokenizer_lanes.py), off the event loop. `TokenizerManager` mixes this in."""

from __future__ import annotations

import asyncio

from sglang.srt.managers.request_validation import check_input_ids


class TokenizerTextMixin:
    """Needs from its host: builder (its lanes and vocab_size) and _request_pool."""

    async def tokenize(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of each text with the server's tokenizer (no chat template), off the event loop."""
        def run() -> list[list[int]]:  # bounded and laned as prompts are (tokenizer_lanes.py)
            return [self.builder.lanes.encode(t, add_special_tokens) for t in texts]

        return await asyncio.get_running_loop().run_in_executor(self._request_pool, run)

    async def detokenize(self, seqs: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """The text of each id sequence; an id outside the vocabulary is a 400 naming it."""
        for ids in seqs:
            check_input_ids(ids, self.builder.vocab_size)
            self.builder.lanes.check_ids(ids)

        def run() -> list[str]:
            return [self.builder.lanes.decode(ids, skip_special_tokens) for ids in seqs]

        return await asyncio.get_running_loop().run_in_executor(self._request_pool, run)
