"""The agent's workspace as git sees it: its root, HEAD, uncommitted changes, a snapshot commit.

Used by the agent's own tools (`grader.agent.check`, `grader.agent.submit`), which run with the
workspace as the working directory. Git runs with the same hardening as the grader's export
(`grader.workspace`): no hooks, no fsmonitor, no pager, no system config.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from grader.workspace import GIT

# Identity of snapshot commits: they are never on a branch, only a name for the working tree.
_SNAPSHOT_ID = {
    "GIT_AUTHOR_NAME": "grader.check",
    "GIT_AUTHOR_EMAIL": "check@localhost",
    "GIT_COMMITTER_NAME": "grader.check",
    "GIT_COMMITTER_EMAIL": "check@localhost",
}


class WorktreeError(RuntimeError):
    """Not a git workspace, or git failed; the message says what to do."""


@dataclass(frozen=True)
class WorktreeState:
    """Where a workspace stands.

    Attributes:
        root: The repository's top directory.
        head: Full commit id of HEAD, or None before the first commit.
        branch: The checked-out branch, or None (detached HEAD or no commit).
        changes: ``git status --porcelain`` lines: staged, unstaged and untracked (not ignored).
    """

    root: Path
    head: str | None
    branch: str | None
    changes: tuple[str, ...]

    @property
    def dirty(self) -> bool:
        return bool(self.changes)


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0", LANG="C")
    env.update(extra or {})
    return env


def git(root: Path, *args: str, extra_env: dict[str, str] | None = None) -> str:
    """Run ``git -C root ARGS`` and return its stdout (stripped).

    Raises:
        WorktreeError: git failed; the message holds its stderr.
    """
    try:
        proc = subprocess.run(
            [*GIT, "-C", str(root), *args],
            capture_output=True,
            text=True,
            env=_env(extra_env),
            timeout=120,
            check=False,
        )
    except FileNotFoundError as exc:
        raise WorktreeError("git is not installed (it is needed to check and submit)") from exc
    if proc.returncode != 0:
        raise WorktreeError(f"git {' '.join(args)} failed in {root}: {proc.stderr.strip()}")
    return proc.stdout.rstrip("\n")


class NotARepository(WorktreeError):
    """The folder is not inside a git repository (an invalid submission: exit code 10)."""


def find_root(start: str | Path | None = None) -> Path:
    """The git repository containing ``start`` (default: the current directory).

    Raises:
        NotARepository: ``start`` is not inside a git repository.
    """
    here = Path(start or Path.cwd()).resolve()
    try:
        return Path(git(here, "rev-parse", "--show-toplevel"))
    except WorktreeError as exc:
        raise NotARepository(
            f"{here} is not inside a git repository. Run this from your workspace (the git "
            "repository that holds solution.py); see its README.md."
        ) from exc


def state(root: Path) -> WorktreeState:
    """HEAD, branch and uncommitted changes of the repository at ``root``."""
    try:
        head: str | None = git(root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    except WorktreeError:
        head = None
    try:
        branch: str | None = git(root, "symbolic-ref", "--quiet", "--short", "HEAD")
    except WorktreeError:
        branch = None
    status = git(root, "status", "--porcelain", "--untracked-files=normal")
    changes = tuple(line for line in status.splitlines() if line.strip())
    return WorktreeState(root=root, head=head or None, branch=branch, changes=changes)


def snapshot_commit(root: Path) -> str:
    """A commit of the working tree as it is on disk, without touching the index or any ref.

    Tracked files with their current content plus untracked files that are not ignored, exactly
    what ``git add -A && git commit`` would record, built in a private index. The commit is
    dangling (on no branch; ``git gc`` removes it eventually), so the grader's export can read
    the working tree through the same code path, with the same limits, as a real commit.

    Raises:
        WorktreeError: git failed.
    """
    head = state(root).head
    with tempfile.TemporaryDirectory(prefix="check-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), **_SNAPSHOT_ID}
        if head is not None:
            git(root, "read-tree", head, extra_env=env)
        git(root, "add", "--all", ".", extra_env=env)
        tree = git(root, "write-tree", extra_env=env)
        parents = ["-p", head] if head is not None else []
        return git(
            root, "commit-tree", tree, *parents, "-m", "grader.check: working tree snapshot",
            extra_env=env,
        )  # fmt: skip


__all__ = ["NotARepository", "WorktreeError", "WorktreeState", "find_root", "git",
           "snapshot_commit", "state"]
