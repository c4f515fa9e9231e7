"""Which workers were seen lately: one small file per worker beside the store's blobs.

The service's ``/readyz`` asks whether anything would grade what it accepts. The grades table
knows a worker only while it holds a grade; an idle worker polling an empty queue leaves no row.
So each look at the queue (`Store.claim`, a lease's renewal, the fleet's round) notes the worker
here: a file named after a hash of the worker's name (a name is the worker's own choice, never a
path), holding its name, device and time, written whole. At most one write per worker per
`_EVERY_S` seconds per process: a worker polling every second costs no disk churn. A file, not a
table, so that noting a worker never waits on (nor takes) the database's write lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from grader.files import write_whole


class Store(Protocol):
    """`grader.service.store.Store`, as far as this module needs it (the store imports this)."""

    @property
    def blobs(self) -> Path: ...

_EVERY_S = 5.0
_last: dict[tuple[Path, str], float] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class Seen:
    worker: str
    device: str
    age_s: float


def folder(store: Store) -> Path:
    """``DIR/workers`` (``FILE.workers`` beside an older single-file store, as its blobs are)."""
    return store.blobs.with_name(store.blobs.name.removesuffix("blobs") + "workers")


def note(store: Store, worker: str, device: str) -> None:
    """Record that ``worker`` (grading on ``device``) is alive now. Never raises: a full disk
    makes the worker look absent, it does not stop it grading."""
    where, now = folder(store), time.time()
    with _lock:
        if now - _last.get((where, worker), 0.0) < _EVERY_S:
            return
        _last[(where, worker)] = now
    data = json.dumps({"worker": worker, "device": device, "seen": now}).encode()
    with contextlib.suppress(OSError):
        where.mkdir(mode=0o700, exist_ok=True)
        write_whole(where / hashlib.sha256(worker.encode()).hexdigest()[:32], data)


def seen(store: Store, within_s: float) -> list[Seen]:
    """The workers noted in the last ``within_s`` seconds, the most recent first."""
    now, out = time.time(), []
    where = folder(store)
    if not where.is_dir():
        return []
    for path in where.iterdir():
        if path.name.startswith("."):  # write_whole's file on its way in
            continue
        try:
            record = json.loads(path.read_bytes())
            age = now - float(record["seen"])
            if age <= within_s:
                out.append(Seen(str(record["worker"]), str(record["device"]), max(age, 0.0)))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # one unreadable file says nothing about the others
    return sorted(out, key=lambda s: s.age_s)


__all__ = ["Seen", "folder", "note", "seen"]
