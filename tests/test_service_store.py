"""The service's store and queue, in one process on a real SQLite file: leases, bounded retries,
fencing of a late worker, dedupe, a run's limits, the final's other-GPU rule, the gap flag."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from service_helpers import solution, tree_tar

from grader.service import runs
from grader.service.archive import UploadLimits, check_upload
from grader.service.store import (
    Device,
    GradeState,
    LimitExceeded,
    Limits,
    Store,
    StoreError,
    Unknown,
)

GPU_A = Device("NVIDIA H200", "GPU-aaaa", 0)
GPU_B = Device("NVIDIA H200", "GPU-bbbb", 1)
GPU_L4 = Device("NVIDIA L4", "GPU-cccc", 0)


def _report(score: float, half: float = 0.01) -> str:
    return json.dumps({"status": "scored", "score": score, "reasons": [],
                       "grader_version": "test",
                       "timing": {"profile": "h200", "score_ci": [score - half, score + half]}})


def _add(store: Store, run: str, score: float, salt: str = "", **kw: object):  # type: ignore[no-untyped-def]
    tree = check_upload(tree_tar(solution(score, salt)), UploadLimits())
    sub, new = store.add_submission(run, commit="c" * 40, tree=tree.tree, archive=tree.archive,
                                    files=len(tree.files), **kw)  # type: ignore[arg-type]
    return sub, new


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


def test_claim_finish_and_fencing(store: Store) -> None:
    run, _ = store.create_run("r")
    sub, new = _add(store, run.id, 0.8)
    assert new
    job = store.claim("w1", GPU_A, lease_s=0.2)
    assert job is not None and job.attempt == 1 and job.submission.id == sub.id
    assert store.claim("w2", GPU_B, lease_s=0.2) is None  # one job, already held
    time.sleep(0.3)
    # w1's lease ran out: the next claim settles it and w2 takes attempt 2.
    job2 = store.claim("w2", GPU_B, lease_s=30)
    assert job2 is not None and job2.attempt == 2
    assert not store.heartbeat(job, 30)
    with pytest.raises(StoreError, match="no longer w1's"):
        store.finish(job, _report(0.9))  # the late worker's report is refused
    done = store.finish(job2, _report(0.8))
    assert done.state is GradeState.DONE and done.score == 0.8 and done.gpu_uuid == "GPU-bbbb"
    assert done.score_ci == (pytest.approx(0.79), pytest.approx(0.81))
    assert "lease expired" in done.history[0]
    assert json.loads(store.report(done) or "")["score"] == 0.8


def test_retries_are_bounded_then_grader_error(store: Store) -> None:
    run, _ = store.create_run("r")
    _add(store, run.id, 0.8, max_attempts=2)
    for attempt in (1, 2):
        job = store.claim("w", GPU_A, lease_s=30)
        assert job is not None and job.attempt == attempt
        grade = store.fail(job, f"executor broke #{attempt}")
    assert grade.state is GradeState.DONE and grade.status == "grader_error"
    assert "failed 2 times" in (grade.reason or "") and "executor broke #2" in (grade.reason or "")
    report = json.loads(store.report(grade) or "")
    assert report["status"] == "grader_error" and "executor broke #1" in " ".join(report["reasons"])
    assert store.claim("w", GPU_A, lease_s=30) is None


def test_restarted_worker_settles_its_own_jobs(store: Store) -> None:
    run, _ = store.create_run("r")
    _add(store, run.id, 0.8)
    assert store.claim("host:GPU-aaaa", GPU_A, lease_s=3600) is not None
    assert store.release_stale("host:GPU-bbbb") == 0
    assert store.release_stale("host:GPU-aaaa") == 1  # no hour-long wait for the lease
    job = store.claim("host:GPU-aaaa", GPU_A, lease_s=30)
    assert job is not None and job.attempt == 2


def test_same_tree_is_not_graded_twice_unless_forced(store: Store) -> None:
    run, _ = store.create_run("r")
    other, _ = store.create_run("other")
    first, new1 = _add(store, run.id, 0.8)
    again, new2 = _add(store, run.id, 0.8)
    assert new1 and not new2 and again.id == first.id
    assert len(store.grades(first.id)) == 1
    _, new3 = _add(store, other.id, 0.8)  # another run's own submission
    forced, new4 = _add(store, run.id, 0.8, force=True)
    assert new3 and new4 and forced.id != first.id


def _grader_error() -> str:
    return json.dumps({"status": "grader_error", "score": 0.0, "grader_version": "test",
                       "reasons": ["the grade process ended with no report"], "timing": None})


def test_same_tree_after_a_grader_error_is_graded_again(store: Store) -> None:
    """The grader's failure is no verdict: the agent sends the same tree again and gets a grade
    (it cannot change the tree to get one); a verdict, or a grade still waiting, is kept."""
    run, _ = store.create_run("r")
    sub, _ = _add(store, run.id, 0.8, max_attempts=1)
    again, new = _add(store, run.id, 0.8)  # still queued: nothing more
    assert not new and again.id == sub.id and len(store.grades(sub.id)) == 1
    job = store.claim("w", GPU_A, lease_s=30)
    assert job is not None and store.finish(job, _grader_error()).status == "grader_error"
    again, new = _add(store, run.id, 0.8)
    assert not new and again.id == sub.id
    grades = store.grades(sub.id)
    assert [g.state for g in grades] == [GradeState.DONE, GradeState.QUEUED]
    job = store.claim("w", GPU_A, lease_s=30)
    assert job is not None and store.finish(job, _report(0.8)).status == "scored"
    _add(store, run.id, 0.8)  # a verdict stands: no third grade
    assert len(store.grades(sub.id)) == 2


def test_a_tree_sent_again_counts_against_the_hourly_limit(store: Store) -> None:
    """Sending a tree the grader failed on again queues a grade: it takes GPU time like a new
    submission, so the hourly limit counts it (it did not: resends were unlimited)."""
    run, _ = store.create_run("r", Limits(max_per_hour=2, max_queued=10))
    sub, _ = _add(store, run.id, 0.8, "a", max_attempts=1)
    job = store.claim("w", GPU_A, lease_s=30)
    assert job is not None and store.finish(job, _grader_error()).status == "grader_error"
    again, new = _add(store, run.id, 0.8, "a")  # the second grade asked for this hour
    assert not new and again.id == sub.id and len(store.grades(sub.id)) == 2
    with pytest.raises(LimitExceeded, match=r"2 submissions in the last hour \(1 of them graded "
                                            r"again\); its limit is 2") as exc:  # fmt: skip
        _add(store, run.id, 0.3, "b")
    assert exc.value.http_status == 429
    job = store.claim("w", GPU_A, lease_s=30)
    assert job is not None and store.finish(job, _grader_error()).status == "grader_error"
    with pytest.raises(LimitExceeded, match="in the last hour"):  # a third resend: refused too
        _add(store, run.id, 0.8, "a")
    assert len(store.grades(sub.id)) == 2 and len(store.submissions(run.id)) == 1


def test_run_limits(store: Store) -> None:
    run, _ = store.create_run("r", Limits(max_per_hour=2, max_upload_bytes=1 << 20))
    _add(store, run.id, 0.1, "a")
    _add(store, run.id, 0.2, "b")
    with pytest.raises(LimitExceeded, match="2 submissions in the last hour") as exc:
        _add(store, run.id, 0.3, "c")
    assert exc.value.http_status == 429
    small, _ = store.create_run("s", Limits(max_upload_bytes=10))
    with pytest.raises(LimitExceeded, match="takes at most 10") as exc:
        _add(store, small.id, 0.3)
    assert exc.value.http_status == 413
    assert len(store.submissions(run.id)) == 2 and store.submissions(small.id) == []


def test_final_runs_on_another_gpu_of_the_same_kind(store: Store) -> None:
    run, _ = store.create_run("r")
    low, _ = _add(store, run.id, 0.7, "low")
    best, _ = _add(store, run.id, 0.9, "best")
    for _ in range(2):
        job = store.claim("wa", GPU_A, lease_s=30)
        assert job is not None
        store.finish(job, _report(0.7 if job.submission.id == low.id else 0.9))
    assert store.best(run.id)[0].id == best.id  # type: ignore[index]
    final = store.request_final(run.id)
    assert final.purpose == "final" and final.gpu_kind == "NVIDIA H200"
    assert store.request_final(run.id).id == final.id  # asked twice: one final
    assert store.claim("wa", GPU_A, lease_s=30) is None  # the GPU that graded it
    assert store.claim("wl", GPU_L4, lease_s=30) is None  # another kind
    job = store.claim("wb", GPU_B, lease_s=30)
    assert job is not None and job.grade.id == final.id
    store.finish(job, _report(0.95, half=0.01))
    view = runs.final_view(store, store.grade(final.id))
    # 0.95 vs 0.9 with half widths 0.01 each: beyond the joint ±0.014.
    assert view["gap_flagged"] and view["gap"] == pytest.approx(0.05)
    report = runs.run_report(store, run.id)
    assert report["best"] == best.id and report["final"]["final"]["gpu_uuid"] == "GPU-bbbb"
    assert "BEYOND" in runs.render_run_report(report)


def test_final_on_the_same_gpu_only_when_allowed(store: Store) -> None:
    run, _ = store.create_run("r")
    _add(store, run.id, 0.9)
    job = store.claim("wa", GPU_A, lease_s=30)
    store.finish(job, _report(0.9))  # type: ignore[arg-type]
    store.request_final(run.id, allow_same_gpu=True)
    job = store.claim("wa", GPU_A, lease_s=30)
    assert job is not None and job.grade.purpose == "final"
    store.finish(job, _report(0.901))
    view = runs.final_view(store, store.grade(job.grade.id))
    assert view["submission"] == job.submission.id and not view["gap_flagged"]
    assert view["final"]["gpu_uuid"] == view["grade"]["gpu_uuid"] == "GPU-aaaa"


def test_finalize_needs_a_scored_submission(store: Store) -> None:
    run, _ = store.create_run("r")
    with pytest.raises(StoreError, match="no scored submission"):
        store.request_final(run.id)
    with pytest.raises(Unknown, match="no run 'nope'"):
        store.run("nope")


def test_tokens_are_per_run_and_stored_hashed(store: Store) -> None:
    a, token_a = store.create_run("a")
    b, token_b = store.create_run("b")
    assert store.run_of_token(token_a).id == a.id  # type: ignore[union-attr]
    assert store.run_of_token(token_b).id == b.id  # type: ignore[union-attr]
    assert store.run_of_token("guess") is None
    assert token_a.encode() not in store.db_path.read_bytes()
    op = store.operator_token()
    assert store.is_operator(op) and not store.is_operator(token_a)
    assert (store.root / "operator.token").stat().st_mode & 0o077 == 0


def test_blobs_are_checked_on_read(store: Store) -> None:
    run, _ = store.create_run("r")
    sub, _ = _add(store, run.id, 0.8)
    path = store._blob_path(sub.archive_sha256)
    path.write_bytes(b"tampered")
    with pytest.raises(StoreError, match="has sha256"):
        store.archive(sub.id)


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    Store(tmp_path / "s").close()
    import sqlite3

    db = sqlite3.connect(tmp_path / "s" / "grader.sqlite")
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(StoreError, match="schema version 99 is newer"):
        Store(tmp_path / "s")


def test_the_store_is_its_owners_alone_and_an_old_one_is_made_so(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with Store(root) as store:
        run, _ = store.create_run("r")
        _add(store, run.id, 0.5)
        store.operator_token()
        modes = {p.relative_to(root).as_posix(): p.stat().st_mode & 0o777
                 for p in [root, *root.rglob("*")]}  # fmt: skip (the -wal file lives while open)
    assert modes["."] == 0o700 and modes["blobs"] == 0o700
    assert {"grader.sqlite", "grader.sqlite-wal", "operator.token"} <= set(modes)
    assert all(m == (0o700 if (root / p).is_dir() else 0o600) for p, m in modes.items()), modes
    for path in [root, *root.rglob("*")]:  # an older grader's modes
        path.chmod(0o755 if path.is_dir() else 0o644)
    Store(root).close()
    assert all(p.stat().st_mode & 0o077 == 0 for p in [root, *root.rglob("*")])


def test_no_store_error_names_a_path_of_the_store(tmp_path: Path) -> None:
    root = tmp_path / "secret-place"
    store = Store(root)
    run, _ = store.create_run("r")
    sub, _ = _add(store, run.id, 0.5)
    messages = []
    for call in (lambda: store.run("nope"), lambda: store.submission(99),
                 lambda: store.grade(99), lambda: store.blob("0" * 64)):  # fmt: skip
        with pytest.raises(StoreError) as exc:
            call()
        messages.append(str(exc.value))
    store._blob_path(sub.archive_sha256).write_bytes(b"tampered")
    with pytest.raises(StoreError) as exc:
        store.archive(sub.id)
    messages.append(str(exc.value))
    assert not [m for m in messages if "secret-place" in m or str(tmp_path) in m], messages


def test_a_refused_upload_writes_no_blob_and_orphans_are_collected(store: Store) -> None:
    run, _ = store.create_run("r", Limits(max_per_hour=1, max_queued=10))
    _add(store, run.id, 0.1, "a")
    before = sorted(store.blobs.rglob("*"))
    for salt in "bcd":
        with pytest.raises(LimitExceeded, match="in the last hour"):
            _add(store, run.id, 0.2, salt)
    assert sorted(store.blobs.rglob("*")) == before
    orphan = store._put_blob(b"no row names me")
    (store._blob_path(orphan).parent / ".half.tmp").write_bytes(b"a writer died")
    assert store.collect_orphans() == 2
    assert sorted(store.blobs.rglob("*")) == before  # the submission's archive stays
    assert store.archive(store.submissions(run.id)[0].id)


def test_a_run_has_a_cap_on_grades_waiting(store: Store) -> None:
    run, _ = store.create_run("r", Limits(max_queued=2))
    _add(store, run.id, 0.1, "a")
    _add(store, run.id, 0.2, "b")
    with pytest.raises(LimitExceeded, match="2 grades queued or running; its limit is 2") as exc:
        _add(store, run.id, 0.3, "c")
    assert exc.value.http_status == 429
    job = store.claim("w", GPU_A, lease_s=30)
    assert job is not None
    with pytest.raises(LimitExceeded):  # running still counts
        _add(store, run.id, 0.3, "c")
    store.finish(job, _report(0.1))
    assert _add(store, run.id, 0.3, "c")[1]
    assert Store(store.root).run(run.id).limits == Limits(max_queued=2)


def test_the_queue_takes_runs_in_turn(store: Store) -> None:
    burst, _ = store.create_run("burst", Limits(max_queued=100))
    small, _ = store.create_run("small", Limits(max_queued=100))
    burst_ids = [_add(store, burst.id, 0.5, f"b{i}")[0].id for i in range(6)]
    small_ids = [_add(store, small.id, 0.5, f"s{i}")[0].id for i in range(2)]
    order = []
    while (job := store.claim("w", GPU_A, lease_s=30)) is not None:
        order.append(job.submission.id)
        store.finish(job, _report(0.5))
    # Submitted after the whole burst, the small run's grades come second and fourth.
    assert order == [burst_ids[0], small_ids[0], burst_ids[1], small_ids[1], *burst_ids[2:]]


def test_a_malformed_report_is_refused_and_the_grade_stays_claimed(store: Store) -> None:
    run, _ = store.create_run("r")
    _add(store, run.id, 0.5)
    job = store.claim("w", GPU_A, lease_s=30)
    assert job is not None
    for bad in ("[]", '"scored"', '{"score": 9.9}', '{"status": "scored", "score": "NaN"}',
                '{"status": "scored", "score": 1e999}', '{"status": "x", "reasons": [1]}'):
        with pytest.raises(ValueError):
            store.finish(job, bad)
    assert store.grade(job.grade.id).state is GradeState.RUNNING  # the worker's to settle
    assert store.fail(job, "the report was not a report").state is GradeState.QUEUED


def test_a_v2_store_is_migrated(tmp_path: Path) -> None:
    import sqlite3

    with Store(tmp_path / "s") as store:
        run, token = store.create_run("old")
        store.local_run()
    db = sqlite3.connect(tmp_path / "s" / "grader.sqlite")
    db.execute("ALTER TABLE runs DROP COLUMN max_queued")
    db.execute("ALTER TABLE runs DROP COLUMN last_claim_ts")
    db.execute("PRAGMA user_version=2")
    db.commit()
    db.close()
    with Store(tmp_path / "s") as store:
        assert store.run(run.id).limits.max_queued == Limits.max_queued
        assert store.run("local").limits.max_queued == 1 << 30  # the agent's own: no cap
        assert store.run_of_token(token).id == run.id  # type: ignore[union-attr]


def _crowded(pid: int = 1234) -> str:
    reason = (f"device short: 1 other process holds 120.0 GiB (pid {pid} python3 120.0 GiB); "
              "1.0 GiB of 140.0 GiB free now; the submission's process held 3.0 GiB")
    return json.dumps({"status": "grader_error", "score": 0.0, "reasons": [reason, "gate: oom"],
                       "grader_version": "test", "timing": None})  # fmt: skip


def test_a_crowded_device_grader_error_is_graded_again(store: Store) -> None:
    """A grade that ended grader_error because other processes filled the device is no verdict:
    queued again with why, until the last attempt, whose report stands."""
    run, _ = store.create_run("r")
    sub, _ = _add(store, run.id, 0.8, max_attempts=3)
    for attempt in (1, 2):
        job = store.claim("w", GPU_A, lease_s=30)
        assert job is not None and job.attempt == attempt
        grade = store.finish(job, _crowded(1000 + attempt))
        assert grade.state is GradeState.QUEUED and grade.status is None
        assert f"pid {1000 + attempt} python3" in grade.history[-1]
    job = store.claim("w", GPU_B, lease_s=30)
    assert job is not None and job.attempt == 3
    done = store.finish(job, _crowded(1003))
    assert done.state is GradeState.DONE and done.status == "grader_error"
    assert (done.reason or "").startswith("device short: ") and "pid 1003" in (done.reason or "")
    assert len(done.history) == 2 and store.claim("w", GPU_A, lease_s=30) is None


def test_a_crowded_retry_then_a_verdict(store: Store) -> None:
    run, _ = store.create_run("r")
    _add(store, run.id, 0.8)
    job = store.claim("w", GPU_A, lease_s=30)
    assert job is not None and store.finish(job, _crowded()).state is GradeState.QUEUED
    job = store.claim("w", GPU_A, lease_s=30)
    assert job is not None
    done = store.finish(job, _report(0.8))
    assert done.state is GradeState.DONE and done.status == "scored" and done.score == 0.8


def test_only_a_device_short_grader_error_is_retried() -> None:
    """Parsed strictly: the status grader_error and the first reason's prefix, exactly."""
    from grader.service.verdict import device_short

    short = json.loads(_crowded())
    assert device_short(short).startswith("device short: 1 other process")
    assert device_short({**short, "status": "out_of_memory"}) == ""
    assert device_short({**short, "reasons": ["gate: oom", short["reasons"][0]]}) == ""
    assert device_short({**short, "reasons": ["Device short: x"]}) == ""
    assert device_short({**short, "reasons": []}) == "" and device_short([short]) == ""
    assert device_short({**short, "reasons": [7]}) == ""
