"""Instructions of the scheduler thread per decode step, counted by valgrind (callgrind) on a machine without a
hardware PMU, where `bench_host_overhead.py --counter instructions` is refused. An emulator's count: exact and
the same under any load, but the process runs about 50 times slower, so a run is a few steps of one workload.

    python benchmark/performance/host_instructions_valgrind.py --workload greedy --batch 128
    python benchmark/performance/host_instructions_valgrind.py --workload greedy --repo /tmp/wt_old  # another tree

How the device's share is kept out: not by eliding ops in a dispatch hook (the hook's own instructions would
be counted) but by a stand-in vocabulary of 16 token ids (HostOverheadRun's `standin_vocab`): the logits,
penalty tables and sampler run every op they run with the real vocabulary, for real, on tiny tensors. The
model forward is the same stub as the bench's. The step's boundaries are os.getppid() calls, on which
callgrind dumps (`--dump-before=getppid`); `--separate-threads=yes` keeps the scheduler thread apart from
torch's worker threads. Requires valgrind on PATH.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def inner(repo: str, workload: str, bs: int, steps: int, prompt_len: int) -> None:
    """Runs under valgrind: prefill, two warm decode steps (every per-request cache made), then `steps`
    marked decode steps."""
    sys.path[:0] = [repo, str(HERE)]
    import gc
    import logging

    from host_overhead_run import WORKLOADS, HostOverheadRun

    from sglang.testing.make_model import ensure_model

    logging.getLogger("sglang").setLevel(logging.WARNING)
    assert sys.modules["sglang"].__file__.startswith(repo), sys.modules["sglang"].__file__
    run = HostOverheadRun(str(ensure_model("qwen3-vl-tiny")), bs, prompt_len, steps + 4, WORKLOADS[workload],
                          elide=False, standin_vocab=16)
    run.prefill()
    s = run.sched
    s.step()
    s.step()
    gc.collect()
    for _ in range(steps):
        os.getppid()
        s.step()
        os.getppid()


def count(repo: str, workload: str, bs: int, steps: int, prompt_len: int) -> list[int]:
    """Instructions of each measured step (the main thread's callgrind dumps between the markers)."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--dump-before=getppid",
               f"--callgrind-out-file={out}", "--dump-instr=no", sys.executable, __file__, "--inner",
               "--repo", repo, "--workload", workload, "--batch", str(bs), "--steps", str(steps),
               "--prompt-len", str(prompt_len)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"valgrind run failed ({done.returncode}):\n{done.stderr[-2000:]}")
        # dump k is written before the k-th getppid: even k close a measured step (odd ones the gaps)
        per_step = []
        for k in range(2, 2 * steps + 1, 2):
            text = (Path(tmp) / f"cg.out.{k}-01").read_text()
            per_step.append(int(re.search(r"^summary:\s+(\d+)", text, re.M).group(1)))
        return per_step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="greedy", choices=("greedy", "sampled", "penalties", "stop"))
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--repo", default=str(REPO), help="the tree whose sglang is measured")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    repo = str(Path(args.repo).resolve())
    if args.inner:
        inner(repo, args.workload, args.batch, args.steps, args.prompt_len)
        return 0
    per_step = count(repo, args.workload, args.batch, args.steps, args.prompt_len)
    print(f"{args.workload} bs={args.batch} ({repo}): {statistics.mean(per_step):,.0f} instructions per decode step "
          f"(median {statistics.median(per_step):,.0f}, min {min(per_step):,}, max {max(per_step):,}, "
          f"{len(per_step)} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
