"""Per-request sampling parameters, validated where the request enters (clear 400s, never a crash later)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang.srt.constrained.request_fields import GRAMMAR_KINDS, ConstraintError, checked_sampling_constraint
from sglang.srt.sampling.stop_regex import StopRegexError, checked_pattern_shapes, checked_patterns


class SamplingParamsError(ValueError):
    pass


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: all tokens
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    # regexes searched in the end of the output text (sampling/stop_regex.py); the first match ends
    # generation, the output is cut before it and matched_stop names the pattern
    stop_regex: list[str] = field(default_factory=list)
    no_stop_trim: bool = False  # keep a matched stop string / stop_regex match in the output
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    min_new_tokens: int = 0  # EOS and stop_token_ids are masked until this many tokens exist
    repetition_penalty: float = 1.0  # >1 discourages every token seen in prompt or output (HF rule)
    frequency_penalty: float = 0.0  # subtracted once per occurrence in the output (OpenAI rule)
    presence_penalty: float = 0.0  # subtracted once if the token occurs in the output
    return_logprob: bool = False  # log-probability of each output token (the model's distribution)
    top_logprobs_num: int = 0  # and of this many most likely alternatives per position
    # with return_logprob or top_logprobs_num: also each prompt token's log-probability from this
    # position on (the first prompt token has none); -1: output tokens only (upstream's default)
    logprob_start_len: int = -1
    return_text_in_logprobs: bool = False  # each logprob entry's third element: the token's text, not null
    # token id -> added to its logit before sampling (OpenAI's logit_bias; JSON keys arrive as strings)
    logit_bias: dict[int, float] | None = None
    # output constraints (at most one; sglang/srt/constrained): a JSON schema (its JSON text; an object
    # is accepted and turned into its text), a regex, an EBNF grammar the whole output must match, or an
    # xgrammar structural tag (its JSON text; an object is accepted)
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    # the request's own values for its custom_logit_processor (upstream's field; JSON object), handed to
    # the processor per row (sglang/srt/sampling/custom_logit_processor.py)
    custom_params: dict | None = None

    def verify(self, compile_patterns: bool = True) -> None:
        """Raises SamplingParamsError naming the first bad field. `compile_patterns=False` leaves out what
        compiles stop_regex patterns (sampling/stop_regex.py: `checked_patterns`), for a caller on the event
        loop that runs that part in a worker thread later; their number and length are still checked."""
        # 0: prefill only (prompt logprobs for scoring), no output token
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool) or self.max_new_tokens < 0:
            raise SamplingParamsError(f"max_new_tokens must be a non-negative integer, got {self.max_new_tokens!r}")
        if not 0.0 <= float(self.temperature) <= 100.0:
            raise SamplingParamsError(f"temperature must be in [0, 100], got {self.temperature!r}")
        if not 0.0 < float(self.top_p) <= 1.0:
            raise SamplingParamsError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k != -1):
            raise SamplingParamsError(f"top_k must be -1 (disabled) or a positive integer, got {self.top_k!r}")
        if not 0.0 <= float(self.min_p) <= 1.0:
            raise SamplingParamsError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise SamplingParamsError(f"seed must be an integer, got {self.seed!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not all(isinstance(s, str) and s for s in self.stop):
            raise SamplingParamsError("stop must be a non-empty string or a list of non-empty strings")
        if len(self.stop) > 16:
            raise SamplingParamsError("at most 16 stop strings")
        try:
            self.stop_regex = (checked_patterns if compile_patterns else checked_pattern_shapes)(self.stop_regex)
        except StopRegexError as e:
            raise SamplingParamsError(str(e)) from None
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise SamplingParamsError("stop_token_ids must be non-negative integers")
        if not isinstance(self.min_new_tokens, int) or not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise SamplingParamsError(
                f"min_new_tokens must be an integer in [0, max_new_tokens={self.max_new_tokens}], got {self.min_new_tokens!r}"
            )
        if not 0.0 < float(self.repetition_penalty) <= 2.0:
            raise SamplingParamsError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty!r}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= float(getattr(self, name)) <= 2.0:
                raise SamplingParamsError(f"{name} must be in [-2, 2], got {getattr(self, name)!r}")
        if not isinstance(self.top_logprobs_num, int) or not 0 <= self.top_logprobs_num <= 20:
            raise SamplingParamsError(f"top_logprobs_num must be an integer in [0, 20], got {self.top_logprobs_num!r}")
        if self.logit_bias is not None:
            self.logit_bias = _checked_logit_bias(self.logit_bias)
        if not isinstance(self.logprob_start_len, int) or isinstance(self.logprob_start_len, bool) or self.logprob_start_len < -1:
            raise SamplingParamsError(f"logprob_start_len must be -1 or a non-negative integer, got {self.logprob_start_len!r}")
        if self.custom_params is not None and not isinstance(self.custom_params, dict):
            raise SamplingParamsError(f"custom_params must be an object, got {type(self.custom_params).__name__}")
        try:
            checked_sampling_constraint(self)
        except ConstraintError as e:
            raise SamplingParamsError(str(e)) from None

    def grammar_key(self) -> tuple[str, str] | None:
        """(kind, text) of the output constraint (after verify), or None."""
        for kind in GRAMMAR_KINDS:
            value = getattr(self, kind)
            if value is not None:
                return kind, value
        return None

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def wants_input_logprobs(self) -> bool:
        return bool(self.return_logprob or self.top_logprobs_num) and self.logprob_start_len >= 0

    @property
    def has_penalty(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


MAX_LOGIT_BIAS_ENTRIES = 1024
def _checked_logit_bias(bias) -> dict[int, float]:
    """{token id: bias} with int keys (OpenAI sends them as strings) and biases in [-100, 100]."""
    if not isinstance(bias, dict):
        raise SamplingParamsError(f"logit_bias must be an object of token id -> bias, got {type(bias).__name__}")
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise SamplingParamsError(f"logit_bias takes at most {MAX_LOGIT_BIAS_ENTRIES} entries, got {len(bias)}")
    out = {}
    for key, value in bias.items():
        try:
            tok = int(key)
        except (TypeError, ValueError):
            raise SamplingParamsError(f"logit_bias keys must be token ids, got {key!r}") from None
        if tok < 0 or isinstance(key, bool) or (isinstance(key, str) and not key.strip().isdigit()):
            raise SamplingParamsError(f"logit_bias keys must be non-negative token ids, got {key!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100.0 <= float(value) <= 100.0:
            raise SamplingParamsError(f"logit_bias values must be numbers in [-100, 100], got {value!r} for token {tok}")
        out[tok] = float(value)
    return out
