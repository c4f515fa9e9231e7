"""The HTTP server's limits (`grader.service.http_server` applies them; ``python -m grader serve``
sets them from its flags). Kept apart from the server, which needs the service extra, so the
operator's commands can offer them, with their defaults, on a host without it.

The defaults are for one service on a shared host, whatever its size: an idle connection holds a
socket in the event loop, never a thread, so ``max_connections`` bounds sockets, not cores, and
``threads`` bounds the routes running at once (each a short SQLite transaction or a file read).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class ServerOptions:
    """The server's limits.

    Attributes:
        keep_alive_s: An idle connection is closed after this (uvicorn's keep-alive), the one
            that never sent a byte included.
        request_s: A request's head and body must arrive within this of its first byte, else
            408 and the connection is closed.
        max_connections: Past this many open at once a new connection gets 503 and is closed.
        backlog: The listen socket's backlog.
        threads: The most requests running at once (the app's thread pool).

    Raises:
        ValueError: A limit that is not a positive finite number (an int for the counts), named
            with the value given.
    """

    keep_alive_s: float = 5.0
    request_s: float = 60.0
    max_connections: int = 512
    backlog: int = 1024
    threads: int = 32

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            whole = f.type in (int, "int")
            kind = int if whole else (int, float)
            if (isinstance(value, bool) or not isinstance(value, kind)
                    or not math.isfinite(value) or value <= 0):
                want = "a positive whole number" if whole else "a positive number of seconds"
                raise ValueError(f"the server's {f.name} must be {want}, got {value!r}")


__all__ = ["ServerOptions"]
