"""Helpers of the dashboard's tests: the service with its dashboard, served by uvicorn on a free
port of 127.0.0.1 in a thread, and requests that see every reply as it is (no redirect
followed, no error raised)."""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from grader.service.http_server import make_server
from grader.service.store import Store


class DashboardServer:
    """The service as ``grader serve`` runs it (`make_server`: the API, its framing gate and the
    dashboard) on a free port of 127.0.0.1 in a thread, until the ``with`` ends; ``store`` is the
    test's own connection to the same store."""

    def __init__(self, store_dir: Path) -> None:
        self.store = Store(store_dir)
        self._server = make_server(store_dir, port=0)
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> DashboardServer:
        # The socket listens from `make_server` on: requests wait in its backlog until it serves.
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)
        self._server.server_close()
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
