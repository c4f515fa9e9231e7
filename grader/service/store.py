"""The one store of runs, submissions and grades: a SQLite file (WAL) and content-addressed blobs.

    DIR/grader.sqlite        runs, submissions, grades (the queue is the grades not yet done)
    DIR/blobs/ab/abcdef…     archives and reports, named by their sha256, written atomically
    DIR/operator.token       the operator's bearer token, made on first use

The folder is its owner's alone (0700, every file in it 0600, set again on every open): a grade
never runs with access to it (`grader.service.executors`), and no message the store raises names
a path of it (its errors reach run tokens' holders through the API).

Used by the service (`grader.service.http`, the workers, ``python -m grader run …``) and by the
agent's local ``python -m grader submit`` (run ``local``). Several processes on one host may share
a store: every write is one transaction, and a claim is ``BEGIN IMMEDIATE`` (not over a network
filesystem: SQLite's locks need a local one).

A grade is a job: ``queued`` → ``running`` (a worker holds a lease and renews it) → ``done`` (a
report is stored, whatever its verdict). A worker that dies lets its lease expire and the grade is
queued again; after ``max_attempts`` the grade is done as ``grader_error`` with why. A late
worker's report is refused: `finish` checks the worker and attempt that claimed the grade.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from grader.files import write_whole
from grader.service import presence
from grader.service.records import Device, Grade, GradeState, Job, Limits, Run, Submission
from grader.service.schema import (
    DB_NAME,
    LOCAL_LIMITS,
    LOCAL_RUN,
    MIGRATIONS,
    SCHEMA_VERSION,
    create_schema,
)
from grader.service.verdict import device_short

_SUBMISSION = (
    "id, run_id, commit_id, tree_id, note, origin, files, archive_sha256, archive_bytes, "
    "submitted_at"
)


class StoreError(RuntimeError):
    """The store is unreadable, a row is missing, or a blob does not match its hash."""


class Unknown(StoreError):
    """No run, submission or grade has that id."""


class LimitExceeded(StoreError):
    """A run's rate or size limit refused a submission (HTTP 429 or 413)."""

    def __init__(self, message: str, http_status: int) -> None:
        super().__init__(message)
        self.http_status = http_status


def now_utc() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


_DIR_MODE, _FILE_MODE = 0o700, 0o600


def _private(root: Path) -> None:
    """Make ``root`` and everything in it its owner's alone (a store made by an older grader, or
    a file some tool wrote with the default umask). Links are left alone, never followed. A file
    that goes meanwhile (a blob's temporary file renamed by another writer) is skipped."""
    for dirpath, dirnames, filenames in os.walk(root):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(dirpath, _DIR_MODE)
        for name in filenames:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(FileNotFoundError):
                if not os.path.islink(path):
                    os.chmod(path, _FILE_MODE)
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]


# ----------------------------------------------------------------------------- the store


class Store:
    """The store at ``path``: a directory (made if missing), or an existing SQLite file of an
    older version (its blobs go beside it, in ``<file>.blobs``). One per process and thread."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path).expanduser()
        if path.is_file():  # an older single-file store: its folder is not the store's own
            self.root, self.db_path = path.parent, path
            self.blobs = path.parent / f"{path.name}.blobs"
            if self.blobs.is_dir():
                _private(self.blobs)
            os.chmod(self.db_path, _FILE_MODE)
        else:
            path.mkdir(parents=True, exist_ok=True, mode=_DIR_MODE)
            self.root, self.db_path, self.blobs = path, path / DB_NAME, path / "blobs"
            # A store this grader made is private already: walk it (every blob) only when its
            # folder says it is an older one.
            if path.stat().st_mode & 0o077:
                _private(self.root)
            # Made 0600 before SQLite opens it: SQLite gives its -wal and -shm files the
            # database file's mode.
            os.close(os.open(self.db_path, os.O_RDWR | os.O_CREAT, _FILE_MODE))
            os.chmod(self.db_path, _FILE_MODE)
        try:
            self._db = sqlite3.connect(self.db_path, timeout=60.0, isolation_level=None,
                                       check_same_thread=False)  # fmt: skip
            self._db.row_factory = sqlite3.Row
            # WAL: readers never block the writer; busy_timeout waits out a concurrent claim.
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=60000")
            self._db.execute("PRAGMA foreign_keys=ON")
            with self._write() as db:
                self._upgrade(db)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open the store's database: {exc}") from exc

    def _upgrade(self, db: sqlite3.Connection) -> None:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if version == 0 and not tables:
            create_schema(db)
        elif version > SCHEMA_VERSION:
            raise StoreError(f"the store's schema version {version} is newer than this "
                             f"grader's {SCHEMA_VERSION}; upgrade the grader")
        else:
            while version < SCHEMA_VERSION:
                step = MIGRATIONS.get(version)
                if step is None:
                    raise StoreError(f"the store's schema version {version} has no migration "
                                     f"to {SCHEMA_VERSION} (tables {sorted(tables)})")
                step(db, self)
                version += 1
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (``IMMEDIATE``): two claims never interleave."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # ------------------------------------------------------------------ blobs

    def _blob_path(self, digest: str) -> Path:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise StoreError(f"not a sha256: {digest!r}")
        return self.blobs / digest[:2] / digest

    def _put_blob(self, data: bytes) -> str:
        """Write ``data`` under its sha256 (once: a second write of the same bytes is a no-op).
        Written to a temporary file, synced, then renamed: a reader never sees half a blob."""
        digest = sha256(data)
        path = self._blob_path(digest)
        if path.is_file():
            return digest
        self.blobs.mkdir(exist_ok=True, mode=_DIR_MODE)
        path.parent.mkdir(exist_ok=True, mode=_DIR_MODE)
        write_whole(path, data, sync=True)  # mkstemp's 0600
        return digest

    def collect_orphans(self) -> int:
        """Delete the blobs no row names (an upload refused or rolled back after its blob was
        written, a writer that died mid-write); how many. Every blob is written inside a write
        transaction (`_put_blob`'s callers), so under one no blob is between its write and its
        row."""
        if not self.blobs.is_dir():
            return 0
        removed = 0
        with self._write() as db:
            named = {r[0] for r in db.execute(
                "SELECT archive_sha256 FROM submissions UNION "
                "SELECT report_sha256 FROM grades WHERE report_sha256 IS NOT NULL")}
            for path in self.blobs.glob("*/*"):
                if path.name not in named and path.is_file():
                    path.unlink()
                    removed += 1
            for folder in self.blobs.iterdir():
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
        return removed

    def blob(self, digest: str) -> bytes:
        """The bytes stored under ``digest``, checked against it."""
        path = self._blob_path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError as exc:
            raise StoreError(f"blob {digest} is missing from the store") from exc
        if sha256(data) != digest:
            raise StoreError(f"blob {digest} has sha256 {sha256(data)}, not its name's")
        return data

    # ------------------------------------------------------------------ runs and tokens

    def operator_token(self) -> str:
        """The operator's token, made on first use in ``operator.token`` (readable by its owner
        only)."""
        path = self.root / "operator.token"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return path.read_text().strip()
        token = secrets.token_urlsafe(32)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token

    def is_operator(self, token: str) -> bool:
        return secrets.compare_digest(token.encode(), self.operator_token().encode())

    @staticmethod
    def _insert_run(db: sqlite3.Connection, run_id: str, name: str, limits: Limits) -> str:
        token = secrets.token_urlsafe(32)
        db.execute(
            "INSERT INTO runs (id, name, created_at, token_sha256, max_per_hour, "
            "max_upload_bytes, max_queued) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (run_id, name, now_utc(), _token_hash(token), limits.max_per_hour,
             limits.max_upload_bytes, limits.max_queued),
        )  # fmt: skip
        return token

    def create_run(self, name: str, limits: Limits | None = None) -> tuple[Run, str]:
        """A new run and its agent's token (shown once: the store keeps only its hash)."""
        limits = limits or Limits()
        if not name.strip():
            raise StoreError("a run needs a name")
        for field, value in vars(limits).items():
            if not isinstance(value, int) or value < 1:
                raise StoreError(f"a run's {field} must be a positive integer, got {value!r}")
        run_id = f"run-{secrets.token_hex(4)}"
        with self._write() as db:
            token = self._insert_run(db, run_id, name.strip(), limits)
        return self.run(run_id), token

    def local_run(self) -> Run:
        """Run ``local``: the agent's submissions when no service is configured."""
        with self._write() as db:
            if db.execute("SELECT 1 FROM runs WHERE id = ?", (LOCAL_RUN,)).fetchone() is None:
                self._insert_run(db, LOCAL_RUN, LOCAL_RUN, LOCAL_LIMITS)
        return self.run(LOCAL_RUN)

    def run(self, run_id: str) -> Run:
        row = self._db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            known = [r[0] for r in self._db.execute("SELECT id FROM runs ORDER BY created_at")]
            raise Unknown(f"no run {run_id!r} in the store (runs: {known or 'none'})")
        return Run(row["id"], row["name"], row["created_at"],
                   Limits(row["max_per_hour"], row["max_upload_bytes"],
                          row["max_queued"]))  # fmt: skip

    def runs(self) -> list[Run]:
        """Every run, the oldest first."""
        ids = [r[0] for r in self._db.execute("SELECT id FROM runs ORDER BY created_at, id")]
        return [self.run(run_id) for run_id in ids]

    def run_of_token(self, token: str) -> Run | None:
        row = self._db.execute("SELECT id FROM runs WHERE token_sha256 = ?",
                               (_token_hash(token),)).fetchone()  # fmt: skip
        return None if row is None else self.run(row["id"])

    # ------------------------------------------------------------------ submissions

    def add_submission(self, run_id: str, *, commit: str, tree: str, archive: bytes, files: int,
                       note: str = "", origin: str = "", force: bool = False,
                       max_attempts: int = 3) -> tuple[Submission, bool]:  # fmt: skip
        """Store a submission of run ``run_id`` and queue its grade.

        Returns the submission and whether it is new. The same tree already in the run is
        returned as it is, not stored or graded again, unless ``force`` (the operator's call);
        but one whose last grade ended ``grader_error`` (the grader failed, no verdict) gets
        another grade queued.

        Every check (size, duplicate, rate, grades waiting) comes before the archive is written,
        in the one write transaction that then writes it: a refused upload writes nothing.

        Raises:
            LimitExceeded: The run's upload size (413), hourly rate (`_check_rate`: a grade
                queued again counts) or grades waiting (429).
        """
        run = self.run(run_id)
        if len(archive) > run.limits.max_upload_bytes:
            raise LimitExceeded(f"the archive is {len(archive)} bytes; run {run_id} takes at most "
                                f"{run.limits.max_upload_bytes}", 413)  # fmt: skip
        with self._write() as db:
            if not force:
                row = db.execute(f"SELECT {_SUBMISSION} FROM submissions WHERE run_id = ? AND "
                                 "tree_id = ? ORDER BY id LIMIT 1", (run_id, tree)).fetchone()
                if row is not None:
                    same = Submission._of(row)
                    if self._ended_by_the_grader(db, same.id):
                        self._check_rate(db, run, time.time())
                        self._check_waiting(db, run)
                        db.execute("INSERT INTO grades (submission_id, purpose, state, "
                                   "max_attempts, queued_at) VALUES (?, 'grade', 'queued', ?, ?)",
                                   (same.id, max_attempts, now_utc()))  # fmt: skip
                    return same, False
            now = time.time()
            self._check_rate(db, run, now)
            self._check_waiting(db, run)
            digest = self._put_blob(archive)
            cursor = db.execute(
                "INSERT INTO submissions (run_id, commit_id, tree_id, note, origin, files, "
                "archive_sha256, archive_bytes, submitted_at, submitted_ts) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, commit, tree, note, origin, files, digest, len(archive), now_utc(), now),
            )  # fmt: skip
            sub_id = cursor.lastrowid
            db.execute("INSERT INTO grades (submission_id, purpose, state, max_attempts, "
                       "queued_at) VALUES (?, 'grade', 'queued', ?, ?)",
                       (sub_id, max_attempts, now_utc()))  # fmt: skip
        assert sub_id is not None
        return self.submission(sub_id), True

    @staticmethod
    def _check_rate(db: sqlite3.Connection, run: Run, now: float) -> None:
        """The run's hourly limit, on the grades it asked for in the last hour: each new
        submission, and each grade queued again for a stored one (a tree the grader failed on,
        sent again: without this, resending such a tree took GPU time outside the limit). The
        operator's regrades of the run's submissions are counted too: the store cannot tell them
        from a resend, and they take the same GPU time."""
        new = db.execute("SELECT COUNT(*) FROM submissions WHERE run_id = ? AND submitted_ts > ?",
                         (run.id, now - 3600)).fetchone()[0]  # fmt: skip
        cutoff = datetime.fromtimestamp(now - 3600, UTC).isoformat(timespec="seconds")
        again = db.execute(
            "SELECT COUNT(*) FROM grades g JOIN submissions s ON s.id = g.submission_id "
            "WHERE s.run_id = ? AND g.purpose = 'grade' AND g.queued_at > ? "
            "AND g.id > (SELECT MIN(id) FROM grades WHERE submission_id = s.id)",
            (run.id, cutoff),
        ).fetchone()[0]
        if new + again >= run.limits.max_per_hour:
            resent = f" ({again} of them graded again)" if again else ""
            raise LimitExceeded(f"run {run.id} has had {new + again} submissions in the last "
                                f"hour{resent}; its limit is {run.limits.max_per_hour}", 429)

    @staticmethod
    def _check_waiting(db: sqlite3.Connection, run: Run) -> None:
        waiting = db.execute("SELECT COUNT(*) FROM grades g JOIN submissions s ON s.id = "
                             "g.submission_id WHERE s.run_id = ? AND g.state != 'done'",
                             (run.id,)).fetchone()[0]  # fmt: skip
        if waiting >= run.limits.max_queued:
            raise LimitExceeded(f"run {run.id} has {waiting} grades queued or running; its "
                                f"limit is {run.limits.max_queued}: submit again when one "
                                "is done", 429)  # fmt: skip

    @staticmethod
    def _ended_by_the_grader(db: sqlite3.Connection, submission_id: int) -> bool:
        """Whether the submission's last ordinary grade is done as ``grader_error`` with none
        waiting: the grader's failure, not a verdict, so the same tree sent again is graded
        again (an agent cannot change a tree the grader failed on to get a grade)."""
        pending = db.execute("SELECT COUNT(*) FROM grades WHERE submission_id = ? AND "
                             "state != 'done'", (submission_id,)).fetchone()[0]  # fmt: skip
        last = db.execute("SELECT status FROM grades WHERE submission_id = ? AND purpose = "
                          "'grade' ORDER BY id DESC LIMIT 1", (submission_id,)).fetchone()
        return not pending and last is not None and last[0] == "grader_error"

    def submission(self, submission_id: int) -> Submission:
        row = self._db.execute(f"SELECT {_SUBMISSION} FROM submissions WHERE id = ?",
                               (submission_id,)).fetchone()  # fmt: skip
        if row is None:
            last = self._db.execute("SELECT MAX(id) FROM submissions").fetchone()[0]
            known = "the store has none" if last is None else f"ids go from 1 to {last}"
            raise Unknown(f"no submission {submission_id} in the store ({known})")
        return Submission._of(row)

    def submissions(self, run_id: str) -> list[Submission]:
        rows = self._db.execute(f"SELECT {_SUBMISSION} FROM submissions WHERE run_id = ? "
                                "ORDER BY id", (run_id,)).fetchall()  # fmt: skip
        return [Submission._of(r) for r in rows]

    def archive(self, submission_id: int) -> bytes:
        return self.blob(self.submission(submission_id).archive_sha256)

    # ------------------------------------------------------------------ grades

    def grade(self, grade_id: int) -> Grade:
        row = self._db.execute("SELECT * FROM grades WHERE id = ?", (grade_id,)).fetchone()
        if row is None:
            raise Unknown(f"no grade {grade_id} in the store")
        return Grade._of(row)

    def grades(self, submission_id: int) -> list[Grade]:
        rows = self._db.execute("SELECT * FROM grades WHERE submission_id = ? ORDER BY id",
                                (submission_id,)).fetchall()  # fmt: skip
        return [Grade._of(r) for r in rows]

    def report(self, grade: Grade) -> str | None:
        return None if grade.report_sha256 is None else self.blob(grade.report_sha256).decode()

    def regrade(self, submission_id: int, max_attempts: int = 3) -> Grade:
        """Queue another ordinary grade of a stored submission (the operator's call)."""
        self.submission(submission_id)
        with self._write() as db:
            cursor = db.execute("INSERT INTO grades (submission_id, purpose, state, max_attempts, "
                                "queued_at) VALUES (?, 'grade', 'queued', ?, ?)",
                                (submission_id, max_attempts, now_utc()))  # fmt: skip
        assert cursor.lastrowid is not None
        return self.grade(cursor.lastrowid)

    def best(self, run_id: str) -> tuple[Submission, Grade] | None:
        """The run's submission with the highest score among its ordinary grades (the earliest
        among equals), with that grade."""
        row = self._db.execute(
            "SELECT g.id FROM grades g JOIN submissions s ON s.id = g.submission_id "
            "WHERE s.run_id = ? AND g.purpose = 'grade' AND g.state = 'done' "
            "AND g.status = 'scored' ORDER BY g.score DESC, s.id ASC, g.id ASC LIMIT 1",
            (run_id,),
        ).fetchone()
        if row is None:
            return None
        grade = self.grade(row["id"])
        return self.submission(grade.submission), grade

    def request_final(self, run_id: str, *, allow_same_gpu: bool = False,
                      max_attempts: int = 3) -> Grade:  # fmt: skip
        """Queue the final regrade of the run's best submission: the same kind of GPU as its
        grade, another UUID than every grade of it (unless ``allow_same_gpu``). A final already
        queued, running or done for that submission is returned instead."""
        best = self.best(run_id)
        if best is None:
            raise StoreError(f"run {run_id} has no scored submission to finalize")
        submission, grade = best
        with self._write() as db:
            row = db.execute("SELECT id FROM grades WHERE submission_id = ? AND purpose = 'final' "
                             "AND (state != 'done' OR status != 'grader_error') ORDER BY id DESC "
                             "LIMIT 1", (submission.id,)).fetchone()  # fmt: skip
            if row is not None:
                return self.grade(row["id"])
            cursor = db.execute(
                "INSERT INTO grades (submission_id, purpose, state, gpu_kind, allow_same_gpu, "
                "max_attempts, queued_at) VALUES (?, 'final', 'queued', ?, ?, ?, ?)",
                (submission.id, grade.gpu_name, int(allow_same_gpu), max_attempts, now_utc()),
            )  # fmt: skip
        assert cursor.lastrowid is not None
        return self.grade(cursor.lastrowid)

    def final(self, run_id: str) -> Grade | None:
        """The run's latest final regrade, whatever its state."""
        row = self._db.execute(
            "SELECT g.id FROM grades g JOIN submissions s ON s.id = g.submission_id "
            "WHERE s.run_id = ? AND g.purpose = 'final' ORDER BY g.id DESC LIMIT 1", (run_id,),
        ).fetchone()  # fmt: skip
        return None if row is None else self.grade(row["id"])

    # ------------------------------------------------------------------ the queue

    def claim(self, worker: str, device: Device, lease_s: float) -> Job | None:
        """Take the next grade this worker may run, or None: finals first, then runs in turn
        (the run with the fewest grades running, then the one whose grade a worker took
        longest ago), and each run's grades in the order they came.

        Runs in turn: one run's burst of submissions delays another run's next grade by at most
        one grade per worker, never by the burst. A final needs a GPU of the kind its submission
        was graded on and, unless allowed, a UUID none of its grades ran on. Expired leases are
        settled first (`expire_leases`).
        """
        presence.note(self, worker, device.name)  # /readyz: a worker looks even when idle
        self.expire_leases()
        with self._write() as db:
            row = db.execute(
                "SELECT g.id, s.run_id FROM grades g JOIN submissions s ON s.id = g.submission_id "
                "JOIN runs r ON r.id = s.run_id WHERE g.state = 'queued' AND "
                "(g.purpose = 'grade' OR (g.gpu_kind IS ? AND (g.allow_same_gpu OR NOT EXISTS "
                "(SELECT 1 FROM grades o WHERE o.submission_id = g.submission_id AND o.id != g.id "
                "AND o.gpu_uuid = ?)))) ORDER BY g.purpose = 'final' DESC, "
                "(SELECT COUNT(*) FROM grades x JOIN submissions y ON y.id = x.submission_id "
                "WHERE y.run_id = s.run_id AND x.state = 'running'), r.last_claim_ts, g.id "
                "LIMIT 1",
                (device.name, device.uuid),
            ).fetchone()  # fmt: skip
            if row is None:
                return None
            now = time.time()
            db.execute("UPDATE grades SET state = 'running', worker = ?, attempts = attempts + 1, "
                       "lease_until = ?, started_at = ? WHERE id = ?",
                       (worker, now + lease_s, now_utc(), row["id"]))  # fmt: skip
            # Strictly increasing even when two claims share a clock tick.
            db.execute("UPDATE runs SET last_claim_ts = MAX(?, (SELECT MAX(last_claim_ts) "
                       "FROM runs) + 1e-6) WHERE id = ?", (now, row["run_id"]))
        grade = self.grade(row["id"])
        return Job(grade, self.submission(grade.submission), worker, grade.attempts, device)

    def heartbeat(self, job: Job, lease_s: float) -> bool:
        """Renew the lease; False when the job is no longer this worker's (its lease expired and
        another attempt began, or it was settled)."""
        presence.note(self, job.worker, job.device.name)
        with self._write() as db:
            cursor = db.execute("UPDATE grades SET lease_until = ? WHERE id = ? AND state = "
                                "'running' AND worker = ? AND attempts = ?",
                                (time.time() + lease_s, job.grade.id, job.worker, job.attempt))
        return cursor.rowcount == 1

    def finish(self, job: Job, report_json: str) -> Grade:
        """Store the report of a claimed grade: its status and score read from it, the device
        the worker's (what the final's other-GPU rule compares).

        Raises:
            StoreError: The job is no longer this worker's attempt (the report is not stored).
            ValueError: The report is not a report (the executor checks it strictly first:
                `grader.service.verdict`; this is the store's own floor).
        """
        report = json.loads(report_json)
        if not isinstance(report, dict) or not isinstance(report.get("status"), str):
            raise ValueError(f"a report is a JSON object with a status, not "
                             f"{type(report).__name__} {str(report)[:80]!r}")  # fmt: skip
        timing = report.get("timing") if isinstance(report.get("timing"), dict) else {}
        ci = timing.get("score_ci") or (None, None)
        score = report.get("score")
        if score is not None and (not isinstance(score, int | float) or not math.isfinite(score)):
            raise ValueError(f"a report's score is a finite number or null, not {score!r}")
        if not (isinstance(ci, list | tuple) and len(ci) == 2):
            raise ValueError(f"a report's score_ci is two numbers or null, not {ci!r}")
        reasons = report.get("reasons") or ()
        if not isinstance(reasons, list | tuple) or not all(isinstance(r, str) for r in reasons):
            raise ValueError(f"a report's reasons are strings, not {str(reasons)[:80]!r}")
        short = device_short(report)
        if short and job.attempt < job.grade.max_attempts:
            # Others' memory filled the device: no verdict, another attempt (the last one's stands).
            return self.fail(job, short)
        with self._write() as db:
            digest = self._put_blob(report_json.encode())
            cursor = db.execute(
                "UPDATE grades SET state = 'done', finished_at = ?, lease_until = NULL, "
                "status = ?, score = ?, score_low = ?, score_high = ?, reason = ?, "
                "report_sha256 = ?, gpu_name = ?, gpu_uuid = ?, profile = ?, grader_version = ? "
                "WHERE id = ? AND state = 'running' AND worker = ? AND attempts = ?",
                (now_utc(), report["status"], score, ci[0], ci[1],
                 "; ".join(reasons) or None, digest, job.device.name,
                 job.device.uuid, timing.get("profile"), report.get("grader_version"),
                 job.grade.id, job.worker, job.attempt),
            )  # fmt: skip
        if cursor.rowcount != 1:
            raise StoreError(f"grade {job.grade.id} attempt {job.attempt} is no longer "
                             f"{job.worker}'s (now {self.grade(job.grade.id).state.value}, "
                             f"attempt {self.grade(job.grade.id).attempts}); report not stored")
        return self.grade(job.grade.id)

    def fail(self, job: Job, reason: str) -> Grade:
        """This attempt failed without a verdict (the executor broke, or the device was short of
        memory; not the submission): queued again, or past ``max_attempts`` done as
        ``grader_error`` with every attempt's reason."""
        with self._write() as db:
            row = db.execute("SELECT * FROM grades WHERE id = ? AND state = 'running' AND "
                             "worker = ? AND attempts = ?",
                             (job.grade.id, job.worker, job.attempt)).fetchone()  # fmt: skip
            if row is not None:
                self._settle_attempt(db, Grade._of(row), f"{job.worker}: {reason}")
        return self.grade(job.grade.id)

    def _settle_attempt(self, db: sqlite3.Connection, grade: Grade, reason: str) -> None:
        history = [*grade.history, f"attempt {grade.attempts}: {reason}"]
        if grade.attempts < grade.max_attempts:
            db.execute("UPDATE grades SET state = 'queued', worker = NULL, lease_until = NULL, "
                       "started_at = NULL, history = ? WHERE id = ?",
                       (json.dumps(history), grade.id))  # fmt: skip
            return
        why = (f"grading failed {grade.attempts} times (the limit is {grade.max_attempts}); "
               f"last: {reason}")
        report = _error_report(why, history)
        db.execute("UPDATE grades SET state = 'done', finished_at = ?, lease_until = NULL, "
                   "status = 'grader_error', score = NULL, reason = ?, report_sha256 = ?, "
                   "history = ? WHERE id = ?",
                   (now_utc(), why, self._put_blob(report.encode()), json.dumps(history),
                    grade.id))  # fmt: skip

    def expire_leases(self) -> int:
        """Settle every running grade whose lease ran out (its worker died or hung); how many."""
        with self._write() as db:
            rows = db.execute("SELECT * FROM grades WHERE state = 'running' AND lease_until < ?",
                              (time.time(),)).fetchall()  # fmt: skip
            for row in rows:
                grade = Grade._of(row)
                self._settle_attempt(db, grade, f"{grade.worker}: its lease expired (the worker "
                                                "died or stopped renewing it)")
        return len(rows)

    def release_stale(self, worker: str) -> int:
        """A worker that starts settles the grades it held before (it died with them)."""
        with self._write() as db:
            rows = db.execute("SELECT * FROM grades WHERE state = 'running' AND worker = ?",
                              (worker,)).fetchall()  # fmt: skip
            for row in rows:
                self._settle_attempt(db, Grade._of(row), f"{worker} restarted while holding it")
        return len(rows)

    def queued(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM grades WHERE state != 'done'").fetchone()[0]


def _error_report(reason: str, history: list[str]) -> str:
    """A report of status ``grader_error`` for a grade no attempt could finish."""
    return json.dumps({"status": "grader_error", "score": 0.0, "reasons": [reason, *history],
                       "generated_at": now_utc()}, indent=2)  # fmt: skip


__all__ = [
    "DB_NAME", "LOCAL_RUN", "SCHEMA_VERSION", "Device", "Grade", "GradeState", "Job", "Limits",
    "LimitExceeded", "Run", "Store", "StoreError", "Submission", "Unknown", "now_utc", "sha256",
]  # fmt: skip
