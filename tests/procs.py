"""Process helpers shared by the real-server tests: free ports and /proc lookups (Linux)."""

from __future__ import annotations

import socket
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` from /proc/*/stat (field 4 is the parent pid)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name (field 2) is in parentheses and may contain spaces; split after it.
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def engine_children(pid: int) -> list[int]:
    """The server's EngineCore process(es): its children minus multiprocessing's resource tracker."""
    return [p for p in children(pid) if "resource_tracker" not in cmdline(p)]


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total
