"""Exploit: the code that is timed is not the code the gate ran.

Written by someone who has read grader/grade.py and grader/gate.py: the gate's children run as
the grader's user, each in a copy of the exported tree beside the exported tree itself
(``<private>/gate/child-<k>`` next to ``<private>/tree``), and timing copies its tree from
``<private>/tree`` after the gate. So while the gate runs, this submission (honest naive kernels)
drops a module into the exported tree. It imports that module only where the file exists (a
failed import is itself a broken rule), so the gate sees only the honest path; in timing the
module is its own file, found and imported, and could take over (a path for the timed shapes
alone, wrong elsewhere, never gated).
Caught: since issue 37 the operating system refuses the write (the exported tree is not on the
gate child's Landlock policy: only its own copy is), so the forward raises PermissionError and
the submission crashed. Behind that, the grade still holds the exported tree to the digests git
gave for it before timing copies it (`grader.workspace.tree_changes`: a file added, changed or
removed is `tree-tampered`; tested without the confinement in tests/test_grader_workspace.py).
Expected: crashed, the write refused.
"""

from pathlib import Path

from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:crashed:Permission denied"

# Absent in the gate (never asked for there); planted for timing.
if (Path(__file__).parent / "timed_only.py").is_file():
    import timed_only  # noqa: F401


def _plant() -> None:
    for parent in Path.cwd().parents:
        tree = parent / "tree"
        if (tree / "solution.py").is_file():
            (tree / "timed_only.py").write_text("FAST = True\n")
            return


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        _plant()
        return super().forward(x)
