"""The forbidden-import rule (grader/child/imports.py): which names, whose frames, which routes.

Classification and attribution run here, with a watch that is not installed. Every route is
exercised in a fresh interpreter with the watch installed (installing it here would wrap this
test process's imports for the rest of the session).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
from file_modules import load_module

from grader.child import imports as child_imports
from grader.child.imports import FAST_NAMES, ImportWatch, own_names

REPO = Path(__file__).resolve().parent.parent


def test_own_names_are_importable_top_level_entries(tmp_path: Path) -> None:
    for name in ("solution.py", "helper.py", "notes.txt", "bad-name.py",
                 "ext.cpython-311-x86_64-linux-gnu.so"):  # fmt: skip
        (tmp_path / name).write_text("")
    for name in ("pkg", "namespace", ".grader", "__pycache__", "not-a-name"):
        (tmp_path / name).mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    assert own_names(str(tmp_path)) == {"solution", "helper", "ext", "pkg", "namespace"}


def test_allowed_names() -> None:
    for name in ("os", "json", "math", "functools", "dataclasses", "pathlib", "__future__",
                 "torch", "triton", "numpy"):  # fmt: skip
        assert name in FAST_NAMES, name
    # The harness's script is __main__: importing it reads the grader's memory. The tools of the
    # attacks of issue 37 are not on the list, and neither is the import machinery.
    for name in ("grader", "reference", "task", "yaml", "sympy", "typing_extensions", "pynvml",
                 "scipy", "torchgen", "__main__", "no_such_module", "sys", "ctypes", "cffi", "gc",
                 "inspect", "threading", "_thread", "multiprocessing", "subprocess", "importlib",
                 "pkgutil", "runpy", "types", "dis", "traceback", "signal", "socket", "mmap",
                 "marshal", "pickle", "code", "codeop", "builtins", "_io"):  # fmt: skip
        assert name not in FAST_NAMES, name


def test_frames_are_classified_by_file(tmp_path: Path) -> None:
    watch = ImportWatch(tmp_path, [].append)
    stdlib = os.path.dirname(os.__file__)
    for filename in ("<string>", child_imports.__file__):
        assert watch._classify(filename) == child_imports._TRANSPARENT, filename
    for filename in ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>",
                     importlib.util.__file__):
        assert watch._classify(filename) == child_imports._MACHINERY, filename
    assert watch._classify(str(tmp_path / "solution.py")) == child_imports._SUBMISSION
    # The standard library's own code imports for itself, like any library; and a package
    # installed beside it is not the standard library.
    others = ("<frozen os>", os.__file__, os.path.join(stdlib, "site-packages", "yaml",
                                                       "__init__.py"),
              str(REPO / "grader" / "gate.py"), str(REPO / "reference" / "block.py"))
    for filename in others:
        assert watch._classify(filename) == child_imports._OTHER, filename


def test_attribution_walks_past_the_standard_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub, lib, std = tmp_path / "sub", tmp_path / "lib", tmp_path / "std"
    for folder in (sub, lib, std):
        folder.mkdir()
    # A standard-library module that calls back (the real ones are classified above).
    monkeypatch.setattr(child_imports, "_STDLIB_DIRS", (*child_imports._STDLIB_DIRS, str(std)))
    (std / "relay.py").write_text("def relay(fn):\n    return fn()\n")
    (std / "importlib").mkdir()
    (std / "importlib" / "relay.py").write_text("def relay(fn):\n    return fn()\n")
    (lib / "their.py").write_text("def ask(watch):\n    return watch._asker()\n")
    (sub / "mine.py").write_text(textwrap.dedent("""\
        def direct(watch):
            return watch._asker()

        def through_stdlib(watch, relay):
            return relay.relay(watch._asker)

        def through_machinery(watch, machinery):
            return machinery.relay(watch._asker)

        def through_exec(watch):
            scope = {"watch": watch}
            exec("asker = watch._asker()", scope)
            return scope["asker"]

        def through_theirs(watch, their):
            return their.ask(watch)
        """))
    watch = ImportWatch(sub, [].append)
    mine, their = load_module(sub / "mine.py", "mine"), load_module(lib / "their.py", "their")
    relay = load_module(std / "relay.py", "relay")
    machinery = load_module(std / "importlib" / "relay.py", "machinery_relay")

    assert mine.direct(watch) == child_imports.Asker("mine.py", 2, None, False)
    # A standard-library function that imports is the library importing for itself...
    assert mine.through_stdlib(watch, relay) is None
    # ...but the import machinery is how the submission asks.
    assert mine.through_machinery(watch, machinery) == child_imports.Asker(
        "mine.py", 8, "importlib.relay.relay", False)
    executed = mine.through_exec(watch)
    assert executed.line == 12 and executed.via == "code compiled from a string (<string>)"
    # The first frame outside the standard library is not the submission's: not its import.
    assert mine.through_theirs(watch, their) is None
    # Called from here (the harness, for this test): nobody's.
    assert watch._asker() is None


def test_own_module_resolved_outside_the_tree_is_not_its_own(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text("")
    watch = ImportWatch(tmp_path, [].append)
    assert watch._inside(load_module(tmp_path / "mine.py", "mine"))
    assert not watch._inside(contextlib)
    assert watch._inside(ModuleType("made_in_memory"))  # no files: nothing a package is


# ---------------------------------------------------------------------- installed, in a child

# Each scenario is a module of the submission's tree with ``run(lib)``; ``lib`` is a module from
# outside the tree (a stand-in for torch's code calling back or importing lazily).
_SCENARIOS = {
    "allowed": """
        import json, functools, dataclasses, collections.abc
        import torch
        importlib = torch.importlib  # reached, not imported: its wrappers still watch
        def run(lib):
            import os.path
            importlib.import_module("os.path")
            importlib.util.find_spec("json")
            import helper
            from pkg import inner
        """,
    "machinery_while_loading": """
        def run(lib):
            import fresh_module_q  # the import system imports _io while it loads it (3.11)
        """,
    "statement_failing": """
        def run(lib):
            try:
                import grader_missing_q
            except ImportError:
                pass
        """,
    "statement_cached": """
        def run(lib):
            import yaml
        """,
    "dunder": """
        def run(lib):
            __import__("yaml")
        """,
    "import_module_relative": """
        import torch
        importlib = torch.importlib
        def run(lib):
            importlib.import_module(".composer", "yaml")
        """,
    "importlib_dunder": """
        import torch
        importlib = torch.importlib
        def run(lib):
            importlib.__import__("yaml")
        """,
    "find_spec_missing": """
        import torch
        importlib = torch.importlib
        def run(lib):
            importlib.util.find_spec("reference_missing_q")
        """,
    "pkgutil": """
        import pkgutil
        def run(lib):
            pkgutil.resolve_name("yaml:safe_load")
        """,
    "private_bootstrap": """
        import torch
        importlib = torch.importlib
        def run(lib):
            try:
                importlib._bootstrap._gcd_import("private_missing_q")
            except ImportError:
                pass
        """,
    "exec": """
        def run(lib):
            exec("import yaml")
        """,
    "forged_file": """
        import os
        __file__ = os.__file__
        def run(lib):
            import yaml
        """,
    "forged_package": """
        __package__ = "yaml"
        def run(lib):
            from . import reader
        """,
    "own_name_shadowed": """
        def run(lib):
            import typing_extensions
        """,
    "theirs": """
        def run(lib):
            lib.lazy()
        """,
    "torch_lazy": """
        import torch
        sys = torch.sys
        def run(lib):
            assert "sympy" not in sys.modules
            import torch.fx.experimental.symbolic_shapes
            assert "sympy" in sys.modules  # torch imported it: theirs
        """,
}

_RUNNER = """
import json, sys
sys.path.insert(0, {repo!r})
import typing_extensions, yaml  # cached before the watch, as torch and the harness leave them
import torch
from grader.child.imports import ImportWatch
found = []
watch = ImportWatch({sub!r}, found.append)
watch.install()
sys.path[:0] = [{sub!r}, {lib!r}]
import lib_mod
result = {{}}
for name in {names!r}:
    found.clear()
    try:
        __import__("scenario_" + name).run(lib_mod)
    except Exception as exc:
        found.append(f"raised {{exc!r}}")
    result[name] = list(found)
sys.meta_path.insert(0, object())
result["tampered"] = watch.tampering()
del sys.meta_path[0]
result["restored"] = watch.tampering()
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """The findings of every scenario, run in one fresh interpreter with the watch installed."""
    root = tmp_path_factory.mktemp("imports")
    sub, lib = root / "sub", root / "lib"
    (sub / "pkg").mkdir(parents=True)
    lib.mkdir()
    for name, source in _SCENARIOS.items():
        (sub / f"scenario_{name}.py").write_text(textwrap.dedent(source))
    (sub / "helper.py").write_text("import os\n")
    (sub / "fresh_module_q.py").write_text("VALUE = 1\n")
    (sub / "pkg" / "__init__.py").write_text("from . import inner\n")
    (sub / "pkg" / "inner.py").write_text("")
    # Its own name, while the real typing_extensions is cached: the import gives the real one.
    (sub / "typing_extensions.py").write_text("")
    (lib / "lib_mod.py").write_text(textwrap.dedent("""\
        def lazy():
            import yaml
            try:
                import lib_missing_q
            except ImportError:
                pass
        """))
    runner = _RUNNER.format(repo=str(REPO), sub=str(sub), lib=str(lib), names=list(_SCENARIOS))
    proc = subprocess.run([sys.executable, "-I", "-c", runner], capture_output=True, text=True,
                          timeout=300, cwd=sub)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        ("statement_failing", "import statement of 'grader_missing_q' at "
         "scenario_statement_failing.py:4 failed (ModuleNotFoundError"),
        ("statement_cached", "import statement of 'yaml' at scenario_statement_cached.py:3 "
         "succeeded"),
        ("dunder", "__import__() of 'yaml' at scenario_dunder.py:3 succeeded"),
        ("import_module_relative", "importlib.import_module() of 'yaml.composer' at "
         "scenario_import_module_relative.py:5 succeeded"),
        ("importlib_dunder", "importlib.__import__() of 'yaml' at "),
        ("find_spec_missing", "importlib.util.find_spec() of 'reference_missing_q' at "
         "scenario_find_spec_missing.py:5 found no module"),
        # pkgutil is not on the list; what resolve_name then imports is pkgutil's doing.
        ("pkgutil", "import statement of 'pkgutil' at scenario_pkgutil.py:2 succeeded"),
        ("private_bootstrap", "an import (through importlib._bootstrap._gcd_import) of "
         "'private_missing_q' at scenario_private_bootstrap.py:6 reached the import system and "
         "found no module"),
        ("exec", "import statement (through code compiled from a string (<string>)) of 'yaml' "
         "at scenario_exec.py:3 succeeded"),
        ("forged_file", "import statement of 'yaml' at scenario_forged_file.py:5 succeeded"),
        ("forged_package", "import statement of 'yaml' at scenario_forged_package.py:4"),
        ("own_name_shadowed", "import statement of 'typing_extensions' at "
         "scenario_own_name_shadowed.py:3 succeeded, but gave "),
    ],
)
def test_route_is_reported(installed: dict[str, list[str]], scenario: str, expected: str) -> None:
    # One finding per attempt: the wrapper that reports it keeps the nested routes quiet.
    found = installed[scenario]
    assert len(found) == 1 and found[0].startswith(expected), found
    assert found[0].endswith("may be imported"), found


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["allowed", "theirs", "torch_lazy", "machinery_while_loading"])
def test_allowed_or_not_the_submissions(installed: dict[str, list[str]], scenario: str) -> None:
    assert installed[scenario] == []


@pytest.mark.slow
def test_a_finder_put_first_is_tampering(installed: dict[str, list[str]]) -> None:
    assert len(installed["tampered"]) == 1 and "sys.meta_path[0]" in installed["tampered"][0]
    assert installed["restored"] == []


# ---------------------------------------------------------------------- inside the guard

_GUARD_RUNNER = """
import json, sys
sys.path.insert(0, {repo!r})
import typing_extensions
from grader.child.rules import Guard
guard = Guard({sub!r}, ())
guard.install()
sys.path.insert(0, {sub!r})
with guard.phase("load", log_ops=False):
    import asks
with guard.phase("undo", log_ops=False):
    import undoes
print(json.dumps([[f.rule, f.phase, f.message] for f in guard.findings]))
"""


@pytest.mark.slow
def test_guard_reports_imports_and_an_undone_watch(tmp_path: Path) -> None:
    """Through the guard: the finding carries its phase, and undoing the watch (the original
    ``__import__`` back from the wrapper's closure, the finder taken out) is a patched module."""
    (tmp_path / "asks.py").write_text("import typing_extensions\n")
    (tmp_path / "undoes.py").write_text(textwrap.dedent("""\
        import builtins, importlib, sys
        cells = [c.cell_contents for c in builtins.__import__.__closure__]
        builtins.__import__ = next(c for c in cells if type(c).__name__ == "builtin_function_or_method")
        del sys.meta_path[0]
        """))
    runner = _GUARD_RUNNER.format(repo=str(REPO), sub=str(tmp_path))
    proc = subprocess.run([sys.executable, "-I", "-c", runner], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    findings = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [rule for rule, phase, _ in findings if phase == "load"] == ["forbidden-import"]
    undone = [message for rule, phase, message in findings
              if phase == "undo" and rule == "patched-module"]  # fmt: skip
    assert "builtins.__import__ was replaced" in undone, findings
    assert any("sys.meta_path[0]" in m for m in undone), findings
