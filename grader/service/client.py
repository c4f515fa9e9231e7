"""Where the agent's ``python -m grader submit`` sends: the operator's service, or the local store.

With both ``GRADER_URL`` and ``GRADER_TOKEN`` set (by the operator), submissions go over HTTP to the
service (`grader.service.api`) and its workers grade them on the operator's GPUs; `client_from_env`
gives the `Client`. With neither, ``submit`` keeps its own store at ``GRADER_STORE``
(`default_store_path`) and grades in place. One of the two alone is a usage error.

`Client` is the standard library's ``urllib.request``, on purpose: the agent's environment has no
package index, and the kit adds no dependency. Every failure is a `ClientError` whose message is
what the agent reads: the server's own ``error`` text with the HTTP status, or why the service
could not be reached, naming the URL.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

URL_ENV = "GRADER_URL"
TOKEN_ENV = "GRADER_TOKEN"
RUN_ENV = "GRADER_RUN"  # optional: the run id (the service also says it from the token)
STORE_ENV = "GRADER_STORE"

# The route that names the caller's run (`grader.service.api`); GRADER_RUN, where set, wins.
WHOAMI = "/v1/whoami"

# Polling a grade: the first look soon (a cached or quick grade), then less often.
_POLL_FIRST_S = 2.0
_POLL_MAX_S = 15.0


class ClientError(RuntimeError):
    """A request failed; ``str()`` says why, for the agent.

    Attributes:
        status: The HTTP status (None when no reply came: refused, unreachable, timed out).
        url: The URL that was asked.
        server_error: The server's ``error`` text ('' when there was no reply).
    """

    def __init__(self, message: str, *, url: str, status: int | None = None,
                 server_error: str = "") -> None:  # fmt: skip
        super().__init__(message)
        self.url = url
        self.status = status
        self.server_error = server_error

    @property
    def token_refused(self) -> bool:
        """401: the service does not know the token (403 is a known token asking for another
        run's data)."""
        return self.status == 401


def default_store_path() -> Path:
    """``$GRADER_STORE``, else ``$XDG_DATA_HOME/dilated-block-task/store`` (a directory).

    An older local store, the single SQLite file ``…/dilated-block-task/submissions.sqlite``, is
    used where it exists (`grader.service.store.Store` migrates it in place). Outside any
    workspace on purpose: a store inside one would make its tree dirty.
    """
    if os.environ.get(STORE_ENV):
        return Path(os.environ[STORE_ENV]).expanduser()
    data = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    old = data / "dilated-block-task" / "submissions.sqlite"
    return old if old.is_file() else data / "dilated-block-task" / "store"


def client_from_env(environ: Mapping[str, str] = os.environ) -> Client | None:
    """The service's client when ``GRADER_URL`` and ``GRADER_TOKEN`` are set; None when neither.

    Raises:
        ValueError: Only one of them is set, or the URL is not ``http(s)://HOST[:PORT]``.
    """
    url, token = environ.get(URL_ENV, "").strip(), environ.get(TOKEN_ENV, "").strip()
    if not url and not token:
        return None
    if not url or not token:
        have, lack = (URL_ENV, TOKEN_ENV) if url else (TOKEN_ENV, URL_ENV)
        raise ValueError(f"{have} is set but {lack} is not: the operator's service needs both "
                         f"({URL_ENV}=http://HOST:PORT {TOKEN_ENV}=<your run's token>); unset "
                         f"{have} to submit to the local store instead")  # fmt: skip
    return Client(url, token, run=environ.get(RUN_ENV, "").strip() or None)


class Client:
    """The service's HTTP API as one run's agent sees it.

    Args:
        url: ``http(s)://HOST[:PORT]``, the service's root.
        token: The run's bearer token.
        run: The run id; asked of the service (`WHOAMI`) when None.
        timeout_s: Seconds one request may take.

    Raises:
        ValueError: ``url`` is not an http(s) URL with a host.
    """

    def __init__(self, url: str, token: str, *, run: str | None = None,
                 timeout_s: float = 60.0) -> None:  # fmt: skip
        parts = urllib.parse.urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{URL_ENV} must be http://HOST:PORT (or https://), got {url!r}")
        self.url = url.strip().rstrip("/")
        self._token = token
        self._run = run
        self.timeout_s = timeout_s

    # ------------------------------------------------------------------ the routes

    @property
    def run(self) -> str:
        """This token's run id (asked once)."""
        if self._run is None:
            try:
                self._run = str(self._json("GET", WHOAMI)["run"])
            except ClientError as exc:
                if exc.status != 404:
                    raise
                raise ClientError(
                    f"the grading service at {self.url} cannot say which run {TOKEN_ENV} belongs "
                    f"to (it has no {WHOAMI}); set {RUN_ENV} to the run id the operator gave "
                    "you with the token", url=exc.url, status=404, server_error=exc.server_error,
                ) from None  # fmt: skip
        return self._run

    def upload(self, archive: bytes, commit: str, note: str = "") -> tuple[dict[str, Any], bool]:
        """Send a committed tree (a ``tar`` or ``tar.gz`` of it) as a submission of this run.

        Returns:
            The submission's view (`grader.service.runs.submission_view`) and whether it is new:
            False when the run already has a submission of the same tree (that one is returned).
        """
        headers = {"Content-Type": "application/x-tar", "X-Grader-Commit": commit}
        if note:
            headers["X-Grader-Note"] = _header_text(note)
        body = self._json("POST", f"/v1/runs/{_quote(self.run)}/submissions", archive, headers)
        return body["submission"], bool(body["new"])

    def submission(self, submission_id: int) -> dict[str, Any]:
        """One submission with its grades (``state``: queued, running or graded)."""
        return self._json("GET", f"/v1/submissions/{int(submission_id)}")

    def report(self, submission_id: int) -> str:
        """The report JSON of a graded submission, as the service stored it."""
        return self._request("GET", f"/v1/submissions/{int(submission_id)}/report").decode()

    def submissions(self) -> list[dict[str, Any]]:
        """Every submission of this run, oldest first."""
        return self._json("GET", f"/v1/runs/{_quote(self.run)}/submissions")["submissions"]

    def best(self) -> dict[str, Any] | None:
        """This run's best submission so far (the highest score), or None."""
        return self._json("GET", f"/v1/runs/{_quote(self.run)}/best")["best"]

    def wait(self, submission_id: int, timeout_s: float,
             on_change: Callable[[dict[str, Any]], None] = lambda view: None,
             sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:  # fmt: skip
        """Poll a submission until it is graded or ``timeout_s`` passes; return its last view.

        ``on_change`` sees the view whenever its state changes. A reply that did not come (the
        service restarting, a network blip) is retried until the timeout; an HTTP error is not.
        """
        deadline = time.monotonic() + timeout_s
        interval, state, unreachable = _POLL_FIRST_S, None, None
        while True:
            try:
                view = self.submission(submission_id)
            except ClientError as exc:
                if exc.status is not None and exc.status < 500:
                    raise
                unreachable = exc
            else:
                unreachable = None
                if view["state"] != state:
                    state = view["state"]
                    on_change(view)
                if state == "graded":
                    return view
            left = deadline - time.monotonic()
            if left <= 0:
                if unreachable is not None:
                    raise unreachable
                return view
            sleep(min(interval, left))
            interval = min(interval * 1.5, _POLL_MAX_S)

    # ------------------------------------------------------------------ plumbing

    def _json(self, method: str, path: str, data: bytes | None = None,
              headers: Mapping[str, str] | None = None) -> Any:  # fmt: skip
        raw = self._request(method, path, data, headers)
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ClientError(f"the grading service at {self.url} answered {method} {path} with "
                              f"something that is not JSON: {raw[:200]!r}",
                              url=self.url + path) from exc  # fmt: skip

    def _request(self, method: str, path: str, data: bytes | None = None,
                 headers: Mapping[str, str] | None = None) -> bytes:  # fmt: skip
        url = self.url + path
        request = urllib.request.Request(url, data=data, method=method,
                                         headers={**(headers or {}), "Accept": "application/json",
                                                  "Authorization": f"Bearer {self._token}"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            text = _error_text(exc.read())
            raise ClientError(f"{text} (HTTP {exc.code} from {url})", url=url, status=exc.code,
                              server_error=text) from None  # fmt: skip
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, TimeoutError):
                raise ClientError(self._no_answer(url), url=url) from None
            raise ClientError(f"cannot reach the grading service at {self.url} ({reason}); is "
                              f"{URL_ENV} right, and is the service running?", url=url) from None
        except TimeoutError:
            raise ClientError(self._no_answer(url), url=url) from None
        except (OSError, http.client.HTTPException) as exc:  # a reset connection, a cut reply
            raise ClientError(f"the connection to the grading service at {self.url} failed "
                              f"during {method} {path}: {exc}", url=url) from None

    def _no_answer(self, url: str) -> str:
        return (f"the grading service at {self.url} did not answer within {self.timeout_s:g} s "
                f"({url})")


def _error_text(body: bytes) -> str:
    """The server's ``{"error": ...}``, else the start of whatever it sent."""
    try:
        value = json.loads(body)
    except ValueError:
        value = None
    if isinstance(value, dict) and isinstance(value.get("error"), str):
        return value["error"]
    text = body[:300].decode(errors="replace").strip()
    return text or "no error text"


def _header_text(text: str) -> str:
    """``text`` as an HTTP header value: one line of Latin-1 (others become ``?``), 500 at most
    (what the service keeps)."""
    line = " ".join(text.split())
    return line.encode("latin-1", errors="replace").decode("latin-1")[:500]


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


__all__ = ["RUN_ENV", "STORE_ENV", "TOKEN_ENV", "URL_ENV", "Client", "ClientError",
           "client_from_env", "default_store_path"]  # fmt: skip
