"""Turn a workspace repository into the submission: its committed tree, exported privately.

The submission is the tree of a commit (HEAD unless told otherwise), never the working copy: the
report says when uncommitted changes were ignored. The tree is checked against `scoring.yaml`'s
``limits`` (file count, file size, total size; no symlinks, no submodules) *before* anything is
written, then every blob is copied out with ``git cat-file``.

Why not ``git archive``: it applies the repository's own ``.gitattributes`` and ``.git/config``
filter drivers (``filter.<name>.smudge`` runs a command of the workspace's choosing), in the
trusted process. Reading blobs by id runs no filter, no hook and no fsmonitor.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from grader.config import Limits

SOLUTION = "solution.py"

# Config the workspace cannot override: no fsmonitor or hooks run in the grader, no pager.
GIT = (
    "git",
    "-c", "core.fsmonitor=false",
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.pager=cat",
    "-c", "safe.directory=*",
)
_GIT_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "HOME": "/nonexistent",
    "LANG": "C",
}


class SubmissionError(ValueError):
    """The workspace or its commit cannot be a submission; the message says why, with values."""


@dataclass(frozen=True)
class Submission:
    """A committed tree, exported.

    Attributes:
        workspace: The repository it came from.
        commit: Full commit id.
        tree: Full tree id of the commit.
        root: Directory holding the exported files.
        files: Paths of the exported files, relative to ``root``.
        total_bytes: Sum of the files' sizes.
        uncommitted_changes: The workspace had staged, unstaged or untracked changes (ignored).
        digests: Each exported file's sha256, as git gave it (`tree_changes` holds ``root`` to
            them).
    """

    workspace: Path
    commit: str
    tree: str
    root: Path
    files: tuple[str, ...]
    total_bytes: int
    uncommitted_changes: bool
    digests: tuple[tuple[str, str], ...] = ()


def _git(workspace: Path, *args: str, input_bytes: bytes | None = None) -> bytes:
    proc = subprocess.run(
        [*GIT, "-C", str(workspace), *args],
        input=input_bytes,
        capture_output=True,
        env=_GIT_ENV,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        message = proc.stderr.decode("utf-8", "replace").strip()
        raise SubmissionError(f"git {' '.join(args[:2])} failed in {workspace}: {message}")
    return proc.stdout


def _entries(workspace: Path, tree: str) -> list[tuple[str, str, str, int, str]]:
    """(mode, type, object id, size, path) of every entry of a tree, recursively."""
    raw = _git(workspace, "ls-tree", "-r", "-l", "-z", "--full-tree", tree)
    out = []
    for record in raw.split(b"\0"):
        if not record:
            continue
        meta, path = record.split(b"\t", 1)
        mode, kind, oid, size = meta.decode().split()
        out.append((mode, kind, oid, int(size) if size != "-" else 0, path.decode("utf-8")))
    return out


def check_tree(entries: list[tuple[str, str, str, int, str]], limits: Limits) -> int:
    """Check a tree listing against the limits; return its total size in bytes.

    Raises:
        SubmissionError: A symlink or submodule, an unsafe path, too many files, a file or the
            whole tree too large, or no ``solution.py`` at the root.
    """
    for mode, kind, _, _, path in entries:
        if mode == "120000":
            raise SubmissionError(f"symlinks are not allowed in a submission: {path!r}")
        if kind != "blob":
            raise SubmissionError(f"{path!r} is a {kind} (submodules are not allowed)")
        parts = PurePosixPath(path).parts
        if path.startswith("/") or ".." in parts or ".git" in parts:
            raise SubmissionError(f"unsafe path in the tree: {path!r}")
    if len(entries) > limits.tree_max_files:
        raise SubmissionError(
            f"the tree has {len(entries)} files; the limit is {limits.tree_max_files}"
        )
    file_max = int(limits.file_max_mb * (1 << 20))
    for *_, size, path in entries:
        if size > file_max:
            raise SubmissionError(
                f"{path!r} is {size / (1 << 20):.2f} MiB; the limit per file is "
                f"{limits.file_max_mb:g} MiB"
            )
    total = sum(size for *_, size, _ in entries)
    if total > limits.tree_max_mb * (1 << 20):
        raise SubmissionError(
            f"the tree is {total / (1 << 20):.2f} MiB; the limit is {limits.tree_max_mb:g} MiB"
        )
    if SOLUTION not in {path for *_, path in entries}:
        raise SubmissionError(f"no {SOLUTION} at the root of the committed tree")
    return total


def has_uncommitted_changes(workspace: Path) -> bool:
    """Staged, unstaged or untracked (not ignored) changes in the working copy, under ``workspace``
    when it is a folder inside the repository."""
    status = _git(workspace, "status", "--porcelain", "--untracked-files=normal", "--", ".")
    return bool(status.strip())


def export_submission(
    workspace: str | Path, dest: str | Path, limits: Limits, rev: str = "HEAD"
) -> Submission:
    """Export the tree of ``rev`` in ``workspace`` into the empty or new directory ``dest``.

    Args:
        workspace: A git repository's root, or a folder inside one: then the submission is that
            folder's subtree of the commit (so a workspace kept inside a larger repository, like
            this project's template and corpus, grades as it would on its own).
        dest: Where the files go.
        limits: ``scoring.yaml``'s ``limits`` (the tree part is used).
        rev: Any commit-ish.

    Raises:
        SubmissionError: Not a repository, an unknown revision, or a tree over the limits.
    """
    workspace = Path(workspace).resolve()
    if not workspace.is_dir():
        raise SubmissionError(f"workspace {workspace} is not a directory")
    try:
        commit = _git(workspace, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except SubmissionError as exc:
        raise SubmissionError(
            f"{workspace}: no commit {rev!r} (is it a git repository with a commit?): {exc}"
        ) from exc
    commit_id = commit.decode().strip()
    prefix = _git(workspace, "rev-parse", "--show-prefix").decode().strip().rstrip("/")
    try:
        tree_id = _git(workspace, "rev-parse", f"{commit_id}:{prefix}").decode().strip()
    except SubmissionError as exc:
        raise SubmissionError(
            f"{workspace}: the folder {prefix!r} is not in commit {commit_id[:12]}"
        ) from exc
    entries = _entries(workspace, tree_id)
    total = check_tree(entries, limits)

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    # One batch process streams every blob: "<oid> blob <size>\n<bytes>\n" per request.
    request = "".join(f"{oid}\n" for _, _, oid, _, _ in entries).encode()
    stream = _git(workspace, "cat-file", "--batch", input_bytes=request)
    pos = 0
    digests = []
    for mode, _, oid, size, path in entries:
        header_end = stream.index(b"\n", pos)
        got_oid, _, got_size = stream[pos:header_end].decode().split()
        if got_oid != oid or int(got_size) != size:
            raise SubmissionError(f"git cat-file returned {got_oid} ({got_size}) for {oid}")
        data = stream[header_end + 1 : header_end + 1 + size]
        pos = header_end + 1 + size + 1
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(0o755 if mode == "100755" else 0o644)
        digests.append((path, hashlib.sha256(data).hexdigest()))
    return Submission(
        workspace=workspace,
        commit=commit_id,
        tree=tree_id,
        root=dest,
        files=tuple(path for *_, path in entries),
        total_bytes=total,
        uncommitted_changes=has_uncommitted_changes(workspace),
        digests=tuple(digests),
    )


def tree_changes(root: Path, digests: tuple[tuple[str, str], ...],
                 skip: tuple[str, ...] = ()) -> list[str]:
    """How the directory ``root`` differs from the exported files ``digests``: a file changed,
    missing or added, or anything that is not a regular file (empty: the same tree).

    The submission's children run as the grader's user, so the exported tree is writable to
    them; what is timed is copied from it after the gate, and must be what the gate ran.

    Args:
        skip: Names directly under ``root`` left out (a child's own ``.tmp``, ``.triton``, the
            files its output goes to).
    """
    want = dict(digests)
    found: list[str] = []
    seen = set()
    for dirpath, dirnames, names in os.walk(root, followlinks=False):
        if Path(dirpath) == root:
            dirnames[:] = [d for d in dirnames if d not in skip]
            names = [n for n in names if n not in skip]
        for name in [*dirnames, *names]:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                found.append(f"{rel} is a link")
            elif path.is_file():
                seen.add(rel)
                if rel not in want:
                    found.append(f"{rel} was added")
                elif hashlib.sha256(path.read_bytes()).hexdigest() != want[rel]:
                    found.append(f"{rel} was changed")
            elif not path.is_dir():
                found.append(f"{rel} is not a file")
    found.extend(f"{rel} was removed" for rel in sorted(set(want) - seen))
    return found


__all__ = [
    "GIT",
    "SOLUTION",
    "Submission",
    "SubmissionError",
    "check_tree",
    "export_submission",
    "has_uncommitted_changes",
    "tree_changes",
]
