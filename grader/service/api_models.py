"""The HTTP API's bodies as pydantic models: what `grader.service.api` accepts and answers, and
what ``/openapi.json`` publishes.

Requests are strict (an integer is an integer, not ``"9"`` nor ``1.5`` nor ``true``; an unknown
field is refused, so a misspelt limit is not silently the default). The views are the dicts of
`grader.service.runs`, documented here field by field; ``extra="allow"`` keeps a field a newer
view adds rather than dropping it on the way out.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from grader.service.records import Limits

# SQLite's INTEGER is 64-bit: a larger limit would be an OverflowError (a 500), not a limit.
_MAX_LIMIT = 1 << 40
PositiveLimit = Annotated[int, Field(strict=True, gt=0, le=_MAX_LIMIT)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _View(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorBody(BaseModel):
    """Every error, whatever the route or the status."""

    error: str


class CreateRun(_Request):
    name: str = Field(min_length=1, max_length=200, pattern=r"\S")
    max_per_hour: PositiveLimit = Limits.max_per_hour
    max_upload_bytes: PositiveLimit = Limits.max_upload_bytes
    max_queued: PositiveLimit = Limits.max_queued


class Finalize(_Request):
    allow_same_gpu: StrictBool = False


class WhoAmI(BaseModel):
    run: str | None
    operator: bool


class CreatedRun(BaseModel):
    run: str
    token: str


class GradeView(_View):
    id: int
    submission: int
    purpose: str
    state: str
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
    score_ci: list[float] | None
    reason: str | None
    report_sha256: str | None
    grader_version: str | None
    history: list[str]


class SubmissionView(_View):
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
    state: str = Field(description="the latest ordinary grade's: queued, running or graded")
    status: str | None
    score: float | None
    score_ci: list[float] | None
    grades: list[GradeView]


class Uploaded(BaseModel):
    submission: SubmissionView
    new: bool = Field(description="false: the run already had this tree (that one is returned)")


class FinalView(_View):
    submission: int
    final: GradeView
    grade: GradeView | None
    gap: float | None
    gap_flagged: bool
    joint_half_width: float | None = None
    gap_note: str | None = None


class Finalized(BaseModel):
    final: FinalView


class Regraded(BaseModel):
    grade: GradeView


class RunStatus(_View):
    run: str
    name: str
    created_at: str
    submissions: int
    by_state: dict[str, int]
    best: int | None
    best_score: float | None
    final: GradeView | None


class RunSubmissions(BaseModel):
    run: str
    submissions: list[SubmissionView]


class Best(BaseModel):
    best: SubmissionView | None


class RunReport(_View):
    run: str
    name: str
    submissions: list[SubmissionView]
    best: int | None
    final: FinalView | None


class Health(BaseModel):
    ok: bool


class Ready(BaseModel):
    ready: bool
    reason: str = Field(description="why not ready; '' when ready")
    workers: list[dict[str, Any]] = Field(
        description="the workers seen within the window: name, device, seconds since")


__all__ = ["Best", "CreateRun", "CreatedRun", "ErrorBody", "Finalize", "Finalized", "FinalView",
           "GradeView", "Health", "Ready", "Regraded", "RunReport", "RunStatus",
           "RunSubmissions", "SubmissionView", "Uploaded", "WhoAmI"]  # fmt: skip
