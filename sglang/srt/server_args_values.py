"""The values server flags take: the choices of each enumerated flag (with the aliases and the refused
upstream values that stop start-up with a reason) and the parsers of counts and multimodal limits. Kept
apart from `ServerArgs` so the packages that serve a choice (grammar backends, tool-call and reasoning
parsers) read its names from here, downward, instead of `server_args` importing them."""

from __future__ import annotations

import re
from decimal import Decimal

def _arg(help: str, choices: tuple | None = None, parse=None, aliases: tuple[str, ...] = (), **kw) -> dict:
    """Field metadata: help, argparse choices, a parser for the raw string (errors name the flag) and other
    spellings of the flag (upstream's long names, this engine's earlier names)."""
    return {"help": help, "choices": choices, "parse": parse, "aliases": aliases, **kw}


# Token (and byte) counts take upstream's suffixes, case-sensitive: SI k M G T (x1000) and IEC Ki Mi Gi Ti
# (x1024); decimals only with an SI suffix and only where the count comes out whole (1.5k = 1500).
_SI_SUFFIXES = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_COUNT = re.compile(r"(?P<int>-?\d+)|(?P<num>\d+(?:\.\d+)?)(?P<suffix>Ki|Mi|Gi|Ti|k|M|G|T)")
_SUFFIX_HELP = "an integer, or one with a suffix: k M G T (x1000) or Ki Mi Gi Ti (x1024), case-sensitive"


def parse_token_count(raw: str | int) -> int:
    """A count as upstream's launcher reads it: `4096`, `128k` (128000), `1M` (1000000), `32Ki` (32768),
    `1.5k` (1500). Anything else is refused, naming the likely intent (`1m` -> 1M, `1KI` -> 1Ki)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    text = str(raw).strip()
    m = _COUNT.fullmatch(text)
    if m is None:
        raise ValueError(f"not a count: {_SUFFIX_HELP}{_suffix_hint(text)}")
    if m["int"] is not None:
        return int(m["int"])
    number, suffix = m["num"], m["suffix"]
    if suffix in _IEC_SUFFIXES:
        if "." in number:
            si = suffix[0].replace("K", "k")
            raise ValueError(f"decimals go with k M G T only, not with {suffix} (write {number}{si} or a whole "
                             f"number of {suffix})")
        return int(number) * _IEC_SUFFIXES[suffix]
    value = Decimal(number) * _SI_SUFFIXES[suffix]
    if value != value.to_integral_value():
        raise ValueError(f"{text} is {value.normalize():f}, not a whole number")
    return int(value)


def _suffix_hint(text: str) -> str:
    m = re.fullmatch(r"\d+(?:\.\d+)?([A-Za-z]+)", text)
    if m is None:
        return ""
    suffix = m[1]
    if suffix == "K":
        return " ('K': write k for 1000 or Ki for 1024)"
    for known in (*_IEC_SUFFIXES, *_SI_SUFFIXES):
        if suffix.lower() == known.lower() and suffix != known:
            return f" ({suffix!r}: did you mean {known!r}?)"
    return f" ({suffix!r} is not a suffix)"


DEFAULT_VIDEO_LIMIT = 8  # videos per request when no limit names them


def parse_mm_limits(raw: str | int | dict) -> int | dict[str, int]:
    """`N` (images), or the JSON forms `{"image": N, "video": M}` (upstream's --limit-mm-data-per-request,
    vLLM's --limit-mm-per-prompt) as a dict. Audio is not served: a non-zero audio limit is refused."""
    import json

    if isinstance(raw, dict):
        limits = raw
    else:
        raw = str(raw).strip()
        if not raw.startswith("{"):
            return int(raw)
        try:
            limits = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"not valid JSON: {e}") from None
    unknown = {k for k, v in limits.items() if k not in ("image", "video") and v}
    if unknown:
        raise ValueError(f"only image and video inputs are served; got limits for {sorted(unknown)}")
    out = {}
    for k in ("image", "video"):
        if limits.get(k) is not None:
            if isinstance(limits[k], bool) or not isinstance(limits[k], int) or limits[k] < 0:
                raise ValueError(f"the {k} limit must be a non-negative integer, got {limits[k]!r}")
            out[k] = limits[k]
    return out


def parse_image_limit(raw: str) -> int:
    """The image part of `parse_mm_limits` (0 when a JSON form names none)."""
    limits = parse_mm_limits(raw)
    return limits if isinstance(limits, int) else limits.get("image", 0)


GRAMMAR_BACKENDS = ("xgrammar", "llguidance", "none")


# --schedule-policy: upstream 0.5.23's values; the ones that need machinery this engine does not have stop
# start-up with the reason
SCHEDULE_POLICIES = ("fcfs", "lpm", "random", "dfs-weight", "lof", "priority")
REFUSED_SCHEDULE_POLICIES = {
    "routing-key": "it orders requests by the routing key sglang-router attaches for data-parallel attention, "
                   "which this engine neither receives nor serves",
    "hrrn": "highest-response-ratio-next is not implemented here",
    "shortest-prefill-first": "upstream's experimental shortest-prefill-first is not implemented here",
}
# --load-balance-method: upstream 0.5.23's choices (auto: round_robin, as upstream outside prefill/decode
# disaggregation) and the names of earlier upstream releases, each -> the method it means here
LOAD_BALANCE_METHODS = {"auto": "round_robin", "round_robin": "round_robin", "total_requests": "total_requests",
                        "shortest_queue": "total_requests", "total_tokens": "total_tokens",
                        "minimum_tokens": "total_tokens"}
REFUSED_LOAD_BALANCE_METHODS = {
    "follow_bootstrap_room": "it follows the bootstrap room of prefill/decode disaggregation, which this engine "
                             "does not serve",
}


def resolve_load_balance_method(name: str) -> str:
    """round_robin, total_requests or total_tokens; ValueError naming the choices otherwise."""
    if name in REFUSED_LOAD_BALANCE_METHODS:
        raise ValueError(f"--load-balance-method {name}: {REFUSED_LOAD_BALANCE_METHODS[name]}")
    if name not in LOAD_BALANCE_METHODS:
        raise ValueError(f"--load-balance-method {name}: choose one of {', '.join(LOAD_BALANCE_METHODS)}")
    return LOAD_BALANCE_METHODS[name]


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_LEVEL_ALIASES = {"warn": "warning", "fatal": "critical"}  # Python's logging takes these too
DEFAULT_MAX_PAYLOAD_SIZE = 64 * 2**20
# an encoder's /encode bodies carry a request's pixels (float32 unless the JPEGs travel compressed)
DEFAULT_ENCODER_MAX_PAYLOAD_SIZE = 2**30

DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


# --tool-call-parser: upstream's names of the formats served here ("qwen" is upstream's newer name of
# "qwen25"), or `auto` (as leaving it unset: picked from the chat template).
# function_call/function_call_parser.py maps each format to its detector.
TOOL_CALL_PARSER_CHOICES = ("qwen25", "qwen", "auto")
# --reasoning-parser: parser/reasoning_parser.py maps each name to its format
REASONING_PARSER_CHOICES = ("qwen3", "qwen3-thinking")
