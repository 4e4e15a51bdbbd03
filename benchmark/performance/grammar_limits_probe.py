"""The figures of docs/reliability.md's grammar rows: launches a server from REPO (this tree, or an export of
an older commit) on MODEL and runs one scenario, printing one JSON line.

    python benchmark/performance/grammar_limits_probe.py REPO MODEL {huge,slow,memory} [SGLANG_X=V ...]

- huge: two 1.5 MB regexes at once; one second later a small `[0-9]{4}` request, an unconstrained one,
  then another small one: status and seconds of each.
- slow: the same with two 60-byte schemas that compile for seconds (a long bounded string).
- memory: eight distinct 400 KB regexes one after the other; RSS growth of the scheduler and of the HTTP /
  tokenizer process, and both grammar caches' figures (after needs SGLANG_GRAMMAR_MAX_BYTES=1048576).
/health is polled throughout (worst_health_s). The one-second pause is a measurement's, not a test's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests


def main() -> None:
    repo, model, scenario = sys.argv[1], sys.argv[2], sys.argv[3]
    sys.path.insert(0, repo)
    from sglang.srt.utils.network import pick_unused_port
    from sglang.srt.utils.process_tree import child_pids

    port = pick_unused_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": repo, "OMP_NUM_THREADS": "1", **dict(a.split("=", 1) for a in sys.argv[4:])}
    proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--port", str(port), "--model-path", model,
                             "--dtype", "float32", "--device", "cpu", "--log-level", "warning"], cwd=repo, env=env)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        sched = next(p for p, name in child_pids(proc.pid).items() if name.startswith("sglang-sched"))

        def rss_mib(pid: int) -> float:
            with open(f"/proc/{pid}/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024

        def gen(sampling: dict) -> tuple[int, float, str]:
            t = time.monotonic()
            r = requests.post(url + "/generate", timeout=900, json={
                "text": "Code:", "sampling_params": {"max_new_tokens": 4, "temperature": 0, **sampling}})
            return r.status_code, round(time.monotonic() - t, 2), r.text[:200]

        worst, stop = [0.0], threading.Event()

        def probe() -> None:
            while not stop.is_set():
                t = time.monotonic()
                requests.get(url + "/health", timeout=60)
                worst[0] = max(worst[0], time.monotonic() - t)
                time.sleep(0.1)

        threading.Thread(target=probe, daemon=True).start()
        gen({"regex": "[a-c]{2}"})  # xgrammar's vocabulary view, built once per process
        out: dict = {}
        if scenario in ("huge", "slow"):
            hostile = ([{"regex": c * 1572864} for c in "ab"] if scenario == "huge" else
                       [{"json_schema": json.dumps({"type": "string", "minLength": 100, "maxLength": 8000 + i})}
                        for i in range(2)])
            with ThreadPoolExecutor(2) as pool:
                futs = [pool.submit(gen, h) for h in hostile]
                time.sleep(1.0)
                out["small"] = gen({"regex": "[0-9]{4}"})[:2]
                out["ordinary"] = gen({})[:2]
                out["hostile"] = [f.result() for f in futs]
            out["small_after"] = gen({"regex": "[0-9]{3}x"})[:2]
        else:
            before = rss_mib(sched), rss_mib(proc.pid)
            out["answers"] = [gen({"regex": f"{i}" + "a" * 409599})[:2] for i in range(8)]
            out["rss_growth_mib"] = {"scheduler": round(rss_mib(sched) - before[0]),
                                     "tokenizer": round(rss_mib(proc.pid) - before[1])}
            info = requests.get(url + "/get_server_info", timeout=60).json()
            out["caches"] = {k: info.get(k) for k in ("grammar_cache", "grammar_check_cache")}
        stop.set()
        out["worst_health_s"] = round(worst[0], 2)
        print(json.dumps(out))
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
