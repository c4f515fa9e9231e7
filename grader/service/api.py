"""The HTTP API: ``python -m grader serve --store DIR [--host H] [--port P]``.

The standard library's threading HTTP server, on purpose: the API is a dozen JSON routes, every
request is short (a grade runs in a worker, never in a request), and the service then adds no
dependency to the trusted image (the ``service`` extra of pyproject.toml is empty). A server of
this kind is not hardened for the open internet: bind it to 127.0.0.1 or a private network, or
put a reverse proxy in front.

Every request carries ``Authorization: Bearer <token>``: a run's token reaches its own run and
its submissions only; the operator's token (``DIR/operator.token``) reaches everything. Routes:

    GET  /v1/whoami                         any       {"run": RUN or null, "operator": bool}
    POST /v1/runs                           operator  {"name"} → {"run", "token"}
    POST /v1/runs/RUN/submissions           run       body: the tar `git archive` makes (or .tar.gz)
                                                      → {"submission": {...}, "new": bool}
    GET  /v1/runs/RUN                       run       counts by state, best, final
    GET  /v1/runs/RUN/submissions           run       every submission with its grades
    GET  /v1/runs/RUN/best                  run       {"best": {...} or null}
    GET  /v1/runs/RUN/report                run       the run's report (`grader.service.runs`)
    POST /v1/runs/RUN/finalize              operator  {"allow_same_gpu": false} → {"final": {...}}
    GET  /v1/submissions/ID                 run       the submission and its grades
    GET  /v1/submissions/ID/report[?grade=G] run      the report JSON (404 until graded)
    POST /v1/submissions/ID/regrade         operator  queue another ordinary grade

Errors are ``{"error": "..."}`` with 400 (bad request or archive), 401 (no or unknown token), 403
(another run's), 404, 405, 411, 413 (too large), 429 (the run's rate limit or grades waiting).

Framing is strict, so that a keep-alive proxy in front never sees two replies to one request: a
GET with a body or a Content-Length, a ``Transfer-Encoding`` (chunked or any other), or a
Content-Length that is repeated, negative or not a number gets 400 and the connection is closed
without reading further. No reply names a path of the operator's (the store's errors name none;
an internal error says only its kind, the service's stderr has the rest).
"""

from __future__ import annotations

import json
import re
import sys
import threading
import traceback
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from grader.service import runs
from grader.service.archive import UploadLimits, UploadRejected, check_upload
from grader.service.store import LimitExceeded, Limits, Run, Store, StoreError, Unknown

_HEX_COMMIT = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Caller:
    operator: bool
    run: Run | None

    def may_see(self, run_id: str) -> None:
        if not self.operator and (self.run is None or self.run.id != run_id):
            raise ApiError(403, "this token belongs to another run")

    def must_be_operator(self) -> None:
        if not self.operator:
            raise ApiError(403, "only the operator's token may do this")


class GraderServer(ThreadingHTTPServer):
    daemon_threads = True
    # The listen backlog: 20 agents submitting at once must not see a reset (the default is 5).
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], store_dir: Path,
                 upload_limits: UploadLimits) -> None:  # fmt: skip
        self.store_dir = store_dir
        self.upload_limits = upload_limits
        self._local = threading.local()
        with Store(store_dir) as store:  # made, migrated, the operator token written
            store.operator_token()
            store.collect_orphans()
        super().__init__(address, Handler)

    def store(self) -> Store:
        """This thread's connection (a SQLite connection is not shared across threads)."""
        store = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = Store(self.store_dir)
        return store


class Handler(BaseHTTPRequestHandler):
    server: GraderServer
    protocol_version = "HTTP/1.1"
    server_version = "grader-service/1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass  # one line per request on stderr is noise for the operator; errors are in replies

    # ------------------------------------------------------------------ plumbing

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_OPTIONS(self) -> None:
        self._dispatch("OPTIONS")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The base class's own errors (a bad request line, headers too long, …) as JSON too,
        and the connection closed (what follows on it cannot be trusted to be a request)."""
        self.close_connection = True
        self._body_read = False
        self._reply(code, {"error": message or self.responses.get(code, ("error",))[0]})

    def _framing(self, method: str) -> None:
        """Refuse what a proxy and this server could split into requests differently."""
        if self.headers.get_all("Transfer-Encoding"):
            raise ApiError(400, "Transfer-Encoding is not accepted: send a Content-Length")
        lengths = self.headers.get_all("Content-Length") or []
        if len(lengths) > 1:
            raise ApiError(400, f"{len(lengths)} Content-Length headers: send one")
        if lengths and not re.fullmatch(r"[0-9]{1,18}", lengths[0].strip()):
            raise ApiError(400, f"Content-Length {lengths[0][:40]!r} is not a length")
        if lengths and method != "POST":
            raise ApiError(400, f"a {method} request carries no body and no Content-Length")

    def _dispatch(self, method: str) -> None:
        # A POST's body is unread until a route reads it; a reply sent before closes the
        # connection (the client's unread bytes would be taken for the next request).
        self._body_read = method != "POST" or self.headers.get("Content-Length", "0") == "0"
        try:
            self._framing(method)
        except ApiError as exc:
            self._body_read = False  # whatever follows on this connection is not read
            self._reply(exc.status, {"error": str(exc)})
            return
        if method not in ("GET", "POST"):
            self._body_read = False
            self._reply(405, {"error": f"{method} is not a method of this API (GET and POST)"})
            return
        try:
            url = urlsplit(self.path)
            parts = [p for p in url.path.split("/") if p]
            query = parse_qs(url.query)
            caller = self._caller()
            status, body = self._route(method, parts, query, caller)
        except ApiError as exc:
            status, body = exc.status, {"error": str(exc)}
        except UploadRejected as exc:
            status, body = exc.http_status, {"error": str(exc)}
        except LimitExceeded as exc:
            status, body = exc.http_status, {"error": str(exc)}
        except Unknown as exc:
            status, body = 404, {"error": str(exc)}
        except StoreError as exc:
            status, body = 409, {"error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a reply, not a dropped connection
            # Its text may name a path of the store's: the operator's log gets it, not the reply.
            traceback.print_exc(file=sys.stderr)
            status, body = 500, {"error": f"internal error ({type(exc).__name__}); the "
                                          "service's log has its details"}
        self._reply(status, body)

    def _reply(self, status: int, body: dict[str, Any] | str) -> None:
        data = (body if isinstance(body, str) else json.dumps(body, indent=2)).encode()
        if not self._body_read:
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _caller(self) -> Caller:
        header = self.headers.get("Authorization", "")
        if not header.startswith("Bearer ") or not header[7:].strip():
            raise ApiError(401, "no token: send Authorization: Bearer <token> (the run's token "
                           "from python -m grader run create, or the operator's)")
        token = header[7:].strip()
        store = self.server.store()
        if store.is_operator(token):
            return Caller(operator=True, run=None)
        run = store.run_of_token(token)
        if run is None:
            raise ApiError(401, "this token is not known to this service")
        return Caller(operator=False, run=run)

    def _body(self, limit: int) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            raise ApiError(411, "a Content-Length header is required")
        try:
            size = int(length)
        except ValueError as exc:
            raise ApiError(400, f"Content-Length {length!r} is not a number") from exc
        if size > limit:
            raise ApiError(413, f"the body is {size} bytes; the limit is {limit}")
        data = self.rfile.read(size)
        self._body_read = True
        if len(data) != size:
            raise ApiError(400, f"the body ended after {len(data)} of {size} bytes")
        return data

    def _json_body(self) -> dict[str, Any]:
        data = self._body(1 << 16)
        try:
            value = json.loads(data or b"{}")
        except ValueError as exc:
            raise ApiError(400, f"the body is not JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise ApiError(400, "the body must be a JSON object")
        return value

    # ------------------------------------------------------------------ routes

    def _route(self, method: str, parts: list[str], query: dict[str, list[str]],
               caller: Caller) -> tuple[int, dict[str, Any] | str]:  # fmt: skip
        store = self.server.store()
        if parts[:1] != ["v1"]:
            raise ApiError(404, f"no route {self.path!r}: the API is under /v1/")
        parts = parts[1:]
        if method == "GET" and parts == ["whoami"]:
            return 200, {"run": caller.run.id if caller.run else None, "operator": caller.operator}
        if method == "POST" and parts == ["runs"]:
            caller.must_be_operator()
            body = self._json_body()
            fields = ("max_per_hour", "max_upload_bytes", "max_queued")
            bad = {k: body[k] for k in fields
                   if k in body and (type(body[k]) is not int or body[k] < 1)}
            if bad:
                raise ApiError(400, f"limits are positive integers, got {bad}")
            limits = Limits(**{k: body[k] for k in fields if k in body})
            run, token = store.create_run(str(body.get("name", "")), limits)
            return 201, {"run": run.id, "token": token}
        if len(parts) >= 2 and parts[0] == "runs":
            run_id = parts[1]
            caller.may_see(run_id)
            store.run(run_id)
            rest = parts[2:]
            if method == "POST" and rest == ["submissions"]:
                return self._upload(store, run_id, caller, query)
            if method == "POST" and rest == ["finalize"]:
                caller.must_be_operator()
                body = self._json_body()
                final = store.request_final(run_id, allow_same_gpu=bool(body.get("allow_same_gpu")))
                return 202, {"final": runs.final_view(store, final)}
            if method == "GET" and rest == []:
                return 200, runs.run_status(store, run_id)
            if method == "GET" and rest == ["submissions"]:
                return 200, {"run": run_id, "submissions": [
                    runs.submission_view(store, s) for s in store.submissions(run_id)]}
            if method == "GET" and rest == ["best"]:
                best = store.best(run_id)
                return 200, {"best": runs.submission_view(store, best[0]) if best else None}
            if method == "GET" and rest == ["report"]:
                return 200, runs.run_report(store, run_id)
        if len(parts) >= 2 and parts[0] == "submissions":
            try:
                submission = store.submission(int(parts[1]))
            except ValueError as exc:
                raise ApiError(404, f"no submission {parts[1]!r}") from exc
            caller.may_see(submission.run)
            rest = parts[2:]
            if method == "GET" and rest == []:
                return 200, runs.submission_view(store, submission)
            if method == "GET" and rest == ["report"]:
                return 200, self._report(store, submission.id, query)
            if method == "POST" and rest == ["regrade"]:
                caller.must_be_operator()
                return 202, {"grade": store.regrade(submission.id).to_dict()}
        raise ApiError(404, f"no route {method} {self.path}")

    def _upload(self, store: Store, run_id: str, caller: Caller,
                query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:  # fmt: skip
        run = store.run(run_id)
        limit = min(run.limits.max_upload_bytes, self.server.upload_limits.max_upload_bytes)
        data = self._body(limit)
        tree = check_upload(data, self.server.upload_limits)
        commit = (self.headers.get("X-Grader-Commit") or tree.commit or "").strip().lower()
        if not _HEX_COMMIT.match(commit):
            raise ApiError(400, "no commit id: upload the tar that `git archive <commit>` makes "
                           f"or send X-Grader-Commit (got {commit!r})")
        if tree.commit and commit != tree.commit:
            raise ApiError(400, f"X-Grader-Commit {commit} differs from the archive's commit "
                           f"{tree.commit}")
        force = query.get("force", ["0"])[0] == "1"
        if force:
            caller.must_be_operator()
        submission, new = store.add_submission(
            run_id, commit=commit, tree=tree.tree, archive=tree.archive, files=len(tree.files),
            note=(self.headers.get("X-Grader-Note") or "")[:500],
            origin=self.client_address[0], force=force,
        )  # fmt: skip
        return (201 if new else 200), {"submission": runs.submission_view(store, submission),
                                       "new": new}

    def _report(self, store: Store, submission_id: int, query: dict[str, list[str]]) -> str:
        grades = store.grades(submission_id)
        if "grade" in query:
            wanted = [g for g in grades if str(g.id) == query["grade"][0]]
            if not wanted:
                raise ApiError(404, f"submission {submission_id} has no grade {query['grade'][0]}")
        else:
            wanted = [g for g in grades if g.purpose == "grade" and g.report_sha256]
        report = store.report(wanted[-1]) if wanted else None
        if report is None:
            raise ApiError(404, f"submission {submission_id} has no report yet")
        return report


def make_server(store_dir: Path, host: str = "127.0.0.1", port: int = 8750,
                upload_limits: UploadLimits | None = None) -> GraderServer:  # fmt: skip
    if upload_limits is None:
        from grader.config import load_config

        upload_limits = UploadLimits.of(load_config().limits)
    return GraderServer((host, port), store_dir, upload_limits)


__all__ = ["GraderServer", "make_server"]
