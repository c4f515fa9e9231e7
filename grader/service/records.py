"""The service's typed rows: runs, submissions, grades, and who grades (a `Device`, a `Job`).

Read from `grader.service.store`; shared by the worker, the executors, the API and the views.
"""

from __future__ import annotations

import enum
import json
import sqlite3
from dataclasses import dataclass
from typing import Any


class GradeState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


@dataclass(frozen=True)
class Limits:
    """A run's limits on what its agent may send.

    Attributes:
        max_per_hour: Grades its agent may ask for in any hour: new submissions, and trees the
            grader failed on sent again (`grader.service.store.Store.add_submission`).
        max_upload_bytes: One archive's bytes.
        max_queued: The run's grades not yet done (queued or running): an upload past it is
            refused (429) until one finishes, so one run's burst never becomes hours of every
            run's GPU time (the queue also takes runs in turn: `Store.claim`).
    """

    max_per_hour: int = 120
    max_upload_bytes: int = 8 << 20
    max_queued: int = 8


@dataclass(frozen=True)
class Run:
    id: str
    name: str
    created_at: str
    limits: Limits


@dataclass(frozen=True)
class Submission:
    id: int
    run: str
    commit: str
    tree: str
    note: str
    origin: str
    files: int
    archive_sha256: str
    archive_bytes: int
    submitted_at: str

    @classmethod
    def _of(cls, row: sqlite3.Row) -> Submission:
        return cls(row["id"], row["run_id"], row["commit_id"], row["tree_id"], row["note"],
                   row["origin"], row["files"], row["archive_sha256"], row["archive_bytes"],
                   row["submitted_at"])  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Grade:
    """One grade of a submission (a job until it is done)."""

    id: int
    submission: int
    purpose: str
    state: GradeState
    attempts: int
    max_attempts: int
    worker: str | None
    queued_at: str
    started_at: str | None
    finished_at: str | None
    gpu_kind: str | None
    allow_same_gpu: bool
    gpu_name: str | None
    gpu_uuid: str | None
    profile: str | None
    status: str | None
    score: float | None
    score_ci: tuple[float, float] | None
    reason: str | None
    report_sha256: str | None
    grader_version: str | None
    history: tuple[str, ...]

    @classmethod
    def _of(cls, row: sqlite3.Row) -> Grade:
        low, high = row["score_low"], row["score_high"]
        return cls(
            id=row["id"], submission=row["submission_id"], purpose=row["purpose"],
            state=GradeState(row["state"]), attempts=row["attempts"],
            max_attempts=row["max_attempts"], worker=row["worker"], queued_at=row["queued_at"],
            started_at=row["started_at"], finished_at=row["finished_at"],
            gpu_kind=row["gpu_kind"], allow_same_gpu=bool(row["allow_same_gpu"]),
            gpu_name=row["gpu_name"], gpu_uuid=row["gpu_uuid"], profile=row["profile"],
            status=row["status"], score=row["score"],
            score_ci=None if low is None or high is None else (low, high),
            reason=row["reason"], report_sha256=row["report_sha256"],
            grader_version=row["grader_version"], history=tuple(json.loads(row["history"])),
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["state"] = self.state.value
        out["score_ci"] = list(self.score_ci) if self.score_ci else None
        out["history"] = list(self.history)
        return out


@dataclass(frozen=True)
class Device:
    """What a worker grades on: a GPU (its name is its kind, its UUID its identity) or the CPU."""

    name: str
    uuid: str
    index: int | None = None  # the CUDA index; None for the CPU (the Triton interpreter)


@dataclass(frozen=True)
class Job:
    """A grade a worker claimed: the attempt it holds, to renew and to finish."""

    grade: Grade
    submission: Submission
    worker: str
    attempt: int
    device: Device


__all__ = ["Device", "Grade", "GradeState", "Job", "Limits", "Run", "Submission"]
