"""A submission cannot reach the service (issue 42): each attack of the report, on the CPU with
the default local executor or, for the reports a grader could write wrongly, the fast forging
grader behind the command executor. Each ends with the submission not scored, the store intact
(the operator's token unchanged and in no report, another run's grade untouched, no fake best),
no job left running, and no escape sequence on the operator's terminal."""

from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from grader_helpers import REPO, ci_config
from service_helpers import ENV, grader_cli, solution, tree_tar, worker

from grader.child.confine import landlock_abi
from grader.service.archive import UploadLimits, check_upload
from grader.service.executors import CommandExecutor, jobs_root
from grader.service.store import Device, GradeState, Limits, Store
from grader.service.worker import Worker, WorkerOptions

FORGED = REPO / "tests" / "service_forged_grade.py"
CPU = Device("cpu", "attack-worker")


def _submit(store: Store, run: str, files: dict[str, str]) -> int:
    tree = check_upload(tree_tar(files), UploadLimits())
    sub, _ = store.add_submission(run, commit="c" * 40, tree=tree.tree, archive=tree.archive,
                                  files=len(tree.files), max_attempts=1)  # fmt: skip
    return sub.id


def _victim(store: Store) -> tuple[str, list[tuple[object, ...]]]:
    """Another run with a scored grade; its rows, to compare after the attacks."""
    run, _ = store.create_run("victim")
    _submit(store, run.id, solution(0.7, "victim"))
    job = store.claim("victim-worker", Device("NVIDIA H200", "GPU-v", 0), lease_s=60)
    assert job is not None
    store.finish(job, json.dumps({"status": "scored", "score": 0.7, "reasons": [],
                                  "timing": {"score_ci": [0.69, 0.71]}}))  # fmt: skip
    return run.id, _rows(store, run.id)


def _rows(store: Store, run: str) -> list[tuple[object, ...]]:
    db = sqlite3.connect(f"file:{store.db_path}?mode=ro", uri=True)
    try:
        return db.execute("SELECT g.*, s.* FROM grades g JOIN submissions s ON s.id = "
                          "g.submission_id WHERE s.run_id = ? ORDER BY g.id", (run,)).fetchall()
    finally:
        db.close()


def _intact(store: Store, token: str, victim: str, victim_rows: list[tuple[object, ...]],
            attackers: list[str]) -> None:  # fmt: skip
    assert (store.root / "operator.token").read_text().strip() == token
    assert store.is_operator(token)
    assert _rows(store, victim) == victim_rows
    assert store.best(victim)[1].score == 0.7  # type: ignore[index]
    for run in attackers:
        assert store.best(run) is None
    blobs = b"".join(p.read_bytes() for p in store.blobs.rglob("*") if p.is_file())
    assert token.encode() not in blobs
    assert store.queued() == 0
    db = sqlite3.connect(f"file:{store.db_path}?mode=ro", uri=True)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()


def test_the_grade_process_cannot_reach_the_store_the_jobs_or_the_worker(tmp_path: Path) -> None:
    """The local executor's confinement itself (`grader.service.grade_process.confine`), with
    code that does what a submission which got past the grader's own confinement would."""
    if landlock_abi() < 6:
        pytest.skip(f"this kernel's Landlock ABI is {landlock_abi()}: signal scoping needs 6")
    store = Store(tmp_path / "store")
    token = store.operator_token()
    root = jobs_root()
    job, other = tempfile.mkdtemp(dir=root), tempfile.mkdtemp(dir=root)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    attempts = {
        "read the token": f"open({str(store.root / 'operator.token')!r}).read()",
        "write the database": f"open({str(store.db_path)!r}, 'r+b').write(b'x')",
        "list the store": f"os.listdir({str(store.root)!r})",
        "list the jobs": f"os.listdir({str(root)!r})",
        "list another job": f"os.listdir({other!r})",
        "signal the worker": f"os.kill({sleeper.pid}, signal.SIGTERM)",
        "signal its parent": "os.kill(os.getppid(), 0)",
        "write its own job": f"open(os.path.join({job!r}, 'x'), 'w').write('ok')",
        "read the grader": f"open({str(REPO / 'grader' / 'cli.py')!r}).read()",
    }
    code = ("import json, os, signal\nfrom grader.service.grade_process import confine\n"
            f"confine({[str(store.root), str(root)]!r}, [{job!r}])\nout = {{}}\n"
            + "".join(f"try:\n    {stmt}\n    out[{name!r}] = 'done'\nexcept OSError as e:\n"
                      f"    out[{name!r}] = type(e).__name__\n"
                      for name, stmt in attempts.items())
            + "print(json.dumps(out))\n")  # fmt: skip
    try:
        done = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {
            "read the token": "PermissionError", "write the database": "PermissionError",
            "list the store": "PermissionError", "list the jobs": "PermissionError",
            "list another job": "PermissionError", "signal the worker": "PermissionError",
            "signal its parent": "PermissionError", "write its own job": "done",
            "read the grader": "done",
        }  # fmt: skip
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
    assert (store.root / "operator.token").read_text().strip() == token


FORGERIES = {
    "killed": "killed by a signal but its report says scored",
    "list": "a JSON list, not an object",
    "garbage": "not JSON",
    "mismatch": "exited with status 13 but its report says scored",
    "score": "score 99.0 is not a number in [0, 3]",
    "nan": "NaN, which JSON has not",
    "extra": "unknown ['best']",
    "escape": "is not one of the grader's",
}


def test_a_report_the_grader_does_not_stand_behind_is_never_a_score(tmp_path: Path) -> None:
    """A report written at the report's path by someone who then killed the grader, and the
    reports no grader writes (``[]``, garbage, a score out of range, NaN, an unknown field, a
    status with an escape, a status the exit code contradicts): each is an executor error, the
    grade ends as grader_error with why, and the worker goes on to the next."""
    store = Store(tmp_path / "store")
    token = store.operator_token()
    victim, victim_rows = _victim(store)
    run, _ = store.create_run("forger", Limits(max_queued=100))
    subs = {mode: _submit(store, run.id, solution(0.5, mode)) for mode in FORGERIES}
    executor = CommandExecutor([sys.executable, str(FORGED), "{workspace}", "{report}"],
                               poll_s=0.2)  # fmt: skip
    log = io.StringIO()
    graded = Worker(store, CPU, executor, name="w", log=log,
                    options=WorkerOptions(once=True)).run()  # fmt: skip
    assert graded == len(FORGERIES)
    for mode, why in FORGERIES.items():
        grade = store.grades(subs[mode])[-1]
        assert grade.state is GradeState.DONE and grade.status == "grader_error", (mode, grade)
        assert grade.score is None and why in (grade.reason or ""), (mode, grade.reason)
        assert str(tmp_path) not in (grade.reason or "") and "grader-jobs" not in grade.reason
        assert sys.prefix not in grade.reason and str(REPO) not in grade.reason
        assert "\x1b" not in grade.reason and "ended with" not in grade.reason  # no output tail
    assert "\x1b" not in log.getvalue() and "\\x1b[32m" in log.getvalue()
    _intact(store, token, victim, victim_rows, [run.id])


# The attacks a submission makes at import: builtins only (the grader's import rule cannot stop
# `open`), then what it found raised as its error. STORE is put in by the test: the worst case,
# a submission that knows where the store is.
THIEF = '''"""Steals the operator's token and rewrites the store."""
STORE = {store!r}
found = []
for name in ("operator.token", "grader.sqlite"):
    try:
        found.append(open(STORE + "/" + name, "rb").read()[:64])
    except OSError as exc:
        found.append(repr(exc))
try:
    with open(STORE + "/grader.sqlite", "r+b") as db:
        db.seek(200)
        db.write(b"99.0 <- best" * 100)
    found.append("wrote the database")
except OSError as exc:
    found.append(repr(exc))
pid = "self"
for _ in range(8):  # every ancestor's command line and environment
    try:
        status = open(f"/proc/{{pid}}/status").read()
        pid = status.split("PPid:")[1].split()[0]
        found.append(open(f"/proc/{{pid}}/cmdline", "rb").read()[:300])
        found.append(open(f"/proc/{{pid}}/environ", "rb").read()[-300:])
    except (OSError, IndexError) as exc:
        found.append(repr(exc))
print("\\x1b[2K\\r\\x1b[32mstatus: scored    score: 9.9900\\x1b[0m", flush=True)
raise RuntimeError(f"STOLEN {{found}} \\x1b[32mscored\\x1b[0m")
'''

FORGER = '''"""Finds the report's path in an ancestor's command line, forges a score, kills its grader."""
FORGED = ('{{"status": "scored", "score": 9.99, "reasons": [], "workspace": "", "commit": "", '
          '"tree": "", "uncommitted_changes_ignored": false, "checked": [], "not_checked": [], '
          '"cases": [], "max_utilisation": null, "findings": [], "system": {{"device": "cpu"}}, '
          '"grader_version": "0.1.0", "started_at": "", "wall_s": 1.0, "timing": null, '
          '"child_stderr_tail": ""}}')
pid, wrote, ancestors = "self", [], []
for _ in range(8):
    try:
        pid = open(f"/proc/{{pid}}/status").read().split("PPid:")[1].split()[0]
        words = open(f"/proc/{{pid}}/cmdline", "rb").read().decode().split("\\0")
    except (OSError, IndexError):
        break
    ancestors.append(int(pid))
    if "--json" in words:
        path = words[words.index("--json") + 1]
        try:
            open(path, "w").write(FORGED)
            wrote.append(path)
        except OSError as exc:
            wrote.append(repr(exc))
try:
    import os
    import signal

    for ancestor in ancestors:
        try:
            os.kill(ancestor, signal.SIGKILL)
        except OSError:
            pass
except ImportError:
    pass
raise RuntimeError(f"FORGED {{wrote}}")
'''


@pytest.mark.slow
def test_a_submission_cannot_steal_rewrite_or_forge_through_the_local_executor(
        tmp_path: Path) -> None:  # fmt: skip
    """Real grades on the CPU by ``python -m grader worker`` with its default executor: a
    submission that reads the operator's token (it knows the store's path) and every ancestor's
    command line and environment, rewrites grader.sqlite and raises what it found with escape
    sequences; and one that looks for the report's path on its ancestors' command lines, writes
    a forged 9.99 there and kills every ancestor it can."""
    store_dir = tmp_path / "store"
    config = ci_config(tmp_path / "scoring.yaml")
    with Store(store_dir) as store:
        token = store.operator_token()
        victim, victim_rows = _victim(store)
        run, _ = store.create_run("attacker", Limits(max_queued=100))
        thief = _submit(store, run.id, {"solution.py": THIEF.format(store=str(store_dir))})
        forger = _submit(store, run.id, {"solution.py": FORGER.format()})
    w = worker(store_dir, "--cpu", "--once", "--name", "attack-worker", "--config", str(config))
    out, err = w.communicate(timeout=900)
    assert w.returncode == 0, err
    assert "\x1b" not in err and "\x1b" not in out
    with Store(store_dir) as store:
        for sub in (thief, forger):
            grade = store.grades(sub)[-1]
            assert grade.state is GradeState.DONE and grade.status != "scored", grade
            assert grade.score in (None, 0.0), grade
        report = store.report(store.grades(thief)[-1]) or ""
        assert "STOLEN" in report and "PermissionError" in report  # it ran, and was refused
        assert "99.0 <- best" not in report and token not in report
        _intact(store, token, victim, victim_rows, [run.id])
    text = grader_cli("run", "report", run.id, "--store", str(store_dir))
    assert text.returncode == 0 and "\x1b" not in text.stdout + text.stderr
    assert str(store_dir) not in json.dumps(json.loads(report))  # no operator path in it


def test_every_status_is_believed_with_its_own_exit_code_only() -> None:
    from grader.report import ExitCode, GradeReport, Status, SystemInfo
    from grader.service import verdict

    for status in Status:
        report = GradeReport(
            status=status, score=None if status is Status.CHECKED_UNTIMED else
            (0.5 if status is Status.SCORED else 0.0), reasons=() if status.passed else ("why",),
            workspace="w", commit="c" * 40, tree="t" * 40, uncommitted_changes_ignored=False,
            checked=(), not_checked=(), cases=(), max_utilisation=None, findings=(),
            system=SystemInfo(device="cpu", python="3", torch="2", triton="3", numpy="2",
                              platform="Linux"),
        )  # fmt: skip
        text = report.to_json()
        code = int(ExitCode.for_status(status))
        assert verdict.check(text, code, tree="t" * 40).status is status
        for wrong in (0, 1, 3, 13, -9, None):
            if wrong != code:
                with pytest.raises(verdict.Unbelieved, match="not the grader's report"):
                    verdict.check(text, wrong)
        with pytest.raises(verdict.Unbelieved, match="is of tree"):
            verdict.check(text, code, tree="u" * 40)
        with pytest.raises(verdict.Unbelieved, match="repeats keys"):
            verdict.check(text.replace('"status"', '"status": "scored", "status"', 1), code)
