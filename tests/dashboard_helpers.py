"""Helpers of the dashboard's tests: its router in a FastAPI app of its own, served by uvicorn on
a free port of 127.0.0.1 in a thread, and requests that see every reply as it is (no redirect
followed, no error raised)."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import uvicorn
from fastapi import FastAPI

from grader.service.dashboard import make_router
from grader.service.store import Store


class DashboardServer:
    """``make_router(store)`` in an app of its own, on uvicorn, until the ``with`` ends."""

    def __init__(self, store_dir: Path) -> None:
        self.store = Store(store_dir)
        app = FastAPI()
        app.include_router(make_router(self.store))
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        daemon=True)  # fmt: skip

    def __enter__(self) -> DashboardServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
        self.store.close()


@dataclass
class Page:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()


def fetch(url: str, *, token: str | None = None, cookie: str | None = None,
          method: str = "GET", form: str | None = None,
          headers: dict[str, str] | None = None) -> Page:  # fmt: skip
    """One request, its reply as it came (a 303 is not followed)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    headers = dict(headers or {})
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if cookie is not None:
        headers["Cookie"] = cookie
    body = None
    if form is not None:
        body = form.encode()
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body,
                     headers)  # fmt: skip
        reply = conn.getresponse()
        return Page(reply.status, reply.headers, reply.read())
    finally:
        conn.close()
