"""Fakes of the profiler's output for the census's parent-side tests: raw event rows in the exact
format `grader.child.census` sends (`grader.census_trace.RawEvent`), and fake kineto events with
the accessors of torch 2.11's and 2.13's ``_KinetoEvent`` (for the child's reading, `_rows`).

No GPU here: kernel and copy records are written as CUPTI's records reach the child through
kineto (a device event linked by ``linked_correlation_id`` to the host range open at the launch,
``metadata_json`` with the grid or the bytes where the torch hands it out).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from grader.child.census import MARKER_PREFIX, NONCE_SEPARATOR

SCOPE_FUNCTION = 0
SCOPE_BACKWARD = 1
SCOPE_USER = 7


class Trace:
    """One profiler read, built as the steps would run: ranges nest by time on one thread."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []
        self.now = 1_000
        self.next_correlation = 1
        self.thread = 11

    def _tick(self) -> int:
        self.now += 10
        return self.now

    @contextmanager
    def _range(self, name: str, kind: str, scope: int = SCOPE_FUNCTION, sequence: int = -1,
               shapes: tuple[tuple[int, ...], ...] = (), dtypes: tuple[str, ...] = ()
               ) -> Iterator[int]:  # fmt: skip
        correlation = self.next_correlation
        self.next_correlation += 1
        row = [name, kind, True, self._tick(), 0, self.thread, scope, sequence,
               [list(s) for s in shapes], list(dtypes), correlation, 0, ""]
        self.rows.append(row)
        yield correlation
        row[4] = self._tick()

    def step(self, label: str, nonce: str = "n0") -> Any:
        """The harness's range around a step."""
        return self._range(f"{MARKER_PREFIX}{label}{NONCE_SEPARATOR}{nonce}", "user_annotation",
                           scope=SCOPE_USER)  # fmt: skip

    def function(self, name: str) -> Any:
        """A custom autograd.Function's forward range (its class name, a sequence number)."""
        return self._range(name, "cpu_op", SCOPE_FUNCTION, sequence=5)

    def backward(self, name: str) -> Any:
        """A custom Function's backward node range (``<Name>Backward``)."""
        return self._range(name, "cpu_op", SCOPE_BACKWARD, sequence=5)

    def composite(self, name: str, *shapes: tuple[int, ...]) -> Any:
        """An op whose work other recorded ops do (open it, then record them inside)."""
        return self._range(name, "cpu_op", shapes=shapes, dtypes=("float",) * len(shapes))

    def op(self, name: str, *shapes: tuple[int, ...], dtype: str = "float", count: int = 1
           ) -> int:  # fmt: skip
        """``count`` leaf ops in a row; the correlation id of the last (for linking a kernel)."""
        last = 0
        for _ in range(count):
            with self._range(name, "cpu_op", shapes=shapes,
                             dtypes=(dtype,) * len(shapes)) as correlation:  # fmt: skip
                last = correlation
        return last

    def device(self, name: str, kind: str, linked: int = 0, metadata: str = "") -> None:
        """A device event (CUPTI's kernel, copy or fill), linked to the host range ``linked``."""
        start = self._tick()
        self.rows.append([name, kind, False, start, start + 5, 0, 0, -1, [], [], 0, linked,
                          metadata])  # fmt: skip

    def kernel(self, name: str, linked: int = 0, grid: tuple[int, int, int] | None = None
               ) -> None:  # fmt: skip
        meta = "" if grid is None else f'"grid": {list(grid)}, "block": [128, 1, 1]'
        self.device(name, "kernel", linked, meta)

    def messages(self, *steps: str, raised: tuple[str, ...] = (),
                 notes: tuple[str, ...] = ()) -> list[dict[str, Any]]:  # fmt: skip
        """The ``census`` messages of this read, as the child sends them (through JSON)."""
        out = [{"events": self.rows, "first": True}]
        out += [{"step": {"label": s, "raised": s in raised, "notes": list(notes)}}
                for s in steps]  # fmt: skip
        return json.loads(json.dumps(out))


class FakeKinetoEvent:
    """A ``torch._C._autograd._KinetoEvent`` of torch 2.13 (``activity_type``, ``metadata_json``)
    or, with ``modern`` false, of torch 2.11 (neither). Neither has ``nbytes``: the census does
    not read it (torch 2.11 does not carry it)."""

    def __init__(self, name: str, *, cpu: bool, start: int, duration: int, kind: str,
                 shapes: list[list[int]] | None = None, dtypes: list[str] | None = None,
                 correlation: int = 0, linked: int = 0, metadata: str = "",
                 modern: bool = True) -> None:  # fmt: skip
        import torch

        self._name, self._cpu, self._start, self._duration = name, cpu, start, duration
        self._kind, self._shapes, self._dtypes = kind, shapes or [], dtypes or []
        self._correlation, self._linked, self._metadata = correlation, linked, metadata
        self._device = torch.autograd.DeviceType.CPU if cpu else torch.autograd.DeviceType.CUDA
        if modern:
            self.activity_type = lambda: self._kind
            self.metadata_json = lambda: self._metadata

    def name(self) -> str:
        return self._name

    def device_type(self) -> Any:
        return self._device

    def start_ns(self) -> int:
        return self._start

    def duration_ns(self) -> int:
        return self._duration

    def start_thread_id(self) -> int:
        return 11 if self._cpu else 0

    def scope(self) -> int:
        return SCOPE_USER if self._kind == "user_annotation" else SCOPE_FUNCTION

    def sequence_nr(self) -> int:
        return -1

    def shapes(self) -> list[list[int]]:
        return self._shapes

    def dtypes(self) -> list[str]:
        return self._dtypes

    def correlation_id(self) -> int:
        return self._correlation

    def linked_correlation_id(self) -> int:
        return self._linked

    def is_user_annotation(self) -> bool:
        return self._kind == "user_annotation"


class FakeResult:
    """A stopped profiler's result: its events."""

    def __init__(self, events: list[FakeKinetoEvent]) -> None:
        self._events = events

    def events(self) -> list[FakeKinetoEvent]:
        return self._events
