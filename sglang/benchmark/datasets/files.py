"""Datasets read from a local `--dataset-path` (nothing is ever downloaded): `sharegpt` and `mmmu`.

sharegpt: a JSON list (or JSONL) of records with a `conversations` (or `conversation`) list of turns, each
`{"from": "human"|"gpt"|..., "value": text}` or `{"role": "user"|"assistant"|..., "content": text}`. The first
human/user turn is the prompt and the turn after it the reference completion, whose token count is the
request's output length unless `--sharegpt-output-len` fixes one. As upstream, records are shuffled (seeded)
and pairs with a prompt under 4 tokens, or a reference completion under 4 tokens (when no fixed output
length is given), are skipped; `--sharegpt-context-len` also skips pairs whose prompt + output exceed it.

mmmu: a JSON list (or JSONL) of records, each with
  - `question`: text (required);
  - `image` (one) or `images` (a list), or MMMU's own `image_1` ... `image_7` fields: each a local file path
    (relative paths are taken from the dataset file's folder), an `http(s)://` URL (sent as is), a `data:`
    URL, or raw base64 image bytes; at least one image per record;
  - `options` (optional): a list of choices, or its Python/JSON text as in MMMU's parquet files.
The prompt is "Question: {question}\n" + "Options:\nA. ...\n" when there are options + "\nAnswer: ", images
first; the output length is `--random-output-len`. Records are shuffled (seeded) and the first
`--num-prompts` used.
"""

from __future__ import annotations

import ast
import base64
import binascii
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from sglang.benchmark.datasets.common import DatasetError, SampleRequest

HUMAN_ROLES = ("human", "user")
MMMU_IMAGE_KEYS = ("image",) + tuple(f"image_{i}" for i in range(1, 8))


def _count(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def check_dataset_path(path: str | None, dataset: str) -> Path:
    """The local file of a file dataset; a one-line DatasetError naming --dataset-path when there is none."""
    if not path:
        raise DatasetError(f"--dataset-path is required for --dataset-name {dataset} (a local file; "
                           "nothing is downloaded)")
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"--dataset-path {path}: no such file (the {dataset} dataset is read locally, "
                           "never downloaded)")
    return p


def read_records(path: str | None, dataset: str) -> list[Any]:
    """The records of a local JSON list / JSONL file; a one-line DatasetError naming --dataset-path otherwise."""
    raw = check_dataset_path(path, dataset).read_text(encoding="utf-8")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        try:
            data = [json.loads(line) for line in raw.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise DatasetError(f"--dataset-path {path}: neither a JSON list nor JSONL ({e})") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise DatasetError(f"--dataset-path {path}: expected a JSON list of records, got {type(data).__name__}")
    return data


def _turn(turn: Any) -> tuple[str, str] | None:
    if not isinstance(turn, dict):
        return None
    role = turn.get("from", turn.get("role"))
    text = turn.get("value", turn.get("content"))
    return (str(role).lower(), text) if isinstance(text, str) else None


def sharegpt_pair(record: Any) -> tuple[str, str] | None:
    """(first human turn, the turn after it), or None when the record has no such pair."""
    conv = record.get("conversations", record.get("conversation")) if isinstance(record, dict) else None
    if not isinstance(conv, list):
        return None
    turns = [_turn(t) for t in conv]
    for i, t in enumerate(turns[:-1]):
        if t is not None and t[0] in HUMAN_ROLES:
            nxt = turns[i + 1]
            return (t[1], nxt[1]) if nxt is not None else None
    return None


def sample_sharegpt(tokenizer, num: int, path: str | None, output_len: int | None = None,
                    context_len: int | None = None, seed: int = 0) -> list[SampleRequest]:
    records = read_records(path, "sharegpt")
    pairs = [p for p in map(sharegpt_pair, records) if p is not None]
    order = np.random.default_rng(seed).permutation(len(pairs))
    out: list[SampleRequest] = []
    for i in order:
        if len(out) == num:
            break
        prompt, completion = pairs[i]
        plen = _count(tokenizer, prompt)
        olen = output_len if output_len is not None else _count(tokenizer, completion)
        if plen < 4 or (output_len is None and olen < 4):
            continue
        if context_len is not None and plen + olen > context_len:
            continue
        out.append(SampleRequest(prompt, plen, olen))
    if not out:
        raise DatasetError(f"--dataset-path {path}: no usable conversation (need a human turn of >= 4 tokens "
                           "followed by a reply)")
    if len(out) < num:
        print(f"sharegpt: only {len(out)} of the {num} requested prompts pass the filters; using {len(out)}")
    return out


def _mime_of(data: bytes) -> str:
    from PIL import Image

    try:
        fmt = Image.open(io.BytesIO(data)).format
    except Exception as e:  # noqa: BLE001 - any decoding failure is "not an image"
        raise DatasetError(f"not a readable image ({type(e).__name__})") from None
    return f"image/{(fmt or 'png').lower()}"


def image_url(ref: str, base_dir: Path) -> str:
    """A record's image reference as a URL the chat API and /generate accept."""
    if ref.startswith(("data:", "http://", "https://")):
        return ref
    p = Path(ref) if Path(ref).is_absolute() else base_dir / ref
    if len(ref) < 4096 and p.is_file():
        data = p.read_bytes()
    else:
        try:
            data = base64.b64decode(ref, validate=True)
        except (binascii.Error, ValueError):
            raise DatasetError(f"image {ref[:80]!r} is neither a file, a URL nor base64") from None
    return f"data:{_mime_of(data)};base64," + base64.b64encode(data).decode("ascii")


def _options(value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return [value] if value.strip() else []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


def mmmu_prompt(question: str, options: list[str]) -> str:
    text = f"Question: {question}\n"
    if options:
        text += "Options:\n" + "".join(f"{chr(ord('A') + i)}. {o}\n" for i, o in enumerate(options))
    return text + "\nAnswer: "


def sample_mmmu(tokenizer, num: int, path: str | None, output_len: int, seed: int = 0) -> list[SampleRequest]:
    records = read_records(path, "mmmu")
    base = Path(path).resolve().parent
    order = np.random.default_rng(seed).permutation(len(records))
    out: list[SampleRequest] = []
    for i in order[:num]:
        rec = records[i]
        where = f"--dataset-path {path}: record {int(i)}"
        if not isinstance(rec, dict) or not isinstance(rec.get("question"), str):
            raise DatasetError(f"{where} has no 'question' text")
        refs = list(rec.get("images") or []) + [rec[k] for k in MMMU_IMAGE_KEYS if isinstance(rec.get(k), str)]
        if not refs:
            raise DatasetError(f"{where} has no image ('image', 'images' or 'image_1'..)")
        try:
            urls = [image_url(str(r), base) for r in refs]
        except DatasetError as e:
            raise DatasetError(f"{where}: {e}") from None
        prompt = mmmu_prompt(rec["question"], _options(rec.get("options")))
        out.append(SampleRequest(prompt, _count(tokenizer, prompt), output_len, urls, images_first=True))
    if not out:
        raise DatasetError(f"--dataset-path {path}: the file holds no records")
    if len(out) < num:
        print(f"mmmu: the file holds only {len(out)} records; using {len(out)} of the {num} requested prompts")
    return out
