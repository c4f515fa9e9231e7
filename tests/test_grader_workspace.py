"""Export of the committed tree: HEAD or a given commit, limits, no symlinks, and no command of
the workspace's choosing runs in the grader (filter drivers, fsmonitor, hooks)."""

from __future__ import annotations

from pathlib import Path

import pytest
from grader_helpers import git, make_workspace

from grader.config import load_config
from grader.workspace import SubmissionError, export_submission

LIMITS = load_config().limits


def test_exports_head_and_flags_uncommitted(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"solution.py": "A = 1\n", "pkg/k.py": "B = 2\n"})
    (ws / "solution.py").write_text("A = 'dirty'\n")
    sub = export_submission(ws, tmp_path / "out", LIMITS)
    assert (sub.root / "solution.py").read_text() == "A = 1\n"
    assert (sub.root / "pkg" / "k.py").read_text() == "B = 2\n"
    assert sub.uncommitted_changes
    assert sorted(sub.files) == ["pkg/k.py", "solution.py"]
    assert sub.commit == git(ws, "rev-parse", "HEAD")


def test_a_folder_inside_a_repository_is_its_committed_subtree(tmp_path: Path) -> None:
    repo = make_workspace(tmp_path / "repo", {
        "README.md": "outer\n",
        "ws/solution.py": "A = 1\n",
        "ws/pkg/k.py": "B = 2\n",
    })  # fmt: skip
    (repo / "README.md").write_text("dirty outside the folder\n")
    sub = export_submission(repo / "ws", tmp_path / "out", LIMITS)
    assert sorted(sub.files) == ["pkg/k.py", "solution.py"]
    assert sub.tree == git(repo, "rev-parse", "HEAD:ws")
    assert not sub.uncommitted_changes  # the change outside the folder is not the submission's
    (repo / "ws" / "solution.py").write_text("A = 'dirty'\n")
    assert export_submission(repo / "ws", tmp_path / "out2", LIMITS).uncommitted_changes
    (repo / "new").mkdir()
    with pytest.raises(SubmissionError, match="'new' is not in commit"):
        export_submission(repo / "new", tmp_path / "out3", LIMITS)


def test_clean_workspace_is_not_flagged(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"solution.py": "A = 1\n"})
    assert not export_submission(ws, tmp_path / "out", LIMITS).uncommitted_changes


def test_exports_an_older_commit(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"solution.py": "V = 1\n"})
    first = git(ws, "rev-parse", "HEAD")
    (ws / "solution.py").write_text("V = 2\n")
    git(ws, "commit", "-qam", "two")
    sub = export_submission(ws, tmp_path / "out", LIMITS, rev=first)
    assert (sub.root / "solution.py").read_text() == "V = 1\n"


@pytest.mark.parametrize(
    "files, message",
    [
        ({"other.py": "x"}, "no solution.py"),
        ({"solution.py": "x", "big.bin": b"\0" * (5 << 20)}, "limit per file"),
        ({"solution.py": "x", **{f"f{i}.py": "" for i in range(201)}}, "files; the limit"),
    ],
)
def test_tree_limits(tmp_path: Path, files: dict, message: str) -> None:
    ws = make_workspace(tmp_path / "ws", files)
    with pytest.raises(SubmissionError, match=message):
        export_submission(ws, tmp_path / "out", LIMITS)


def test_symlink_is_refused(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"solution.py": "x"})
    (ws / "link.py").symlink_to("/etc/passwd")
    git(ws, "add", "link.py")
    git(ws, "commit", "-qm", "link")
    with pytest.raises(SubmissionError, match="symlinks"):
        export_submission(ws, tmp_path / "out", LIMITS)


def test_not_a_repository(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(SubmissionError, match="no commit"):
        export_submission(tmp_path / "plain", tmp_path / "out", LIMITS)


def test_workspace_config_cannot_run_commands(tmp_path: Path) -> None:
    """A smudge filter, an fsmonitor and hooks set by the workspace never run in the grader."""
    marker = tmp_path / "pwned"
    ws = make_workspace(tmp_path / "ws", {"solution.py": "x = 1\n",
                                          ".gitattributes": "*.py filter=evil\n"})  # fmt: skip
    git(ws, "config", "filter.evil.smudge", f"sh -c 'touch {marker}; cat'")
    git(ws, "config", "core.fsmonitor", f"sh -c 'touch {marker}'")
    hooks = ws / ".git" / "hooks"
    (hooks / "post-checkout").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (hooks / "post-checkout").chmod(0o755)
    sub = export_submission(ws, tmp_path / "out", LIMITS)
    assert (sub.root / "solution.py").read_text() == "x = 1\n"
    assert not marker.exists()


def test_tree_changes_names_every_file_added_changed_removed_or_linked(tmp_path: Path) -> None:
    """What timing copies must be what the gate ran (tests/corpus/rewrites_timed_tree)."""
    from grader.workspace import tree_changes

    ws = make_workspace(tmp_path / "ws", {"solution.py": "x = 1\n", "pkg/m.py": "y = 2\n"})
    sub = export_submission(ws, tmp_path / "tree", LIMITS)
    assert tree_changes(sub.root, sub.digests) == []
    (sub.root / "solution.py").write_text("x = 2\n")
    (sub.root / "pkg" / "m.py").unlink()
    (sub.root / "timed_only.py").write_text("FAST = True\n")
    (sub.root / "link.py").symlink_to(sub.root / "timed_only.py")
    assert sorted(tree_changes(sub.root, sub.digests)) == [
        "link.py is a link", "pkg/m.py was removed", "solution.py was changed",
        "timed_only.py was added"]
    # A child's own directories may be left out, at the top only.
    (sub.root / ".triton").mkdir()
    (sub.root / ".triton" / "cache.bin").write_bytes(b"\0")
    (sub.root / "pkg" / ".triton").mkdir()
    (sub.root / "pkg" / ".triton" / "m.py").write_text("z = 3\n")
    assert sorted(tree_changes(sub.root, sub.digests, skip=(".triton",))) == [
        "link.py is a link", "pkg/.triton/m.py was added", "pkg/m.py was removed",
        "solution.py was changed", "timed_only.py was added"]


def test_a_grade_holds_the_copy_of_a_timing_child_started_beside_the_gate(tmp_path: Path,
                                                                           monkeypatch) -> None:
    """With ``--overlap-timing`` the timing child's copy of the tree exists while the gate runs
    (the gate's children could write it): a change there is `tree-tampered`, and nothing is timed.
    The GPU, the gate and the timing start are stand-ins; the check and its verdict are real."""
    import grader.grade as grade_module
    from grader.gate import GateResult
    from grader.report import CaseResult, Status
    from grader.sandbox import ChildResult, Outcome

    class EarlyTiming:
        finished = cancelled = False

        def tree_changes(self, digests):
            assert dict(digests).keys() == {"solution.py"}
            return ["fast_path.py was added"]

        def finish(self, triton_cache):
            self.finished = True

        def cancel(self):
            self.cancelled = True

    early = EarlyTiming()
    passed = CaseResult(name="c1#1", kind="case", dtype="float32", shape=(1, 1, 1), dilation=1,
                        passed=True, checks=(), max_utilisation=0.1, reason="")
    child = ChildResult(outcome=Outcome.OK, exit_code=0, signal=None, wall_s=1.0,
                        peak_rss_mb=1.0, peak_tasks=1)
    monkeypatch.setattr(grade_module, "_pick_gpu", lambda options: 0)
    monkeypatch.setattr(grade_module.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(grade_module.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(grade_module.torch.cuda, "get_device_name", lambda index: "stand-in")
    monkeypatch.setattr(grade_module, "_start_timing", lambda *a, **kw: early)
    monkeypatch.setattr(grade_module, "run_gate", lambda *a, **kw: GateResult(
        items=(None,), cases=(passed,), findings=(), child=child))
    ws = make_workspace(tmp_path / "ws", {"solution.py": "x = 1\n"})
    report = grade_module.grade(ws, grade_module.GradeOptions(overlap_timing=True,
                                                              progress=False))
    assert report.status is Status.RULE_BROKEN, report.reasons
    assert report.reasons == ("tree-tampered (gate): the timing child's copy of the tree "
                              "changed while the gate ran: fast_path.py was added",)
    assert [f.rule for f in report.findings][:1] == ["tree-tampered"]
    assert not early.finished and early.cancelled
