"""One server per configuration: start `python -m sglang.launch_server` in its own session, wait for /health,
sample the memory of its process tree, stop it and make sure nothing of it is left.

Memory: the peak over the run of the summed resident set (VmRSS) of the server and all its descendants, read
from /proc every `interval` seconds; on CUDA machines also the summed GPU memory of those processes
(`nvidia-smi --query-compute-apps`), None elsewhere.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

from sglang.srt.utils.network import pick_unused_port
from sglang.srt.utils.process_tree import ppid_map, process_tree, rss_bytes


# ----------------------------------------------------------------------------- memory
def gpu_bytes(pids: set[int]) -> int | None:
    """Summed GPU memory of `pids` (nvidia-smi), None when there is no NVIDIA tool or it fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    total = 0
    for line in out.splitlines():
        try:
            pid, mib = (int(x) for x in line.split(","))
        except ValueError:
            continue
        if pid in pids:
            total += mib * 1024 * 1024
    return total


class MemorySampler:
    """Background thread recording the peak RSS (and GPU memory) of a process tree."""

    def __init__(self, pid: int, interval: float = 0.25, gpu: bool | None = None):
        self.pid, self.interval = pid, interval
        self.gpu = shutil.which("nvidia-smi") is not None if gpu is None else gpu
        self.peak_rss = 0
        self.peak_gpu: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tune-mem", daemon=True)

    def sample(self) -> None:
        tree = process_tree(self.pid)
        self.peak_rss = max(self.peak_rss, sum(rss_bytes(p) for p in tree))
        if self.gpu:
            g = gpu_bytes(set(tree))
            if g is not None:
                self.peak_gpu = max(self.peak_gpu or 0, g)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> "MemorySampler":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


# ----------------------------------------------------------------------------- the server
class ServerStartError(RuntimeError):
    pass


class ServerHandle:
    """`python -m sglang.launch_server` in its own session (so a Ctrl-C of the tuner reaches only the tuner,
    which then stops the server itself), its output in `log_path`."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None,
                 python: str = sys.executable, host: str = "127.0.0.1"):
        self.port = pick_unused_port(host)
        self.url = f"http://{host}:{self.port}"
        self.log_path = log_path
        self.cmd = [python, "-m", "sglang.launch_server", "--host", host, "--port", str(self.port), *argv]
        # The server inherits this environment; extra variables go through env(1), which execs the server
        # (same pid), so that only sglang/srt/environ.py ever reads os.environ.
        prefix = ["env", *(f"{k}={v}" for k, v in (env or {}).items())] if env else []
        self._log = open(log_path, "ab")
        self._log.write(("$ " + " ".join(prefix + self.cmd) + "\n").encode())
        self._log.flush()
        self.proc = subprocess.Popen(prefix + self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.pgid = self.proc.pid  # leader of its own session and process group

    def log_tail(self, n: int = 1500) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def wait_healthy(self, timeout: float) -> float:
        """Seconds until /health answered 200; raises ServerStartError on exit or timeout."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise ServerStartError(f"server exited with code {self.proc.returncode} during start-up; "
                                       f"log {self.log_path}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise ServerStartError(f"server not healthy within {timeout:g} s (--start-timeout-s); log {self.log_path}")

    def server_info(self) -> dict:
        try:
            r = requests.get(self.url + "/get_server_info", timeout=5)
            return r.json() if r.status_code == 200 else {}
        except (requests.RequestException, ValueError):
            return {}

    def _group_alive(self) -> bool:
        """Any living process left in the server's process group (its children stay in it)."""
        return any(_pgid_of(p) == self.pgid for p in ppid_map())

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (the server's clean shutdown), SIGKILL after `timeout`; then any process left in its group
        is killed. Returns the exit code."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        deadline = time.monotonic() + 10
        while self._group_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._group_alive():
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._log.close()
        return self.proc.returncode


def _pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
