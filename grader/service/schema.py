"""The store's SQLite schema and the steps that bring an older store to it (`grader.service.store`
opens a store, reads its ``user_version`` and runs the steps in one transaction). A step gets the
`Store` being opened (typed loosely here: the store imports this module) to write blobs."""

from __future__ import annotations

import hashlib
import sqlite3
from typing import Any

from grader.service.records import Limits

SCHEMA_VERSION = 3
DB_NAME = "grader.sqlite"
LOCAL_RUN = "local"  # the agent's own run when it submits without a service
# The agent's own machine grades its local run: nothing to share, so nothing to cap.
LOCAL_LIMITS = Limits(max_per_hour=1 << 30, max_queued=1 << 30)

SCHEMA = """
CREATE TABLE runs (
    id                TEXT    PRIMARY KEY,
    name              TEXT    NOT NULL,
    created_at        TEXT    NOT NULL,
    token_sha256      TEXT    NOT NULL UNIQUE,
    max_per_hour      INTEGER NOT NULL,
    max_upload_bytes  INTEGER NOT NULL,
    max_queued        INTEGER NOT NULL DEFAULT 8,
    last_claim_ts     REAL    NOT NULL DEFAULT 0
);
CREATE TABLE submissions (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id          TEXT    NOT NULL REFERENCES runs (id),
    commit_id       TEXT    NOT NULL,
    tree_id         TEXT    NOT NULL,
    note            TEXT    NOT NULL DEFAULT '',
    origin          TEXT    NOT NULL DEFAULT '',
    files           INTEGER NOT NULL,
    archive_sha256  TEXT    NOT NULL,
    archive_bytes   INTEGER NOT NULL,
    submitted_at    TEXT    NOT NULL,
    submitted_ts    REAL    NOT NULL
);
CREATE INDEX submissions_run_tree ON submissions (run_id, tree_id);
CREATE TABLE grades (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    submission_id   INTEGER NOT NULL REFERENCES submissions (id),
    purpose         TEXT    NOT NULL CHECK (purpose IN ('grade', 'final')),
    state           TEXT    NOT NULL CHECK (state IN ('queued', 'running', 'done')),
    gpu_kind        TEXT,
    allow_same_gpu  INTEGER NOT NULL DEFAULT 0,
    attempts        INTEGER NOT NULL DEFAULT 0,
    max_attempts    INTEGER NOT NULL,
    worker          TEXT,
    lease_until     REAL,
    queued_at       TEXT    NOT NULL,
    started_at      TEXT,
    finished_at     TEXT,
    gpu_name        TEXT,
    gpu_uuid        TEXT,
    profile         TEXT,
    status          TEXT,
    score           REAL,
    score_low       REAL,
    score_high      REAL,
    reason          TEXT,
    report_sha256   TEXT,
    grader_version  TEXT,
    history         TEXT    NOT NULL DEFAULT '[]'
);
CREATE INDEX grades_queue ON grades (state, id);
CREATE INDEX grades_submission ON grades (submission_id);
"""


def create_schema(db: sqlite3.Connection) -> None:
    """The current schema, statement by statement (``executescript`` would commit the open
    transaction first, and a migration must be all or nothing)."""
    for statement in SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)


def _migrate_v1(db: sqlite3.Connection, store: Any) -> None:
    """v1 (the agent's local store before the service): one ``submissions`` table with the
    archive and report inside. Its rows become run ``local``'s, its archives and reports blobs."""
    db.execute("ALTER TABLE submissions RENAME TO submissions_v1")
    create_schema(db)
    rows = db.execute("SELECT * FROM submissions_v1 ORDER BY id").fetchall()
    if rows:
        store._insert_run(db, LOCAL_RUN, LOCAL_RUN, LOCAL_LIMITS)
    for r in rows:
        archive = bytes(r["archive"])
        store._put_blob(archive)
        db.execute(
            "INSERT INTO submissions (id, run_id, commit_id, tree_id, note, origin, files, "
            "archive_sha256, archive_bytes, submitted_at, submitted_ts) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (r["id"], LOCAL_RUN, r["commit_id"], r["tree_id"], r["note"], r["workspace"],
             r["files"], hashlib.sha256(archive).hexdigest(), len(archive), r["submitted_at"], 0.0),
        )  # fmt: skip
        report = r["report_json"]
        state = {"graded": "done", "error": "done", "grading": "queued"}.get(r["status"], "queued")
        status = r["grade_status"] if r["status"] == "graded" else None
        if r["status"] == "error":
            status = "grader_error"
        db.execute(
            "INSERT INTO grades (submission_id, purpose, state, max_attempts, worker, queued_at, "
            "started_at, finished_at, status, score, reason, report_sha256) "
            "VALUES (?, 'grade', ?, 3, ?, ?, ?, ?, ?, ?, ?, ?)",
            (r["id"], state, r["worker"], r["submitted_at"], r["started_at"], r["finished_at"],
             status, r["score"], r["error"],
             store._put_blob(report.encode()) if report else None),
        )  # fmt: skip
    db.execute("DROP TABLE submissions_v1")


def _migrate_v2(db: sqlite3.Connection, store: Any) -> None:
    """v2 → v3: a run's cap on grades not yet done, and when a worker last took one of its grades
    (the queue takes runs in turn). A v1 store's step made the current tables already."""
    columns = {r[1] for r in db.execute("PRAGMA table_info(runs)")}
    if "max_queued" not in columns:
        db.execute(f"ALTER TABLE runs ADD COLUMN max_queued INTEGER NOT NULL DEFAULT "
                   f"{Limits.max_queued}")
    if "last_claim_ts" not in columns:
        db.execute("ALTER TABLE runs ADD COLUMN last_claim_ts REAL NOT NULL DEFAULT 0")
    db.execute("UPDATE runs SET max_queued = ? WHERE id = ?", (LOCAL_LIMITS.max_queued, LOCAL_RUN))


# version → the step that brings a store of that version to the next one. A new store is made at
# SCHEMA_VERSION at once.
MIGRATIONS = {1: _migrate_v1, 2: _migrate_v2}
