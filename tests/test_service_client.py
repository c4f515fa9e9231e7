"""The agent's ``submit`` against the operator's service: real HTTP on 127.0.0.1 to the API
(`grader.service.http_server.make_server` in a thread), a real git workspace, a worker thread grading with
the fast fake grader (`tests/service_fake_grade.py`). The happy path and a refused token run
``python -m grader submit`` as the agent does, in a subprocess with only the environment."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from grader_helpers import REPO, git, make_workspace
from service_helpers import FAKE_GRADE

from grader.agent.submit import EXIT_PENDING, EXIT_REFUSED, EXIT_STORE, main
from grader.service.client import RUN_ENV, Client, ClientError
from grader.service.executors import CommandExecutor
from grader.service.http_server import make_server
from grader.service.store import Store
from grader.service.worker import Worker, WorkerOptions, cpu_device


@dataclass(frozen=True)
class Service:
    url: str
    store: Path
    run: str
    token: str
    other_run: str
    other_token: str

    def env(self, token: str | None = None, run: str | None = None) -> dict[str, str]:
        """What the operator gives the agent (with the run id: see
        `test_the_run_is_found_from_the_token_alone`)."""
        return {"GRADER_URL": self.url, "GRADER_TOKEN": token or self.token,
                RUN_ENV: run or self.run}  # fmt: skip


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    store = tmp_path / "service"
    server = make_server(store, "127.0.0.1", 0)
    with Store(store) as s:
        run, token = s.create_run("agent one")
        other, other_token = s.create_run("agent two")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Service(f"http://127.0.0.1:{server.server_address[1]}", store, run.id, token,
                      other.id, other_token)  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def worker(service: Service) -> Iterator[None]:
    """One worker on the CPU, grading with the fake grader until the test ends."""
    stop = threading.Event()

    def work() -> None:
        with Store(service.store) as store:
            executor = CommandExecutor([sys.executable, str(FAKE_GRADE), "{workspace}",
                                        "{report}"], poll_s=0.05)  # fmt: skip
            Worker(store, cpu_device("test-worker"), executor, name="test-worker",
                   options=WorkerOptions(poll_s=0.05), log=io.StringIO()).run(stop=stop.is_set)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(timeout=30)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_workspace(tmp_path / "ws", {"solution.py": '"""Fake."""\nSCORE = 0.7\n'})


def _agent(ws: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m grader submit ARGS`` in the workspace, as the agent runs it."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GRADER_", "PYTHON"))}
    return subprocess.run([sys.executable, "-m", "grader", "submit", *args], cwd=ws,
                          env={**base, "PYTHONPATH": str(REPO), **env}, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip


def _as(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name in ("GRADER_URL", "GRADER_TOKEN", RUN_ENV, "GRADER_STORE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_submit_prints_the_id_and_the_same_tree_again_is_already_submitted(
    service: Service, ws: Path
) -> None:
    head = git(ws, "rev-parse", "HEAD")
    sent = _agent(ws, service.env(), "--note", "first try \u2713")
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert f"submitted #1: commit {head[:12]}" in sent.stdout
    assert f"sent to {service.url} (run {service.run})" in sent.stdout
    assert "next: python -m grader submit show 1" in sent.stdout

    git(ws, "commit", "-q", "--allow-empty", "-m", "nothing new")
    again = _agent(ws, service.env())
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already submitted as #1" in again.stdout and "(queued, score -)" in again.stdout

    with Store(service.store) as store:
        [only] = store.submissions(service.run)
        assert (only.commit, only.tree) == (head, git(ws, "rev-parse", "HEAD^{tree}"))
        assert only.note == "first try ?", "a header is Latin-1: the rest is replaced"
        assert store.submissions(service.other_run) == []


def test_a_refused_token_says_so_and_exits_non_zero(service: Service, ws: Path) -> None:
    sent = _agent(ws, service.env(token="not-the-token"))
    assert sent.returncode == EXIT_REFUSED
    assert sent.stdout == ""
    assert f"the grading service at {service.url} refused GRADER_TOKEN" in sent.stderr
    assert "this token is not known to this service (HTTP 401)" in sent.stderr
    with Store(service.store) as store:
        assert store.submissions(service.run) == []


def test_wait_prints_the_report_a_worker_wrote(
    service: Service, ws: Path, worker: None, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    sent = _agent(ws, service.env(), "--wait", "--timeout", "60")
    assert sent.returncode == 0, sent.stdout + sent.stderr
    out = sent.stdout
    assert "submitted #1" in out and "waiting for #1 to be graded on the operator's GPUs" in out
    assert "submission #1: graded, scored, score 0.7000" in out
    assert "graded on cpu by the operator's service" in out
    # The worker's report is a GradeReport: shown as the grader's own table.
    assert "status: scored    score: 0.7000" in out and "device: fake" in out
    assert "best = #1 with 0.7000" in out
    assert "#1: graded" in sent.stderr, "progress on stderr"

    _as(monkeypatch, service.env())
    report = tmp_path / "report.json"
    assert main(["--workspace", str(ws), "show", "1", "--json", str(report)]) == 0
    assert "submission #1: graded, scored, score 0.7000" in capsys.readouterr().out
    assert '"status": "scored"' in report.read_text()
    assert main(["--workspace", str(ws), "list"]) == 0
    listed = capsys.readouterr().out
    assert "graded   scored           0.7000" in listed and "best: #1" in listed


def test_another_runs_token_cannot_show_this_runs_submission(
    service: Service, ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _as(monkeypatch, service.env())
    assert main(["--workspace", str(ws)]) == 0
    capsys.readouterr()
    _as(monkeypatch, service.env(token=service.other_token, run=service.other_run))
    assert main(["--workspace", str(ws), "show", "1"]) == EXIT_REFUSED
    err = capsys.readouterr().err
    # The same 404 as a submission that does not exist: nothing of the other run leaks.
    assert f"no submission 1 in this token's run (HTTP 404 from {service.url}" in err
    # Nor list it through the other run's id.
    _as(monkeypatch, service.env(token=service.other_token, run=service.run))
    assert main(["list"]) == EXIT_REFUSED
    assert "this token belongs to another run" in capsys.readouterr().err
    _as(monkeypatch, service.env(token=service.other_token, run=service.other_run))
    assert main(["list"]) == 0
    assert "no submissions yet" in capsys.readouterr().out


def test_a_dirty_tree_is_refused_before_anything_is_sent(
    service: Service, ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _as(monkeypatch, service.env())
    (ws / "solution.py").write_text("SCORE = 0.9\n")
    assert main(["--workspace", str(ws)]) == EXIT_REFUSED
    err = capsys.readouterr().err
    assert "refusing to submit: 1 uncommitted change(s)" in err and "--allow-dirty" in err
    with Store(service.store) as store:
        assert store.submissions(service.run) == []
    assert main(["--workspace", str(ws), "--allow-dirty"]) == 0
    assert "note: 1 uncommitted change(s) were NOT sent: solution.py" in capsys.readouterr().out


@pytest.mark.parametrize("only", ["GRADER_URL", "GRADER_TOKEN"])
def test_one_variable_without_the_other_is_a_usage_error(
    only: str, service: Service, ws: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    _as(monkeypatch, {only: service.env()[only]})
    assert main(["--workspace", str(ws)]) == EXIT_REFUSED
    other = "GRADER_TOKEN" if only == "GRADER_URL" else "GRADER_URL"
    assert f"{only} is set but {other} is not" in capsys.readouterr().err


def test_grade_and_store_are_local_only(
    service: Service, ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _as(monkeypatch, service.env())
    assert main(["grade"]) == EXIT_REFUSED
    assert "grade runs here with the local store only" in capsys.readouterr().err
    assert main(["--store", str(ws.parent / "s"), "list"]) == EXIT_REFUSED
    assert "--store names the local store" in capsys.readouterr().err


def test_wait_gives_up_after_its_timeout_and_says_how_to_look_later(
    service: Service, ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _as(monkeypatch, service.env())
    assert main(["--workspace", str(ws), "--wait", "--timeout", "0.3"]) == EXIT_PENDING
    err = capsys.readouterr().err
    assert "#1 is still queued after 0.3 s" in err and "python -m grader submit show 1" in err


def test_an_unreachable_service_names_its_url(
    ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _as(monkeypatch, {"GRADER_URL": f"http://127.0.0.1:{port}", "GRADER_TOKEN": "t",
                      RUN_ENV: "run-x"})  # fmt: skip
    assert main(["--workspace", str(ws)]) == EXIT_STORE
    assert (f"cannot reach the grading service at http://127.0.0.1:{port}"
            in capsys.readouterr().err)  # fmt: skip


def test_client_errors_carry_the_status_and_the_servers_text(service: Service) -> None:
    client = Client(service.url, service.token, run=service.run)
    with pytest.raises(ClientError) as missing:
        client.submission(99)
    assert missing.value.status == 404 and missing.value.server_error.startswith("no submission 99")
    assert f"(HTTP 404 from {service.url}/v1/submissions/99)" in str(missing.value)
    with pytest.raises(ClientError) as bad:
        client.upload(b"not a tar at all", "c" * 40)
    assert bad.value.status == 400 and "tar" in bad.value.server_error
    with pytest.raises(ValueError, match="GRADER_URL must be http://HOST:PORT"):
        Client("127.0.0.1:8750", "t")


def test_the_run_is_found_from_the_token_alone(
    service: Service, ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _as(monkeypatch, {"GRADER_URL": service.url, "GRADER_TOKEN": service.token})
    code = main(["--workspace", str(ws)])
    err = capsys.readouterr().err
    if code != 0:  # meanwhile the message says what to set
        assert f"set {RUN_ENV} to the run id the operator gave you" in err
    assert code == 0, err
