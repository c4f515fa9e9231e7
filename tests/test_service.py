"""The service for real: ``python -m grader serve`` and ``worker`` processes on one SQLite store,
requests over HTTP on 127.0.0.1, a fast fake grader behind the worker's command executor where a
real grade is not the point, and one real grade on the CPU."""

from __future__ import annotations

import gzip
import io
import json
import os
import signal
import tarfile
import threading
import time
from pathlib import Path

import pytest
from grader_helpers import NAIVE, ci_config, make_workspace
from service_helpers import (
    ENV,
    Server,
    call,
    fake_command,
    fake_commit,
    grader_cli,
    pid_alive,
    solution,
    tar_with,
    tree_tar,
    upload,
    wait_for,
    worker,
)

from grader.service.store import GradeState, Store


def _create_run(store: Path, name: str = "run", *extra: str) -> tuple[str, str]:
    done = grader_cli("run", "create", name, "--store", str(store), "--json", *extra)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    return out["run"], out["token"]


def _log_lines(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.slow
def test_a_worker_killed_mid_grade_loses_nothing(tmp_path: Path) -> None:
    store_dir, log = tmp_path / "store", tmp_path / "grades.log"
    run, token = _create_run(store_dir)
    with Server(store_dir) as server:
        reply = upload(server.url, token, run, tree_tar(solution(0.8)), fake_commit("a"))
        assert reply.status == 201, reply.body
    sub = reply.body["submission"]["id"]
    # The workers' temporary folder: where their grades' folders are (grader-jobs-<uid>/w-*/).
    (tmp_path / "tmp").mkdir()
    env = {**ENV, "TMPDIR": str(tmp_path / "tmp")}
    jobs = tmp_path / "tmp" / f"grader-jobs-{os.getuid()}"
    w1 = worker(store_dir, "--cpu", "--name", "w1", "--lease", "2",
                "--command", fake_command(log, sleep=120), env=env)  # fmt: skip
    wait_for(lambda: _log_lines(log), 60, "the first attempt to start")
    grade_pid = int(_log_lines(log)[0][2])
    w1.send_signal(signal.SIGKILL)
    w1.wait()
    # The grade in progress dies with its worker: no stray attempt races the next one.
    wait_for(lambda: not pid_alive(grade_pid), 10, "the killed worker's grade to die")
    (left,) = jobs.iterdir()  # the killed worker's folder, its grade's folders in it
    assert left.name.startswith(f"w-{w1.pid}-") and list(left.glob("job-*/repo/solution.py"))
    time.sleep(2.5)  # w1's lease runs out
    w2 = worker(store_dir, "--cpu", "--name", "w2", "--once", "--command", fake_command(log),
                env=env)  # fmt: skip
    out, err = w2.communicate(timeout=120)
    assert w2.returncode == 0, err
    # w2 removed what w1 left, and its own folder when it exited: nothing is left behind.
    assert "removed the grade folders of 1 dead worker(s)" in err
    assert list(jobs.iterdir()) == []
    with Store(store_dir) as store:
        grades = store.grades(sub)
    assert len(grades) == 1, grades
    grade = grades[0]
    assert grade.state is GradeState.DONE and grade.status == "scored" and grade.score == 0.8
    assert grade.attempts == 2 and grade.worker == "w2"
    assert "w1: its lease expired" in grade.history[0]
    assert [line[1] for line in _log_lines(log)] == ["grade", "grade"]  # tried twice, done once


@pytest.mark.slow
def test_200_concurrent_submissions_from_8_clients_are_each_graded_once(tmp_path: Path) -> None:
    store_dir, log = tmp_path / "store", tmp_path / "grades.log"
    run, token = _create_run(store_dir, "busy", "--max-per-hour", "1000", "--max-queued", "1000")
    ids: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        for i in range(25):
            salt = f"{c}-{i}"
            reply = upload(server.url, token, run, tree_tar(solution(0.5, salt)), fake_commit(salt))
            with lock:
                if reply.status == 201:
                    ids.append(reply.body["submission"]["id"])
                else:
                    errors.append(f"{salt}: {reply.status} {reply.body}")
        again = upload(server.url, token, run, tree_tar(solution(0.5, f"{c}-0")), fake_commit("x"))
        with lock:
            if again.status != 200 or again.body["new"]:
                errors.append(f"resubmitted tree {c}-0: {again.status} {again.body}")

    with Server(store_dir) as server:
        # Two workers grade while the clients submit.
        workers = [worker(store_dir, "--cpu", "--name", f"w{k}", "--command", fake_command(log))
                   for k in range(2)]  # fmt: skip
        threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[:5]
        assert len(set(ids)) == 200
        with Store(store_dir) as store:
            wait_for(lambda: store.queued() == 0, 240, "the queue to drain")
            grades = [g for i in ids for g in store.grades(i)]
        for w in workers:
            w.send_signal(signal.SIGTERM)
            w.wait(timeout=60)
    assert len(grades) == 200 and all(g.state is GradeState.DONE and g.status == "scored"
                                      for g in grades)  # fmt: skip
    trees = [line[0] for line in _log_lines(log)]
    assert len(trees) == 200 == len(set(trees))  # each tree graded exactly once
    assert {g.worker for g in grades} == {"w0", "w1"}


@pytest.mark.slow
def test_bad_uploads_are_refused_and_nothing_is_stored(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    run, token = _create_run(store_dir, "strict", "--max-upload-mb", "0.01")
    good = tree_tar(solution(0.5))
    bomb = io.BytesIO()
    with gzip.GzipFile(fileobj=bomb, mode="wb") as gz:
        for _ in range(64):
            gz.write(bytes(1 << 20))
    cases = {
        "tampered": (gzip.compress(good)[:-40], 400, "gzip"),
        "escaping": (tar_with("../evil.py"), 400, ".."),
        "absolute": (tar_with("/etc/evil.py"), 400, "absolute"),
        "symlink": (tar_with("link", tarfile.SYMTYPE, "/etc/passwd"), 400, "symlink"),
        "device": (tar_with("dev", tarfile.CHRTYPE), 400, "device"),
        "oversized": (good + bytes(20_000), 413, "limit"),
        "bomb": (bomb.getvalue(), 413, ""),
    }
    with Server(store_dir) as server:
        for name, (data, status, words) in cases.items():
            reply = upload(server.url, token, run, data, fake_commit(name))
            assert reply.status == status, (name, reply.body)
            assert words in reply.body["error"], (name, reply.body)
        no_commit = upload(server.url, token, run, good)
        assert no_commit.status == 400 and "no commit id" in no_commit.body["error"]
    with Store(store_dir) as store:
        assert store.submissions(run) == []
    assert not list((store_dir / "blobs").rglob("*")) if (store_dir / "blobs").exists() else True


@pytest.mark.slow
def test_a_runs_token_reaches_its_own_run_only(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    run_a, token_a = _create_run(store_dir, "a")
    run_b, token_b = _create_run(store_dir, "b", "--max-queued", "4")
    with Server(store_dir) as server:
        base = server.url
        sub_b = upload(base, token_b, run_b, tree_tar(solution(0.5)), fake_commit("b")).body
        sub_b = sub_b["submission"]["id"]
        assert call(f"{base}/v1/runs/{run_b}", token_a).status == 403
        assert call(f"{base}/v1/runs/{run_b}/submissions", token_a).status == 403
        # Another run's submission is the same 404 as one that does not exist.
        for path in (f"submissions/{sub_b}", f"submissions/{sub_b}/report",
                     f"submissions/{sub_b + 1000}"):
            reply = call(f"{base}/v1/{path}", token_a)
            assert reply.status == 404 and "in this token's run" in reply.body["error"], reply
        assert upload(base, token_a, run_b, tree_tar(solution(0.6)), fake_commit("c")).status == 403
        assert call(f"{base}/v1/runs/{run_a}", None).status == 401
        assert call(f"{base}/v1/runs/{run_a}", "not-a-token").status == 401
        assert call(f"{base}/v1/runs/{run_a}/finalize", token_a, "POST", b"{}").status == 403
        assert call(f"{base}/v1/runs", token_a, "POST", b'{"name": "x"}').status == 403
        assert call(f"{base}/v1/submissions/{sub_b}", token_b).status == 200
        assert call(f"{base}/v1/submissions/{sub_b}", server.operator).status == 200
        made = call(f"{base}/v1/runs", server.operator, "POST", b'{"name": "by-api"}')
        assert made.status == 201 and made.body["token"]
    with Store(store_dir) as store:
        assert [s.id for s in store.submissions(run_a)] == []


@pytest.mark.slow
def test_the_queue_survives_a_server_restart(tmp_path: Path) -> None:
    store_dir, log = tmp_path / "store", tmp_path / "grades.log"
    run, token = _create_run(store_dir, "run", "--max-queued", "10")
    first = Server(store_dir)
    ids = [upload(first.url, token, run, tree_tar(solution(0.5, f"{i}")), fake_commit(f"{i}"))
           .body["submission"]["id"] for i in range(3)]  # fmt: skip
    first.kill()  # mid-queue: nothing graded yet
    with Server(store_dir) as second:
        ids += [upload(second.url, token, run, tree_tar(solution(0.5, f"{i}")),
                       fake_commit(f"{i}")).body["submission"]["id"] for i in range(3, 6)]
        w = worker(store_dir, "--cpu", "--once", "--command", fake_command(log))
        assert w.wait(timeout=120) == 0
        views = [call(f"{second.url}/v1/submissions/{i}", token).body for i in ids]
    assert [v["state"] for v in views] == ["graded"] * 6
    assert len(_log_lines(log)) == 6


@pytest.mark.slow
def test_finalize_regrades_the_best_on_another_device(tmp_path: Path) -> None:
    store_dir, log = tmp_path / "store", tmp_path / "grades.log"
    run, token = _create_run(store_dir)
    with Server(store_dir) as server:
        for score in (0.7, 0.9, 0.8):
            upload(server.url, token, run, tree_tar(solution(score)), fake_commit(f"{score}"))
    cmd = fake_command(log)
    assert worker(store_dir, "--cpu", "--name", "a", "--once", "--command", cmd).wait(60) == 0
    best = grader_cli("run", "best", run, "--store", str(store_dir), "--json")
    assert json.loads(best.stdout)["best"]["score"] == 0.9
    queued = grader_cli("run", "finalize", run, "--store", str(store_dir), "--json", "--no-wait")
    assert queued.returncode == 0, queued.stderr
    # Worker a graded every submission: the final waits for another device.
    a_again = worker(store_dir, "--cpu", "--name", "a", "--once", "--command", cmd)
    assert a_again.wait(60) == 0 and "graded 0" in a_again.communicate()[0]
    assert worker(store_dir, "--cpu", "--name", "b", "--once", "--command", cmd).wait(60) == 0
    final = grader_cli("run", "finalize", run, "--store", str(store_dir), "--json")
    assert final.returncode == 0, final.stderr
    out = json.loads(final.stdout)
    assert out["final"]["state"] == "done" and out["final"]["gpu_uuid"] == "b"
    assert out["grade"]["gpu_uuid"] == "a" and out["gap"] == pytest.approx(0.0)
    assert not out["gap_flagged"]
    report = json.loads(grader_cli("run", "report", run, "--store", str(store_dir),
                                   "--json").stdout)  # fmt: skip
    assert [s["score"] for s in report["submissions"]] == [0.7, 0.9, 0.8]
    assert report["best"] == report["submissions"][1]["id"]
    assert report["final"]["final"]["purpose"] == "final"
    text = grader_cli("run", "report", run, "--store", str(store_dir)).stdout
    assert "RESULT: 0.9000" in text
    lines = _log_lines(log)
    assert [line[1] for line in lines] == ["grade", "grade", "grade", "final"]


@pytest.mark.slow
def test_a_runs_burst_does_not_starve_another_run(tmp_path: Path) -> None:
    """Real concurrent clients: run A's 8 clients send 24 submissions at once while run B's one
    client sends 3; a worker grading throughout takes the runs in turn, so B's grades are done
    within the first few, not after A's burst. A run's grades waiting are capped: past the cap
    its uploads get 429."""
    store_dir, log = tmp_path / "store", tmp_path / "grades.log"
    run_a, token_a = _create_run(store_dir, "a", "--max-queued", "30", "--max-per-hour", "100")
    run_b, token_b = _create_run(store_dir, "b", "--max-queued", "4")
    trees: dict[str, str] = {}
    statuses: list[int] = []
    lock = threading.Lock()

    def client(token: str, run: str, salts: list[str]) -> None:
        for salt in salts:
            reply = upload(server.url, token, run, tree_tar(solution(0.5, salt)), fake_commit(salt))
            with lock:
                statuses.append(reply.status)
                if reply.status == 201:
                    trees[reply.body["submission"]["tree"]] = salt

    with Server(store_dir) as server:
        threads = [threading.Thread(target=client, args=(token_a, run_a, [f"a{c}-{i}"
                                                                          for i in range(3)]))
                   for c in range(8)]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        b = threading.Thread(target=client, args=(token_b, run_b, ["b0", "b1", "b2"]))
        b.start()
        b.join()
        assert sorted(statuses) == [201] * 27, statuses
        w = worker(store_dir, "--cpu", "--once", "--command", fake_command(log))
        assert w.wait(timeout=300) == 0
        # The cap: run B may have 4 grades waiting; the fifth upload is refused.
        over = [upload(server.url, token_b, run_b, tree_tar(solution(0.5, f"b-over{i}")),
                       fake_commit(f"b-over{i}")).status for i in range(5)]  # fmt: skip
        assert over == [201] * 4 + [429], over
    order = [trees[line[0]][0] for line in _log_lines(log)]
    assert len(order) == 27
    # Runs in turn: B's three grades are the 2nd, 4th and 6th, though sent after A's 24.
    assert "".join(order[:7]) == "abababa", order


def test_cli_errors_are_clear(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    run, _ = _create_run(store_dir)
    missing = grader_cli("run", "status", "run-nope", "--store", str(store_dir), "--json")
    assert missing.returncode == 1 and "no run 'run-nope'" in json.loads(missing.stdout)["error"]
    empty = grader_cli("run", "finalize", run, "--store", str(store_dir), "--json")
    assert empty.returncode == 1 and "no scored submission" in json.loads(empty.stdout)["error"]
    status = json.loads(grader_cli("run", "status", run, "--store", str(store_dir),
                                   "--json").stdout)  # fmt: skip
    assert status["submissions"] == 0 and status["best"] is None


@pytest.mark.slow
def test_end_to_end_on_the_cpu(tmp_path: Path) -> None:
    """serve, create a run, a worker in interpreter mode, the naive control sent over HTTP as
    `git archive` makes it: its report is checked_untimed, as the same grade outside the
    service."""
    store_dir = tmp_path / "store"
    config = ci_config(tmp_path / "scoring.yaml")
    run, token = _create_run(store_dir, "e2e")
    ws = make_workspace(tmp_path / "ws", {"solution.py": NAIVE.read_text()})
    import subprocess

    tar = subprocess.run(["git", "-C", str(ws), "archive", "--format=tar", "HEAD"],
                         capture_output=True, check=True).stdout  # fmt: skip
    with Server(store_dir) as server:
        reply = upload(server.url, token, run, tar)
        assert reply.status == 201, reply.body
        sub = reply.body["submission"]
        head = subprocess.run(["git", "-C", str(ws), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
        assert sub["commit"] == head
        w = worker(store_dir, "--cpu", "--once", "--config", str(config))
        _, err = w.communicate(timeout=900)
        assert w.returncode == 0, err
        view = call(f"{server.url}/v1/submissions/{sub['id']}", token).body
        report = call(f"{server.url}/v1/submissions/{sub['id']}/report", token).body
    assert view["state"] == "graded" and view["status"] == "checked_untimed", view
    assert report["status"] == "checked_untimed" and report["tree"] == sub["tree"]
    assert report["commit"] == head  # the agent's commit, not the rebuilt repository's
    assert os.environ.get("GRADER_URL") is None  # the test did not rely on the caller's service
