"""The HTTP API, a FastAPI app: ``python -m grader serve --store DIR [--host H] [--port P]``.

`create_app` builds it from a store; `grader.service.http_server` serves it with uvicorn (its
timeouts, its connection cap and the framing its HTTP parser, h11, enforces). FastAPI for the
pydantic models of every body (`grader.service.api_models`: bad input is a 4xx, never a 500),
OpenAPI at ``/openapi.json`` and ``/docs``, and routes another module can add to (an
``APIRouter`` with `current_store` and `operator_only` as its dependencies). The agent's client
(`grader.service.client`) stays the standard library's. Not hardened for the open internet: bind
it to 127.0.0.1 or a private network, or put a reverse proxy in front.

Every ``/v1`` request carries ``Authorization: Bearer <token>``: a run's token reaches its own
run and its submissions only; the operator's token (``DIR/operator.token``) reaches everything.
Routes:

    GET  /healthz                           none      {"ok": true}: the process answers
    GET  /readyz                            none      200 {"ready": true, ...}; 503 with the reason
                                                      (the store not writable, no worker seen)
    GET  /v1/whoami                         any       {"run": RUN or null, "operator": bool}
    POST /v1/runs                           operator  {"name", "max_per_hour", "max_upload_bytes",
                                                      "max_queued"} → {"run", "token"}
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

Every error, from a route, the models, the router or the HTTP parser, is ``{"error": "..."}``:
400 (bad request, bad body, bad archive, bad framing), 401 (no or unknown token), 403 (another
run's, or an operator's route), 404, 405 (PUT, DELETE, HEAD, PATCH, ...), 408 (the request was
not received in time), 411, 413 (too large), 429 (the run's rate limit or grades waiting), 501
(not an HTTP method), 503 (too many connections; not ready).

A run token learns nothing of other runs: another run's id is 403 whether it exists or not, and
another run's submission is the same 404 as one that does not exist. No reply names a path of
the operator's or the store's id range (an internal error says only its kind; the log has the
rest).

Framing is strict, so that a keep-alive proxy in front never sees two replies to one request: a
request other than a POST with a ``Content-Length``, a ``Transfer-Encoding`` (chunked or any
other), two ``Content-Length`` headers that differ (h11 takes equal ones as one), or one that is
negative, not a number or over the limit (64 KiB for JSON, the run's upload limit for an upload)
gets its 4xx and the connection is closed without reading the body. An upload is read as it arrives,
never past the run's limit. Every request is one access-log line (`logging`, logger
``grader.service.access``): client, method, path without its query, status, milliseconds; never
a header, so never a token.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from grader.service import presence, runs
from grader.service.api_models import (
    Best,
    CreatedRun,
    CreateRun,
    ErrorBody,
    Finalize,
    Finalized,
    Health,
    Ready,
    Regraded,
    RunReport,
    RunStatus,
    RunSubmissions,
    SubmissionView,
    Uploaded,
    WhoAmI,
)
from grader.service.archive import UploadLimits, UploadRejected, check_upload
from grader.service.store import (
    DB_NAME,
    LimitExceeded,
    Limits,
    Run,
    Store,
    StoreError,
    Submission,
    Unknown,
)

_HEX_COMMIT = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
JSON_LIMIT = 1 << 16  # a JSON body's bytes
UPLOAD_ROUTE = re.compile(r"^/v1/runs/[^/]+/submissions$")
_HTTP_METHODS = {"HEAD", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"}

log = logging.getLogger("grader.service.api")
access_log = logging.getLogger("grader.service.access")

BodyT = TypeVar("BodyT", bound=BaseModel)
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ReadyRule:
    """What `/readyz` asks: a worker seen within ``worker_s`` seconds (``presence``)."""

    worker_s: float = 120.0


@dataclass(frozen=True)
class StoreFiles:
    """Where the store's database and blobs are (what `/readyz` probes, with no connection)."""

    db_path: Path
    blobs: Path


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


class Stores:
    """The app's store connections, one per request at a time: a SQLite connection must not
    serve two threads at once, and FastAPI runs a request's dependencies and its route in
    whichever threads of its pool are free. A request takes one (`lease`) and gives it back;
    there are never more than requests at once (the thread pool bounds them)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._free: list[Store] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def lease(self) -> Iterator[Store]:
        with self._lock:
            store = self._free.pop() if self._free else None
        if store is None:
            store = Store(self.path)
        try:
            yield store
        finally:
            with self._lock:
                self._free.append(store)


def _store_path(store: Store | Path) -> Path:
    """What reopens ``store``: its folder, or the file of an older single-file store."""
    if isinstance(store, Path):
        return store
    return store.root if store.db_path == store.root / DB_NAME else store.db_path


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


# ----------------------------------------------------------------------------- dependencies


def current_store(request: Request) -> Iterator[Store]:
    """A store connection for this request alone (`Stores`)."""
    with request.app.state.stores.lease() as store:
        yield store


def caller_of(request: Request, store: Annotated[Store, Depends(current_store)]) -> Caller:
    header = request.headers.get("authorization", "")
    if not header.startswith("Bearer ") or not header[7:].strip():
        raise ApiError(401, "no token: send Authorization: Bearer <token> (the run's token from "
                       "python -m grader run create, or the operator's)")  # fmt: skip
    token = header[7:].strip()
    if store.is_operator(token):
        return Caller(operator=True, run=None)
    run = store.run_of_token(token)
    if run is None:
        raise ApiError(401, "this token is not known to this service")
    return Caller(operator=False, run=run)


def operator_only(caller: Annotated[Caller, Depends(caller_of)]) -> Caller:
    """The operator's token, else 403 (for the operator's routes and pages)."""
    caller.must_be_operator()
    return caller


def json_body(model: type[BodyT]) -> Callable[[Request], Awaitable[BodyT]]:
    """A dependency: the body as ``model``, whatever its Content-Type says (the agent's and the
    operator's stdlib clients send none); an empty body is ``{}``. Its size the gate bounded."""

    async def parse(request: Request) -> BodyT:
        data = await request.body()
        try:
            return model.model_validate_json(data.strip() or b"{}")
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False)) from None

    return parse


def _json_doc(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of a route that parses ``model`` with `json_body`."""
    return {"requestBody": {"content": {"application/json": {
        "schema": model.model_json_schema()}}}}  # fmt: skip


CallerDep = Annotated[Caller, Depends(caller_of)]
OperatorDep = Annotated[Caller, Depends(operator_only)]
StoreDep = Annotated[Store, Depends(current_store)]


def _run_of(store: Store, caller: Caller, run_id: str) -> Run:
    caller.may_see(run_id)  # first: a run token learns nothing of whether another run exists
    try:
        return store.run(run_id)
    except Unknown:
        raise ApiError(404, f"no run {run_id[:80]!r}") from None  # the store's lists every run


def _submission_of(store: Store, caller: Caller, submission_id: str) -> Submission:
    """The submission, or 404: the same 404 whether it does not exist or is another run's, and
    never the store's id range (the store's own message gives it)."""
    number = re.fullmatch(r"[0-9]{1,18}", submission_id) is not None
    missing = ApiError(404, f"no submission {submission_id if number else repr(submission_id[:40])}"
                       + ("" if caller.operator else " in this token's run"))  # fmt: skip
    if not number:
        raise missing
    try:
        submission = store.submission(int(submission_id))
    except Unknown:
        raise missing from None
    if not caller.operator and (caller.run is None or submission.run != caller.run.id):
        raise missing
    return submission


# ----------------------------------------------------------------------------- the app


def create_app(store: Store | Path, upload_limits: UploadLimits | None = None,
               ready: ReadyRule | None = None) -> FastAPI:  # fmt: skip
    """The API of the store at ``store`` (a `Store`, or its path): its routes, models, error
    handlers and framing gate. Made, migrated and its operator token written here."""
    path = _store_path(store)
    with Store(path) as opened:
        opened.operator_token()
        opened.collect_orphans()
        files = StoreFiles(opened.db_path, opened.blobs)
    if upload_limits is None:
        from grader.config import load_config

        upload_limits = UploadLimits.of(load_config().limits)
    app = FastAPI(title="grader service", version="1",
                  summary="Submissions of a GPU-kernel task, graded by the operator's workers",
                  responses={400: {"model": ErrorBody}, 401: {"model": ErrorBody},
                             403: {"model": ErrorBody}, 404: {"model": ErrorBody}})  # fmt: skip
    app.state.stores = Stores(path)
    app.state.store_files = files
    app.state.upload_limits = upload_limits
    app.state.ready = ready or ReadyRule()
    _errors(app)
    _routes(app)
    # The operators' pages (HTML, the operator's token or its session cookie): a connection of
    # their own, read under the dashboard's lock; closed with the app.
    from grader.service.dashboard import make_router

    board_store = Store(path)
    app.state.dashboard_store = board_store
    app.include_router(make_router(board_store))
    app.add_middleware(_Gate, upload_limit=upload_limits.max_upload_bytes)
    return app


def _errors(app: FastAPI) -> None:
    """Every error as ``{"error": ...}``, whatever raised it."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, str(exc))

    @app.exception_handler(UploadRejected)
    async def rejected(request: Request, exc: UploadRejected) -> JSONResponse:
        return _error(exc.http_status, str(exc))

    @app.exception_handler(LimitExceeded)
    async def limited(request: Request, exc: LimitExceeded) -> JSONResponse:
        return _error(exc.http_status, str(exc))

    @app.exception_handler(Unknown)
    async def unknown(request: Request, exc: Unknown) -> JSONResponse:
        # The routes turn a missing id into their own 404; one that reaches here still must not
        # give the store's text (it lists runs and the id range).
        return _error(404, "no such run, submission or grade")

    @app.exception_handler(StoreError)
    async def store_error(request: Request, exc: StoreError) -> JSONResponse:
        return _error(409, str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, _validation_text(exc))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 404:
            text = f"no route {request.method} {request.url.path[:200]}"
        elif exc.status_code == 405:
            text = f"{request.method} is not a method of {request.url.path[:200]}"
        else:
            text = str(exc.detail)
        return _error(exc.status_code, text, dict(exc.headers or {}))


def _validation_text(exc: RequestValidationError) -> str:
    """pydantic's errors, one clause each: where, what, and the value (cut short)."""
    clauses = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        clause = f"{where}: {err.get('msg', 'invalid')}"
        if err.get("type") not in ("missing", "json_invalid") and "input" in err:
            clause += f" (got {repr(err['input'])[:60]})"
        clauses.append(clause)
    return "bad request: " + "; ".join(clauses)


def _routes(app: FastAPI) -> None:
    @app.get("/healthz", response_model=Health, tags=["operations"])
    def healthz() -> dict[str, Any]:
        return {"ok": True}

    @app.get("/readyz", response_model=Ready, tags=["operations"],
             responses={503: {"model": Ready}})  # fmt: skip
    def readyz(request: Request) -> Any:
        # No store connection: opening one waits out a writer for 60 s; this says so in 2.
        rule: ReadyRule = request.app.state.ready
        files: StoreFiles = request.app.state.store_files
        reason = _unwritable(files)
        workers = presence.seen(files, rule.worker_s)
        if not reason and not workers:
            reason = f"no worker has looked at the queue in the last {rule.worker_s:g} s"
        seen = [{"worker": w.worker, "device": w.device, "seen_s_ago": round(w.age_s, 1)}
                for w in workers]  # fmt: skip
        body = {"ready": not reason, "reason": reason, "workers": seen}
        return JSONResponse(body, status_code=503 if reason else 200)

    @app.get("/v1/whoami", response_model=WhoAmI)
    def whoami(caller: CallerDep) -> dict[str, Any]:
        return {"run": caller.run.id if caller.run else None, "operator": caller.operator}

    @app.post("/v1/runs", response_model=CreatedRun, status_code=201,
              openapi_extra=_json_doc(CreateRun))  # fmt: skip
    def create_run(caller: OperatorDep, store: StoreDep,
                   body: Annotated[CreateRun, Depends(json_body(CreateRun))]) -> Any:  # fmt: skip
        limits = Limits(max_per_hour=body.max_per_hour, max_upload_bytes=body.max_upload_bytes,
                        max_queued=body.max_queued)  # fmt: skip
        run, token = store.create_run(body.name, limits)
        return {"run": run.id, "token": token}

    @app.post("/v1/runs/{run_id}/submissions", response_model=Uploaded, status_code=201,
              responses={200: {"model": Uploaded, "description": "the run had this tree"},
                         413: {"model": ErrorBody}, 429: {"model": ErrorBody}},
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/x-tar": {"schema": {"type": "string", "format": "binary"}}}}})
    async def upload(
        run_id: str, request: Request, caller: CallerDep, force: Annotated[bool, Query()] = False,
        x_grader_commit: Annotated[str, Header(max_length=200)] = "",
        x_grader_note: Annotated[str, Header(max_length=2000)] = "",
    ) -> Any:
        # async: the body is read here as it arrives; the store is used in the thread pool.
        stores: Stores = request.app.state.stores

        def find_run() -> Run:
            with stores.lease() as store:
                return _run_of(store, caller, run_id)

        run = await run_in_threadpool(find_run)
        if force:
            caller.must_be_operator()
        limits: UploadLimits = request.app.state.upload_limits
        data = await _read_body(request, min(run.limits.max_upload_bytes, limits.max_upload_bytes))
        origin = request.client.host if request.client else ""

        def store_it() -> tuple[int, dict[str, Any]]:
            with stores.lease() as store:
                return _store_upload(store, run, data, limits, x_grader_commit, x_grader_note,
                                     origin, force)  # fmt: skip

        status, body = await run_in_threadpool(store_it)
        return JSONResponse(Uploaded.model_validate(body).model_dump(mode="json"),
                            status_code=status)  # fmt: skip

    @app.get("/v1/runs/{run_id}", response_model=RunStatus)
    def run_status(run_id: str, caller: CallerDep, store: StoreDep) -> Any:
        _run_of(store, caller, run_id)
        return runs.run_status(store, run_id)

    @app.get("/v1/runs/{run_id}/submissions", response_model=RunSubmissions)
    def run_submissions(run_id: str, caller: CallerDep, store: StoreDep) -> Any:
        _run_of(store, caller, run_id)
        return {"run": run_id, "submissions": [runs.submission_view(store, s)
                                               for s in store.submissions(run_id)]}  # fmt: skip

    @app.get("/v1/runs/{run_id}/best", response_model=Best)
    def run_best(run_id: str, caller: CallerDep, store: StoreDep) -> Any:
        _run_of(store, caller, run_id)
        best = store.best(run_id)
        return {"best": runs.submission_view(store, best[0]) if best else None}

    @app.get("/v1/runs/{run_id}/report", response_model=RunReport)
    def run_report(run_id: str, caller: CallerDep, store: StoreDep) -> Any:
        _run_of(store, caller, run_id)
        return runs.run_report(store, run_id)

    @app.post("/v1/runs/{run_id}/finalize", response_model=Finalized, status_code=202,
              openapi_extra=_json_doc(Finalize))  # fmt: skip
    def finalize(run_id: str, caller: OperatorDep, store: StoreDep,
                 body: Annotated[Finalize, Depends(json_body(Finalize))]) -> Any:  # fmt: skip
        _run_of(store, caller, run_id)
        final = store.request_final(run_id, allow_same_gpu=body.allow_same_gpu)
        return {"final": runs.final_view(store, final)}

    @app.get("/v1/submissions/{submission_id}", response_model=SubmissionView)
    def submission(submission_id: str, caller: CallerDep, store: StoreDep) -> Any:
        return runs.submission_view(store, _submission_of(store, caller, submission_id))

    @app.get("/v1/submissions/{submission_id}/report",
             responses={200: {"description": "the grade's report, as the grader wrote it "
                                             "(grader.report.GradeReport)"}})  # fmt: skip
    def submission_report(
        submission_id: str, caller: CallerDep, store: StoreDep,
        grade: Annotated[int | None, Query(ge=1, le=1 << 62)] = None,
    ) -> Any:  # fmt: skip
        sub = _submission_of(store, caller, submission_id)
        grades = store.grades(sub.id)
        if grade is not None:
            wanted = [g for g in grades if g.id == grade]
            if not wanted:
                raise ApiError(404, f"submission {sub.id} has no grade {grade}")
        else:
            wanted = [g for g in grades if g.purpose == "grade" and g.report_sha256]
        report = store.report(wanted[-1]) if wanted else None
        if report is None:
            raise ApiError(404, f"submission {sub.id} has no report yet")
        return Response(report, media_type="application/json")

    @app.post("/v1/submissions/{submission_id}/regrade", response_model=Regraded,
              status_code=202)  # fmt: skip
    def regrade(submission_id: str, caller: CallerDep, store: StoreDep) -> Any:
        sub = _submission_of(store, caller, submission_id)
        caller.must_be_operator()
        return {"grade": store.regrade(sub.id).to_dict()}


def _unwritable(store: StoreFiles) -> str:
    """Why the store cannot take a write now ('' when it can): a write transaction begun and
    rolled back on a connection of its own that waits 2 s at most (a probe must not hang for the
    store's 60 s), and a file made and removed in its blob folder."""
    try:
        db = sqlite3.connect(store.db_path, timeout=2.0, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("ROLLBACK")
        finally:
            db.close()
        store.blobs.mkdir(exist_ok=True, mode=0o700)
        probe = store.blobs / f".ready-{threading.get_ident()}"
        probe.write_bytes(b"")
        probe.unlink()
    except (OSError, sqlite3.Error) as exc:  # its text names paths: the kind is the answer
        return f"the store is not writable ({type(exc).__name__}: {_kind(exc)})"
    return ""


def _kind(exc: BaseException) -> str:
    """An OS or SQLite error without its paths: its errno's name, or SQLite's own words."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) if isinstance(exc, sqlite3.Error) else type(exc).__name__


async def _read_body(request: Request, limit: int) -> bytes:
    """The body as it arrives, refused (413) before it is read when its declared length is over
    ``limit``, and the moment more than ``limit`` bytes came."""
    declared = int(request.headers.get("content-length", "0"))  # the gate checked it
    if declared > limit:
        raise ApiError(413, f"the body is {declared:,} bytes; this run's limit is {limit:,}")
    data = bytearray()
    try:
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise ApiError(413, f"the body is over this run's limit of {limit:,} bytes")
    except ClientDisconnect:
        raise ApiError(400, f"the body ended after {len(data):,} of {declared:,} bytes") from None
    return bytes(data)


def _store_upload(store: Store, run: Run, data: bytes, limits: UploadLimits, commit_header: str,
                  note: str, origin: str, force: bool) -> tuple[int, dict[str, Any]]:  # fmt: skip
    tree = check_upload(data, limits)
    commit = (commit_header or tree.commit or "").strip().lower()
    if not _HEX_COMMIT.match(commit):
        raise ApiError(400, "no commit id: upload the tar that `git archive <commit>` makes or "
                       f"send X-Grader-Commit (got {commit[:80]!r})")  # fmt: skip
    if tree.commit and commit != tree.commit:
        raise ApiError(400, f"X-Grader-Commit {commit} differs from the archive's commit "
                       f"{tree.commit}")  # fmt: skip
    submission, new = store.add_submission(
        run.id, commit=commit, tree=tree.tree, archive=tree.archive, files=len(tree.files),
        note=note[:500], origin=origin, force=force,
    )  # fmt: skip
    return (201 if new else 200), {"submission": runs.submission_view(store, submission),
                                   "new": new}


# ----------------------------------------------------------------------------- the gate


class _Gate:
    """The outermost layer: the framing rules, the body caps before a byte of the body is read,
    ``Connection: close`` on any reply sent before its request's body was read, and the access
    log. Plain ASGI, so that it sees every request, the ones no route matches included."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]],
                 upload_limit: int) -> None:  # fmt: skip
        self.app = app
        self.upload_limit = upload_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        method, path = scope["method"], scope["path"]
        has_body = any(k in (b"content-length", b"transfer-encoding") for k, _ in scope["headers"])
        state: dict[str, Any] = {"status": 0, "body_done": not has_body}

        async def receive_tracked() -> Message:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                state["body_done"] = True
            return message

        async def send_tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
                if not state["body_done"]:  # the unread body must not be taken for a request
                    message["headers"] = [*message.get("headers", []), (b"connection", b"close")]
            await send(message)

        try:
            refusal = self._refusal(method, path, scope["headers"])
            if refusal is not None:  # what follows on this connection is not trusted either
                state["body_done"] = False
                await _error(*refusal)(scope, receive, send_tracked)
            else:
                await self.app(scope, receive_tracked, send_tracked)
        except ClientDisconnect:  # the client went (or was cut off) mid-body: no one to answer
            state["status"] = state["status"] or "-"
        except Exception as exc:  # noqa: BLE001 - a reply, not a dropped connection
            # Its text may name a path of the store's: the operator's log gets it, the reply
            # says only its kind.
            log.error("internal error on %s %s", method, path[:200], exc_info=exc)
            if not state["status"]:
                await _error(500, f"internal error ({type(exc).__name__}); the service's log "
                             "has its details")(scope, receive, send_tracked)  # fmt: skip
        finally:
            client = (scope.get("client") or ("-",))[0]
            access_log.info("%s %s %s %s %.1fms", client, method, path[:200], state["status"],
                            (time.monotonic() - start) * 1000)  # fmt: skip

    def _refusal(self, method: str, path: str,
                 headers: list[tuple[bytes, bytes]]) -> tuple[int, str] | None:  # fmt: skip
        if any(k == b"transfer-encoding" for k, _ in headers):
            return 400, "Transfer-Encoding is not accepted: send a Content-Length"
        lengths = [v for k, v in headers if k == b"content-length"]
        if len(lengths) > 1:
            return 400, f"{len(lengths)} Content-Length headers: send one"
        if lengths and not re.fullmatch(rb"[0-9]{1,18}", lengths[0].strip()):
            return 400, f"Content-Length {lengths[0][:40]!r} is not a length"
        if method not in ("GET", "POST"):
            if method in _HTTP_METHODS:
                return 405, f"{method} is not a method of this API (GET and POST)"
            return 501, f"{method[:20]!r} is not an HTTP method this API knows"
        if method != "POST":
            if lengths:
                return 400, f"a {method} request carries no body and no Content-Length"
            return None
        if not lengths:
            return 411, "a Content-Length header is required"
        size = int(lengths[0])
        limit = self.upload_limit if UPLOAD_ROUTE.match(path) else JSON_LIMIT
        if size > limit:
            return 413, f"the body is {size:,} bytes; the limit is {limit:,}"
        return None


__all__ = ["ApiError", "Caller", "ReadyRule", "StoreFiles", "Stores", "caller_of", "create_app",
           "current_store", "json_body", "operator_only"]  # fmt: skip
