"""Helpers of the service's tests: trees as tars, the service and its workers as real processes,
requests over real HTTP on 127.0.0.1."""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FAKE_GRADE = REPO / "tests" / "service_fake_grade.py"
ENV = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def tree_tar(files: dict[str, str], commit: str | None = None) -> bytes:
    """A tar like ``git archive``'s: a pax global header naming the commit, then the files."""
    buffer = io.BytesIO()
    headers = {"comment": commit} if commit else {}
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT,
                      pax_headers=headers) as tar:  # fmt: skip
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def tar_with(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", size: int = 0) -> bytes:
    """An uncompressed upload of ``solution.py`` and one member ``name`` of ``kind`` (a regular
    file of ``size`` zero bytes, or a link to ``link``, a device, a fifo): an archive trick."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("solution.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        if kind == tarfile.REGTYPE:
            info.size = size
            tar.addfile(info, io.BytesIO(bytes(size)))
        else:
            tar.addfile(info)
    return buffer.getvalue()


def solution(score: float, salt: str = "") -> dict[str, str]:
    return {"solution.py": f'"""A fake submission."""\nSCORE = {score}\n# {salt}\n'}


def fake_commit(salt: str) -> str:
    return hashlib.sha1(salt.encode()).hexdigest()


def fake_command(log: Path, sleep: float = 0.0) -> str:
    return (f"{sys.executable} {FAKE_GRADE} {{workspace}} {{report}} {{final}} --sleep {sleep} "
            f"--log {log}")


@dataclass
class Reply:
    status: int
    body: Any


def call(url: str, token: str | None, method: str = "GET", data: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 30.0) -> Reply:  # fmt: skip
    request = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Reply(response.status, json.loads(response.read() or b"null"))
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, json.loads(exc.read() or b"null"))


def upload(base: str, token: str, run: str, tar: bytes, commit: str | None = None) -> Reply:
    headers = {"Content-Type": "application/x-tar"}
    if commit:
        headers["X-Grader-Commit"] = commit
    return call(f"{base}/v1/runs/{run}/submissions", token, "POST", tar, headers)


def grader_cli(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "grader", *args], env=ENV, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip


class Server:
    """``python -m grader serve`` as a process on a free port of 127.0.0.1 (``flags``: more of
    its flags)."""

    def __init__(self, store: Path, *flags: str) -> None:
        self.store = store
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "grader", "serve", "--store", str(store), "--port", "0",
             "--json", *flags], env=ENV, cwd=REPO, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"serve did not start: {self.proc.stderr.read()}")  # type: ignore[union-attr]
        self.url = json.loads(line)["url"]
        self.operator = (store / "operator.token").read_text().strip()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def worker(store: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "grader", "worker", "--store", str(store),
                             *args], env=env or ENV, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too (reaped by init later).
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def exchange(port: int, raw: bytes) -> bytes:
    """Send ``raw`` and read until the server closes the connection (or 10 s pass)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                raise AssertionError(f"the server kept the connection open after "
                                     f"{b''.join(chunks)!r}") from None  # fmt: skip
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def one_reply(data: bytes) -> tuple[int, dict[str, str], dict[str, object]]:
    """The one response in ``data`` (an assertion error when there are more)."""
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers["content-length"])
    assert len(body) == length, f"more than one response on the connection: {data!r}"
    return status, headers, json.loads(body)


def read_reply(sock: socket.socket) -> bytes:
    """One whole response from a keep-alive connection: its head, then Content-Length bytes
    (the two may arrive apart)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"the connection closed mid-reply: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                  if line.lower().startswith(b"content-length:"))  # fmt: skip
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body
