"""The local check's own parts: case selection, published g, the estimate, snapshots, messages."""

from __future__ import annotations

import io
import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from grader.agent import check, check_report, estimate, hints, repro, worktree
from grader.config import ConfigError, load_config
from grader.report import (
    CaseResult,
    CheckResult,
    ExitCode,
    RuleFinding,
    Severity,
    ShapeTiming,
    Status,
    TimingReport,
)

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
    """Every published entry, of the scoring reference or the ceiling, covers its profile's
    shapes and has a basis; an entry without g says why. Until the GPU run of issue 41 the
    scoring reference has no g anywhere, and never the ceiling's in their place."""
    for name, profile in CONFIG.timing.profiles.items():
        for block in estimate.SECTIONS:
            published, why = estimate.published_entry(name, block)
            if published is None:
                assert why.startswith("no published g of the "), (name, block, why)
                continue
            assert set(published.g) == {s.label for s in profile.shapes}, (name, block)
            assert published.basis in estimate.BASES and published.block == block
    assert estimate.load_published("smoke") is None
    h200 = estimate.load_ceiling("h200")
    assert h200 is not None and h200.basis == "measured"
    ref = estimate.load_published("h200")
    assert ref is None or ref.g != h200.g, "the scoring reference's g are the ceiling's"


def _published_file(tmp_path: Path, reference: dict, ceiling: dict | None = None) -> Path:
    path = tmp_path / "published.json"
    path.write_text(json.dumps({"schema": 2, "reference": {"profiles": reference},
                                "ceiling": {"profiles": ceiling or {}}}))
    return path


def test_published_entries_say_what_they_are(tmp_path: Path) -> None:
    """A g null entry is no g (with its reason), a bad basis or old schema is refused, and a
    modelled entry is read as modelled."""
    g = {s.label: 2.5 for s in CONFIG.timing.profiles["l4"].shapes}
    path = _published_file(tmp_path, {
        "l4": {"basis": "modelled", "source": "bytes model", "g": g},
        "h200": {"basis": None, "source": "not yet measured: pending", "g": None},
    }, {"h200": {"basis": "measured", "source": "old", "g": {"x": 3.0}}})
    l4 = estimate.load_published("l4", path)
    assert l4 is not None and l4.basis == "modelled" and l4.g == g and l4.block == "reference"
    none, why = estimate.published_entry("h200", "reference", path)
    assert none is None and why == ("no published g of the scoring reference for profile h200: "
                                    "not yet measured: pending")
    assert estimate.load_ceiling("h200", path).g == {"x": 3.0}  # type: ignore[union-attr]
    assert estimate.published_entry("l4", "ceiling", path) == (
        None, "no published g of the ceiling for profile l4")
    bad = _published_file(tmp_path, {"l4": {"basis": "guessed", "g": g}})
    with pytest.raises(ConfigError, match="basis='guessed' must be one of"):
        estimate.load_published("l4", bad)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema": 1, "profiles": {"l4": {"g": g}}}))
    with pytest.raises(ConfigError, match="schema=1: expected schema 2"):
        estimate.load_published("l4", old)


def test_quick_and_full_case_selection() -> None:
    cases, drift = check.select_cases(CONFIG, check_report.Mode.QUICK, gpu=False)
    assert cases == CONFIG.smoke_cases()
    assert all(c.smoke for c in drift) and drift
    gpu_cases, _ = check.select_cases(CONFIG, check_report.Mode.QUICK, gpu=True)
    extra = [c for c in gpu_cases if not c.smoke]
    assert sorted(c.dtype for c in extra) == ["bfloat16", "float16", "float32"]
    full, full_drift = check.select_cases(CONFIG, check_report.Mode.FULL, gpu=False)
    assert full == CONFIG.correctness.cases and full_drift == CONFIG.correctness.drift.cases
    one, none = check.select_cases(CONFIG, check_report.Mode.QUICK, gpu=False, names=["c5-l127-d3"])
    assert [c.name for c in one] == ["c5-l127-d3"] and none == ()
    with pytest.raises(ConfigError, match=r"no case named \['nope'\].*c1-l1"):
        check.select_cases(CONFIG, check_report.Mode.QUICK, gpu=False, names=["nope"])


def _timing(status: str = "ok", r: float = 2.0) -> TimingReport:
    shapes = tuple(
        ShapeTiming(label=s.label, t_plain_ms=2.0, t_ref_ms=2.0, t_sub_ms=2.0 / r, r=r, g=1.01,
                    r_ci=(r * 0.9, r * 1.1))
        for s in CONFIG.timing.profiles["l4"].shapes
    )
    return TimingReport(profile="l4", shapes=shapes, status=status, reason="" if status == "ok"
                        else "a timed step's result differs from plain PyTorch")


def test_estimate_uses_measured_r_and_published_g() -> None:
    g = {s.label: 4.0 for s in CONFIG.timing.profiles["l4"].shapes}
    published = estimate.Published("l4", g, basis="measured", source="test")
    est = estimate.estimate(_timing(r=2.0), published, CONFIG)
    want = math.log(2.0) / math.log(1.1 * 4.0)
    assert est.score == pytest.approx(want)
    assert all(s.score == pytest.approx(want) and s.target == pytest.approx(4.4)
               for s in est.shapes)
    assert all(s.noise == 1.01 for s in est.shapes), "plain vs itself is reported as noise"
    # A failed timing phase estimates 0, never a number from the samples.
    failed = estimate.estimate(_timing(status="check_failed"), published, CONFIG)
    assert failed.score == 0.0 and all(s.score == 0.0 for s in failed.shapes)
    # No published g: no estimate, and it says why.
    none = estimate.estimate(_timing(), None, CONFIG)
    assert none.score is None and none.basis is None and "no published g" in none.source


def test_no_reference_g_estimates_nothing_and_the_ceiling_stays_information() -> None:
    """The scoring reference without g: no score, the reason shown; the ceiling's g, given,
    appear as r over them and change no score; the ceiling's g cannot score."""
    labels = [s.label for s in CONFIG.timing.profiles["l4"].shapes]
    ceiling = estimate.Published("l4", dict.fromkeys(labels, 4.0), basis="measured",
                                 source="ceiling run", block="ceiling")
    est = estimate.estimate(_timing(r=2.0), None, CONFIG, ceiling=ceiling,
                            why_none="no published g of the scoring reference for profile l4: "
                                     "not yet measured")
    assert est.score is None and est.basis is None and all(s.score is None for s in est.shapes)
    assert all(s.ceiling_g == 4.0 and s.vs_ceiling == pytest.approx(0.5) for s in est.shapes)
    text = "\n".join(check_report._render_estimate(est, None))
    assert "estimated score: none: no published g of the scoring reference for profile l4: " \
        "not yet measured" in text
    assert "information only, never in the score" in text and "r/g 0.50" in text
    with pytest.raises(ValueError, match="scoring reference's g only"):
        estimate.estimate(_timing(), ceiling, CONFIG)
    modelled = estimate.Published("l4", dict.fromkeys(labels, 4.0), basis="modelled",
                                  source="bytes")
    scored = estimate.estimate(_timing(r=2.0), modelled, CONFIG, ceiling=ceiling)
    assert scored.score == pytest.approx(math.log(2.0) / math.log(4.4))
    assert "MODELLED published g" in "\n".join(check_report._render_estimate(scored, None))


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
    out = check_report.render(report)
    assert "FAILED  case c5-l9-d4#1301" in out
    assert "check grad_conv: error 0.01 vs budget 0.003" in out
    assert "reproduce: python -m grader check --repro 'c5-l9-d4#1301'" in out
    assert "next: fix c5-l9-d4 first; rerun just it with python -m grader check --case c5-l9-d4" in out
    assert "note: 1 uncommitted change(s)" in out


def test_outside_a_workspace_says_where_to_run(tmp_path: Path) -> None:
    with pytest.raises(worktree.WorktreeError, match="Run this from your workspace"):
        check.run_check(tmp_path, progress=None)
    # An invalid submission, as the workspace's README says (issue 38: it exited 2).
    assert check.main(["--workspace", str(tmp_path)]) == 10


def test_timing_runs_plain_in_the_reference_slot_and_estimates(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a GPU the check times with the grader's engine, plain PyTorch standing in for the
    reference (the agent's environment has none), and scores with the published g."""
    import numpy as np

    import grader.timing_run

    seen: dict[str, object] = {}

    def fake_run_timing(root: Path, config: object, **kwargs: object) -> TimingReport:
        seen.update(kwargs, root=root)
        report = _timing(r=3.0)
        shapes = tuple(ShapeTiming(**{**s.__dict__, "r": np.float64(3.0)}) for s in report.shapes)
        return TimingReport(profile="l4", shapes=shapes, telemetry={"x": np.arange(2)})

    monkeypatch.setattr(grader.timing_run, "run_timing", fake_run_timing)
    timing, est = check._time(tmp_path, CONFIG, None, 1, None)
    assert seen["reference_module"] == "task.model" == check.PLAIN_AS_REFERENCE
    assert seen["gpu"] == 1  # the check's --gpu reaches the timing child
    assert est.profile == "l4"
    published = estimate.load_published("l4")
    if published is None:  # not yet modelled (issue 41): no score, and the reason
        assert est.score is None and est.basis is None and "scoring reference" in est.source
    else:
        assert est.basis == published.basis
        assert est.shapes[0].score == pytest.approx(
            CONFIG.score.shape_score(3.0, published.g[est.shapes[0].label]))
    assert check._timing_verdict(timing, est) == (Status.SCORED, ())
    failed = TimingReport(profile="l4", status="implausible", reason="below the floor")
    assert check._timing_verdict(failed, est) == (
        Status.TIMING_FAILED, ("timing implausible: below the floor",))
    # The report serialises numpy values from the statistics.
    report = check_report.CheckReport(
        status=Status.SCORED, reasons=(), next_steps=(), mode=check_report.Mode.QUICK,
        source="working tree", workspace=str(tmp_path), head=None, uncommitted=(),
        device="cuda:0", timing=timing, estimate=est)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["timing"]["shapes"][0]["r"] == 3.0 and data["exit_code"] == 0
    assert "estimated score: " in check_report.render(report)


def _crashing(tmp: Path) -> tuple[Path, int]:
    """A workspace whose stats kernel calls .to() on a range() loop variable: a plain int in the
    interpreter, so every item raises an InterpreterError. Returns it and the line that raises."""
    text = NAIVE.read_text()
    bad = "offs = start.to(tl.int64) + tl.arange(0, BLOCK)"
    text = text.replace("offs = start + tl.arange(0, BLOCK)", bad, 1)
    ws = _workspace(tmp)
    (ws / "solution.py").write_text(text)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if bad in s)
    return ws, line


def test_crash_names_the_lines_in_the_workspace_and_a_next_step(tmp_path: Path) -> None:
    """A crash used to print only repr(e), the same reason twice under --case, and a circular
    'run the failing case alone (--case NAME)' after --case had been used."""
    if not NAIVE.is_file():
        pytest.skip(f"{NAIVE} is missing")
    ws, line = _crashing(tmp_path)
    progress = io.StringIO()
    report = check.run_check(ws, cases=["c1-l1"], progress=progress)
    assert report.status is Status.CRASHED and report.exit_code == 14
    assert progress.getvalue().startswith("gate (chosen cases): 3 items of 1 case, public seeds")
    out = check_report.render(report)
    # The kernel's line (the InterpreterError's cause) is the deepest frame, under the case.
    assert f"      at solution.py:{line} in _stats: offs = start.to(tl.int64)" in out
    assert "in forward: " in out.split(f"solution.py:{line}")[0].split("FAILED")[1]
    assert report.frames["c1-l1#1101"][-1].startswith(f"solution.py:{line} in _stats")
    # Each item's reason once.
    status = out.split("status: crashed")[1]
    assert status.count("  - c1-l1#1101: the submission raised") == 1
    assert len(report.reasons) == len(set(report.reasons))
    steps = "\n".join(report.next_steps)
    assert "--case NAME" not in steps and "--case c1-l1" not in steps, steps
    assert "read above where it raised" in steps
    assert "python -m grader check --repro 'c1-l1#1101'" in steps
    assert "range() loop variable is a plain int" in steps
    # Without --case, the next step names the case to narrow to.
    steps = hints._next_steps(report.status, _result(report), None, False,
                              worktree.state(ws), None, narrowed=False)  # fmt: skip
    assert "python -m grader check --case c1-l1 --no-time" in steps[0]


def _result(report: check_report.CheckReport) -> object:
    import types

    return types.SimpleNamespace(cases=report.cases, findings=report.findings, items=())


def test_repro_writes_a_script_that_runs_the_item_and_checks_it(tmp_path: Path) -> None:
    """The reproduce recipe used to end in 'truth task.oracle.oracle_step(...)': not runnable."""
    if not NAIVE.is_file():
        pytest.skip(f"{NAIVE} is missing")
    ws = _workspace(tmp_path, NAIVE)
    assert check.main(["--workspace", str(ws), "--repro", "c1-l1#1102"]) == 0
    script = ws / "scratch" / "repro_c1-l1_1102.py"
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TRITON_"))}
    run = subprocess.run([sys.executable, str(script.relative_to(ws))], cwd=ws, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    names = [line.split(":")[0] for line in run.stdout.splitlines()]
    assert names == ["ok   forward", "ok   grad_x", "ok   grad_conv", "ok   grad_fc1",
                     "ok   grad_fc2"], run.stdout  # fmt: skip
    # A wrong kernel: a script for a case with a nonzero conv gradient says FAIL and exits 1,
    # so a shell loop can tell.
    text = (ws / "solution.py").read_text()
    (ws / "solution.py").write_text(text.replace("return dx, dw, None, None",
                                                 "return dx, dw * 1.01, None, None"))
    script = repro.write_repro(CONFIG, "c5-l9-d4#1301", ws)
    run = subprocess.run([sys.executable, str(script.relative_to(ws))], cwd=ws, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert "FAIL grad_conv" in run.stdout
    # Identity and drift items, and a case name alone (its first seed).
    assert repro.find_item(CONFIG, "c1-l1#1101/identity").kind == "identity"
    assert repro.find_item(CONFIG, "drift-c9-l20-d3").kind == "drift"
    assert repro.find_item(CONFIG, "c1-l1").name == "c1-l1#1101"
    for name in ("drift-c9-l20-d3#8401", "c16-l1024-offset#1601/identity"):
        compile(repro.write_repro(CONFIG, name, ws).read_text(), name, "exec")
    with pytest.raises(ConfigError, match="no gate item named 'c1-l1#9'"):
        repro.find_item(CONFIG, "c1-l1#9")
    assert check.main(["--workspace", str(ws), "--repro", "nope"]) == 2


def _case(name: str, *checks: CheckResult) -> CaseResult:
    return CaseResult(name, "case", "float32", (2, 9, 5), 1, all(c.passed for c in checks),
                      checks, max((c.utilisation or 0.0 for c in checks), default=None),
                      next((f"{c.name}: {c.detail}" for c in checks if not c.passed), ""))


def _report(**kw: object) -> check_report.CheckReport:
    base = dict(status=Status.CHECKED_UNTIMED, reasons=(), next_steps=(),
                mode=check_report.Mode.QUICK, source="working tree", workspace="/ws", head=None,
                uncommitted=(),
                device="cpu (triton interpreter)", items_total=12)  # fmt: skip
    base.update(kw)
    return check_report.CheckReport(**base)  # type: ignore[arg-type]


def test_rule_break_summary_passes_nothing_and_lists_every_finding() -> None:
    """The template's first check said '1 of 12 items passed' for the item that broke the rules,
    and showed 5 of its 7 rule lines."""
    findings = tuple(
        RuleFinding(f"rule-{i}", Severity.VIOLATION, "runtime", f"message {i}",
                    phase=f"{'forward' if i < 5 else 'backward'}:c1-l1#1101")
        for i in range(7))  # fmt: skip
    report = _report(
        status=Status.RULE_BROKEN, cases=(_case("c1-l1#1101", CheckResult("forward", True)),),
        findings=findings, reasons=tuple(f"{f.rule} ({f.phase}): {f.message}" for f in findings))
    out = check_report.render(report)
    assert "gate: 0 of 12 items passed (stopped at the first rule break in c1-l1#1101)" in out
    # Each rule line once: as a RULE BROKEN line, not again among the status's reasons.
    assert all(out.count(f"rule-{i}") == 1 and f"RULE BROKEN  rule-{i} in " in out
               for i in range(7)), out
    assert "  - the 7 rule break(s) above" in out
    # A drift item's step phase names the item too.
    drift = _report(status=Status.RULE_BROKEN, cases=(_case("d#1", CheckResult("x", True)),),
                    findings=(RuleFinding("r", Severity.VIOLATION, "runtime", "m",
                                          phase="forward:d#1/step2"),), reasons=("r",))
    out = check_report.render(drift)
    assert "0 of 12 items passed (stopped at the first rule break in d#1)" in out


def test_forward_failure_reads_as_a_ratio_with_both_values() -> None:
    detail = ("output off by 0.0114 at (1, 1023, 4) (got 996.715, expected 996.727; allowed "
              "0.0002); 868 values over budget")
    case = _case("c16-l1024-offset#1601", CheckResult("forward", False, 56.9, 1.0, 56.9, detail))
    out = check_report.render(_report(status=Status.GATE_FAILED, cases=(case,), reasons=("x",)))
    assert ("    check forward: max |err|/(atol+rtol·|ref|) = 56.9 (> 1 fails); output off by "
            "0.0114") in out
    assert "got 996.715, expected 996.727; allowed 0.0002" in out
    assert "vs budget 1 " not in out


def test_a_pass_names_the_checks_closest_to_their_budget() -> None:
    cases = tuple(_case(f"c{i}#1", CheckResult("forward", True, u, 1.0, u),
                        CheckResult("grad_x", True, u / 2, 1.0, u / 2))
                  for i, u in enumerate((0.1, 0.32, 0.05, 0.2)))  # fmt: skip
    out = check_report.render(_report(cases=cases))
    assert ("closest to the budget: c1#1 forward 0.320, c3#1 forward 0.200, c0#1 forward 0.100 "
            "(a --json FILE report has every check's)") in out


def test_family_hints_for_failed_cases() -> None:
    """One hint per input family with a failing case (task/inputs.py), none for passing ones."""
    import types

    by = {c.family: c for c in CONFIG.correctness.cases}
    items = [types.SimpleNamespace(name=f"{f}#1", case=by[f])
             for f in ("offset", "tiny", "scale", "normal")]  # fmt: skip
    bad = CheckResult("forward", False, math.inf, 1.0, math.inf, "3 of 9 output values are not "
                      "finite")
    cases = (_case("offset#1", bad), _case("tiny#1", bad), _case("scale#1", CheckResult("x", True)),
             _case("normal#1", bad))
    result = types.SimpleNamespace(cases=cases, items=items, findings=())
    got = hints._hints(result)
    assert got == [hints.FAMILY_HINTS["offset"], hints.FAMILY_HINTS["tiny"],
                   hints.NON_FINITE_HINT]  # fmt: skip
    assert "Welford/Chan" in got[0] and "before the rsqrt" in got[1]
    assert "fp16" in hints.FAMILY_HINTS["scale"]
    assert set(hints.FAMILY_HINTS) == {f for f in by if f != "normal"}


def test_before_submit_advice_depends_on_the_device(tmp_path: Path) -> None:
    """On a CPU --full runs every case through the interpreter (tens of minutes): the advice
    says so; on the GPU it still asks for --full before submitting."""
    import types

    where = worktree.state(_workspace(tmp_path))
    result = types.SimpleNamespace(cases=(), findings=(), items=())
    cpu = hints._next_steps(Status.CHECKED_UNTIMED, result, None, False, where, None)
    gpu = hints._next_steps(Status.SCORED, result, None, True, where, None)
    assert "--full is slow here" in cpu[-1] and "the GPU grade runs every case" in cpu[-1]
    assert not any("before you submit" in s for s in cpu)
    assert gpu[-1] == ("run python -m grader check --full before you submit, then "
                       "python -m grader submit --wait")


def test_workspace_readme_lists_every_exit_code_and_the_interpreter_tips() -> None:
    readme = (REPO / "workspace_template" / "README.md").read_text()
    for code in ExitCode:
        if code in (ExitCode.GRADER_ERROR, ExitCode.USAGE):
            assert "| 1 / 2 |" in readme
            continue
        assert f"| {int(code)} | `{Status[code.name].value}` |" in readme, code
    assert "TRITON_INTERPRET=1" in readme and "--repro NAME" in readme
    assert "`range`/`tl.range` loop variable is a plain\n`int`" in readme
    assert "tens of minutes" in readme
