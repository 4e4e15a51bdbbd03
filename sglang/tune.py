"""`python -m sglang.tune`: benchmark a grid of server configurations on your workload and print the best
launch command. The logic lives in `sglang/tuning/`; the guide is docs/tuning.md."""

from __future__ import annotations

import sys

from sglang.tuning.cli import main

if __name__ == "__main__":
    sys.exit(main())
