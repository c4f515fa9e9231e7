"""The SQLite submission store: rows, archives, atomic claims, and the errors it raises."""

from __future__ import annotations

import io
import multiprocessing
import sqlite3
import tarfile
from pathlib import Path

import pytest

from grader.agent.store import (
    Store,
    StoreError,
    SubmissionStatus,
    extract_archive,
    make_archive,
    sha256,
)


def _tree(root: Path) -> list[str]:
    (root / "pkg").mkdir(parents=True)
    (root / "solution.py").write_text("print('hi')\n")
    (root / "pkg" / "kernels.py").write_text("X = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    return ["solution.py", "pkg/kernels.py", "run.sh"]


def _add(store: Store, archive: bytes = b"not really a tarball", **kw: object):
    fields = dict(workspace="/ws", commit="c" * 40, tree="t" * 40, archive=archive, files=1)
    fields.update(kw)
    return store.add(**fields)  # type: ignore[arg-type]


def test_archive_is_deterministic_and_round_trips(tmp_path: Path) -> None:
    files = _tree(tmp_path / "a")
    first = make_archive(tmp_path / "a", files)
    # Same content written later, in another order: the same bytes.
    files_b = _tree(tmp_path / "b")
    assert make_archive(tmp_path / "b", list(reversed(files_b))) == first
    out = tmp_path / "out"
    names = extract_archive(first, out)
    assert sorted(names) == sorted(files)
    assert (out / "pkg" / "kernels.py").read_text() == "X = 1\n"
    assert (out / "run.sh").stat().st_mode & 0o111, "the executable bit survives"
    assert not (out / "solution.py").stat().st_mode & 0o111


def test_extract_refuses_paths_outside_the_destination(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.OutsideDestinationError):
        extract_archive(buffer.getvalue(), tmp_path / "dest")
    assert not (tmp_path / "escape.py").exists()


def test_add_get_list_and_the_recorded_hash(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite") as store:
        first = _add(store, note="first")
        second = _add(store, archive=b"other bytes")
        assert (first.id, second.id) == (1, 2)
        assert first.status is SubmissionStatus.QUEUED
        assert first.archive_sha256 == sha256(b"not really a tarball")
        assert first.archive_bytes == len(b"not really a tarball")
        assert first.note == "first" and first.submitted_at.endswith("+00:00")
        assert [r.id for r in store.list()] == [1, 2]
        assert store.archive(2) == b"other bytes"
        assert store.report_json(1) is None
    # Durable: a new connection sees the rows.
    with Store(tmp_path / "s.sqlite") as again:
        assert again.get(2).archive_sha256 == sha256(b"other bytes")


def test_with_tree_finds_every_submission_of_the_same_content(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite") as store:
        _add(store, tree="a" * 40)
        _add(store, tree="b" * 40)
        _add(store, tree="a" * 40, commit="d" * 40)
    # Durable: another connection to the same file finds them.
    with Store(tmp_path / "s.sqlite") as again:
        assert [r.id for r in again.with_tree("a" * 40)] == [1, 3]
        assert [r.commit for r in again.with_tree("a" * 40)] == ["c" * 40, "d" * 40]
        assert again.with_tree("e" * 40) == []


def test_missing_id_says_which_ids_exist(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite") as store:
        with pytest.raises(StoreError, match="no submission 1 .*the store is empty"):
            store.get(1)
        _add(store)
        with pytest.raises(StoreError, match="no submission 7 .*ids go from 1 to 1"):
            store.get(7)


def test_corrupted_archive_is_refused_with_both_hashes(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite") as store:
        record = _add(store)
    db = sqlite3.connect(tmp_path / "s.sqlite")
    db.execute("UPDATE submissions SET archive = ? WHERE id = 1", (b"tampered",))
    db.commit()
    db.close()
    with Store(tmp_path / "s.sqlite") as store:
        with pytest.raises(StoreError) as err:
            store.archive(1)
    assert sha256(b"tampered") in str(err.value) and record.archive_sha256 in str(err.value)


def test_lifecycle_claim_finish_fail_requeue_best(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite") as store:
        for _ in range(3):
            _add(store)
        with pytest.raises(StoreError, match="is queued, not grading"):
            store.finish(1, report_json="{}", grade_status="scored", score=1.0)
        claimed = store.claim("w1")
        assert claimed is not None and claimed.id == 1
        assert claimed.status is SubmissionStatus.GRADING and claimed.worker == "w1"
        assert store.claim("w2", submission_id=1) is None, "a claimed row cannot be claimed again"
        done = store.finish(1, report_json='{"a": 1}', grade_status="scored", score=0.8)
        assert done.status is SubmissionStatus.GRADED and done.finished_at is not None
        assert store.report_json(1) == '{"a": 1}'

        assert store.claim("w1", submission_id=3) is not None
        store.finish(3, report_json="{}", grade_status="scored", score=1.2)
        assert store.claim("w1").id == 2  # type: ignore[union-attr]
        failed = store.fail(2, "the GPU fell off the bus")
        assert failed.status is SubmissionStatus.ERROR and failed.error.startswith("the GPU")
        assert store.best().id == 3  # type: ignore[union-attr]
        again = store.requeue(2)
        assert again.status is SubmissionStatus.QUEUED and again.error is None
        assert store.claim("w1").id == 2  # type: ignore[union-attr]
        assert store.claim("w1") is None


def _claim_all(path: str, worker: str, out: multiprocessing.Queue) -> None:
    with Store(path) as store:
        got = []
        while (record := store.claim(worker)) is not None:
            got.append(record.id)
        out.put(got)


def test_concurrent_workers_claim_each_submission_once(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        for _ in range(60):
            _add(store)
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = ctx.Queue()
    workers = [ctx.Process(target=_claim_all, args=(str(path), f"w{i}", out)) for i in range(4)]
    for w in workers:
        w.start()
    claimed = [i for _ in workers for i in out.get(timeout=60)]
    for w in workers:
        w.join(timeout=60)
    assert sorted(claimed) == list(range(1, 61))


def test_schema_version_mismatch_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema version 99, this grader reads 1"):
        Store(path)


def test_default_path_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from grader.agent.store import default_store_path

    monkeypatch.setenv("GRADER_STORE", str(tmp_path / "x.sqlite"))
    assert default_store_path() == tmp_path / "x.sqlite"
    monkeypatch.delenv("GRADER_STORE")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_store_path() == tmp_path / "dilated-block-task" / "submissions.sqlite"
