"""The AST tripwire: aliases resolved, strings and comments ignored, findings advisory."""

from __future__ import annotations

from pathlib import Path

from grader.report import Severity
from grader.static_scan import scan_tree


def rules(tmp_path: Path, source: str) -> set[str]:
    (tmp_path / "solution.py").write_text(source)
    found = scan_tree(tmp_path)
    assert all(f.severity is Severity.ADVISORY for f in found)
    return {f.rule for f in found}


def test_aliases_are_resolved(tmp_path: Path) -> None:
    src = "import torch as t\nfrom torch import compile as c\nt.compile(f)\nc(g)\n"
    assert "static:compiler" in rules(tmp_path, src)


def test_strings_and_comments_do_not_match(tmp_path: Path) -> None:
    src = "# torch.compile(f) and import subprocess\nDOC = 'torch.compile'\n"
    assert rules(tmp_path, src) == set()


def test_patch_and_dynamic_attribute(tmp_path: Path) -> None:
    src = ("import torch\nimport torch.nn.functional as F\nF.gelu = None\n"
           "torch.backends.cuda.matmul.allow_tf32 = True\nname = 'x'\ngetattr(torch, name)\n")
    found = rules(tmp_path, src)
    assert {"static:patch", "static:dynamic-attribute"} <= found


def test_grader_import_threads_and_frames(tmp_path: Path) -> None:
    src = "import grader.gate\nimport threading\nimport sys\nsys._getframe(1)\n"
    assert {"static:imports-grader", "static:thread", "static:introspection"} <= rules(tmp_path, src)


def test_syntax_error_is_a_finding(tmp_path: Path) -> None:
    assert rules(tmp_path, "def (:\n") == {"static:syntax"}
