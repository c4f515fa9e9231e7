"""The harness adapters driven the way their harnesses call them, with no real model, on the CPU
(the Triton interpreter, the CI's reduced case list): the Inspect task under Inspect's own runner
with its mock model and a scripted honest solver (`tests/inspect_honest.py`), and the METR
TaskFamily's methods in the order its harness calls them. A CPU grade times nothing, so no grade
is scored and there is no final regrade to run; the final regrade itself is driven through the
embedded service with the tests' fast fake grade (`tests/service_fake_grade.py`)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from grader_helpers import NAIVE, REPO, ci_config, git, make_workspace

from grader.adapters.grading import LocalGrading, clone_bundle
from grader.service.executors import CommandExecutor

pytestmark = pytest.mark.adapters

FAKE = Path(__file__).resolve().parent / "service_fake_grade.py"


def _fake_executor() -> CommandExecutor:
    return CommandExecutor([sys.executable, str(FAKE), "{workspace}", "{report}", "{final}"])


def test_the_local_grader_grades_a_bundle_and_regrades_the_best_as_final(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"solution.py": "SCORE = 0.1\n"})
    grading = LocalGrading(tmp_path / "store", name="t", executor=_fake_executor(), cpu=True)
    assert grading.final() is None, "nothing scored yet: no final"

    def submit(source: str):  # type: ignore[no-untyped-def]
        (ws / "solution.py").write_text(source)
        git(ws, "commit", "-qam", source)
        subprocess.run(["git", "-C", str(ws), "bundle", "create", "-q", str(tmp_path / "b"),
                        "HEAD"], check=True)  # fmt: skip
        clone = clone_bundle((tmp_path / "b").read_bytes(), tmp_path / f"clone-{source[8:11]}")
        return grading.submit(clone)

    first, best, worse = submit("SCORE = 0.3\n"), submit("SCORE = 0.7\n"), submit("SCORE = 0.4\n")
    assert [o.score for o in (first, best, worse)] == [0.3, 0.7, 0.4]
    assert best.commit == git(ws, "rev-parse", "HEAD~1"), "the report names the agent's commit"
    assert best.state == "graded" and best.score_ci == (0.69, 0.71)
    assert "submission #2: graded, scored, score 0.7000" in best.text
    final = grading.final()
    assert final is not None and final.final and final.submission == best.submission
    assert final.score == 0.7 and final.score_ci == (0.69, 0.71)
    assert final.report is not None and final.report["timing"]["rounds"] == 12, "--final"
    assert final.small() == {
        "submission": 2,
        "commit": best.commit,
        "status": "scored",
        "score": 0.7,
        "score_ci": [0.69, 0.71],
        "final": True,
    }


def test_the_service_grades_each_submission_and_another_gpu_regrades_the_best(
    tmp_path: Path,
) -> None:
    """Real HTTP to the API on 127.0.0.1; two CPU workers (two "GPUs" of one kind), so the
    final regrade runs on the one its submission was not graded on."""
    import io
    import threading

    from grader.adapters.grading import ServiceGrading
    from grader.service.http_server import make_server
    from grader.service.store import Store
    from grader.service.worker import Worker, WorkerOptions, cpu_device

    store = tmp_path / "service"
    server = make_server(store, "127.0.0.1", 0)
    with Store(store) as s:
        operator = s.operator_token()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop = threading.Event()

    def work(name: str) -> None:
        with Store(store) as s:
            Worker(s, cpu_device(name), _fake_executor(), name=name, log=io.StringIO(),
                   options=WorkerOptions(poll_s=0.05)).run(stop=stop.is_set)  # fmt: skip

    workers = [threading.Thread(target=work, args=(n,), daemon=True) for n in ("w1", "w2")]
    for w in workers:
        w.start()
    try:
        grading = ServiceGrading(f"http://127.0.0.1:{server.server_address[1]}", operator,
                                 name="inspect sample 1")  # fmt: skip
        grading.poll_s = 0.1
        ws = make_workspace(tmp_path / "ws", {"solution.py": "SCORE = 0.6\n"})
        bundle = subprocess.run(["git", "-C", str(ws), "bundle", "create", "-q", "-", "HEAD"],
                                capture_output=True, check=True).stdout  # fmt: skip
        first = grading.submit(clone_bundle(bundle, tmp_path / "clone"))
        assert (first.state, first.status, first.score) == ("graded", "scored", 0.6)
        assert "submission #1: graded, scored, score 0.6000" in first.text
        final = grading.final()
        assert final is not None and final.final and final.submission == first.submission
        assert final.score == 0.6 and final.score_ci == (0.59, 0.61)
        assert final.report is not None and final.report["timing"]["rounds"] == 12
        with Store(store) as s:
            [grade, regrade] = s.grades(1)
            assert regrade.purpose == "final" and regrade.gpu_uuid != grade.gpu_uuid
            assert s.run(grading.run).name == "inspect sample 1"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        for w in workers:
            w.join(timeout=30)


def test_a_bundle_that_is_not_one_is_refused(tmp_path: Path) -> None:
    from grader.adapters.grading import GradingError, bundle_head

    with pytest.raises(GradingError, match="does not clone"):
        clone_bundle(b"not a bundle", tmp_path / "x")
    (tmp_path / "empty").mkdir()
    subprocess.run(["git", "init", "-q", str(tmp_path / "empty")], check=True)
    with pytest.raises(GradingError, match="no commit to grade"):
        bundle_head(tmp_path / "empty")


def test_the_service_needs_both_of_its_variables(tmp_path: Path) -> None:
    from grader.adapters.grading import grading_from

    for half in ({"GRADER_URL": "http://127.0.0.1:1"}, {"GRADER_OPERATOR_TOKEN": "t"}):
        with pytest.raises(ValueError, match="needs both GRADER_URL and GRADER_OPERATOR_TOKEN"):
            grading_from(half, store=tmp_path / "s", name="t")


def test_the_inspect_task_grades_under_inspects_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("inspect_ai", reason="the inspect extra: pip install '.[inspect]'")
    from inspect_ai import eval as inspect_eval
    from inspect_ai.event import ScoreEvent
    from inspect_honest import honest_naive

    from grader.adapters.inspect_task import dilated_block

    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the local grader's subprocess imports grader
    for name in ("GRADER_URL", "GRADER_OPERATOR_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    config = ci_config(tmp_path / "scoring.yaml")
    task = dilated_block(store=str(tmp_path / "store"), config=str(config), cpu=True)
    [log] = inspect_eval(task, model="mockllm/model", solver=honest_naive(), sandbox="local",
                         log_dir=str(tmp_path / "logs"), display="none")  # fmt: skip
    assert log.status == "success", log.error
    [sample] = log.samples
    report = sample.store["grade_report"]
    assert "submission #1: graded, checked_untimed, score none (untimed)" in report, report
    assert "correct on every smoke case; nothing was timed (no GPU)" in report
    [event] = [e for e in sample.events if isinstance(e, ScoreEvent) and e.intermediate]
    assert event.score.metadata["status"] == "checked_untimed"
    assert event.score.answer == event.score.metadata["commit"]
    [final] = sample.scores.values()
    assert final.value == 0.0 and final.metadata["final"] is None
    assert "no submission was scored" in final.explanation
    assert [g["status"] for g in final.metadata["grades"]] == ["checked_untimed"]
    # What bench/gpu_session.sh inspect-run prints from the log (and its exit status).
    spec = importlib.util.spec_from_file_location("inspect_log", REPO / "bench" / "adapters" / "inspect_log.py")
    assert spec is not None and spec.loader is not None
    reader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reader)
    lines, timed = reader.summarize(log.location)
    assert not timed and "checked_untimed" in lines[1] and "NO TIMED SCORE > 0" in lines[2]
    prompt = sample.input if isinstance(sample.input, str) else sample.input[0].text
    assert prompt.startswith((REPO / "task" / "PROMPT.md").read_text()[:200])
    assert "call the `grade` tool" in prompt


def _family():  # type: ignore[no-untyped-def]
    path = REPO / "metr" / "dilated_block" / "dilated_block.py"
    spec = importlib.util.spec_from_file_location("dilated_block", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_metr_family_in_its_harness_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    family = _family()
    home, store = tmp_path / "home" / "agent", tmp_path / "root" / "store"
    for name, value in {"DILATED_BLOCK_PROJECT": REPO, "DILATED_BLOCK_AGENT_HOME": home,
                        "DILATED_BLOCK_STORE": store, "DILATED_BLOCK_CPU": "1",
                        "DILATED_BLOCK_CONFIG": ci_config(tmp_path / "scoring.yaml"),
                        "PYTHONPATH": REPO}.items():  # fmt: skip
        monkeypatch.setenv(name, str(value))
    # install() at the image's build: here everything is present, so it asks for nothing.
    asked: list[list[str]] = []
    monkeypatch.setattr(family.subprocess, "check_call", lambda argv: asked.append(argv))
    TaskFamily = family.TaskFamily
    TaskFamily.install()
    assert asked == [], f"install() would run {asked} on a machine that has it all"
    tasks = TaskFamily.get_tasks()
    assert list(tasks) == ["main"]
    t = tasks["main"]
    instructions = TaskFamily.get_instructions(t)
    assert instructions.startswith((REPO / "task" / "PROMPT.md").read_text())
    assert f"`{home}/workspace`" in instructions and "call the `score` tool" in instructions
    assert TaskFamily.get_permissions(t) == []
    TaskFamily.start(t)
    ws = home / "workspace"
    assert git(ws, "log", "--format=%s") == "start: the plain PyTorch block from the template"
    assert not list(home.rglob("reference*")), "the agent's home holds the reference"
    assert (home / "kit" / "PROMPT.md").is_file() and (home / "env.sh").is_file()

    # The agent: the naive Triton solution, committed; an uncommitted edit is not graded.
    (ws / "solution.py").write_text(NAIVE.read_text())
    git(ws, "commit", "-qam", "naive Triton kernels")
    (ws / "solution.py").write_text("broken = \n")
    first = TaskFamily.intermediate_score(t)
    head = git(ws, "rev-parse", "HEAD")
    assert math.isnan(first["score"]), "a CPU grade has no score"
    assert first["details"] == {"commit": head, "status": "checked_untimed", "score": None}
    assert first["message"]["submission"] == 1
    assert "correct on every smoke case; nothing was timed (no GPU)" in first["message"]["report"]
    assert len(json.dumps(first["details"])) < 200, "details stay small (the bridge trims them)"
    # A later call is a fresh process in the harness: the run is found again, the tree known.
    again = _family().TaskFamily.intermediate_score(t)
    assert again["message"]["submission"] == 1 and again["details"] == first["details"]
    # Nothing was scored (a CPU times nothing), so there is no final regrade: NaN, "no score".
    assert math.isnan(TaskFamily.aggregate_scores(t, [first, again]))


def test_the_metr_manifest_asks_for_one_gpu() -> None:
    import yaml

    manifest = yaml.safe_load((REPO / "metr" / "dilated_block" / "manifest.yaml").read_text())
    [(name, spec)] = manifest["tasks"].items()
    assert name in _family().TaskFamily.get_tasks()
    assert spec["resources"]["gpu"] == {"count_range": [1, 1], "model": "h100"}
    assert spec["resources"]["cpus"] >= 4 and spec["resources"]["memory_gb"] >= 32
    assert set(spec["scoring"]) <= {"visible_to_agent", "score_on_usage_limits", "instructions"}
