"""The operators' dashboard over HTTP: its router served by uvicorn on 127.0.0.1, a store filled
through its own API with reports of every kind (timed and scored, a final regrade, a crash whose
reason carries markup, a CPU grade), and what each page shows to whom.

The browser's view of the same pages, after real CPU grades: tests/test_service_dashboard_browser.py."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest
from dashboard_helpers import DashboardServer, fetch
from markupsafe import escape

from grader.service.dashboard import COOKIE, ENDED_UNTIMED, NOT_TIMED, session_value
from grader.service.store import Device, Store

H200_A, H200_B, CPU = (Device("NVIDIA H200", "GPU-aaaa", 0), Device("NVIDIA H200", "GPU-bbbb", 1),
                       Device("cpu", "cpu"))  # fmt: skip
SCRIPT = "<script>alert('owned')</script>"
STDERR = '<img src=x onerror="alert(2)"> & </pre><b>bold</b>'


def _timed(score: float, ci: tuple[float, float]) -> str:
    # The float16 row carries the target it was scored against; the float32 row is as a report
    # written before shapes carried one (no "target" key).
    shapes = [{"label": label, "t_plain_ms": 1.0, "t_ref_ms": 0.5, "t_sub_ms": 0.6, "r": 1.66,
               "g": 2.0, "r_ci": [1.6, 1.7], "g_ci": [1.9, 2.1], "score": score, "status": "ok",
               "reason": "", "score_ci": list(ci), "weight": 1.0, **extra}
              for label, extra in (("float32:8x4096:d1", {}),
                                   ("float16:8x4096:d4", {"target": 2.375}))]  # fmt: skip
    timing = {"profile": "h200", "shapes": shapes, "score": score, "status": "ok", "reason": "",
              "telemetry": {"device": {"name": "NVIDIA H200"}}, "score_ci": list(ci),
              "rounds": 30, "warmup": 3, "wall_s": 12.0}  # fmt: skip
    return json.dumps({"status": "scored", "score": score, "reasons": [], "cases": [],
                       "not_checked": [], "timing": timing, "wall_s": 40.0})  # fmt: skip


def _crashed() -> str:
    return json.dumps({"status": "crashed", "score": 0.0,
                       "reasons": [f"c3-l2#1201: the submission raised: RuntimeError: {SCRIPT}"],
                       "cases": [{"name": "c3-l2#1201", "kind": "case", "dtype": "float32",
                                  "passed": False, "reason": f"raised {SCRIPT}"}],
                       "not_checked": [], "timing": None,
                       "child_stderr_tail": STDERR})  # fmt: skip


def _untimed() -> str:
    return json.dumps({"status": "checked_untimed", "score": None, "reasons": [], "cases": [],
                       "not_checked": ["timing and score: no GPU (nothing was timed)"],
                       "timing": None})  # fmt: skip


def _grade(store: Store, device: Device, report: str) -> int:
    job = store.claim("worker-1", device, 60.0)
    assert job is not None
    return store.finish(job, report).id


def _add(store: Store, run: str, salt: str, note: str = "") -> int:
    sub, new = store.add_submission(run, commit=salt * 40, tree=salt * 40, archive=salt.encode(),
                                    files=1, note=note)  # fmt: skip
    assert new
    return sub.id


@pytest.fixture
def board(tmp_path: Path):
    """A store with two runs: "alpha" with four graded submissions (two scored, the better one
    regraded as the final; a crash; a CPU grade), "beta" with none; served."""
    store_dir = tmp_path / "store"
    with Store(store_dir) as store:
        run, token = store.create_run("alpha <i>run</i>")
        other, _ = store.create_run("beta")
        ids = {
            "low": _add(store, run.id, "a"),
            "high": _add(store, run.id, "b", note=f"note {SCRIPT}"),
            "crash": _add(store, run.id, "c"),
            "cpu": _add(store, run.id, "d"),
        }
        grades = {
            "low": _grade(store, H200_A, _timed(0.61, (0.58, 0.64))),
            "high": _grade(store, H200_A, _timed(0.88, (0.87, 0.89))),
            "crash": _grade(store, H200_A, _crashed()),
            "cpu": _grade(store, CPU, _untimed()),
        }
        final = store.request_final(run.id)
        assert _grade(store, H200_B, _timed(0.87, (0.86, 0.885))) == final.id
        operator = store.operator_token()
    with DashboardServer(store_dir) as server:
        yield {"url": f"{server.url}/dashboard", "run": run.id, "other": other.id,
               "token": token, "operator": operator, "ids": ids, "grades": grades,
               "final": final.id}  # fmt: skip


def _paths(b: dict) -> list[str]:
    sub = b["ids"]["high"]
    return ["/", f"/runs/{b['run']}", f"/submissions/{sub}/report",
            f"/submissions/{sub}/plot.png?grade={b['grades']['high']}"]  # fmt: skip


def test_only_the_operator_sees_a_page(board: dict) -> None:
    """Nothing, an unknown token, a stale or forged cookie: 401 with the login form; a run's token
    (even for its own run): 403; the operator's token, or the cookie made from it: the page."""
    operator_cookie = f"{COOKIE}={session_value(board['operator'])}"
    for path in _paths(board):
        url = board["url"] + path
        for kwargs, status in (({}, 401), ({"token": "not-a-token"}, 401),
                               ({"token": board["token"]}, 403),
                               ({"cookie": f"{COOKIE}={board['operator']}"}, 401),
                               ({"cookie": f"{COOKIE}={session_value('old-token')}"}, 401),
                               ({"token": board["operator"]}, 200),
                               ({"cookie": operator_cookie}, 200)):  # fmt: skip
            page = fetch(url, **kwargs)
            assert page.status == status, (path, kwargs, page.status, page.body[:300])
            if status != 200:
                assert 'name="token"' in page.text and "alpha" not in page.text, (path, kwargs)
            if status == 401:
                assert page.headers["WWW-Authenticate"].startswith("Bearer")
    basic = fetch(board["url"] + "/", headers={"Authorization": f"Basic {board['operator']}"})
    assert basic.status == 401 and "Bearer" in basic.text


def test_the_login_form_sets_a_strict_http_only_cookie(board: dict) -> None:
    url = board["url"]
    form = fetch(f"{url}/login")
    assert form.status == 200 and 'type="password"' in form.text
    for token, status in ((board["token"], 403), ("wrong", 401), ("", 401)):
        refused = fetch(f"{url}/login", method="POST", form=f"token={token}")
        assert refused.status == status and refused.headers["Set-Cookie"] is None, token
    done = fetch(f"{url}/login", method="POST", form=f"token={board['operator']}")
    assert done.status == 303 and done.headers["Location"] == "/dashboard/"
    cookie = done.headers["Set-Cookie"]
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"httponly", "path"} <= attributes and "samesite=strict" in cookie.lower()
    assert board["operator"] not in cookie  # the cookie is an HMAC of it, not the token
    value = cookie.split(";")[0]
    assert fetch(f"{url}/runs/{board['run']}", cookie=value).status == 200
    out = fetch(f"{url}/logout", method="POST", cookie=value)
    assert out.status == 303 and f'{COOKIE}=""' in out.headers["Set-Cookie"]
    too_long = fetch(f"{url}/login", method="POST", form="token=" + "x" * 5000)
    assert too_long.status == 413


def test_the_login_form_comes_back_to_the_page_asked_for_and_only_there(board: dict) -> None:
    run_page = f"/dashboard/runs/{board['run']}"
    asked = fetch(board["url"] + f"/runs/{board['run']}")
    assert asked.status == 401 and f'name="next" value="{run_page}"' in asked.text
    for wanted, landing in ((run_page, run_page), ("/dashboard/submissions/1/report?grade=2",
                            "/dashboard/submissions/1/report?grade=2"),
                            ("https://evil.example/", "/dashboard/"),
                            ("//evil.example/dashboard/", "/dashboard/"),
                            ("/dashboard//evil.example/", "/dashboard/"),
                            ("/dashboard/\\evil.example/", "/dashboard/"),
                            ("/dashboard/../v1/runs", "/dashboard/"),
                            ("/dashboard/login", "/dashboard/"),
                            ("/dashboard/x\r\nSet-Cookie: a=b", "/dashboard/"),
                            ("", "/dashboard/")):  # fmt: skip
        done = fetch(f"{board['url']}/login", method="POST",
                     form=f"token={board['operator']}&next={quote(wanted)}")  # fmt: skip
        assert done.status == 303 and done.headers["Location"] == landing, wanted


def test_the_runs_page_lists_every_run(board: dict) -> None:
    page = fetch(board["url"] + "/", token=board["operator"]).text
    assert f'id="run-{board["run"]}"' in page and f'id="run-{board["other"]}"' in page
    row = page.split(f'id="run-{board["run"]}"')[1].split("</tr>")[0]
    assert "alpha &lt;i&gt;run&lt;/i&gt;" in row and "graded 4" in row
    assert f"#{board['ids']['high']} 0.8800" in row and "scored" in row and "0.8700" in row


def test_the_run_page_marks_the_best_and_the_final(board: dict) -> None:
    page = fetch(f"{board['url']}/runs/{board['run']}", token=board["operator"]).text
    rows = {k: page.split(f'id="submission-{i}"')[1].split("</tr>")[0]
            for k, i in board["ids"].items()}  # fmt: skip
    assert rows["high"].startswith(' class="best final"'), rows["high"][:80]
    assert rows["low"].startswith(' class=""') and rows["crash"].startswith(' class=""')
    assert "0.8800 [0.8700, 0.8900]" in rows["high"] and "0.6100 [0.5800, 0.6400]" in rows["low"]
    assert "crashed" in rows["crash"] and "checked_untimed" in rows["cpu"]
    assert f"report?grade={board['final']}" in rows["high"]
    assert f"Best: submission #{board['ids']['high']}, score" in page
    final = page.split('id="final"')[1].split("</p>")[0]
    assert "scored" in final and "0.8700 [0.8600, 0.8850]" in final and "GPU-bbbb" in final
    assert "gap -0.0100, joint interval ±0.0160" in final and "BEYOND" not in final


def test_what_a_submission_wrote_is_shown_as_text(board: dict) -> None:
    """A reason, a case's reason, a log tail and a note carry markup: each is shown escaped, and
    no page has a script of its own to run, nor lets one run (the policy)."""
    for path in (f"/submissions/{board['ids']['crash']}/report", f"/runs/{board['run']}"):
        page = fetch(board["url"] + path, token=board["operator"])
        assert "<script" not in page.text.lower() and "<img src=x" not in page.text
        assert "<i>run</i>" not in page.text
        policy = page.headers["Content-Security-Policy"]
        assert "default-src 'none'" in policy and "script-src" not in policy
        assert "unsafe-inline" not in policy
    report = fetch(f"{board['url']}/submissions/{board['ids']['crash']}/report",
                   token=board["operator"]).text  # fmt: skip
    assert str(escape(SCRIPT)) in report and "&lt;script&gt;" in report
    assert str(escape(STDERR)) in report.split('id="stderr"')[1]
    assert 'class="status status-failed">crashed' in report
    # A GPU grade that ended before timing says so, not that a CPU never times.
    assert str(escape(ENDED_UNTIMED.format(status="crashed"))) in report
    assert str(escape(NOT_TIMED)) not in report
    run_page = fetch(f"{board['url']}/runs/{board['run']}", token=board["operator"]).text
    assert f"note {escape(SCRIPT)}" in run_page


def test_a_timed_grade_shows_its_shapes_and_plot(board: dict) -> None:
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the plot extra)")
    sub, grade = board["ids"]["high"], board["final"]
    page = fetch(f"{board['url']}/submissions/{sub}/report?grade={grade}",
                 token=board["operator"]).text  # fmt: skip
    assert f"final {grade}" in page and 'id="shapes"' in page and "float16:8x4096:d4" in page
    # Each row's target r: the report's own, or "-" where an older report holds none.
    rows = {row.split("</td>", 1)[0]: row for row in page.split("<tr><td>")[1:]}
    assert '<td class="num">2.375</td>' in rows["float16:8x4096:d4"]
    assert '<td class="num">-</td>' in rows["float32:8x4096:d1"]
    assert f'src="/dashboard/submissions/{sub}/plot.png?grade={grade}"' in page
    png = fetch(f"{board['url']}/submissions/{sub}/plot.png?grade={grade}",
                token=board["operator"])  # fmt: skip
    assert png.status == 200 and png.headers["Content-Type"] == "image/png"
    assert png.body.startswith(b"\x89PNG\r\n\x1a\n") and len(png.body) > 5000
    # The default is the latest ordinary grade, not the final.
    default = fetch(f"{board['url']}/submissions/{sub}/report", token=board["operator"]).text
    assert f"grade {board['grades']['high']}</h1>" in default


def test_an_untimed_grade_says_it_was_not_timed(board: dict) -> None:
    sub = board["ids"]["cpu"]
    page = fetch(f"{board['url']}/submissions/{sub}/report", token=board["operator"]).text
    assert str(escape(NOT_TIMED)) in page and 'id="plot"' not in page
    assert "timing and score: no GPU" in page and "checked_untimed" in page
    plot = fetch(f"{board['url']}/submissions/{sub}/plot.png", token=board["operator"])
    assert plot.status == 404 and b"was not timed" in plot.body


@pytest.mark.parametrize(("path", "status"), [
    ("/runs/run-nosuch", 404),
    ("/submissions/999/report", 404),
    ("/submissions/1/report?grade=999", 404),
    ("/submissions/abc/report", 400),
    ("/submissions/1/report?grade=-1", 400),
    ("/submissions/abc/plot.png", 400),
])  # fmt: skip
def test_an_unknown_or_bad_id_is_a_page_saying_so(board: dict, path: str, status: int) -> None:
    page = fetch(board["url"] + path, token=board["operator"])
    assert page.status == status, page.body[:300]
    if status == 404 and "plot" not in path:
        assert 'id="error"' in page.text and "no " in page.text


def test_a_grade_not_done_and_one_no_attempt_finished_have_their_pages(tmp_path: Path) -> None:
    """A queued grade says so; a grade whose every attempt failed (the store's own grader_error
    report: no cases, no timing) shows its reason and attempts; a timing phase that timed no
    shape says so, with no plot."""
    store_dir = tmp_path / "store"
    with Store(store_dir) as store:
        run, _ = store.create_run("r")
        broken, _ = store.add_submission(run.id, commit="e" * 40, tree="e" * 40, archive=b"e",
                                         files=1, max_attempts=1)  # fmt: skip
        job = store.claim("worker-1", CPU, 60.0)
        assert job is not None and job.submission.id == broken.id
        store.fail(job, "the executor <broke>")
        early = _add(store, run.id, "g")
        _grade(store, H200_A, json.dumps({
            "status": "timing_failed", "score": 0.0, "reasons": ["the baselines did not start"],
            "timing": {"profile": "h200", "shapes": [], "status": "check_failed",
                       "reason": "the baselines did not start"}}))  # fmt: skip
        queued = _add(store, run.id, "f")
        operator = store.operator_token()
    with DashboardServer(store_dir) as server:
        url = f"{server.url}/dashboard/submissions"
        page = fetch(f"{url}/{broken.id}/report", token=operator)
        assert page.status == 200 and "grader_error" in page.text, page.text[:500]
        assert "last: worker-1: the executor &lt;broke&gt;" in page.text
        assert "attempt 1: worker-1: the executor &lt;broke&gt;" in page.text
        timing = fetch(f"{url}/{early}/report", token=operator).text
        assert "No per-shape timings: the timing phase ended (check_failed)" in timing
        assert 'id="plot"' not in timing and "Timing: the baselines did not start" in timing
        pending = fetch(f"{url}/{queued}/report", token=operator)
        assert pending.status == 200 and "Not graded yet: this grade is queued." in pending.text
