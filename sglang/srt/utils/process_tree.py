"""A process and its descendants, read from Linux /proc: who they are and how much memory they hold.

Used to watch a server's whole tree (tokenizer, schedulers, detokenizer): the tuner's peak memory, the
soak test's leak check, the e2e tests' child bookkeeping. Processes that vanish while being read are
skipped, never an error."""

from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses


def ppid_map(include_zombies: bool = False) -> dict[int, int]:
    """pid -> parent pid for every process on the machine."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(entry)
            if fields is not None and (include_zombies or fields[0] != "Z"):
                out[int(entry)] = int(fields[1])
    return out


def process_tree(pid: int) -> list[int]:
    """`pid` and its living descendants."""
    children: dict[int, list[int]] = {}
    for p, parent in ppid_map().items():
        children.setdefault(parent, []).append(p)
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, ()))
    return tree


def child_pids(pid: int) -> dict[int, str]:
    """Direct children of `pid` (zombies included) -> their /proc comm name."""
    out = {}
    for p, parent in ppid_map(include_zombies=True).items():
        if parent == pid:
            try:
                out[p] = Path(f"/proc/{p}/comm").read_text().strip()
            except OSError:
                continue
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds `pid` has used so far (0 when it is gone)."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_status(pid: int) -> dict[str, int]:
    """The resident-memory lines of /proc/<pid>/status in bytes: VmRSS (everything resident) and its parts
    RssAnon (private heap: what a leak grows), RssFile (mapped files: shared libraries page in as new
    kernels run) and RssShmem (shared memory mapped); VmHWM, the peak VmRSS so far. Empty when the
    process is gone."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "RssAnon:", "RssFile:", "RssShmem:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return out


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    return memory_status(pid).get(field, 0)


def tree_rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """Resident memory (`field` of memory_status) of `pid` and all its living descendants."""
    return sum(rss_bytes(p, field) for p in process_tree(pid))


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                out.add(link[8:-1])
    except OSError:
        pass
    return out


def _hex_address(text: str) -> tuple[str, int]:
    import ipaddress

    addr, port = text.split(":")
    raw = bytes.fromhex(addr)
    # /proc/net/tcp{,6} print each 32-bit word in host (little-endian) order
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(raw)), int(port, 16)


def listening_tcp(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket that `pid` or a descendant listens on ("0.0.0.0" / "::": all
    interfaces), read from /proc/net/tcp and tcp6: what a deployment exposes, whatever the code says."""
    inodes = set().union(*(_socket_inodes(p) for p in process_tree(pid)))
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and f[9] in inodes:  # 0A: LISTEN
                out.add(_hex_address(f[1]))
    return out
