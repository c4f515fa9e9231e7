"""The operators' dashboard: the store as server-rendered HTML pages, behind the operator token.

    GET  /dashboard/login                              the login form (no token needed)
    POST /dashboard/login                              ``token=…&next=…`` → a session cookie,
                                                       303 to the page asked for (or /)
    POST /dashboard/logout                             the cookie cleared, 303 to the form
    GET  /dashboard/                                   every run: counts by state, best, final
    GET  /dashboard/runs/RUN                           its submissions, the best and final marked
    GET  /dashboard/submissions/ID/report[?grade=G]    a grade's report (the latest by default)
    GET  /dashboard/submissions/ID/plot.png?grade=G    its per-shape speedup plot (timed grades)

`make_router` gives them as a FastAPI router over one store; the service's app includes it.

Who: the operator only. ``Authorization: Bearer <operator token>`` (a script), or the cookie the
login form sets (a browser): HttpOnly, SameSite=Strict, Secure over HTTPS, and not the token but
an HMAC of it, so the cookie opens these read-only pages and not the API, and a new operator
token ends every session. Nothing, or a token the store does not know: 401 with the login form.
A run's token: 403 (an agent never sees another run, nor its own from here).

A submission writes much of what is shown (reasons, case names, its log tail) and an agent the
rest (notes): everything goes through Jinja2's autoescape, control and bidirectional characters
escaped first (`grader.service.text.printable`), and the Content-Security-Policy allows no
script and only this module's own style, so a missed escape would still run nothing.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import hmac
import json
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import DictLoader, Environment, StrictUndefined
from markupsafe import Markup

from grader.config import ConfigError, Score, load_config
from grader.plot import plot_speedups
from grader.report import ShapeTiming, TimingReport
from grader.service.runs import run_report, run_status
from grader.service.store import Grade, GradeState, Store, StoreError, Unknown
from grader.service.text import printable

COOKIE = "grader_dashboard"
_SESSION_CONTEXT = b"grader dashboard session v1"
_MAX_FORM_BYTES = 4096  # a token is 43 characters; a login form is never more
_PLOT_CACHE = 32  # rendered plots kept, by report hash (a report never changes)
CPU_DEVICE = "cpu"  # the device name a CPU worker grades under (`grader.service.worker`)
NOT_TIMED = ("Not timed: this grade ran on the CPU (the Triton interpreter), where nothing is "
             "timed, so it has no score and no per-shape speedups.")  # fmt: skip
ENDED_UNTIMED = "Not timed: the grade ended ({status}) before its timing phase."


def session_value(operator_token: str) -> str:
    """The cookie's value for ``operator_token``: an HMAC of it, never the token itself."""
    return hmac.new(operator_token.encode(), _SESSION_CONTEXT, hashlib.sha256).hexdigest()


# ----------------------------------------------------------------------------- the pages' text

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1d232a; background: #f6f7f9; }
header { background: #1d232a; color: #fff; padding: 8px 20px; display: flex;
         justify-content: space-between; align-items: center; }
header a { color: #fff; text-decoration: none; font-weight: 600; }
header form { margin: 0; }
main { padding: 12px 20px 40px; max-width: 1200px; }
table { border-collapse: collapse; background: #fff; margin: 8px 0 16px; }
th, td { border: 1px solid #d5d9de; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #eceff2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.time, td.num { white-space: nowrap; }
tr.best td { background: #e7f6e9; }
tr.final td { box-shadow: inset 0 -2px 0 #2f6fb3; }
.tag { display: inline-block; padding: 0 6px; border-radius: 3px; font-size: 12px;
       color: #fff; margin-left: 4px; }
.tag.best { background: #2e8540; } .tag.final { background: #2f6fb3; }
.status { font-weight: 600; }
.status-scored { color: #2e8540; } .status-checked_untimed { color: #2f6fb3; }
.status-failed { color: #b3261e; }
.error { color: #b3261e; font-weight: 600; }
.note { color: #59636e; }
pre { background: #fff; border: 1px solid #d5d9de; padding: 8px; white-space: pre-wrap;
      word-break: break-word; max-height: 400px; overflow: auto; }
img.plot { max-width: 100%; background: #fff; border: 1px solid #d5d9de; }
code { background: #eceff2; padding: 0 3px; }
"""
# The one style the policy allows: by its hash, so no injected <style> or style= applies either.
_CSS_HASH = base64.b64encode(hashlib.sha256(_CSS.encode()).digest()).decode()
HEADERS = {
    "Content-Security-Policy": (
        f"default-src 'none'; style-src 'sha256-{_CSS_HASH}'; "
        "img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
        "base-uri 'none'"
    ),  # fmt: skip
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

_TEMPLATES = {
    "base": """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }} · grader dashboard</title><style>{{ css }}</style></head>
<body><header><a href="{{ base }}/">grader dashboard</a>
{% if signed_in %}<form method="post" action="{{ base }}/logout">
<button type="submit" id="logout">log out</button></form>{% endif %}</header>
<main>{% block main %}{% endblock %}</main></body></html>
""",
    "login": """{% extends "base" %}{% block main %}
<h1>Operator login</h1>
{% if error %}<p class="error" id="error">{{ error }}</p>{% endif %}
<form method="post" action="{{ base }}/login">
<label for="token">Operator token</label>
<input type="password" id="token" name="token" autocomplete="current-password" required>
<input type="hidden" name="next" value="{{ next }}">
<button type="submit" id="login">Log in</button></form>
<p class="note">The token is in <code>operator.token</code> in the store's folder (the service
makes it on its first start). A script may send <code>Authorization: Bearer &lt;token&gt;</code>
instead. A run's token does not open the dashboard.</p>
{% endblock %}""",
    "error": """{% extends "base" %}{% block main %}
<h1>{{ title }}</h1><p class="error" id="error">{{ message }}</p>
<p><a href="{{ base }}/">every run</a></p>{% endblock %}""",
    "runs": """{% extends "base" %}{% block main %}
<h1>Runs</h1>
{% if not runs %}<p id="no-runs">No run yet (<code>python -m grader run create NAME</code>).</p>
{% else %}<table id="runs"><tr><th>name</th><th>run</th><th>created</th><th>submissions</th>
<th>by state</th><th>best</th><th>final regrade</th></tr>
{% for r in runs %}<tr id="run-{{ r.run }}">
<td><a href="{{ base }}/runs/{{ r.run | urlencode }}">{{ r.name }}</a></td><td>{{ r.run }}</td>
<td>{{ r.created_at }}</td><td class="num">{{ r.submissions }}</td>
<td>{% for state, n in r.by_state.items() %}{{ state }} {{ n }}{% if not loop.last %}, {% endif %}
{% else %}-{% endfor %}</td>
<td>{% if r.best is none %}-{% else %}#{{ r.best }} {{ r.best_score | score }}{% endif %}</td>
<td>{% if r.final %}{{ r.final.state }}{% if r.final.status %}:
<span class="status {{ r.final.status | status_class }}">{{ r.final.status }}</span>
{{ r.final.score | score }}{% endif %}{% else %}not requested{% endif %}</td></tr>
{% endfor %}</table>{% endif %}{% endblock %}""",
    "run": """{% extends "base" %}{% block main %}
<h1>Run {{ report.name }} <span class="note">{{ report.run }}</span></h1>
<p id="best">{% if report.best is none %}Best: none yet (no grade has scored; CPU grades are
untimed and never score).{% else %}Best: submission #{{ report.best }}, score
{{ best_score | score }}{{ best_ci | ci }}.{% endif %}</p>
<p id="final">{% if final is none %}Final regrade: not requested
(<code>python -m grader run finalize {{ report.run }}</code>).{% else %}Final regrade of
submission #{{ final.submission }}: {{ final.final.state }}{% if final.final.status %},
<span class="status {{ final.final.status | status_class }}">{{ final.final.status }}</span>
{{ final.final.score | score }}{{ final.final.score_ci | ci }} on {{ final.final.gpu_name or '?' }}
{{ final.final.gpu_uuid or '' }}{% endif %}.{% if final.get('gap_note') %}
<span{% if final.gap_flagged %} class="error"{% endif %}>{{ final.gap_note }}</span>{% endif %}
{% endif %}</p>
<table id="submissions"><tr><th>id</th><th>commit</th><th>note</th><th>state</th>
<th>status</th><th>score [95% interval]</th><th>submitted</th><th>graded</th>
<th>grades</th></tr>
{% for s in report.submissions %}
<tr id="submission-{{ s.id }}" class="{{ s.marks | join(' ') }}">
<td class="num">{{ s.id }}{% for m in s.marks %}<span class="tag {{ m }}">{{ m }}</span>
{% endfor %}</td><td><code>{{ s.commit[:12] }}</code></td><td>{{ s.note }}</td>
<td>{{ s.state }}</td>
<td class="status {{ s.status | status_class }}">{{ s.status or '-' }}</td>
<td class="num">{{ s.score | score }}{{ s.score_ci | ci }}</td>
<td class="time">{{ s.submitted_at }}</td><td class="time">{{ s.graded_at or '-' }}</td>
<td>{% for g in s.grades %}<a href="{{ base }}/submissions/{{ s.id }}/report?grade={{ g.id }}"
>{{ g.purpose }} {{ g.id }}</a>{% if g.status %} ({{ g.status }}){% endif %}
{% if not loop.last %}<br>{% endif %}{% endfor %}</td></tr>
{% endfor %}</table>{% endblock %}""",
    "report": """{% extends "base" %}{% block main %}
<h1>Submission #{{ sub.id }}, {{ grade.purpose }} {{ grade.id }}</h1>
<p><a href="{{ base }}/runs/{{ sub.run | urlencode }}">run {{ sub.run }}</a> ·
commit <code>{{ sub.commit }}</code> · tree <code>{{ sub.tree }}</code>
{% if sub.note %}· note: {{ sub.note }}{% endif %}</p>
{% if others %}<p>Other grades of this submission: {% for g in others %}
<a href="{{ base }}/submissions/{{ sub.id }}/report?grade={{ g.id }}">{{ g.purpose }} {{ g.id }}</a>
{% endfor %}</p>{% endif %}
<table id="grade"><tr><th>status</th><td id="status" class="status {{ grade.status |
status_class }}">{{ grade.status or grade.state.value }}</td></tr>
<tr><th>score [95% interval]</th><td id="score">{{ grade.score | score }}{{ grade.score_ci | ci }}
</td></tr>
<tr><th>state</th><td>{{ grade.state.value }} (attempt {{ grade.attempts }} of
{{ grade.max_attempts }})</td></tr>
<tr><th>where</th><td>{{ grade.worker or '-' }} · {{ grade.gpu_name or '-' }}
{{ grade.gpu_uuid or '' }}{% if grade.profile %} · profile {{ grade.profile }}{% endif %}</td></tr>
<tr><th>times</th><td>queued {{ grade.queued_at }} · started {{ grade.started_at or '-' }} ·
finished {{ grade.finished_at or '-' }}{% if report and report.get('wall_s') %} ·
{{ '%.1f' | format(report.wall_s) }} s{% endif %}</td></tr></table>
{% if report is none %}<p id="pending">Not graded yet: this grade is {{ grade.state.value }}.</p>
{% else %}
<h2>Reasons</h2>{% if reasons %}<ul id="reasons">{% for r in reasons %}<li>{{ r }}</li>
{% endfor %}</ul>{% else %}<p id="reasons">None: nothing failed.</p>{% endif %}
<h2>Per shape</h2>
{% if shapes %}<table id="shapes"><tr><th>shape</th><th>status</th><th>t plain ms</th>
<th>t ref ms</th><th>t sub ms</th><th>r [95%]</th><th>g [95%]</th><th>target r</th>
<th>score [95%]</th>
<th>weight</th><th>reason</th></tr>
{% for s in shapes %}<tr><td>{{ s.label }}</td><td>{{ s.status }}</td>
<td class="num">{{ s.t_plain_ms | num }}</td><td class="num">{{ s.t_ref_ms | num }}</td>
<td class="num">{{ s.t_sub_ms | num }}</td><td class="num">{{ s.r | num }}{{ s.r_ci | ci }}</td>
<td class="num">{{ s.g | num }}{{ s.g_ci | ci }}</td><td class="num">{{ s.target | num }}</td>
<td class="num">{{ s.score | score }}{{ s.score_ci | ci }}</td>
<td class="num">{{ s.weight | num }}</td><td>{{ s.reason }}</td></tr>
{% endfor %}</table>
{% if plot %}<p><img class="plot" id="plot" alt="per-shape speedup plot"
src="{{ base }}/submissions/{{ sub.id }}/plot.png?grade={{ grade.id }}"></p>
{% else %}<p class="note" id="no-plot">{{ no_plot }}</p>{% endif %}
{% else %}<p id="not-timed">{{ not_timed }}</p>{% endif %}
{% if timing_reason %}<p>Timing: {{ timing_reason }}</p>{% endif %}
{% if not_checked %}<h2>Not checked</h2><ul id="not-checked">{% for n in not_checked %}
<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
{% if cases %}<h2>Correctness cases</h2><table id="cases"><tr><th>case</th><th>kind</th>
<th>dtype</th><th>result</th></tr>{% for c in cases %}<tr><td>{{ c.name }}</td>
<td>{{ c.kind }}</td><td>{{ c.dtype }}</td><td>{% if c.passed %}ok{% else %}FAIL:
{{ c.reason }}{% endif %}</td></tr>{% endfor %}</table>{% endif %}
{% if report.get('child_stderr_tail') %}<h2>The child's stderr (its last lines)</h2>
<pre id="stderr">{{ report.child_stderr_tail }}</pre>{% endif %}
{% if grade.history %}<h2>Attempts</h2><ul>{% for h in grade.history %}<li>{{ h }}</li>
{% endfor %}</ul>{% endif %}
{% endif %}{% endblock %}""",
}


# What a report's shape and case rows hold when a field is absent (an older or an error report).
_SHAPE = {f.name: f.default for f in dataclasses.fields(ShapeTiming)}
_CASE = {"name": "", "kind": "", "dtype": "", "passed": False, "reason": ""}


def _shown(value: Any) -> Any:
    """Every ``{{ }}`` of a page, before Jinja2 escapes it: control and bidirectional-override
    characters escaped (they could reorder or hide what the operator reads)."""
    if value is None or isinstance(value, Markup | int | float):
        return value
    return printable(value)


# The number filters take whatever a stored report holds: a report is checked before it is
# stored (`grader.service.verdict`), but a page must not fail on one that is odd.
def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _score(value: Any) -> str:
    return f"{value:.4f}" if _is_number(value) else "-" if value is None else str(value)


def _num(value: Any) -> str:
    return f"{value:.4g}" if _is_number(value) else "-" if value is None else str(value)


def _ci(ci: Any) -> str:
    if not (isinstance(ci, list | tuple) and len(ci) == 2 and all(map(_is_number, ci))):
        return ""
    return f" [{ci[0]:.4f}, {ci[1]:.4f}]"


def _status_class(status: str | None) -> str:
    if status in ("scored", "checked_untimed"):
        return f"status-{status}"
    return "" if status is None else "status-failed"


def _environment() -> Environment:
    env = Environment(loader=DictLoader(_TEMPLATES), autoescape=True, finalize=_shown,
                      undefined=StrictUndefined)  # fmt: skip
    env.filters.update(score=_score, num=_num, ci=_ci, status_class=_status_class)
    return env


# ----------------------------------------------------------------------------- the plot


class _Plots:
    """The per-shape speedup plot of a timed report, as PNG bytes, drawn once per report."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # pyplot's state is global
        self._done: OrderedDict[str, bytes | None] = OrderedDict()

    def png(self, digest: str, timing: dict[str, Any]) -> bytes | None:
        """None when matplotlib is not installed.

        Raises:
            Exception: Whatever the report's timing makes `plot_speedups` raise (the caller
                answers without the plot).
        """
        with self._lock:
            if digest in self._done:
                self._done.move_to_end(digest)
                return self._done[digest]
            with tempfile.TemporaryDirectory(prefix="grader-plot-") as folder:
                path = Path(folder) / "plot.png"
                written = plot_speedups(TimingReport.from_dict(timing), path, _targets())
                data = path.read_bytes() if written else None
            self._done[digest] = data
            while len(self._done) > _PLOT_CACHE:
                self._done.popitem(last=False)
            return data


@functools.cache
def _targets() -> Score | None:
    """The score settings for the target ticks of a report that holds none (one written before
    shapes carried the target they were scored against, `ShapeTiming.target`): the service's
    scoring.yaml (none drawn if it does not load; the plot is still worth showing)."""
    try:
        return load_config().score
    except ConfigError:
        return None


# ----------------------------------------------------------------------------- the router


class _Denied(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Dashboard:
    """The pages over one store. The store's connection is one, and FastAPI runs these handlers
    on a pool of threads: every read of the store holds ``_lock``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._env = _environment()
        self._plots = _Plots()

    # ------------------------------------------------------------------ who is asking

    def _operator_token(self) -> str:
        with self._lock:
            return self.store.operator_token()

    def check_token(self, token: str) -> None:
        """Pass for the operator's token; raise `_Denied` 403 for a run's, 401 for any other."""
        if hmac.compare_digest(token.encode(), self._operator_token().encode()):
            return
        with self._lock:
            run = self.store.run_of_token(token)
        if run is not None:
            raise _Denied(403, "a run's token does not open the dashboard: it is the operator's")
        raise _Denied(401, "this token is not the operator's")

    def check(self, request: Request) -> None:
        """The operator's bearer token or session cookie, else `_Denied`."""
        header = request.headers.get("authorization")
        if header is not None:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise _Denied(401, "send Authorization: Bearer <the operator's token>")
            self.check_token(token.strip())
            return
        cookie = request.cookies.get(COOKIE)
        if not cookie:
            raise _Denied(401, "log in with the operator's token")
        if not hmac.compare_digest(cookie.encode(), session_value(self._operator_token()).encode()):
            raise _Denied(401, "this session is no longer valid (the operator's token changed?): "
                               "log in again")  # fmt: skip

    # ------------------------------------------------------------------ responses

    def page(self, request: Request, template: str, status: int = 200, *,
             signed_in: bool = True, **values: Any) -> HTMLResponse:  # fmt: skip
        base = request.scope.get("root_path", "") + "/dashboard"
        html = self._env.get_template(template).render(
            base=base, css=Markup(_CSS), signed_in=signed_in, **values
        )
        headers = dict(HEADERS)
        if status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="grader dashboard"'
        return HTMLResponse(html, status, headers=headers)

    def denied(
        self, request: Request, denied: _Denied, next_page: str | None = None
    ) -> HTMLResponse:
        """401: the login form with why; 403: why, with the form (to log in as the operator).
        The form comes back to ``next_page``, by default the page that was asked for."""
        if next_page is None:
            query = request.url.query
            next_page = request.url.path + (f"?{query}" if query else "")
        return self.page(request, "login", denied.status, signed_in=False,
                         title="Operator login", error=denied.message,
                         next=next_page)  # fmt: skip

    def guarded(self, request: Request, template: str, view: Any, *args: Any) -> Response:
        """``view(*args)`` (the page's values, read under the store's lock) rendered, for the
        operator only; an unknown id is a 404 page, a bad one a 400."""
        try:
            self.check(request)
            with self._lock:
                values = view(*args)
        except _Denied as denied:
            return self.denied(request, denied)
        except Unknown as exc:
            return self.page(request, "error", 404, title="Not found", message=str(exc))
        except (ValueError, StoreError) as exc:
            status = 500 if isinstance(exc, StoreError) else 400
            return self.page(request, "error", status, title="Cannot show this", message=str(exc))
        return self.page(request, template, **values)

    # ------------------------------------------------------------------ the pages' values

    def runs_values(self) -> dict[str, Any]:
        runs = []
        for run in self.store.runs():
            status = run_status(self.store, run.id)
            runs.append({**status, "created_at": run.created_at})
        return {"title": "Runs", "runs": runs}

    def run_values(self, run_id: str) -> dict[str, Any]:
        report = run_report(self.store, run_id)
        final = report["final"]
        best = self.store.best(run_id)
        for s in report["submissions"]:
            is_final = final is not None and s["id"] == final["submission"]
            s["marks"] = [m for m, hit in (("best", s["id"] == report["best"]), ("final", is_final))
                          if hit]  # fmt: skip
            ordinary = [g for g in s["grades"] if g["purpose"] == "grade"]
            s["graded_at"] = ordinary[-1]["finished_at"] if ordinary else None
        return {"title": f"Run {report['name']}", "report": report, "final": final,
                "best_score": best[1].score if best else None,
                "best_ci": best[1].score_ci if best else None}  # fmt: skip

    def _grade_of(self, submission_id: int, grade_id: int | None) -> Grade:
        grades = self.store.grades(submission_id)
        if grade_id is not None:
            for g in grades:
                if g.id == grade_id:
                    return g
            raise Unknown(f"submission {submission_id} has no grade {grade_id} (its grades: "
                          f"{[g.id for g in grades] or 'none'})")  # fmt: skip
        done = [g for g in grades if g.state is GradeState.DONE]
        ordinary = [g for g in done if g.purpose == "grade"]
        if not grades:
            raise Unknown(f"submission {submission_id} has no grade")
        return (ordinary or done or grades)[-1]

    def report_values(self, submission_id: int, grade_id: int | None) -> dict[str, Any]:
        sub = self.store.submission(submission_id)
        grade = self._grade_of(submission_id, grade_id)
        text = self.store.report(grade)
        report = None if text is None else json.loads(text)
        values: dict[str, Any] = {
            "title": f"Submission {sub.id}, grade {grade.id}", "sub": sub, "grade": grade,
            "others": [g for g in self.store.grades(submission_id) if g.id != grade.id],
            "report": report, "reasons": [], "shapes": [], "cases": [], "not_checked": [],
            "timing_reason": "", "plot": False, "no_plot": "",
            "not_timed": NOT_TIMED if grade.gpu_name == CPU_DEVICE
            else ENDED_UNTIMED.format(status=grade.status),
        }  # fmt: skip
        if report is None:
            return values
        timing = report.get("timing") if isinstance(report.get("timing"), dict) else None
        values.update(reasons=list(report.get("reasons") or []),
                      cases=[{**_CASE, **c} for c in report.get("cases") or []],
                      not_checked=list(report.get("not_checked") or []))  # fmt: skip
        if timing is not None:
            values["shapes"] = [{**_SHAPE, **s} for s in timing.get("shapes") or []]
            values["timing_reason"] = timing.get("reason") or ""
            values["plot"] = bool(values["shapes"])
            if not values["shapes"]:
                values["not_timed"] = (
                    "No per-shape timings: the timing phase ended "
                    f"({timing.get('status')}) before any shape was timed."
                )
            if values["plot"] and not _matplotlib():
                values.update(
                    plot=False,
                    no_plot="No plot: matplotlib is not installed "
                    "where the service runs (the plot extra).",
                )
        return values

    def plot(self, submission_id: int, grade_id: int | None) -> Response:
        """The PNG of a timed grade (the caller checked who asks)."""
        try:
            with self._lock:
                grade = self._grade_of(submission_id, grade_id)
                text = self.store.report(grade)
        except Unknown as exc:
            return Response(str(exc), 404, media_type="text/plain", headers=HEADERS)
        timing = None if text is None else json.loads(text).get("timing")
        if not isinstance(timing, dict) or not timing.get("shapes") or grade.report_sha256 is None:
            return Response(f"grade {grade.id} was not timed: it has no plot", 404,
                            media_type="text/plain", headers=HEADERS)  # fmt: skip
        try:
            png = self._plots.png(grade.report_sha256, timing)
        except Exception as exc:  # a report the plot cannot draw: the page shows it without
            return Response(f"grade {grade.id}'s plot could not be drawn: {exc}", 404,
                            media_type="text/plain", headers=HEADERS)  # fmt: skip
        if png is None:
            return Response("matplotlib is not installed where the service runs", 404,
                            media_type="text/plain", headers=HEADERS)  # fmt: skip
        return Response(png, media_type="image/png", headers=HEADERS)


def _matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def _landing(base: str, wanted: str) -> str:
    """Where a login goes: the dashboard page it was asked from, never anywhere else (an open
    redirect would lend this host's name to another's page)."""
    plain = (
        wanted.isascii()
        and wanted.isprintable()
        and not any(part in wanted for part in ("//", "\\", "/."))
    )
    page = wanted.startswith(f"{base}/") and not wanted.startswith(f"{base}/log")
    return wanted if plain and page else f"{base}/"


def _id(text: str, what: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise ValueError(f"a {what} id is a number, not {text[:40]!r}")
    return int(text)


def make_router(store: Store) -> APIRouter:
    """The dashboard's routes over ``store`` (the app's store: one connection, used under a
    lock). Left out of the OpenAPI schema: they answer HTML, not the API's JSON."""
    board = Dashboard(store)
    router = APIRouter(prefix="/dashboard", include_in_schema=False)

    @router.get("/login")
    def login_form(request: Request) -> Response:
        return board.page(request, "login", signed_in=False, title="Operator login", error=None,
                          next="")  # fmt: skip

    @router.post("/login")
    async def login(request: Request) -> Response:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_FORM_BYTES:
                too_long = _Denied(413, f"the login form is at most {_MAX_FORM_BYTES} bytes")
                return board.denied(request, too_long, "")
        form = parse_qs(body.decode("utf-8", "replace"))
        token = form.get("token", [""])[0].strip()
        next_page = form.get("next", [""])[0]
        try:
            if not token:
                raise _Denied(401, "enter the operator's token")
            board.check_token(token)
        except _Denied as denied:
            return board.denied(request, denied, next_page)
        base = request.scope.get("root_path", "") + "/dashboard"
        reply = RedirectResponse(_landing(base, next_page), 303, headers=HEADERS)
        reply.set_cookie(COOKIE, session_value(token), path=base, httponly=True,
                         samesite="strict", secure=request.url.scheme == "https")  # fmt: skip
        return reply

    @router.post("/logout")
    def logout(request: Request) -> Response:
        base = request.scope.get("root_path", "") + "/dashboard"
        reply = RedirectResponse(f"{base}/login", 303, headers=HEADERS)
        reply.delete_cookie(COOKIE, path=base, httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")  # fmt: skip
        return reply

    @router.get("/")
    def runs(request: Request) -> Response:
        return board.guarded(request, "runs", board.runs_values)

    @router.get("/runs/{run_id}")
    def run(request: Request, run_id: str) -> Response:
        return board.guarded(request, "run", board.run_values, run_id)

    def _ids(submission: str, request: Request) -> tuple[int, int | None]:
        grade = request.query_params.get("grade")
        return _id(submission, "submission"), None if grade is None else _id(grade, "grade")

    @router.get("/submissions/{submission}/report")
    def report(request: Request, submission: str) -> Response:
        def values() -> dict[str, Any]:
            return board.report_values(*_ids(submission, request))

        return board.guarded(request, "report", values)

    @router.get("/submissions/{submission}/plot.png")
    def plot(request: Request, submission: str) -> Response:
        try:
            board.check(request)
            sub_id, grade_id = _ids(submission, request)
        except _Denied as denied:
            return board.denied(request, denied)
        except ValueError as exc:
            return Response(str(exc), 400, media_type="text/plain", headers=HEADERS)
        return board.plot(sub_id, grade_id)

    return router


__all__ = ["COOKIE", "CPU_DEVICE", "ENDED_UNTIMED", "HEADERS", "NOT_TIMED", "Dashboard",
           "make_router", "session_value"]  # fmt: skip
