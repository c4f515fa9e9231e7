"""The child's side of the sandbox protocol: an authenticated, strictly ordered result channel.

A child harness reports to its parent over a pipe whose write end it inherits (fd number in
``GRADER_CHANNEL_FD``). Every message is one *frame*:

    MAGIC (4 bytes) | JSON length (u32) | blob length (u64) | JSON | blobs | tag (32 bytes)

- the JSON object holds ``seq`` (0, 1, 2, ... in the order sent), ``event``, the fields, and
  ``blobs``: one ``{"name", "dtype", "shape", "nbytes"}`` per raw array that follows the JSON
  (outputs and gradients leave the child as bytes, never as a file it could rewrite later);
- ``tag`` is HMAC-SHA256 over everything before it, keyed with 32 random bytes the parent writes
  as the first line of the child's stdin (``key <hex>``) before anything else runs: no file,
  argument or environment variable holds the key.

The parent (`ChannelReader`, in ``grader/sandbox.py``) takes a frame only if its tag verifies and
its ``seq`` is the next one; anything else (garbage, a forged or replayed frame, a gap, a
duplicate) is tampering and ends the child. What this buys, and what not: a writer that does not
hold the key cannot add a message, and one that does (the submission shares the harness's memory
and could find it) cannot insert one without the harness's own next message arriving out of order.
A submission that takes over the harness's writer entirely can still say what it likes; that is
why a message only says *what happened when* and the verdicts come from what the parent and the
trusted process measure themselves.

Also here, because every harness needs them before it imports anything of the submission: the
exit codes (`ChildExit`), the arming handshake (`ChannelWriter.arm`) and the thread-pool pin
(`pin_pools`).
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import hmac
import json
import os
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CHANNEL_ENV = "GRADER_CHANNEL_FD"
"""Environment variable that tells the child which fd is the result channel's write end."""
POOL_ENV = "GRADER_POOL_THREADS"
"""Environment variable that tells a harness the size of torch's intra- and inter-op pools."""
ARM_EVENT = "armed"
"""The channel event (and its stdin reply) with which a harness arms the task limit."""
KEY_PREFIX = "key "
"""The first line of a child's stdin: ``key <64 hex digits>``."""
MAGIC = b"GRC1"
HEADER = struct.Struct(">4sIQ")
TAG_BYTES = 32
KEY_BYTES = 32
MAX_JSON_BYTES = 1 << 20


class ChildExit(enum.IntEnum):
    """Exit codes a trusted child harness uses to say how it ended on purpose."""

    OK = 0  # every requested item was handled and reported
    HARNESS_ERROR = 1  # the harness itself failed (a grader bug, or Python's default for errors)
    SUBMISSION_ERROR = 2  # importing or constructing the submission raised
    OUT_OF_MEMORY = 3  # MemoryError or a torch out-of-memory error was caught
    RULE_VIOLATION = 4  # a run-time rule check stopped the run


class ChannelError(Exception):
    """A frame that is not the harness's next message: tampering (the parent ends the child).

    Attributes:
        messages: The whole frames that came before it in the same read, still valid.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.messages: list[dict[str, Any]] = []


@dataclass(frozen=True)
class Blob:
    """A raw array carried after a frame's JSON.

    Attributes:
        dtype: torch's name of the element type (``float32``, ``bfloat16``...).
        shape: The array's shape.
        data: Its bytes, C-contiguous.
    """

    dtype: str
    shape: tuple[int, ...]
    data: bytes | bytearray | memoryview


def _tagger(key: bytes) -> Any:
    return hmac.new(key, digestmod=hashlib.sha256)


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


class ChannelWriter:
    """The child's end of the channel: one authenticated frame per message, written at once.

    Args:
        fd: The pipe's write end (default: ``GRADER_CHANNEL_FD``).
        key: The channel key (default: read from the first line of stdin, as the parent sends).
    """

    def __init__(self, fd: int | None = None, key: bytes | None = None) -> None:
        self._fd = int(os.environ[CHANNEL_ENV]) if fd is None else fd
        self._key = read_key() if key is None else key
        self._seq = 0

    def send(self, event: str, blobs: Sequence[tuple[str, Blob]] = (), **fields: Any) -> None:
        """Send ``event`` with JSON ``fields`` and raw ``blobs`` (name, `Blob`) as one frame."""
        described = [{"name": name, "dtype": b.dtype, "shape": list(b.shape),
                      "nbytes": memoryview(b.data).nbytes} for name, b in blobs]
        body = json.dumps({"seq": self._seq, "event": event, **fields, "blobs": described},
                          default=str).encode()
        header = HEADER.pack(MAGIC, len(body), sum(d["nbytes"] for d in described))
        tag = _tagger(self._key)
        for part in (header, body, *(b.data for _, b in blobs)):
            tag.update(part)
        self._seq += 1
        # One frame goes out as a whole before anything else runs in this harness.
        _write_all(self._fd, header + body)
        for _, blob in blobs:
            _write_all(self._fd, blob.data)
        _write_all(self._fd, tag.digest())

    def arm(self) -> None:
        """Arm the parent's task limit (`ARM_EVENT`) and wait until it has counted this tree.

        Call it right before the first submission code runs: what the process holds then is
        the harness's (pools, CUDA driver threads, Triton), and only what comes after is the
        submission's.
        """
        self.send(ARM_EVENT)
        answer = sys.stdin.readline().strip()
        if answer != ARM_EVENT:
            raise RuntimeError(f"the parent answered {answer!r} to {ARM_EVENT!r}, expected "
                               f"{ARM_EVENT!r}")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def read_key() -> bytes:
    """The channel key from the first line of stdin (``key <hex>``), as the parent writes it."""
    line = sys.stdin.readline().strip()
    if not line.startswith(KEY_PREFIX):
        raise RuntimeError(f"the first line of stdin is {line[:20]!r}, expected {KEY_PREFIX!r}")
    key = bytes.fromhex(line.removeprefix(KEY_PREFIX))
    if len(key) != KEY_BYTES:
        raise RuntimeError(f"the channel key has {len(key)} bytes, expected {KEY_BYTES}")
    return key


class ChannelReader:
    """The parent's end: verifies each frame's tag and order; yields messages as dicts.

    A message's blobs come back under ``"_blobs"`` as ``{name: Blob}`` (their bytes unparsed:
    the caller decides what shapes and types it accepts).

    Args:
        key: The key the parent sent the child.
        max_frame_bytes: The largest frame accepted (blobs included).
    """

    def __init__(self, key: bytes, max_frame_bytes: int = 8 << 30) -> None:
        self._key = key
        self._max = max_frame_bytes
        self._buffer = bytearray()
        self.next_seq = 0

    @property
    def pending(self) -> int:
        """Bytes received that do not make a whole frame yet."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Take ``data`` from the pipe; return the whole frames it completed, in order.

        Raises:
            ChannelError: The bytes are not the harness's next frame (bad magic, length, tag,
                sequence number or blob table).
        """
        out: list[dict[str, Any]] = []
        try:
            self._frames(data, out)
        except ChannelError as exc:
            exc.messages = out
            raise
        return out

    def _frames(self, data: bytes, out: list[dict[str, Any]]) -> None:
        buf = self._buffer
        buf += data
        # Judged as soon as the magic is in, so garbage is caught without waiting for more.
        if len(buf) >= len(MAGIC) and buf[:len(MAGIC)] != MAGIC:
            raise ChannelError(f"frame {self.next_seq} starts with {bytes(buf[:4])!r}, not "
                               f"{MAGIC!r}")
        while len(buf) >= HEADER.size:
            magic, json_len, blob_len = HEADER.unpack_from(buf)
            if magic != MAGIC:
                raise ChannelError(f"frame {self.next_seq} starts with {bytes(magic)!r}, not "
                                   f"{MAGIC!r}")
            total = HEADER.size + json_len + blob_len + TAG_BYTES
            if json_len > MAX_JSON_BYTES or total > self._max:
                raise ChannelError(f"frame {self.next_seq} claims {total} bytes, more than "
                                   f"the {self._max} allowed")
            if len(buf) < total:
                break
            view = memoryview(buf)
            try:
                tag = _tagger(self._key)
                tag.update(view[:total - TAG_BYTES])
                if not hmac.compare_digest(tag.digest(), bytes(view[total - TAG_BYTES:total])):
                    raise ChannelError(f"frame {self.next_seq} does not carry the channel's tag")
                message = self._message(view, json_len, blob_len)
            finally:
                view.release()
            del buf[:total]
            out.append(message)
            if len(buf) >= len(MAGIC) and buf[:len(MAGIC)] != MAGIC:
                raise ChannelError(f"frame {self.next_seq} starts with {bytes(buf[:4])!r}, "
                                   f"not {MAGIC!r}")

    def _message(self, view: memoryview, json_len: int, blob_len: int) -> dict[str, Any]:
        start = HEADER.size
        try:
            message = json.loads(bytes(view[start:start + json_len]))
        except ValueError as exc:
            raise ChannelError(f"frame {self.next_seq} holds no JSON: {exc}") from exc
        if not isinstance(message, dict):
            raise ChannelError(f"frame {self.next_seq} holds {type(message).__name__}, not an "
                               "object")
        seq = message.pop("seq", None)
        if seq != self.next_seq:
            raise ChannelError(f"frame {seq!r} arrived where frame {self.next_seq} was due")
        self.next_seq += 1
        table = message.pop("blobs", [])
        blobs: dict[str, Blob] = {}
        offset = start + json_len
        try:
            for entry in table:
                name, nbytes = str(entry["name"]), int(entry["nbytes"])
                shape = tuple(int(s) for s in entry["shape"])
                if nbytes < 0 or name in blobs:
                    raise ValueError(f"blob {name!r} of {nbytes} bytes")
                blobs[name] = Blob(str(entry["dtype"]), shape, bytes(view[offset:offset + nbytes]))
                offset += nbytes
        except (KeyError, TypeError, ValueError) as exc:
            raise ChannelError(f"frame {seq}: malformed blob table: {exc}") from exc
        if offset != start + json_len + blob_len:
            raise ChannelError(f"frame {seq}: its blobs hold {offset - start - json_len} "
                               f"bytes, its header says {blob_len}")
        if blobs:
            message["_blobs"] = blobs
        return message


def pin_pools(torch: Any) -> int:
    """Size torch's intra- and inter-op pools from `POOL_ENV` (the parent's choice), before any
    parallel work has started them; returns the size. Harness side, right after ``import torch``."""
    threads = int(os.environ.get(POOL_ENV, "4"))
    torch.set_num_threads(threads)
    # Raises once inter-op work has started; a harness calls this first, so it never has.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(threads)
    return threads


def tensor_blob(tensor: Any) -> Blob:
    """A tensor's values as a `Blob` of immutable bytes (copied to host memory, C-contiguous):
    nothing in this process can change them once taken."""
    import torch

    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
    return Blob(str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape),
                raw.numpy().tobytes())


__all__ = [
    "ARM_EVENT",
    "CHANNEL_ENV",
    "KEY_PREFIX",
    "POOL_ENV",
    "Blob",
    "ChannelError",
    "ChannelReader",
    "ChannelWriter",
    "ChildExit",
    "pin_pools",
    "read_key",
    "tensor_blob",
]
