"""The local check's own parts: case selection, published g, the estimate, snapshots, messages."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest

from grader import check, worktree
from grader.config import ConfigError, load_config
from grader.report import ShapeTiming, Status, TimingReport

REPO = Path(__file__).resolve().parent.parent
NAIVE = REPO / "tests" / "corpus" / "naive_triton" / "solution.py"
CONFIG = load_config()


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def _workspace(tmp: Path, solution: Path | None = None) -> Path:
    ws = tmp / "ws"
    ws.mkdir()
    for name in ("solution.py", "README.md", ".gitignore"):
        shutil.copy(REPO / "workspace_template" / name, ws / name)
    if solution is not None:
        shutil.copy(solution, ws / "solution.py")
    _git(ws, "init", "-q")
    _git(ws, "add", "-A")
    _git(ws, "commit", "-qm", "start")
    return ws


def test_published_g_cover_every_shape_of_their_profiles() -> None:
    for name, profile in CONFIG.timing.profiles.items():
        published = check.load_published(name)
        if name == "smoke":
            assert published is None
            continue
        assert published is not None, f"no published g for profile {name}"
        assert set(published.g) == {s.label for s in profile.shapes}, name
        # Until the timing bench replaces them, the numbers say they are placeholders.
        assert published.provisional == ("PROVISIONAL" in published.source)


def test_quick_and_full_case_selection() -> None:
    cases, drift = check.select_cases(CONFIG, check.Mode.QUICK, gpu=False)
    assert cases == CONFIG.smoke_cases()
    assert all(c.smoke for c in drift) and drift
    gpu_cases, _ = check.select_cases(CONFIG, check.Mode.QUICK, gpu=True)
    extra = [c for c in gpu_cases if not c.smoke]
    assert sorted(c.dtype for c in extra) == ["bfloat16", "float16", "float32"]
    full, full_drift = check.select_cases(CONFIG, check.Mode.FULL, gpu=False)
    assert full == CONFIG.correctness.cases and full_drift == CONFIG.correctness.drift.cases
    one, none = check.select_cases(CONFIG, check.Mode.QUICK, gpu=False, names=["c5-l127-d3"])
    assert [c.name for c in one] == ["c5-l127-d3"] and none == ()
    with pytest.raises(ConfigError, match=r"no case named \['nope'\].*c1-l1"):
        check.select_cases(CONFIG, check.Mode.QUICK, gpu=False, names=["nope"])


def _timing(status: str = "ok", r: float = 2.0) -> TimingReport:
    shapes = tuple(
        ShapeTiming(label=s.label, t_plain_ms=2.0, t_ref_ms=2.0, t_sub_ms=2.0 / r, r=r, g=1.01,
                    r_ci=(r * 0.9, r * 1.1))
        for s in CONFIG.timing.profiles["l4"].shapes
    )
    return TimingReport(profile="l4", shapes=shapes, status=status, reason="" if status == "ok"
                        else "a timed step's result differs from plain PyTorch")


def test_estimate_uses_measured_r_and_published_g() -> None:
    published = check.Published("l4", {s.label: 4.0 for s in CONFIG.timing.profiles["l4"].shapes},
                                provisional=False, source="test")
    est = check.estimate(_timing(r=2.0), published, CONFIG)
    want = math.log(2.0) / math.log(1.1 * 4.0)
    assert est.score == pytest.approx(want)
    assert all(s.score == pytest.approx(want) and s.target == pytest.approx(4.4)
               for s in est.shapes)
    assert all(s.noise == 1.01 for s in est.shapes), "plain vs itself is reported as noise"
    # A failed timing phase estimates 0, never a number from the samples.
    failed = check.estimate(_timing(status="check_failed"), published, CONFIG)
    assert failed.score == 0.0 and all(s.score == 0.0 for s in failed.shapes)
    # No published g: no estimate, and it says why.
    none = check.estimate(_timing(), None, CONFIG)
    assert none.score is None and none.provisional and "no published g" in none.source


def test_snapshot_commit_leaves_index_head_and_refs_alone(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    (ws / "solution.py").write_text((ws / "solution.py").read_text() + "\n# edited\n")
    (ws / "kernels.py").write_text("K = 1\n")
    _git(ws, "add", "kernels.py")
    (ws / "notes.txt").write_text("untracked\n")
    (ws / "scratch").mkdir()
    (ws / "scratch" / "log.txt").write_text("ignored\n")
    before = (_git(ws, "rev-parse", "HEAD"), _git(ws, "status", "--porcelain"),
              _git(ws, "for-each-ref"))
    snap = worktree.snapshot_commit(ws)
    after = (_git(ws, "rev-parse", "HEAD"), _git(ws, "status", "--porcelain"),
             _git(ws, "for-each-ref"))
    assert before == after
    files = set(_git(ws, "ls-tree", "-r", "--name-only", snap).split())
    assert files == {".gitignore", "README.md", "solution.py", "kernels.py", "notes.txt"}
    assert "# edited" in _git(ws, "show", f"{snap}:solution.py")


def test_failing_case_names_the_check_both_values_and_how_to_reproduce(tmp_path: Path) -> None:
    if not NAIVE.is_file():
        pytest.skip(f"{NAIVE} is missing")
    ws = _workspace(tmp_path, NAIVE)
    text = (ws / "solution.py").read_text().replace(
        "return dx, dw, None, None", "return dx, dw * 1.01, None, None")
    (ws / "solution.py").write_text(text)
    report = check.run_check(ws, cases=["c5-l9-d4"], progress=None)
    assert report.status is Status.GATE_FAILED and report.exit_code == 13
    out = check.render(report)
    assert "FAILED  case c5-l9-d4#1301" in out
    assert "check grad_conv: error 0.01 vs budget 0.003" in out
    assert "seed=task.inputs.derive_seed(1301)" in out
    assert "next: fix c5-l9-d4 first; rerun just it with python -m grader.check --case c5-l9-d4" in out
    assert "note: 1 uncommitted change(s)" in out


def test_outside_a_workspace_says_where_to_run(tmp_path: Path) -> None:
    with pytest.raises(worktree.WorktreeError, match="Run this from your workspace"):
        check.run_check(tmp_path, progress=None)
    assert check.main(["--workspace", str(tmp_path)]) == 2


def test_timing_runs_plain_in_the_reference_slot_and_estimates(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a GPU the check times with the grader's engine, plain PyTorch standing in for the
    reference (the agent's environment has none), and scores with the published g."""
    import numpy as np

    import grader.timing

    seen: dict[str, object] = {}

    def fake_run_timing(root: Path, config: object, **kwargs: object) -> TimingReport:
        seen.update(kwargs, root=root)
        report = _timing(r=3.0)
        shapes = tuple(ShapeTiming(**{**s.__dict__, "r": np.float64(3.0)}) for s in report.shapes)
        return TimingReport(profile="l4", shapes=shapes, telemetry={"x": np.arange(2)})

    monkeypatch.setattr(grader.timing, "run_timing", fake_run_timing)
    timing, est = check._time(tmp_path, CONFIG, None, 1, None)
    assert seen["reference_module"] == "task.model" == check.PLAIN_AS_REFERENCE
    assert seen["gpu"] == 1  # the check's --gpu reaches the timing child
    assert est.profile == "l4" and est.provisional
    g = check.load_published("l4").g  # type: ignore[union-attr]
    assert est.shapes[0].score == pytest.approx(
        CONFIG.score.shape_score(3.0, g[est.shapes[0].label]))
    assert check._timing_verdict(timing, est) == (Status.SCORED, ())
    failed = TimingReport(profile="l4", status="implausible", reason="below the floor")
    assert check._timing_verdict(failed, est) == (
        Status.TIMING_FAILED, ("timing implausible: below the floor",))
    # The report serialises numpy values from the statistics.
    import json

    report = check.CheckReport(
        status=Status.SCORED, reasons=(), next_steps=(), mode=check.Mode.QUICK,
        source="working tree", workspace=str(tmp_path), head=None, uncommitted=(),
        device="cuda:0", timing=timing, estimate=est)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["timing"]["shapes"][0]["r"] == 3.0 and data["exit_code"] == 0
    assert "estimated score: " in check.render(report)
