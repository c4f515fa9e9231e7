"""How a worker runs one grade: the executor interface and the executors behind it.

An executor gets a stored submission's canonical archive and the device, and returns the grade's
report JSON, or raises `ExecutorError` when the machinery failed (the submission is not to blame,
and the queue tries again). The submission itself never runs in the worker's process:

- `LocalExecutor`: ``python -m grader grade`` in a subprocess on a repository rebuilt from the
  archive: the grader's own isolation (a sandboxed child per phase, secret seeds).
- `CommandExecutor`: any command with the same contract (an operator's wrapper; the tests' fast
  fake grader).
- The Docker executor (issue 16) implements the same `Executor` protocol.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from grader.service.archive import extract_archive
from grader.service.store import Device


class ExecutorError(RuntimeError):
    """The grade could not be run or produced no report; the message says why."""


@dataclass(frozen=True)
class GradeRequest:
    """One grade to run.

    Attributes:
        archive: The submission's canonical ``tar.gz`` (checked against its sha256 by the store).
        commit, tree: What the agent submitted; the rebuilt repository must have this tree.
        final: The final regrade: the profile's final sample counts.
        device: Where to run.
        label: For logs and temporary names (``submission 7, grade 9``).
    """

    archive: bytes
    commit: str
    tree: str
    final: bool
    device: Device
    label: str


class Executor(Protocol):
    def run(self, request: GradeRequest, alive: Callable[[], bool]) -> str:
        """Grade ``request``; return the report JSON. ``alive`` is polled while it runs: when it
        returns False (the lease was lost) the grade is abandoned."""
        ...


# The rebuilt repository's commit: fixed identity and dates, so a tree always gives one commit.
_REBUILD_ENV = {
    "GIT_AUTHOR_NAME": "grader", "GIT_AUTHOR_EMAIL": "grader@localhost",
    "GIT_COMMITTER_NAME": "grader", "GIT_COMMITTER_EMAIL": "grader@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}  # fmt: skip


def rebuild(request: GradeRequest, dest: Path) -> Path:
    """Unpack the archive into a one-commit repository whose tree is the submitted one."""
    extract_archive(request.archive, dest)
    env = {**os.environ, **_REBUILD_ENV}

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(dest), *args], env=env, capture_output=True,
                              text=True, check=False)  # fmt: skip
        if done.returncode:
            raise ExecutorError(f"git {' '.join(args)} failed in {dest}: {done.stderr.strip()}")
        return done.stdout.strip()

    git("init", "--quiet")
    git("add", "--all", ".")
    git("commit", "--quiet", "--no-verify", "--allow-empty", "-m",
        f"{request.label} (commit {request.commit})")  # fmt: skip
    tree = git("rev-parse", "HEAD^{tree}")
    if tree != request.tree:
        raise ExecutorError(f"{request.label}: the archive rebuilds tree {tree}, the store says "
                            f"{request.tree}")  # fmt: skip
    return dest


class CommandExecutor:
    """Runs ``argv`` (its words formatted with ``{workspace}``, ``{report}``, ``{device}``,
    ``{gpu}``, ``{final}``) on the rebuilt repository and reads the JSON it writes to
    ``{report}``.

    The command runs in its own process group with a wall-clock limit; the group is killed when
    the limit passes, the lease is lost, or the worker dies (the leader gets SIGKILL with it).

    Args:
        argv: The command, one word per item.
        timeout_s: The whole grade's backstop (the grader's own deadlines end a hang sooner).
        poll_s: How often ``alive`` is asked.
    """

    def __init__(self, argv: Sequence[str], *, timeout_s: float = 3 * 3600, poll_s: float = 2.0,
                 ) -> None:  # fmt: skip
        self.argv = list(argv)
        self.timeout_s = timeout_s
        self.poll_s = poll_s

    def command(self, workspace: Path, report: Path, request: GradeRequest) -> list[str]:
        fields = {
            "workspace": str(workspace), "report": str(report), "device": request.device.name,
            "gpu": "" if request.device.index is None else str(request.device.index),
            "final": "--final" if request.final else "",
        }  # fmt: skip
        words = [w.format(**fields) for w in self.argv]
        return [w for w in words if w != ""]

    def run(self, request: GradeRequest, alive: Callable[[], bool]) -> str:
        with tempfile.TemporaryDirectory(prefix="grade-job-") as tmp:
            repo = rebuild(request, Path(tmp) / "repo")
            report = Path(tmp) / "report.json"
            argv = self.command(repo, report, request)
            log = Path(tmp) / "log.txt"
            with open(log, "wb") as out:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=_die_with_parent, cwd=tmp)  # fmt: skip
                why = self._wait(proc, alive)
            tail = log.read_bytes()[-2000:].decode(errors="replace")
            if why:
                raise ExecutorError(f"{why}; its output ended with:\n{tail}")
            if not report.is_file():
                raise ExecutorError(f"{shlex.join(argv[:4])}… exited with status "
                                    f"{proc.returncode} and wrote no report; its output ended "
                                    f"with:\n{tail}")  # fmt: skip
            return as_submitted(report.read_text(), request)

    def _wait(self, proc: subprocess.Popen[bytes], alive: Callable[[], bool]) -> str:
        """Wait for ``proc``; a reason when it had to be killed, else ''."""
        deadline = time.monotonic() + self.timeout_s
        try:
            while True:
                try:
                    proc.wait(timeout=self.poll_s)
                    return ""
                except subprocess.TimeoutExpired:
                    pass
                if time.monotonic() > deadline:
                    return f"the grade ran past the executor's {self.timeout_s:.0f} s limit"
                if not alive():
                    return "the worker lost its lease on this grade"
        finally:
            if proc.poll() is None:
                _kill_group(proc)


class LocalExecutor(CommandExecutor):
    """The grader's own ``python -m grader grade`` on this host."""

    def __init__(self, *, config: Path | None = None, timeout_s: float = 3 * 3600) -> None:
        argv = [sys.executable, "-m", "grader", "grade", "{workspace}", "--json", "{report}",
                "--quiet", "{final}"]  # fmt: skip
        if config is not None:
            argv += ["--config", str(config)]
        super().__init__(argv, timeout_s=timeout_s)

    def command(self, workspace: Path, report: Path, request: GradeRequest) -> list[str]:
        argv = super().command(workspace, report, request)
        index = request.device.index
        return argv + (["--cpu"] if index is None else ["--gpu", str(index)])


def as_submitted(report_json: str, request: GradeRequest) -> str:
    """The report naming the commit the agent sent, not the rebuilt repository's (the same tree,
    checked by `rebuild`); a report of another tree, or not JSON, is left as it is."""
    try:
        data = json.loads(report_json)
    except ValueError:
        return report_json
    if not isinstance(data, dict) or data.get("tree") != request.tree:
        return report_json
    data.update(commit=request.commit, workspace=request.label)
    return json.dumps(data, indent=2)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the worker dies (Linux PR_SET_PDEATHSIG), so a
    killed worker leaves no grade running that another attempt would race."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


__all__ = ["CommandExecutor", "Executor", "ExecutorError", "GradeRequest", "LocalExecutor",
           "as_submitted", "rebuild"]  # fmt: skip
