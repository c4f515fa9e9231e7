"""The guard's audit-hook rules of issue 37 (grader/child/rules.py): what the submission's code
does with modules it reached without an import, code that passes for a library's, and the
guard's own switches. Each scenario runs in a fresh interpreter with the guard installed
(installing it here would hook this test process for the rest of the session)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

_SCENARIOS = {
    # Code compiled under torch's file name, then a frame walk from it.
    "compile_as_torch": """
        import torch
        def run():
            space = {"torch": torch}
            exec(compile("def f():\\n    return torch.sys._getframe(0)\\n", torch.__file__,
                         "exec"), space)
            space["f"]()
        """,
    # A code object renamed to a library's file (code.replace: no compile call).
    "code_replace": """
        import torch
        def helper():
            return 1
        def run():
            helper.__code__ = helper.__code__.replace(co_filename=torch.__file__)
        """,
    # Honest: code generated under names of its own, and a real import of its own module.
    "honest_codegen": """
        import os
        def run():
            space = {}
            exec(compile("def f():\\n    return 2\\n", "<generated>", "exec"), space)
            exec(compile("def g():\\n    return 3\\n", os.path.abspath(__file__) + ":gen",
                         "exec"), space)
            import fresh_own_q
            assert space["f"]() + space["g"]() + fresh_own_q.VALUE == 6
        """,
    # importlib reached through torch; a module's code run by hand.
    "exec_module": """
        import torch
        def run():
            spec = torch.importlib.machinery.PathFinder.find_spec("colorsys")
            module = torch.importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        """,
    # ctypes taken from sys.modules (no import), used.
    "ctypes_from_modules": """
        import torch
        def run():
            ctypes = torch.sys.modules["ctypes"]
            ctypes.CDLL(None).getpid()
        """,
    # The guard's counter raised (through a frame walk of a traceback: no audit event).
    "trusted_counter": """
        def run():
            try:
                raise LookupError
            except LookupError as exc:
                frame = exc.__traceback__.tb_frame
            while frame is not None:
                guard = frame.f_locals.get("guard")
                if guard is not None and hasattr(guard, "_trusted"):
                    guard._trusted += 1_000_000
                    return
                frame = frame.f_back
        """,
    # A method replaced on the guard itself.
    "method_on_instance": """
        def run():
            import gc  # forbidden, and reported: the replacement below does not silence it
        """,
    # The reference read through a descriptor of "/" and a relative path.
    "dirfd_relative": """
        import os
        def run():
            root = os.open("/", os.O_PATH | os.O_DIRECTORY)
            try:
                os.open(os.path.relpath(FORBIDDEN, "/"), os.O_RDONLY, dir_fd=root)
            except OSError:
                pass
        """,
}

_RUNNER = """
import json, sys
sys.path.insert(0, {repo!r})
import torch, ctypes
from grader.child.rules import Guard
result = {{}}
guard = Guard({sub!r}, ({forbidden!r},))
guard.install()
sys.path.insert(0, {sub!r})
for name in {names!r}:
    before = len(guard.findings)
    if name == "method_on_instance":
        guard.check_launches = lambda record: None
    with guard.phase(name, log_ops=False):
        try:
            __import__("scenario_" + name).run()
        except Exception as exc:
            result[name + ":raised"] = repr(exc)
    result[name] = [[f.rule, f.message] for f in guard.findings[before:]]
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def findings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[list[str]]]:
    root = tmp_path_factory.mktemp("rules")
    sub, forbidden = root / "sub", root / "grader_tree"
    sub.mkdir()
    forbidden.mkdir()
    (forbidden / "secret.py").write_text("")
    for name, source in _SCENARIOS.items():
        text = textwrap.dedent(source).replace("FORBIDDEN", repr(str(forbidden / "secret.py")))
        (sub / f"scenario_{name}.py").write_text(text)
    (sub / "fresh_own_q.py").write_text("VALUE = 1\n")
    runner = _RUNNER.format(repo=str(REPO), sub=str(sub), forbidden=str(forbidden),
                            names=list(_SCENARIOS))
    proc = subprocess.run([sys.executable, "-I", "-c", runner], capture_output=True, text=True,
                          timeout=300, cwd=sub)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _rules(found: list[list[str]]) -> set[str]:
    return {rule for rule, _ in found}


@pytest.mark.parametrize(("scenario", "rule", "text"), [
    ("compile_as_torch", "foreign-code-name", "compiled code under the file name"),
    ("code_replace", "foreign-code-name", "torch"),
    ("exec_module", "forbidden-import", "outside the import system"),
    ("ctypes_from_modules", "forbidden-import", "ctypes"),
    ("trusted_counter", "guard-tampered", "trusted counter is 1000000"),
    ("method_on_instance", "guard-tampered", "Guard.check_launches was replaced"),
    ("dirfd_relative", "reads-grader", "secret.py"),
])
def test_each_route_is_a_finding(findings: dict[str, list[list[str]]], scenario: str, rule: str,
                                 text: str) -> None:  # fmt: skip
    found = findings[scenario]
    assert rule in _rules(found), found
    assert any(text in message for r, message in found if r == rule), found


def test_the_import_is_reported_even_with_a_method_replaced(
        findings: dict[str, list[list[str]]]) -> None:  # fmt: skip
    assert "forbidden-import" in _rules(findings["method_on_instance"])


def test_honest_code_generation_is_no_finding(findings: dict[str, list[list[str]]]) -> None:
    assert findings["honest_codegen"] == [], findings["honest_codegen"]
    assert "honest_codegen:raised" not in findings
