"""uvicorn serving the API (`grader.service.api.create_app`), with the limits a service on a
shared host needs.

- **Idle connections** are closed after ``keep_alive_s`` (uvicorn's ``timeout_keep_alive``),
  the one that never sent a byte included (uvicorn arms its timer only after a first reply).
- **Slow requests**: a request's head and body must arrive within ``request_s`` of its first
  byte, else 408 (if no reply began) and the connection is closed. A client dripping a byte a
  second holds a socket for that long, never a thread.
- **Connections**: past ``max_connections`` open at once a new one gets 503 (JSON) and is
  closed; the listen backlog is ``backlog``; requests run in at most ``threads`` threads. An
  idle connection holds a socket in the event loop, never a thread. (uvicorn's own
  ``limit_concurrency`` is not used: its 503 is plain text.)
- **Every reply is JSON**, h11's own refusals of bad framing (a ``Content-Length`` that is not
  a length, two that differ, a malformed head) included. uvicorn's parser is h11 (its
  ``httptools`` one is never chosen): it takes a request body by its declared length only.

The limits are `grader.service.server_limits.ServerOptions` (``serve`` sets each from a flag).
`GraderServer` binds its socket when made, so that a busy port is an `OSError` before anything
is served and port 0 names the free port it got; `GraderServer.serve_forever` runs uvicorn on it
until `GraderServer.shutdown`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from http import HTTPStatus
from pathlib import Path
from typing import Any

import anyio.to_thread
import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from grader.service.api import ReadyRule, create_app
from grader.service.archive import UploadLimits
from grader.service.server_limits import ServerOptions

log = logging.getLogger("grader.service.http")


def raw_reply(status: int, message: str) -> bytes:
    """A whole JSON error reply that closes its connection, for where no request is parsed."""
    body = json.dumps({"error": message}).encode()
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")  # fmt: skip
    return head.encode() + body


# A connection closed while its client still sends (a refused upload, a bad request followed by
# more) is closed gently: the reply and a FIN go first, then what still comes is read and dropped,
# up to these, before the socket closes. Closed at once, the kernel would answer the unread bytes
# with a reset, and a reset can discard the reply before the client reads it.
LINGER_S = 2.0
LINGER_BYTES = 4 << 20


class _Lingering:
    """The connection's transport as uvicorn sees it, with `close` made gentle (above) and any
    write after it dropped (a route's late reply to a request cut off for its deadline)."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedH11) -> None:
        self._transport = transport
        self._protocol = protocol
        self._closing = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self._closing or self._transport.is_closing()

    def write(self, data: bytes) -> None:
        if not self._closing:
            self._transport.write(data)

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._transport.is_closing() or not self._transport.can_write_eof():
            self._transport.close()
            return
        self._transport.write_eof()
        self._transport.resume_reading()
        self._protocol.linger()


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with the first-byte idle timer, the request deadline, the
    connection cap and JSON refusals. `options` is set on a subclass per server."""

    options = ServerOptions()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._socket_transport = transport
        self.transport = _Lingering(transport, self)  # type: ignore[assignment]
        self._deadline: asyncio.TimerHandle | None = None
        self._dropped: int | None = None  # bytes read and dropped while lingering
        self._linger_timer: asyncio.TimerHandle | None = None
        if len(self.connections) > self.options.max_connections:
            self.transport.write(raw_reply(503, f"the service has {self.options.max_connections} "
                                                "connections open: try again shortly"))  # fmt: skip
            self.transport.close()
            return
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler)  # fmt: skip

    def linger(self) -> None:
        self._dropped = 0
        self._linger_timer = self.loop.call_later(LINGER_S, self._socket_transport.close)

    def data_received(self, data: bytes) -> None:
        if self._dropped is not None:
            self._dropped += len(data)
            if self._dropped > LINGER_BYTES:
                self._socket_transport.close()
            return
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._deadline = self.loop.call_later(self.options.request_s, self._too_slow)
        super().data_received(data)
        if self._deadline is not None and self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            self._deadline.cancel()  # all of it came: what the route takes is not limited here
            self._deadline = None

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._deadline, self._linger_timer):
            if timer is not None:
                timer.cancel()
        self._deadline = self._linger_timer = None
        super().connection_lost(exc)

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(raw_reply(408, "the request did not arrive within "
                                                f"{self.options.request_s:g} s"))  # fmt: skip
        log.info("closed %s: its request did not arrive within %g s",
                 self.client[0] if self.client else "-", self.options.request_s)  # fmt: skip
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        # h11 refused the request's framing or head: what follows on the connection is not read.
        self.transport.write(raw_reply(400, "not a valid HTTP/1.1 request (its head is "
                                            "malformed, or its Content-Length is not one "
                                            "non-negative length)"))  # fmt: skip
        self.transport.close()


class _ThreadBound:
    """The app, with the event loop's thread pool (where ``def`` routes run) set to ``threads``
    on the first call (the lifespan's startup): a per-loop setting of anyio's."""

    def __init__(self, app: FastAPI, threads: int) -> None:
        self.app = app
        self.threads = threads
        self._set = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if not self._set:
            anyio.to_thread.current_default_thread_limiter().total_tokens = self.threads
            self._set = True
        await self.app(scope, receive, send)


def _protocol(options: ServerOptions) -> type[GuardedH11]:
    return type("GuardedH11", (GuardedH11,), {"options": options})


class GraderServer:
    """The API on ``host:port`` (module docstring)."""

    def __init__(self, app: FastAPI, host: str, port: int, options: ServerOptions) -> None:
        self.app = app
        self.options = options
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.create_server((host, port), family=family, backlog=options.backlog)
        self.server_address: tuple[str, int] = self.socket.getsockname()[:2]
        self._stopped = threading.Event()
        self._stopped.set()

        config = uvicorn.Config(
            _ThreadBound(app, options.threads), http=_protocol(options), lifespan="on",
            access_log=False, log_config=None,
            timeout_keep_alive=options.keep_alive_s, backlog=options.backlog,  # type: ignore[arg-type]
            timeout_graceful_shutdown=5, server_header=False, proxy_headers=False,
        )  # fmt: skip
        self._server = uvicorn.Server(config)

    def serve_forever(self) -> None:
        self._stopped.clear()
        try:
            self._server.run(sockets=[self.socket])
        finally:
            self._stopped.set()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop `serve_forever` (from another thread) and wait for it to return."""
        self._server.should_exit = True
        self._stopped.wait(timeout)

    def server_close(self) -> None:
        self.socket.close()


def make_server(store_dir: Path, host: str = "127.0.0.1", port: int = 8750,
                upload_limits: UploadLimits | None = None, options: ServerOptions | None = None,
                ready: ReadyRule | None = None) -> GraderServer:  # fmt: skip
    """The API of the store at ``store_dir`` on a socket bound now (`OSError` if it cannot)."""
    return GraderServer(create_app(Path(store_dir), upload_limits, ready), host, port,
                        options or ServerOptions())  # fmt: skip


__all__ = ["GraderServer", "GuardedH11", "ServerOptions", "make_server", "raw_reply"]
