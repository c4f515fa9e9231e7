"""``python -m grader grade`` as an operator runs it: exit codes, JSON, the uncommitted flag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from grader_helpers import NAIVE, REPO, ci_config, make_workspace, run_grade

from grader.report import ExitCode, Status


def test_invalid_submission_exit_code(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"README.md": "no solution here\n"})
    run = run_grade(ws, None, tmp_path / "r.json", "--cpu")
    assert run.report.status is Status.INVALID_SUBMISSION
    assert run.returncode == ExitCode.INVALID_SUBMISSION
    assert run.report.score == 0.0 and "solution.py" in run.report.reasons[0]


def test_import_error_is_load_failed(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"solution.py": "import does_not_exist\n"})
    run = run_grade(ws, ci_config(tmp_path / "s.yaml"), tmp_path / "r.json", "--cpu")
    assert run.report.status is Status.LOAD_FAILED, run.report.reasons
    assert "does_not_exist" in run.report.reasons[0]


@pytest.mark.slow
def test_uncommitted_changes_are_ignored_and_said(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"solution.py": NAIVE.read_text()})
    (ws / "solution.py").write_text("raise SystemExit('this edit is not committed')\n")
    run = run_grade(ws, ci_config(tmp_path / "s.yaml"), tmp_path / "r.json", "--cpu")
    assert run.report.status is Status.CHECKED_UNTIMED, run.report.reasons
    assert run.report.uncommitted_changes_ignored
    assert run.report.score is None and run.returncode == ExitCode.CHECKED_UNTIMED
    assert "NOT graded" in run.stdout and "timing and score: no GPU" in run.stdout


def test_usage_error_exit_code() -> None:
    proc = subprocess.run([sys.executable, "-m", "grader", "grade"], cwd=REPO,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == ExitCode.USAGE


def test_agent_tools_are_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m grader check --where`` runs `grader.agent.check` with ``--where``."""
    from grader.cli import main

    assert main(["check", "--where"]) == 0
    assert "PROMPT.md" in capsys.readouterr().out


def test_plot_is_written_beside_the_json_when_timed(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from grader.cli import _write_plot
    from grader.config import DEFAULT_PATH
    from grader.report import GradeReport, ShapeTiming, SystemInfo, TimingReport

    shape = ShapeTiming(label="float32:32x4096:d1", t_plain_ms=3.0, t_ref_ms=1.5, t_sub_ms=1.2,
                        r=2.5, g=2.0, r_ci=(2.4, 2.6), g_ci=(1.9, 2.1), score=1.16)
    report = GradeReport(
        status=Status.SCORED, score=1.16, reasons=(), workspace="ws", commit="c", tree="t",
        uncommitted_changes_ignored=False, checked=(), not_checked=(), cases=(),
        max_utilisation=0.1, findings=(), started_at="now", wall_s=1.0,
        system=SystemInfo(device="cuda:0", python="3", torch="t", triton="3.6.0", numpy="2",
                          platform="linux"),
        timing=TimingReport(profile="h200", shapes=(shape,), score=1.16),
    )
    _write_plot(report, tmp_path / "report.png", DEFAULT_PATH)
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("flags", "overlap"), [((), None), (("--overlap-timing",), True),
                                                 (("--sequential-timing",), False)])
def test_grade_options_from_the_command_line(flags, overlap, monkeypatch, tmp_path) -> None:
    """What the operator types is what the grade is asked: the timing beside the gate with
    ``--overlap-timing``, after it with ``--sequential-timing``, else as the profile says."""
    import grader.grade
    from grader.cli import main

    asked = []

    def fake_grade(path, options):  # type: ignore[no-untyped-def]
        asked.append(options)
        raise ValueError("stop here")

    monkeypatch.setattr(grader.grade, "grade", fake_grade)
    assert main(["grade", str(tmp_path), "--quiet", *flags]) == ExitCode.USAGE
    assert asked[0].overlap_timing is overlap and asked[0].progress is False


def test_grade_overlaps_as_its_profile_says_unless_asked(monkeypatch) -> None:
    """Without a flag the timing profile decides (h200: measured, on; l4: not measured, off);
    a flag wins over it; a profile that does not exist never overlaps (timing says why)."""
    from grader import telemetry
    from grader.config import DEFAULT_PATH, load_config
    from grader.grade import GradeOptions, grade_profile, overlaps

    config = load_config(DEFAULT_PATH)
    assert config.timing.profiles["h200"].overlap_timing is True
    assert config.timing.profiles["l4"].overlap_timing is False
    names = iter(["NVIDIA H200", "NVIDIA L4", None])
    monkeypatch.setattr(telemetry, "device_info",
                        lambda index=0: telemetry.DeviceInfo(name=next(names)))

    def decided(options: GradeOptions) -> bool:
        return overlaps(options, grade_profile(config, options, 0))

    assert decided(GradeOptions()) is True
    assert decided(GradeOptions()) is False
    assert decided(GradeOptions()) is (
        config.timing.profiles[config.timing.fallback].overlap_timing)
    assert decided(GradeOptions(profile="h200", overlap_timing=False)) is False
    assert decided(GradeOptions(profile="l4", overlap_timing=True)) is True
    assert decided(GradeOptions(profile="smoke")) is False
    assert decided(GradeOptions(profile="nope")) is False
