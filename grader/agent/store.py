"""Durable store of submissions: SQLite rows holding the commit, its tree and an archive of it.

The local stand-in for the operator's grading service (SPEC §7). One row per ``submit``: the
commit and tree ids, a deterministic ``tar.gz`` of the exported tree with its sha256, timestamps,
a status, and the grade report's JSON once graded. Workers claim queued rows with one atomic
``UPDATE … RETURNING``, so several graders may share one file on one host (SQLite WAL; not over
a network filesystem).

Statuses: ``queued`` → ``grading`` → ``graded`` (a report exists, whatever its verdict) or
``error`` (the grading machinery failed; the submission is not to blame and may be regraded).
"""

from __future__ import annotations

import enum
import hashlib
import io
import os
import sqlite3
import tarfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

STORE_ENV = "GRADER_STORE"
"""Environment variable naming the SQLite file; default `default_store_path()`."""

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS submissions (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace       TEXT    NOT NULL,
    commit_id       TEXT    NOT NULL,
    tree_id         TEXT    NOT NULL,
    note            TEXT    NOT NULL DEFAULT '',
    files           INTEGER NOT NULL,
    archive         BLOB    NOT NULL,
    archive_sha256  TEXT    NOT NULL,
    archive_bytes   INTEGER NOT NULL,
    submitted_at    TEXT    NOT NULL,
    started_at      TEXT,
    finished_at     TEXT,
    status          TEXT    NOT NULL,
    worker          TEXT,
    grade_status    TEXT,
    score           REAL,
    report_json     TEXT,
    error           TEXT
);
CREATE INDEX IF NOT EXISTS submissions_status ON submissions (status, id);
"""

# Every column but the archive: listing a run must not read every tree back.
_COLUMNS = (
    "id, workspace, commit_id, tree_id, note, files, archive_sha256, archive_bytes, "
    "submitted_at, started_at, finished_at, status, worker, grade_status, score, error"
)


class StoreError(RuntimeError):
    """The store is unreadable, a row is missing, or an archive does not match its hash."""


class UnknownSubmission(StoreError):
    """No submission has that id; the message says which ids exist."""


class SubmissionStatus(enum.StrEnum):
    """Where a stored submission is in its life."""

    QUEUED = "queued"  # stored, not yet picked up
    GRADING = "grading"  # a worker claimed it
    GRADED = "graded"  # a report is stored (its own status says pass or fail)
    ERROR = "error"  # the grading machinery failed; regrade it


@dataclass(frozen=True)
class SubmissionRecord:
    """One stored submission, without its archive bytes.

    Attributes:
        id: Submission id (1, 2, …), unique in the store.
        workspace: Path of the workspace it was sent from.
        commit: Full commit id that was submitted.
        tree: Git tree id of that commit (content identity).
        note: Free text given at submit time.
        files: Number of files in the tree.
        archive_sha256: sha256 of the stored ``tar.gz``.
        archive_bytes: Size of the stored ``tar.gz``.
        submitted_at, started_at, finished_at: ISO-8601 UTC times (None until they happen).
        status: `SubmissionStatus`.
        worker: Who claimed it.
        grade_status: The report's status (``scored``, ``gate_failed``, …) once graded.
        score: The report's score (None when not graded, or graded but not timed).
        error: Why grading failed, for status ``error``.
    """

    id: int
    workspace: str
    commit: str
    tree: str
    note: str
    files: int
    archive_sha256: str
    archive_bytes: int
    submitted_at: str
    started_at: str | None
    finished_at: str | None
    status: SubmissionStatus
    worker: str | None
    grade_status: str | None
    score: float | None
    error: str | None

    @classmethod
    def _from_row(cls, row: sqlite3.Row) -> SubmissionRecord:
        return cls(
            id=row["id"],
            workspace=row["workspace"],
            commit=row["commit_id"],
            tree=row["tree_id"],
            note=row["note"],
            files=row["files"],
            archive_sha256=row["archive_sha256"],
            archive_bytes=row["archive_bytes"],
            submitted_at=row["submitted_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            status=SubmissionStatus(row["status"]),
            worker=row["worker"],
            grade_status=row["grade_status"],
            score=row["score"],
            error=row["error"],
        )


def now_utc() -> str:
    """The current time as ISO-8601 UTC with seconds."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def default_store_path() -> Path:
    """``$GRADER_STORE``, else ``$XDG_DATA_HOME/dilated-block-task/submissions.sqlite``.

    Outside any workspace on purpose: a store inside one would make its tree dirty.
    """
    if os.environ.get(STORE_ENV):
        return Path(os.environ[STORE_ENV]).expanduser()
    data = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return data / "dilated-block-task" / "submissions.sqlite"


# ----------------------------------------------------------------------------- archives


def make_archive(root: Path, files: Sequence[str]) -> bytes:
    """A deterministic ``tar.gz`` of ``files`` (paths relative to ``root``).

    Sorted names, zero times and owners, modes 0644/0755 only: the same tree always gives the
    same bytes, so the sha256 identifies the content.
    """
    buffer = io.BytesIO()
    # mtime=0 in the gzip header too, or the bytes change with the clock.
    with (
        _gzip_writer(buffer) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name in sorted(files):
            path = root / name
            data = path.read_bytes()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@contextmanager
def _gzip_writer(buffer: io.BytesIO) -> Iterator[io.BufferedIOBase]:
    import gzip

    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz:
        yield gz


def extract_archive(data: bytes, dest: Path) -> list[str]:
    """Unpack an archive made by `make_archive` into ``dest``; return the file names.

    Uses tarfile's ``data`` filter: no absolute paths, no ``..``, no links, no devices.
    """
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
        tar.extractall(dest, filter="data")
    return [m.name for m in members if m.isfile()]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- the store


class Store:
    """The SQLite file of submissions. Open one per process; each call uses its own transaction.

    Args:
        path: The database file; its directory is created.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_store_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            # WAL: readers never block the writer; busy_timeout waits out a concurrent claim.
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=30000")
            self._db.executescript(_SCHEMA)
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: schema version {version}, this grader reads {SCHEMA_VERSION}"
                )
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open the submission store {self.path}: {exc}") from exc

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writes

    def add(
        self,
        *,
        workspace: str,
        commit: str,
        tree: str,
        archive: bytes,
        files: int,
        note: str = "",
    ) -> SubmissionRecord:
        """Store a new submission as ``queued`` and return it."""
        cursor = self._db.execute(
            "INSERT INTO submissions (workspace, commit_id, tree_id, note, files, archive, "
            "archive_sha256, archive_bytes, submitted_at, status) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (workspace, commit, tree, note, files, archive, sha256(archive), len(archive),
             now_utc(), SubmissionStatus.QUEUED.value),
        )  # fmt: skip
        assert cursor.lastrowid is not None
        return self.get(cursor.lastrowid)

    def claim(self, worker: str, submission_id: int | None = None) -> SubmissionRecord | None:
        """Move one queued submission (the oldest, or ``submission_id``) to ``grading``.

        One statement, so two workers never claim the same row. Returns None when there is
        nothing queued (or ``submission_id`` is not queued).
        """
        if submission_id is None:
            pick = "(SELECT id FROM submissions WHERE status = ? ORDER BY id LIMIT 1)"
            args: tuple[object, ...] = (SubmissionStatus.QUEUED.value,)
        else:
            pick = "(SELECT id FROM submissions WHERE status = ? AND id = ?)"
            args = (SubmissionStatus.QUEUED.value, submission_id)
        row = self._db.execute(
            f"UPDATE submissions SET status = ?, worker = ?, started_at = ? WHERE id = {pick} "
            "RETURNING id",
            (SubmissionStatus.GRADING.value, worker, now_utc(), *args),
        ).fetchone()
        return None if row is None else self.get(row["id"])

    def finish(
        self, submission_id: int, *, report_json: str, grade_status: str, score: float | None
    ) -> SubmissionRecord:
        """Store the report of a claimed submission; status ``graded``."""
        self._set_done(
            submission_id, SubmissionStatus.GRADED, grade_status=grade_status, score=score,
            report_json=report_json, error=None,
        )  # fmt: skip
        return self.get(submission_id)

    def fail(self, submission_id: int, error: str) -> SubmissionRecord:
        """Record that grading itself failed (not the submission); status ``error``."""
        self._set_done(
            submission_id, SubmissionStatus.ERROR, grade_status=None, score=None,
            report_json=None, error=error,
        )  # fmt: skip
        return self.get(submission_id)

    def requeue(self, submission_id: int) -> SubmissionRecord:
        """Put a submission back in the queue (after an ``error``, or to regrade it)."""
        self._db.execute(
            "UPDATE submissions SET status = ?, worker = NULL, started_at = NULL, "
            "finished_at = NULL, error = NULL WHERE id = ?",
            (SubmissionStatus.QUEUED.value, submission_id),
        )
        return self.get(submission_id)

    def _set_done(self, submission_id: int, status: SubmissionStatus, **values: object) -> None:
        cursor = self._db.execute(
            "UPDATE submissions SET status = ?, finished_at = ?, grade_status = ?, score = ?, "
            "report_json = ?, error = ? WHERE id = ? AND status = ?",
            (status.value, now_utc(), values["grade_status"], values["score"],
             values["report_json"], values["error"], submission_id,
             SubmissionStatus.GRADING.value),
        )  # fmt: skip
        if cursor.rowcount != 1:
            current = self.get(submission_id).status
            raise StoreError(
                f"submission {submission_id} is {current.value}, not grading: claim it first"
            )

    # ------------------------------------------------------------------ reads

    def get(self, submission_id: int) -> SubmissionRecord:
        """The submission ``submission_id``.

        Raises:
            UnknownSubmission: No such submission.
        """
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM submissions WHERE id = ?", (submission_id,)
        ).fetchone()
        if row is None:
            last = self._db.execute("SELECT MAX(id) FROM submissions").fetchone()[0]
            known = "the store is empty" if last is None else f"ids go from 1 to {last}"
            raise UnknownSubmission(f"no submission {submission_id} in {self.path} ({known})")
        return SubmissionRecord._from_row(row)

    def list(self) -> list[SubmissionRecord]:
        """Every submission, oldest first."""
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM submissions ORDER BY id").fetchall()
        return [SubmissionRecord._from_row(r) for r in rows]

    def with_tree(self, tree: str) -> list[SubmissionRecord]:
        """Every submission of the git tree ``tree`` (the same content), oldest first."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM submissions WHERE tree_id = ? ORDER BY id", (tree,)
        ).fetchall()
        return [SubmissionRecord._from_row(r) for r in rows]

    def best(self) -> SubmissionRecord | None:
        """The graded submission with the highest score (the earliest among equals)."""
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM submissions WHERE status = ? AND score IS NOT NULL "
            "ORDER BY score DESC, id ASC LIMIT 1",
            (SubmissionStatus.GRADED.value,),
        ).fetchone()
        return None if row is None else SubmissionRecord._from_row(row)

    def report_json(self, submission_id: int) -> str | None:
        """The stored report of a graded submission (None before)."""
        self.get(submission_id)
        row = self._db.execute(
            "SELECT report_json FROM submissions WHERE id = ?", (submission_id,)
        ).fetchone()
        return row["report_json"]

    def archive(self, submission_id: int) -> bytes:
        """The stored ``tar.gz``, checked against its sha256.

        Raises:
            StoreError: No such submission, or the bytes do not match the recorded hash.
        """
        record = self.get(submission_id)
        row = self._db.execute(
            "SELECT archive FROM submissions WHERE id = ?", (submission_id,)
        ).fetchone()
        data = bytes(row["archive"])
        if sha256(data) != record.archive_sha256:
            raise StoreError(
                f"submission {submission_id}: archive sha256 {sha256(data)} differs from the "
                f"recorded {record.archive_sha256}"
            )
        return data


__all__ = [
    "STORE_ENV",
    "Store",
    "StoreError",
    "SubmissionRecord",
    "SubmissionStatus",
    "UnknownSubmission",
    "default_store_path",
    "extract_archive",
    "make_archive",
    "now_utc",
    "sha256",
]
