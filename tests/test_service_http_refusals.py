"""Bad HTTP input, over real sockets to uvicorn on 127.0.0.1 (`make_server` in a thread, short
timeouts): each bad request gets a 4xx whose body is exactly ``{"error": "..."}``, nothing of
the store or of other runs leaks, idle and slow connections are closed, the server's threads and
memory stay bounded, and a restart loses nothing. Also the operator's endpoints (``/healthz``,
``/readyz``, ``/openapi.json``, ``/docs``), the access log, and ``serve`` on a busy port."""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import socket
import sqlite3
import struct
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from service_helpers import (
    ENV,
    REPO,
    Server,
    call,
    exchange,
    fake_commit,
    one_reply,
    read_reply,
    solution,
    tar_with,
    tree_tar,
    upload,
)

from grader.service.archive import UploadLimits
from grader.service.http_server import GraderServer, ServerOptions, make_server
from grader.service.store import Device, Limits, Store

OPTIONS = ServerOptions(keep_alive_s=1.0, request_s=2.0)


@dataclass(frozen=True)
class Live:
    server: GraderServer
    url: str
    port: int
    store: Path
    run: str
    token: str
    other_run: str
    other_token: str
    operator: str


def _start(store: Path, options: ServerOptions = OPTIONS) -> tuple[GraderServer, threading.Thread]:
    server = make_server(store, "127.0.0.1", 0, UploadLimits(), options)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def _stop(server: GraderServer, thread: threading.Thread) -> None:
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)
    assert not thread.is_alive()


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    store = tmp_path / "store"
    with Store(store) as s:
        run, token = s.create_run("r", Limits(max_upload_bytes=64 << 10, max_queued=100))
        other, other_token = s.create_run("other")
        operator = s.operator_token()
    server, thread = _start(store)
    port = server.server_address[1]
    try:
        yield Live(server, f"http://127.0.0.1:{port}", port, store, run.id, token, other.id,
                   other_token, operator)  # fmt: skip
    finally:
        _stop(server, thread)


def _is_error(status: int, body: object, expected: int) -> str:
    """The error text, once the reply is checked to be ``expected`` and the one error shape."""
    assert status == expected, (status, body)
    assert isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], str)
    assert body["error"], body
    return body["error"]


def _raw(live: Live, method: str, path: str, *, token: str | None = None, extra: str = "",
         body: bytes = b"") -> bytes:  # fmt: skip
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}{extra}\r\n").encode() + body


def _bomb() -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb") as gz:
        for _ in range(64):
            gz.write(bytes(1 << 20))
    return out.getvalue()


# ----------------------------------------------------------------------------- framing


FRAMING = {
    # name: (raw request built from the live server, expected status)
    "negative length": (lambda lv: _raw(lv, "POST", f"/v1/runs/{lv.run}/submissions",
                                        token=lv.token, extra="Content-Length: -1\r\n"), 400),
    "a length that is not a number": (lambda lv: _raw(lv, "POST", "/v1/runs", token=lv.operator,
                                                      extra="Content-Length: 12abc\r\n"), 400),
    "two lengths that differ": (lambda lv: _raw(lv, "POST", "/v1/runs", token=lv.operator,
                                                extra="Content-Length: 2\r\nContent-Length: 3\r\n",
                                                body=b"{}x"), 400),
    "an upload over the service's limit": (lambda lv: _raw(
        lv, "POST", f"/v1/runs/{lv.run}/submissions", token=lv.token,
        extra=f"Content-Length: {1 << 40}\r\n"), 413),
    "an upload over the run's limit": (lambda lv: _raw(
        lv, "POST", f"/v1/runs/{lv.run}/submissions", token=lv.token,
        extra=f"Content-Length: {1 << 20}\r\n"), 413),
    "a JSON body over 64 KiB": (lambda lv: _raw(lv, "POST", "/v1/runs", token=lv.operator,
                                                extra="Content-Length: 100000\r\n"), 413),
    "a POST without a length": (lambda lv: _raw(lv, "POST", "/v1/runs", token=lv.operator), 411),
    "chunked": (lambda lv: _raw(lv, "POST", f"/v1/runs/{lv.run}/submissions", token=lv.token,
                                extra="Transfer-Encoding: chunked\r\n", body=b"0\r\n\r\n"), 400),
    "transfer-encoding gzip": (lambda lv: _raw(lv, "POST", "/v1/runs", token=lv.operator,
                                               extra="Transfer-Encoding: gzip\r\n"), 400),
    "a length and chunked": (lambda lv: _raw(lv, "POST", "/v1/runs", token=lv.operator,
                                             extra="Content-Length: 5\r\nTransfer-Encoding: "
                                                   "chunked\r\n", body=b"0\r\n\r\n"), 400),
    "a GET with a body": (lambda lv: _raw(lv, "GET", "/v1/whoami", token=lv.token,
                                          extra="Content-Length: 2\r\n", body=b"{}"), 400),
    "a malformed request line": (lambda lv: b"GET /v1/whoami HTTP/1.1 extra\r\nHost: x\r\n\r\n",
                                 400),
    "a header without a colon": (lambda lv: b"GET /v1/whoami HTTP/1.1\r\nHost x\r\n\r\n", 400),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(FRAMING))
def test_bad_framing_gets_one_json_4xx_and_the_connection_closes(live: Live, name: str) -> None:
    """The body (if any) is not read: the reply comes at once, and a well-formed request sent
    after it on the same connection is never answered."""
    build, status = FRAMING[name]
    start = time.monotonic()
    data = exchange(live.port, build(live) + _raw(live, "GET", "/v1/whoami", token=live.token))
    took = time.monotonic() - start
    code, headers, body = one_reply(data)
    _is_error(code, body, status)
    assert headers["content-type"] == "application/json"
    assert took < OPTIONS.request_s, f"{name}: the reply waited for the body ({took:.1f} s)"


def test_two_equal_lengths_are_one(live: Live) -> None:
    """What h11 does: equal ``Content-Length`` headers are merged into one (no ambiguity for a
    proxy either), differing ones are refused (above)."""
    data = exchange(live.port, _raw(live, "POST", "/v1/runs", token=live.operator,
                                    extra="Content-Length: 13\r\nContent-Length: 13\r\n"
                                          "Connection: close\r\n", body=b'{"name": "x"}'))  # fmt: skip
    code, _, body = one_reply(data)
    assert code == 201 and set(body) == {"run", "token"}, body


def test_a_body_longer_than_declared_is_cut_at_the_length(live: Live) -> None:
    """The declared length is the body: what follows is a next request, not valid HTTP, and is
    answered 400 and the connection closed (never read on as the upload)."""
    data = exchange(live.port, _raw(live, "POST", f"/v1/runs/{live.run}/submissions",
                                    token=live.token, extra="Content-Length: 10\r\n",
                                    body=b"0123456789" + bytes(500_000)))  # fmt: skip
    first, _, rest = data.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 400"), data[:300]  # ten bytes are not a tar
    assert data.count(b"HTTP/1.1 400 Bad Request\r\n") == 2, data[:600]  # and nothing more
    assert rest.endswith(b'non-negative length)"}'), data[-300:]


# ----------------------------------------------------------------------------- timeouts


def test_an_idle_connection_is_closed_after_the_keep_alive(live: Live) -> None:
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
        start = time.monotonic()
        assert sock.recv(1024) == b""  # closed by the server, nothing sent
        assert time.monotonic() - start < OPTIONS.keep_alive_s + 2
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
        sock.sendall(_raw(live, "GET", "/healthz"))
        assert read_reply(sock).startswith(b"HTTP/1.1 200")
        start = time.monotonic()
        assert sock.recv(1024) == b""  # idle after a reply
        assert time.monotonic() - start < OPTIONS.keep_alive_s + 2


@pytest.mark.parametrize("where", ["head", "body"])
def test_a_slow_request_gets_408_and_is_cut_off(live: Live, where: str) -> None:
    """A byte every 0.1 s: the head or the body does not arrive within request_s."""
    raw = _raw(live, "POST", "/v1/runs", token=live.operator, extra="Content-Length: 200\r\n",
               body=b'{"name": "' + b"x" * 180 + b'"}')  # fmt: skip
    cut = len(raw) - 200 if where == "body" else 0
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
        sock.sendall(raw[:cut])
        start, got = time.monotonic(), b""
        for byte in raw[cut:]:
            try:
                sock.sendall(bytes([byte]))
            except OSError:  # the server closed it
                break
            ready = sock.recv(65536) if _readable(sock) else b""
            got += ready
            if got and not ready:
                break
            time.sleep(0.1)
        sock.settimeout(5)
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except OSError:
            pass
    took = time.monotonic() - start
    assert OPTIONS.request_s - 0.5 < took < OPTIONS.request_s + 3, took
    code, _, body = one_reply(got)
    assert "did not arrive" in _is_error(code, body, 408)


def _readable(sock: socket.socket) -> bool:
    import select

    return bool(select.select([sock], [], [], 0)[0])


# ----------------------------------------------------------------------------- bodies and ids


def test_bad_json_and_bad_values_get_400(live: Live) -> None:
    url = f"{live.url}/v1/runs"
    cases = {
        b'{"name": "x", "max_per_hour": "abc"}': "max_per_hour",
        b'{"name": "x", "max_queued": -1}': "max_queued",
        b'{"name": "x", "max_upload_bytes": 0}': "max_upload_bytes",
        b'{"name": "x", "max_queued": 1e30}': "max_queued",
        b'{"name": "x", "max_queued": 99999999999999999999999}': "max_queued",
        b'{"name": "x", "max_per_hur": 5}': "max_per_hur",
        b'{"name": "   "}': "name",
        b'{"name": 5}': "name",
        b"{}": "name",
        b"[1, 2]": "body",
        b'{"name": "x",': "JSON",
        b"\xff\xfe not utf-8": "JSON",
    }
    for data, words in cases.items():
        reply = call(url, live.operator, "POST", data)
        assert words in _is_error(reply.status, reply.body, 400), (data, reply.body)
    reply = call(f"{live.url}/v1/runs/{live.run}/finalize", live.operator, "POST",
                 b'{"allow_same_gpu": "yes"}')  # fmt: skip
    assert "allow_same_gpu" in _is_error(reply.status, reply.body, 400)
    reply = call(f"{live.url}/v1/runs/{live.run}/submissions?force=maybe", live.operator, "POST",
                 tree_tar(solution(0.5)))  # fmt: skip
    assert "force" in _is_error(reply.status, reply.body, 400)
    with Store(live.store) as store:
        assert [r for r in (store.run(live.run), store.run(live.other_run))]  # none was made
        runs = store._db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    assert runs == 2


def test_unknown_ids_get_404_and_leak_nothing(live: Live) -> None:
    up = upload(live.url, live.other_token, live.other_run, tree_tar(solution(0.5)),
                fake_commit("other"))  # fmt: skip
    assert up.status == 201, up.body
    theirs = up.body["submission"]["id"]
    for token in (live.operator, live.token):
        for path in ("/v1/submissions/999999", "/v1/submissions/abc", "/v1/submissions/-1",
                     f"/v1/submissions/{'9' * 30}", f"/v1/submissions/{theirs}/report?grade=77",
                     "/v1/nothing-here", "/nothing"):  # fmt: skip
            if token == live.token and "report" in path:
                path = path.replace(str(theirs), "999999")
            reply = call(live.url + path, token)
            text = _is_error(reply.status, reply.body, 404)
            assert "ids go from" not in text and live.other_run not in text, (path, text)
    # The operator: an unknown run is a 404 that lists no run.
    reply = call(f"{live.url}/v1/runs/run-nope", live.operator)
    text = _is_error(reply.status, reply.body, 404)
    assert live.run not in text and live.other_run not in text, text
    # A run token: another run's submission is the same 404 as none at all; another run, real or
    # not, is the same 403.
    mine = call(f"{live.url}/v1/submissions/{theirs}", live.token)
    none = call(f"{live.url}/v1/submissions/{theirs + 1000}", live.token)
    assert mine.status == none.status == 404
    assert mine.body["error"].replace(str(theirs), "N") == none.body["error"].replace(
        str(theirs + 1000), "N")  # fmt: skip
    real = call(f"{live.url}/v1/runs/{live.other_run}", live.token)
    fake = call(f"{live.url}/v1/runs/run-nope", live.token)
    assert _is_error(real.status, real.body, 403) == _is_error(fake.status, fake.body, 403)
    for path in ("", "/submissions", "/best", "/report"):
        reply = call(f"{live.url}/v1/runs/{live.other_run}{path}", live.token)
        assert live.other_run not in _is_error(reply.status, reply.body, 403)


@pytest.mark.parametrize("method", ["PUT", "DELETE", "HEAD", "PATCH", "OPTIONS", "TRACE"])
def test_other_methods_get_405_json(live: Live, method: str) -> None:
    for path in ("/v1/whoami", f"/v1/runs/{live.run}", "/healthz", "/nowhere"):
        data = exchange(live.port, _raw(live, method, path, token=live.token,
                                        extra="Connection: close\r\n"))  # fmt: skip
        head, _, rest = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 405"), data
        assert b"content-type: application/json" in head.lower()
        if method == "HEAD":
            assert rest == b"", data  # a HEAD reply has no body
        else:
            _is_error(405, json.loads(rest), 405)


def test_tokens(live: Live) -> None:
    url = f"{live.url}/v1/runs/{live.run}"
    for token in (None, "", "not-a-token", live.token + "x"):
        reply = call(url, token)
        _is_error(reply.status, reply.body, 401)
    reply = call(url, None, headers={"Authorization": f"Basic {live.token}"})
    _is_error(reply.status, reply.body, 401)
    reply = call(url, live.other_token)
    _is_error(reply.status, reply.body, 403)
    for path, body in (("/v1/runs", b'{"name": "x"}'), (f"/v1/runs/{live.run}/finalize", b"{}")):
        reply = call(live.url + path, live.token, "POST", body)
        _is_error(reply.status, reply.body, 403)
    assert call(url, live.token).status == 200 and call(url, live.operator).status == 200


ARCHIVES = {
    "absolute path": (tar_with("/etc/evil.py", size=1), 400, "absolute"),
    "dot-dot": (tar_with("../evil.py", size=1), 400, ".."),
    "symlink": (tar_with("link", tarfile.SYMTYPE, "/etc/passwd"), 400, "symlink"),
    "hard link": (tar_with("hard", tarfile.LNKTYPE, "solution.py"), 400, "link"),
    "device": (tar_with("dev", tarfile.CHRTYPE), 400, "device"),
    "fifo": (tar_with("fifo", tarfile.FIFOTYPE), 400, ""),
    "oversize member": (b"", 413, ""),  # built in the test: over the run's 64 KiB as received
    "compression bomb": (_bomb(), 413, ""),
    "not a tar": (b"just some bytes" * 10, 400, "tar"),
    "a truncated gzip": (gzip.compress(tree_tar(solution(0.5)))[:-40], 400, "gzip"),
}


@pytest.mark.parametrize("name", sorted(ARCHIVES))
def test_every_archive_trick_comes_back_400_or_413_json(live: Live, name: str) -> None:
    data, status, words = ARCHIVES[name]
    if name == "oversize member":
        data = tar_with("big.bin", size=100_000)
    reply = upload(live.url, live.token, live.run, data, fake_commit(name))
    assert words in _is_error(reply.status, reply.body, status), reply.body
    with Store(live.store) as store:
        assert store.submissions(live.run) == []


# ----------------------------------------------------------------------------- bounds


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_100_idle_connections_hold_no_threads_and_log_no_tracebacks(
        live: Live, caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    caplog.set_level(logging.INFO)
    before = _threads()
    socks = [socket.create_connection(("127.0.0.1", live.port), timeout=10) for _ in range(100)]
    try:
        for sock in socks[:50]:  # half of them mid-request, half silent
            sock.sendall(b"GET /v1/whoami HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.5)
        assert _threads() <= before + 4, (before, _threads())
        for sock in socks[50:75]:  # the client goes first, with a reset
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        deadline = time.monotonic() + OPTIONS.request_s + 5
        for sock in socks[75:] + socks[:50]:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                while sock.recv(65536):
                    pass
            except ConnectionResetError:
                pass  # closed with our unread bytes: also closed
    finally:
        for sock in socks:
            sock.close()
    time.sleep(0.5)
    assert _threads() <= before + 4
    records = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not records, [r.getMessage() for r in records[:3]]
    assert len(caplog.records) < 150, len(caplog.records)  # a line or so a connection at most


def test_requests_run_in_a_bounded_pool_of_threads(tmp_path: Path) -> None:
    """24 requests at once that each wait 2 s in a route (``/readyz`` while a writer holds the
    store's lock), sent on raw sockets so that the client adds no thread: the server's threads
    grow by the pool's 8 at most, and every request is answered."""
    store = tmp_path / "store"
    Store(store).close()
    server, thread = _start(store, ServerOptions(keep_alive_s=1.0, request_s=30.0, threads=8))
    port = server.server_address[1]
    db = sqlite3.connect(store / "grader.sqlite", isolation_level=None)
    try:
        before = _threads()
        db.execute("BEGIN IMMEDIATE")
        socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(24)]
        for sock in socks:
            sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        peak = before
        for _ in range(10):
            time.sleep(0.3)
            peak = max(peak, _threads())
        replies = [exchange_on(sock) for sock in socks]
        assert all(r.startswith(b"HTTP/1.1 503") for r in replies), replies[:2]
        assert peak <= before + 8 + 2, (before, peak)
    finally:
        db.close()
        _stop(server, thread)


def exchange_on(sock: socket.socket) -> bytes:
    with sock:
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def _one_past_the_cap(port: int, cap: int) -> list[socket.socket]:
    """Hold ``cap`` idle connections, check that one more gets the 503 that names the cap, and
    return the held ones (the caller closes them)."""
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(cap)]
    try:
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            code, _, body = one_reply(exchange_on(extra))
        assert f"{cap} connections open" in _is_error(code, body, 503)
    except BaseException:
        for sock in held:
            sock.close()
        raise
    return held


def test_past_the_connection_cap_a_connection_gets_503_json(tmp_path: Path) -> None:
    server, thread = _start(tmp_path / "store", ServerOptions(keep_alive_s=5.0, max_connections=5))
    port = server.server_address[1]
    held: list[socket.socket] = []
    try:
        held = _one_past_the_cap(port, 5)
        held.pop().close()
        time.sleep(0.3)
        assert call(f"http://127.0.0.1:{port}/healthz", None).status == 200  # room again
    finally:
        for sock in held:
            sock.close()
        _stop(server, thread)


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_oversized_uploads_are_not_read_into_memory(live: Live) -> None:
    """Ten uploads that declare 8 MiB (the service's cap) to a run that takes 64 KiB and then
    send 8 MiB each: each is refused at once, and the process grows by far less than 80 MiB."""
    chunk = bytes(1 << 20)
    before = _rss()
    for _ in range(10):
        with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
            sock.sendall(_raw(live, "POST", f"/v1/runs/{live.run}/submissions", token=live.token,
                              extra=f"Content-Length: {8 << 20}\r\n"))  # fmt: skip
            got = b""
            try:
                for _ in range(8):
                    sock.sendall(chunk)
            except OSError:
                pass  # closed by the server: the rest was never read
            try:
                while data := sock.recv(65536):
                    got += data
            except OSError:
                pass
            assert got == b"" or got.startswith(b"HTTP/1.1 413"), got[:200]
    grown = _rss() - before
    assert grown < 24 << 20, f"the process grew {grown / (1 << 20):.1f} MiB"
    assert call(f"{live.url}/healthz", None).status == 200  # and still serves


# ----------------------------------------------------------------------------- restarts


def test_a_restart_loses_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with Store(store) as s:
        run, token = s.create_run("r", Limits(max_queued=10))
    server, thread = _start(store)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    ids = [upload(url, token, run.id, tree_tar(solution(0.5, str(i))), fake_commit(str(i)))
           .body["submission"]["id"] for i in range(3)]  # fmt: skip
    before = call(f"{url}/v1/runs/{run.id}/report", token).body
    _stop(server, thread)
    server, thread = _start(store)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert call(f"{url}/v1/runs/{run.id}/report", token).body == before
        assert [call(f"{url}/v1/submissions/{i}", token).body["id"] for i in ids] == ids
        again = upload(url, token, run.id, tree_tar(solution(0.5, "0")), fake_commit("0"))
        assert again.status == 200 and again.body["new"] is False  # the same tree, known
    finally:
        _stop(server, thread)


# ----------------------------------------------------------------------------- operations


def test_health_readiness_openapi_and_docs(live: Live) -> None:
    assert call(f"{live.url}/healthz", None).body == {"ok": True}
    ready = call(f"{live.url}/readyz", None)
    assert ready.status == 503 and "no worker" in ready.body["reason"], ready.body
    with Store(live.store) as store:
        assert store.claim("w1", Device("cpu", "w1"), lease_s=30) is None  # a worker looks
    ready = call(f"{live.url}/readyz", None)
    assert ready.status == 200 and ready.body["ready"] is True, ready.body
    assert [w["worker"] for w in ready.body["workers"]] == ["w1"]
    # A writer that holds the store's lock: not ready, said within seconds.
    db = sqlite3.connect(live.store / "grader.sqlite", isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    try:
        start = time.monotonic()
        ready = call(f"{live.url}/readyz", None)
        assert ready.status == 503 and "not writable" in ready.body["reason"], ready.body
        assert time.monotonic() - start < 10
        assert str(live.store) not in json.dumps(ready.body)
    finally:
        db.execute("ROLLBACK")
        db.close()
    spec = call(f"{live.url}/openapi.json", None).body
    assert {"/v1/runs", "/v1/runs/{run_id}/submissions", "/v1/submissions/{submission_id}",
            "/healthz", "/readyz"} <= set(spec["paths"])  # fmt: skip
    created = spec["paths"]["/v1/runs"]["post"]["requestBody"]["content"]["application/json"]
    assert "max_per_hour" in created["schema"]["properties"]
    assert "SubmissionView" in spec["components"]["schemas"]
    import urllib.request

    with urllib.request.urlopen(f"{live.url}/docs", timeout=10) as page:
        assert page.status == 200 and b"swagger" in page.read().lower()


def test_the_access_log_has_one_line_per_request_and_no_secret(
        live: Live, caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    caplog.set_level(logging.INFO, logger="grader.service.access")
    call(f"{live.url}/v1/runs/{live.run}?secret=hunter2", live.token)
    call(f"{live.url}/v1/runs/{live.other_run}", live.token)
    deadline = time.monotonic() + 5  # a line is written once its reply is sent: just after
    while len(_access_lines(caplog)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # and no third one comes
    lines = _access_lines(caplog)
    assert len(lines) == 2, lines
    assert lines[0].split()[1:4] == ["GET", f"/v1/runs/{live.run}", "200"], lines
    assert lines[1].split()[1:4] == ["GET", f"/v1/runs/{live.other_run}", "403"], lines
    assert all(line.endswith("ms") for line in lines)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert live.token not in text and "hunter2" not in text


def _access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "grader.service.access"]


def test_serve_on_a_busy_port_is_one_line_and_exit_1(tmp_path: Path) -> None:
    import subprocess

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = str(busy.getsockname()[1])
        for extra in ([], ["--json"]):
            done = subprocess.run([sys.executable, "-m", "grader", "serve", "--store",
                                   str(tmp_path / "store"), "--port", port, *extra], env=ENV,
                                  cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
            assert done.returncode == 1, done
            out = done.stdout if extra else done.stderr
            assert len(out.strip().splitlines()) == 1 and "in use" in out, done
            assert "Traceback" not in done.stderr
            if extra:
                assert "in use" in json.loads(done.stdout)["error"]


def test_serve_takes_the_servers_limits_from_its_flags(tmp_path: Path) -> None:
    """``serve --max-connections 2 --request-s 1``: a third connection gets 503, a request whose
    head never ends gets 408 after about a second (the defaults are 512 and 60 s)."""
    with Server(tmp_path / "store", "--max-connections", "2", "--request-s", "1") as server:
        port = int(server.url.rsplit(":", 1)[1])
        for sock in _one_past_the_cap(port, 2):
            sock.close()
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
            slow.sendall(b"GET /healthz HTTP/1.1\r\n")  # a head that never ends
            start = time.monotonic()
            code, _, body = one_reply(exchange_on(slow))
            took = time.monotonic() - start
        assert "within 1 s" in _is_error(code, body, 408) and 0.5 < took < 5, took


@pytest.mark.parametrize("flag, value", [("--threads", "0"), ("--max-connections", "-1"),
                                         ("--keep-alive-s", "inf"), ("--request-s", "nan")])
def test_serve_refuses_a_limit_that_is_not_positive(tmp_path: Path, flag: str, value: str) -> None:
    """Exit 2 and one line naming the limit and the value; no store is made."""
    import subprocess

    store = tmp_path / "store"
    done = subprocess.run([sys.executable, "-m", "grader", "serve", "--store", str(store),
                           "--port", "0", flag, value, "--json"], env=ENV, cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, done
    error = json.loads(done.stdout)["error"]
    assert flag.removeprefix("--").replace("-", "_") in error and value in error, error
    assert not store.exists() and "Traceback" not in done.stderr


def test_an_internal_error_is_a_500_that_names_no_path(
        live: Live, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    from grader.service import runs

    def broken(*_: object) -> None:
        raise RuntimeError(f"cannot read {live.store}/grader.sqlite")

    monkeypatch.setattr(runs, "run_status", broken)
    reply = call(f"{live.url}/v1/runs/{live.run}", live.token)
    text = _is_error(reply.status, reply.body, 500)
    assert "RuntimeError" in text and str(live.store) not in text, text
    assert any(str(live.store) in (r.exc_text or "") or r.exc_info for r in caplog.records)
    assert call(f"{live.url}/v1/runs/{live.run}/best", live.token).status == 200  # serves on
