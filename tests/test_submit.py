"""``python -m grader submit`` on a real git workspace and a real SQLite store (no grading)."""

from __future__ import annotations

from pathlib import Path

import pytest
from grader_helpers import git, make_workspace

from grader.agent.store import Store
from grader.agent.submit import main


def _submit(ws: Path, db: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["--store", str(db), "--workspace", str(ws), *args]) == 0
    return capsys.readouterr().out


def test_same_tree_again_warns_names_the_earlier_and_still_stores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = make_workspace(tmp_path / "ws", {"solution.py": "X = 1\n"})
    db = tmp_path / "store.sqlite"
    first = _submit(ws, db, capsys)
    assert "submitted #1" in first and "warning" not in first
    assert "python -m grader submit grade 1" in first, "a queued submission says how to grade it"

    # A new commit with the same tree (an empty commit, or a change that was never added).
    git(ws, "commit", "-q", "--allow-empty", "-m", "nothing new")
    second = _submit(ws, db, capsys)
    tree = git(ws, "rev-parse", "HEAD^{tree}")
    assert f"warning: #2 has the same tree {tree[:12]} as #1 (queued, score -)" in second
    assert "submitted #2" in second and "stored anyway" in second

    # The earlier ones' status is the stored one: grade #1 by hand, submit the tree a third time.
    with Store(db) as store:
        store.claim("test", 1)
        store.finish(1, report_json="{}", grade_status="gate_failed", score=0.0)
    third = _submit(ws, db, capsys, "--note", "again")
    assert "as #1 (graded, gate_failed, score 0.0000); #2 (queued, score -)" in third, third

    # A changed tree is not warned about.
    (ws / "solution.py").write_text("X = 2\n")
    git(ws, "commit", "-q", "-am", "a real change")
    fourth = _submit(ws, db, capsys)
    assert "submitted #4" in fourth and "warning" not in fourth

    with Store(db) as store:
        assert [r.tree for r in store.list()] == [tree] * 3 + [git(ws, "rev-parse", "HEAD^{tree}")]
        assert store.get(3).note == "again"
