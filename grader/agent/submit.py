"""The agent's ``submit``: send the committed HEAD to the grading store, grade it, show reports.

Run from the workspace::

    python -m grader submit [--wait] [--allow-dirty] [--note TEXT]   # send HEAD
    python -m grader submit list                                     # every submission
    python -m grader submit show ID [--json FILE]                    # one, with its report
    python -m grader submit grade [ID]                               # local worker

A submission is the tree of HEAD, never the working copy: ``submit`` refuses while there are
uncommitted changes (``--allow-dirty`` sends HEAD anyway and says what was left out). The tree is
exported with the grader's own export (`grader.workspace`: same limits, no filters or hooks),
archived deterministically and stored with its commit and tree ids (`grader.agent.store`). A tree
that was submitted before is stored again, with a warning naming the earlier submissions and their
status.

Until the operator's grading service is connected, the store is a local SQLite file and
``--wait`` (or ``grade``) grades right here: the archive is unpacked into a fresh repository, its
tree id must equal the stored one, and the grader's ``grade`` pipeline runs on it with a fresh
secret seed. Where the reference is not installed (the agent's own environment) the same gate runs
on every case with a secret seed, timing runs against plain PyTorch, and the score is an estimate
from the reference's published speedups (`grader.agent.check`); the report says so.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import sys
import tempfile
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from grader.agent import worktree
from grader.agent.store import (
    Store,
    StoreError,
    SubmissionRecord,
    SubmissionStatus,
    UnknownSubmission,
    extract_archive,
    make_archive,
)
from grader.config import ConfigError, load_config
from grader.report import ExitCode
from grader.workspace import SubmissionError, export_submission

# Exit statuses of submit itself (grading exits with the report's `grader.report.ExitCode`).
EXIT_OK = 0
EXIT_REFUSED = 2  # dirty tree, no commit, not a workspace, bad arguments
EXIT_INVALID = int(ExitCode.INVALID_SUBMISSION)  # the tree is over the limits or has no solution
EXIT_STORE = int(ExitCode.GRADER_ERROR)  # the store or the grading machinery failed

# Identity of the commit that rebuilds a stored tree for grading; the tree id is what must match.
_REBUILD_ID = {
    "GIT_AUTHOR_NAME": "grader.submit",
    "GIT_AUTHOR_EMAIL": "submit@localhost",
    "GIT_COMMITTER_NAME": "grader.submit",
    "GIT_COMMITTER_EMAIL": "submit@localhost",
}


class Refused(RuntimeError):
    """``submit`` will not send: the message says why and what to do."""


@dataclass(frozen=True)
class Graded:
    """One grade of a stored submission.

    Attributes:
        record: The submission after grading.
        text: The report for people.
        exit_code: The report's exit code.
    """

    record: SubmissionRecord
    text: str
    exit_code: int


def submit(
    workspace: str | Path | None = None,
    *,
    store: Store,
    allow_dirty: bool = False,
    note: str = "",
) -> tuple[SubmissionRecord, tuple[str, ...]]:
    """Store the committed HEAD of ``workspace`` as a queued submission.

    Returns:
        The stored record and the uncommitted changes that were left out (with ``allow_dirty``).

    Raises:
        Refused: Not a workspace, no commit yet, or uncommitted changes without ``allow_dirty``.
        SubmissionError: The committed tree breaks the grader's limits.
    """
    try:
        root = worktree.find_root(workspace)
        where = worktree.state(root)
    except worktree.WorktreeError as exc:
        raise Refused(str(exc)) from exc
    if where.head is None:
        raise Refused(
            f"{root} has no commit yet, and a submission is a commit. Run: git add -A && "
            "git commit -m 'first version', then submit again."
        )
    if where.dirty and not allow_dirty:
        listed = "\n".join(f"    {line}" for line in where.changes[:20])
        more = f"\n    ... {len(where.changes) - 20} more" if len(where.changes) > 20 else ""
        raise Refused(
            f"refusing to submit: {len(where.changes)} uncommitted change(s) in {root}:\n"
            f"{listed}{more}\n"
            f"A submission is the committed HEAD ({where.head[:12]}); these changes would not be "
            "in it.\nCommit them (git add -A && git commit -m '...') and submit again, or run "
            "python -m grader submit --allow-dirty to send HEAD without them."
        )
    config = load_config()
    with tempfile.TemporaryDirectory(prefix="submit-") as tmp:
        exported = export_submission(root, Path(tmp) / "tree", config.limits, rev=where.head)
        archive = make_archive(exported.root, exported.files)
    record = store.add(
        workspace=str(root),
        commit=exported.commit,
        tree=exported.tree,
        archive=archive,
        files=len(exported.files),
        note=note,
    )
    return record, where.changes if allow_dirty else ()


def _worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def rebuild_repository(store: Store, record: SubmissionRecord, dest: Path) -> Path:
    """Unpack a stored archive into a fresh one-commit repository whose tree id is the stored one.

    Raises:
        StoreError: The archive's hash or the rebuilt tree id does not match the record.
    """
    extract_archive(store.archive(record.id), dest)
    worktree.git(dest, "init", "--quiet")
    worktree.git(dest, "add", "--all", ".")
    worktree.git(
        dest, "commit", "--quiet", "--no-verify", "-m", f"submission {record.id} "
        f"(commit {record.commit})", extra_env=_REBUILD_ID,
    )  # fmt: skip
    tree = worktree.git(dest, "rev-parse", "HEAD^{tree}")
    if tree != record.tree:
        raise StoreError(
            f"submission {record.id}: the archive rebuilds tree {tree}, the record says "
            f"{record.tree}"
        )
    return dest


def reference_available() -> bool:
    """Whether the reference is installed here (the operator's grader has it; agents do not)."""
    return importlib.util.find_spec("reference") is not None


def grade_submission(
    store: Store, submission_id: int | None = None, *, progress: bool = True
) -> Graded | None:
    """Claim a queued submission (``submission_id`` or the oldest) and grade it here.

    Returns:
        The graded result, or None when nothing (or not that id) is queued.
    """
    record = store.claim(_worker(), submission_id)
    if record is None:
        return None
    try:
        with tempfile.TemporaryDirectory(prefix="submission-") as tmp:
            repo = rebuild_repository(store, record, Path(tmp) / "repo")
            if reference_available():
                payload, text, status, score, code = _grade_full(repo, record, progress)
            else:
                payload, text, status, score, code = _grade_estimate(repo, record, progress)
    except Exception as exc:  # noqa: BLE001 - a failure of the machinery is stored, not raised
        detail = f"{exc!r}\n{traceback.format_exc(limit=8)}"
        failed = store.fail(record.id, detail)
        return Graded(failed, f"grading failed (not your submission's fault): {exc!r}",
                      EXIT_STORE)  # fmt: skip
    payload["submission"] = {"id": record.id, "commit": record.commit, "tree": record.tree}
    payload["report_text"] = text
    graded = store.finish(
        record.id, report_json=json.dumps(payload), grade_status=status, score=score
    )
    return Graded(graded, text, code)


def _grade_full(
    repo: Path, record: SubmissionRecord, progress: bool
) -> tuple[dict, str, str, float | None, int]:
    """The grader's own ``grade`` (secret seed, every case, the reference timed alongside)."""
    from dataclasses import replace

    from grader.grade import GradeOptions, grade
    from grader.report import render_table

    report = grade(repo, GradeOptions(progress=progress))
    if report.tree == record.tree:
        # The rebuilt repository holds the submitted tree under a new commit id: name the
        # commit the agent sent (same tree, checked in rebuild_repository).
        report = replace(report, workspace=record.workspace, commit=record.commit)
    payload = {"kind": "grade", "report": report.to_dict()}
    return payload, render_table(report), report.status.value, report.score, int(report.exit_code)


def _grade_estimate(
    repo: Path, record: SubmissionRecord, progress: bool
) -> tuple[dict, str, str, float | None, int]:
    """Without the reference: the full gate with a secret seed, timing against plain PyTorch,
    and the score estimated from published g (`grader.agent.check`)."""
    import torch

    from grader.agent.check import run_check
    from grader.agent.check_report import Mode, render

    secret = int.from_bytes(os.urandom(8), "little") >> 1
    # As `grader.grade` does: every case on a GPU, the smoke cases through the interpreter.
    mode = Mode.FULL if torch.cuda.is_available() else Mode.QUICK
    report = run_check(
        repo, mode=mode, commit="HEAD", secret=secret,
        progress=sys.stderr if progress else None,
    )  # fmt: skip
    from dataclasses import replace

    not_checked = [n for n in report.not_checked if not n.startswith("the other cases")]
    if mode is Mode.QUICK:
        not_checked.insert(0, "correctness on the cases not marked smoke: a CPU run checks the "
                           "smoke cases only")
    steps = ["submit improvements as often as you like: python -m grader submit list shows "
             "the best, which is what counts"]
    if report.status.passed and mode is Mode.QUICK:
        steps.insert(0, "on the GPU this grade runs every case and times your block")
    report = replace(
        report, workspace=record.workspace, source=f"submission #{record.id}, commit "
        f"{record.commit[:12]}", not_checked=tuple(not_checked),
        next_steps=tuple(steps) if report.status.passed else report.next_steps,
    )  # fmt: skip
    score = None
    if report.estimate is not None:
        score = report.estimate.score
    elif not report.status.passed:
        score = 0.0
    text = (
        "LOCAL ESTIMATE: the reference is not installed here, so its g is the published one and "
        "this score is an estimate; the operator's grade measures g in the same run.\n"
        + render(report)
    )
    payload = {"kind": "local-estimate", "report": report.to_dict()}
    return payload, text, report.status.value, score, report.exit_code


# ----------------------------------------------------------------------------- output


def _score(record: SubmissionRecord) -> str:
    if record.status is not SubmissionStatus.GRADED:
        return "-"
    return "none (untimed)" if record.score is None else f"{record.score:.4f}"


def render_list(records: Sequence[SubmissionRecord], best: SubmissionRecord | None) -> str:
    """One line per submission, oldest first, then the best."""
    if not records:
        return "no submissions yet: commit, then python -m grader submit --wait"
    lines = [f"{'id':>4}  {'submitted (UTC)':<25} {'commit':<12} {'status':<8} "
             f"{'result':<16} {'score':<14} note"]  # fmt: skip
    for r in records:
        lines.append(
            f"{r.id:>4}  {r.submitted_at:<25} {r.commit[:12]:<12} {r.status.value:<8} "
            f"{(r.grade_status or '-'):<16} {_score(r):<14} {r.note}"
        )
    if best is not None:
        lines.append(f"best: #{best.id} (commit {best.commit[:12]}), score {best.score:.4f}")
    return "\n".join(lines)


def _state(record: SubmissionRecord) -> str:
    """``graded, checked_untimed, score none (untimed)``: where it stands and what it got."""
    grade = f", {record.grade_status}" if record.grade_status else ""
    return f"{record.status.value}{grade}, score {_score(record)}"


def render_same_tree(record: SubmissionRecord, earlier: Sequence[SubmissionRecord]) -> str:
    """The warning for a submission whose tree was already submitted (stored all the same)."""
    named = "; ".join(f"#{r.id} ({_state(r)})" for r in earlier[-5:])
    more = f" and {len(earlier) - 5} earlier" if len(earlier) > 5 else ""
    return (
        f"warning: #{record.id} has the same tree {record.tree[:12]} as {named}{more}: stored "
        f"anyway, but it is the same content (to submit a change, commit it first; python -m "
        f"grader submit show {earlier[-1].id} shows #{earlier[-1].id})"
    )


def render_record(record: SubmissionRecord, store: Store) -> str:
    """A submission's facts and, once graded, its report."""
    lines = [
        f"submission #{record.id}: {_state(record)}",
        f"  commit {record.commit}  tree {record.tree}  ({record.files} files)",
        f"  archive sha256 {record.archive_sha256} ({record.archive_bytes} bytes)",
        f"  from {record.workspace}",
        f"  submitted {record.submitted_at}  started {record.started_at or '-'}  "
        f"finished {record.finished_at or '-'}",
    ]
    if record.note:
        lines.append(f"  note: {record.note}")
    if record.status is SubmissionStatus.ERROR:
        lines.append(f"  grading failed: {record.error}")
        lines.append(f"next: python -m grader submit grade {record.id} grades it again")
    raw = store.report_json(record.id)
    if raw:
        lines.append("")
        lines.append(json.loads(raw).get("report_text", ""))
    elif record.status is SubmissionStatus.QUEUED:
        lines.append(f"next: python -m grader submit grade {record.id} grades it here")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    store_opt = argparse.ArgumentParser(add_help=False)
    store_opt.add_argument("--store", default=argparse.SUPPRESS, metavar="FILE",
                           help="the SQLite store (default: $GRADER_STORE or ~/.local/share/...)")
    p = argparse.ArgumentParser(
        prog="python -m grader submit",
        description="Submit your workspace's committed HEAD for grading, or look at submissions.",
        parents=[store_opt],
    )
    p.add_argument("--wait", action="store_true", help="grade it now and print the report")
    p.add_argument("--allow-dirty", action="store_true",
                   help="send HEAD even though there are uncommitted changes (they are left out)")
    p.add_argument("--note", default="", help="a note stored with the submission")
    p.add_argument("--workspace", metavar="DIR", help="workspace (default: the current directory)")
    p.add_argument("--quiet", action="store_true", help="no progress output while grading")
    sub = p.add_subparsers(dest="command", metavar="{list,show,grade}")
    sub.add_parser("list", parents=[store_opt], help="every submission, with status and score")
    show = sub.add_parser("show", parents=[store_opt], help="one submission and its report")
    show.add_argument("id", type=int)
    show.add_argument("--json", metavar="FILE", help="write its stored report JSON here")
    grade = sub.add_parser("grade", parents=[store_opt],
                           help="local worker: grade submission ID, or every queued one")
    grade.add_argument("id", type=int, nargs="?")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        store = Store(getattr(args, "store", None))
    except StoreError as exc:
        print(f"submit: {exc}", file=sys.stderr)
        return EXIT_STORE
    with store:
        try:
            return _dispatch(args, store)
        except UnknownSubmission as exc:
            print(f"submit: {exc}; python -m grader submit list shows them", file=sys.stderr)
            return EXIT_REFUSED
        except (StoreError, ConfigError) as exc:
            print(f"submit: {exc}", file=sys.stderr)
            return EXIT_STORE


def _dispatch(args: argparse.Namespace, store: Store) -> int:
    if args.command == "list":
        print(render_list(store.list(), store.best()))
        return EXIT_OK
    if args.command == "show":
        record = store.get(args.id)
        print(render_record(record, store))
        if args.json:
            raw = store.report_json(record.id)
            if raw is None:
                print(f"submission {record.id} has no report yet ({record.status.value})")
                return EXIT_REFUSED
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(json.loads(raw), indent=2) + "\n")
            print(f"report written to {os.path.abspath(args.json)}")
        return EXIT_OK
    if args.command == "grade":
        return _grade_command(store, args.id, progress=not args.quiet)

    try:
        record, left_out = submit(
            args.workspace, store=store, allow_dirty=args.allow_dirty, note=args.note
        )
    except Refused as exc:
        print(f"submit: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except SubmissionError as exc:
        print(f"submit: the committed tree cannot be a submission: {exc}", file=sys.stderr)
        return EXIT_INVALID
    print(
        f"submitted #{record.id}: commit {record.commit[:12]} (tree {record.tree[:12]}), "
        f"{record.files} files, archive {record.archive_bytes} bytes sha256 "
        f"{record.archive_sha256[:16]}…, stored in {store.path}"
    )
    if left_out:
        print(f"note: {len(left_out)} uncommitted change(s) were NOT sent: "
              + ", ".join(line[3:] for line in left_out[:6]))
    # A warning, not a refusal: regrading the same tree is legitimate (timing noise, a grading
    # error), but usually it means the change that was meant to go was never committed.
    earlier = [r for r in store.with_tree(record.tree) if r.id != record.id]
    if earlier:
        print(render_same_tree(record, earlier))
    if not args.wait:
        print(f"queued. next: python -m grader submit grade {record.id} grades it here (or "
              f"submit with --wait); python -m grader submit show {record.id} shows its report")
        return EXIT_OK
    print(f"grading #{record.id} (this takes a while; progress on stderr)...", flush=True)
    return _grade_command(store, record.id, progress=not args.quiet)


def _grade_command(store: Store, submission_id: int | None, *, progress: bool) -> int:
    if submission_id is not None:
        record = store.get(submission_id)
        if record.status is SubmissionStatus.ERROR:
            store.requeue(submission_id)
        elif record.status is not SubmissionStatus.QUEUED:
            print(f"submission {submission_id} is already {record.status.value}; "
                  f"python -m grader submit show {submission_id} shows it")
            return EXIT_OK if record.status is SubmissionStatus.GRADED else EXIT_REFUSED
    code = EXIT_OK
    graded_any = False
    while True:
        graded = grade_submission(store, submission_id, progress=progress)
        if graded is None:
            break
        graded_any = True
        print(render_record(graded.record, store) if graded.record.status is
              SubmissionStatus.GRADED else graded.text)  # fmt: skip
        print(f"next: python -m grader submit list shows every submission; best = "
              f"{_best_line(store)}")
        code = graded.exit_code
        if submission_id is not None:
            break
    if not graded_any:
        print("nothing queued to grade")
    return code


def _best_line(store: Store) -> str:
    best = store.best()
    if best is None:
        return "none scored yet"
    return f"#{best.id} with {best.score:.4f}"


if __name__ == "__main__":
    sys.exit(main())
