"""The processes a child left, read from ``/proc`` by the trusted parent (`grader.sandbox`): its
tree (descendants and everything still in its process group), their memory and threads, and
the kill of them all."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Sequence
from pathlib import Path


def read_proc(pid: int, name: str) -> str | None:
    try:
        return Path(f"/proc/{pid}/{name}").read_text()
    except OSError:
        return None


def scan() -> dict[int, tuple[int, int]]:
    """pid → (ppid, process group) of every process visible in /proc."""
    out: dict[int, tuple[int, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = read_proc(int(entry.name), "stat")
        if stat is None:
            continue
        # Fields after the parenthesised command name, which may itself hold spaces.
        rest = stat.rsplit(")", 1)[-1].split()
        out[int(entry.name)] = (int(rest[1]), int(rest[2]))
    return out


def process_tree(root: int) -> list[int]:
    """``root``, its living descendants, and every process still in its process group.

    The group catches orphans that were re-parented to init after their parent exited.
    """
    procs = scan()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = {pid for pid, (_, pgrp) in procs.items() if pgrp == root}, [root]
    while todo:
        pid = todo.pop()
        if pid in procs or pid == root:
            tree.add(pid)
        todo.extend(c for c in children.get(pid, ()) if c not in tree)
    return sorted(tree)


def usage(pids: Sequence[int]) -> tuple[float, int]:
    """(resident MiB, thread count) summed over ``pids``."""
    rss_kb, tasks = 0, 0
    for pid in pids:
        status = read_proc(pid, "status")
        if status is None:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss_kb += int(line.split()[1])
            elif line.startswith("Threads:"):
                tasks += int(line.split()[1])
    return rss_kb / 1024.0, tasks


def kill_all(pids: Sequence[int], pgid: int | None) -> None:
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
