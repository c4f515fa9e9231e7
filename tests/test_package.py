"""The operator's path as a new user takes it: a wheel of the project, a fresh venv, and the
README's "Grading service (operators)" block run command by command, from a folder that is not
the checkout and with no ``PYTHONPATH`` (issue 38: the worker failed every grade with `No module
named grader`, and a non-editable install could not read ``scoring.yaml``)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import site
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from grader_helpers import make_workspace

from grader.service.store import GradeState, Store

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "corpus"
# The README's block, exactly: a change to it is a change to this test.
README_BLOCK = [
    "pip install '.[service]'",
    "grader serve --store /srv/grader --host 127.0.0.1 --port 8750 &",
    "grader worker --store /srv/grader --cpu &",
    "grader run create my-run --store /srv/grader",
    "GRADER_URL=http://127.0.0.1:8750 GRADER_TOKEN=<token> grader submit --wait",
    "grader run status <run> --store /srv/grader",
    "grader run best <run> --store /srv/grader",
    "grader run regrade <submission> --store /srv/grader",
    "grader run report <run> --store /srv/grader",
    "grader run finalize <run> --store /srv/grader",
]
# What the wheel must carry for a grade and the agent's tools, beside the modules.
PACKAGE_DATA = ("grader/scoring.yaml", "grader/published_speedups.json", "task/PROMPT.md",
                "task/model.py", "reference/plans/h200.json", "grader/child/confine.py")  # fmt: skip


def readme_block() -> list[str]:
    """The commands of the first ``bash`` block of the README's operator section, comments and
    alignment dropped."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Grading service (operators)"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    commands = []
    for line in block.group(1).splitlines():
        command = re.sub(r"\s+#.*$", "", line).strip()
        if command and not command.startswith("#"):
            commands.append(re.sub(r"\s+", " ", command))
    return commands


def test_the_readme_block_is_the_one_this_test_runs() -> None:
    assert readme_block() == README_BLOCK


def build_wheel(dest: Path) -> Path:
    """A wheel of the checkout as it is (tracked and untracked files git does not ignore), built
    from a copy so the checkout gets no build folders."""
    source = dest / "source"
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard",
                            "-z"], capture_output=True, check=True).stdout.split(b"\0")  # fmt: skip
    for name in filter(None, (f.decode() for f in files)):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((REPO / name).read_bytes())
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps",
                    "--no-build-isolation", "--quiet", "-w", str(dest / "dist")], check=True,
                   capture_output=True)  # fmt: skip
    (wheel,) = (dest / "dist").glob("*.whl")
    return wheel


def fresh_venv(dest: Path, wheel: Path) -> Path:
    """A new venv with the wheel installed (no dependencies), and the dependencies given by a
    ``.pth`` naming this environment's site folders: torch's CPU wheel alone is 200 MB, and CI
    has no index to spare; the ``grader`` package itself comes only from the wheel (asserted)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    python = dest / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                    "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True)  # fmt: skip
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"], check=True,
                             capture_output=True, text=True).stdout.strip()  # fmt: skip
    shared = [p for p in site.getsitepackages() if "grader" not in os.listdir(p)]
    (Path(purelib) / "zz_shared_dependencies.pth").write_text("\n".join(shared) + "\n")
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_readme_operator_block_runs_from_a_wheel(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "build")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = next(z.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
        assert set(PACKAGE_DATA) <= names, set(PACKAGE_DATA) - names
        # The wheel's contract is the checkout's, byte for byte (setup.py copies it).
        assert z.read("grader/scoring.yaml") == (REPO / "scoring.yaml").read_bytes()
    assert not any(n.startswith(("tests/", "bench/")) for n in names)
    venv = fresh_venv(tmp_path / "venv", wheel)
    here = tmp_path / "elsewhere"  # not the checkout: nothing of it is found from here
    here.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "GRADER_URL", "GRADER_TOKEN", "GRADER_STORE")}  # fmt: skip
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1")
    where = subprocess.run(["python", "-c", "import grader; print(grader.__file__)"], cwd=here,
                           env=env, capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert Path(where.strip()).is_relative_to(venv), where
    # Installed, no child may read the grader's, the task's or the reference's package (the
    # harness copies what a child runs), while the rest of site-packages stays readable.
    probe = subprocess.run(["python", "-c", "import json, pathlib, grader.confinement as c\n"
                            "h = c.Harness(pathlib.Path('harness'))\n"
                            "print(json.dumps([c.forbidden_paths(), str(c.PROJECT_DIR), "
                            "sorted(str(p.relative_to(h.root)) for p in h.root.rglob('*.py'))"
                            "]))"], cwd=here, env=env, capture_output=True, text=True,
                           check=True).stdout  # fmt: skip
    forbidden, project, harness = json.loads(probe)
    assert Path(project).is_relative_to(venv.resolve()), project
    assert forbidden == [f"{project}/grader", f"{project}/reference", f"{project}/task"]
    assert {"grader/__init__.py", "task/model.py", "grader/child/gate.py"} <= set(harness)

    store, port = tmp_path / "srv" / "grader", free_port()
    values: dict[str, str] = {}
    naive = (CORPUS / "naive_triton" / "solution.py").read_text()
    workspaces = [  # the honest naive control, then its conv weight's gradient with taps swapped
        make_workspace(tmp_path / "naive", {"solution.py": naive}),
        make_workspace(tmp_path / "wrong", {"naive_triton.py": naive, "solution.py": (
            CORPUS / "wrong_conv_grad" / "solution.py").read_text()}),
    ]  # fmt: skip
    background: list[subprocess.Popen[str]] = []

    def words(command: str) -> list[str]:
        command = command.replace("/srv/grader", str(store)).replace("8750", str(port))
        for key, value in values.items():
            command = command.replace(f"<{key}>", value)
        return shlex.split(command)

    def run(argv: list[str], cwd: Path = here, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, cwd=cwd, env={**env, **extra}, capture_output=True,
                              text=True, timeout=900, check=False)  # fmt: skip

    try:
        for command in README_BLOCK:
            argv = words(command.removesuffix(" &"))
            if command.startswith("pip install"):
                # Done above: the wheel pip builds from ".", installed in a fresh venv; its
                # service extra's packages come with the environment (fresh_venv's .pth).
                assert "Provides-Extra: service" in metadata, metadata
                continue
            if command.endswith("&"):
                background.append(subprocess.Popen(argv, cwd=here, env=env, text=True,
                                                   stdout=subprocess.PIPE,
                                                   stderr=subprocess.PIPE))  # fmt: skip
                if argv[1] == "serve":  # it listens before anything is sent to it
                    _wait_for_port(port, background[-1])
                continue
            if argv[0].startswith("GRADER_URL="):
                assignments = dict(w.split("=", 1) for w in argv[:2])
                codes = [run(argv[2:], cwd=ws, **assignments) for ws in workspaces]
                assert [c.returncode for c in codes] == [3, 13], [c.stderr for c in codes]
                assert "checked_untimed" in codes[0].stdout and "gate_failed" in codes[1].stdout
                with Store(store) as s:
                    values["submission"] = str(s.submissions(values["run"])[0].id)
                continue
            done = run(argv)
            verb = argv[2] if argv[1] == "run" else argv[1]
            if verb == "create":
                assert done.returncode == 0, done.stderr
                values["run"] = re.search(r"^run (\S+)", done.stdout, re.M).group(1)  # type: ignore[union-attr]
                values["token"] = re.search(r"agent token: (\S+)", done.stdout).group(1)  # type: ignore[union-attr]
            elif verb == "status":
                assert done.returncode == 0, done.stderr
                assert "submissions: 2 (2 graded)" in done.stdout, done.stdout
            elif verb == "best":
                assert done.returncode == 0 and "no scored submission yet" in done.stdout
            elif verb == "regrade":
                assert done.returncode == 0, done.stderr
                assert f"of submission {values['submission']} " in done.stdout
                _wait_graded(store, int(values["submission"]), grades=2)
            elif verb == "report":
                assert done.returncode == 0, done.stderr
                assert done.stdout.count("checked_untimed") == 1, done.stdout
                assert done.stdout.count("gate_failed") == 1, done.stdout
            elif verb == "finalize":
                assert done.returncode == 1, (done.stdout, done.stderr)
                assert "no scored submission to finalize" in done.stderr
            else:
                raise AssertionError(f"the test does not know how to check {command!r}")
    finally:
        for proc in background:
            proc.send_signal(signal.SIGTERM)  # a worker ends its grade in hand, then exits
        logs = [proc.communicate(timeout=120) for proc in background]
    worker_out, worker_err = logs[1]
    assert background[1].returncode == 0, worker_err
    assert "No module named" not in worker_err and "grader_error" not in worker_err
    with Store(store) as s:
        grades = [g for sub in s.submissions(values["run"]) for g in s.grades(sub.id)]
    assert [g.status for g in grades] == ["checked_untimed", "checked_untimed", "gate_failed"]
    assert all(g.attempts == 1 for g in grades), [g.history for g in grades]
    # What a run's token reads names no folder of this host: the venv, the store, the jobs.
    with Store(store) as s:
        seen = [(g.reason or "") + (s.report(g) or "") for g in grades]
    for text in seen:
        assert str(tmp_path) not in text and "grader-jobs" not in text, text[-2000:]


def _wait_for_port(port: int, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listened on port {port} after {timeout} s")


def _wait_graded(store: Path, submission: int, grades: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with Store(store) as s:
            done = [g for g in s.grades(submission) if g.state is GradeState.DONE]
        if len(done) >= grades:
            return
        time.sleep(0.5)
    raise AssertionError(f"submission {submission} was not graded {grades} times in {timeout} s")
