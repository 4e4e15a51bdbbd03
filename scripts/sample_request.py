"""Sends one image request to a running server through the OpenAI client and prints the answer.

  python scripts/sample_request.py --port 30000 [--image PATH]   (default: a built-in test card)
"""

from __future__ import annotations

import argparse
import base64
import io
import sys


def _test_card_data_url() -> str:
    from sglang.testing.sample_image import test_card

    buf = io.BytesIO()
    test_card().save(buf, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--image", default=None, help="image file (default: a built-in test card)")
    ap.add_argument("--prompt", default="Describe this image.")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()

    from openai import OpenAI

    if args.image:
        with open(args.image, "rb") as f:
            url = "data:image/jpeg;base64," + base64.b64encode(f.read()).decode()
    else:
        url = _test_card_data_url()
    client = OpenAI(base_url=f"http://{args.host}:{args.port}/v1", api_key="none")
    model = client.models.list().data[0].id
    resp = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": args.prompt},
        ]}],
        max_tokens=args.max_tokens,
        temperature=0,
    )
    print(f"model:  {model}")
    print(f"answer: {resp.choices[0].message.content!r}")
    print(f"usage:  {resp.usage.prompt_tokens} prompt + {resp.usage.completion_tokens} completion tokens, "
          f"finish_reason={resp.choices[0].finish_reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
