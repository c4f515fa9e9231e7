"""The local executor's grade process: confine itself, then run ``python -m grader grade``.

    GRADER_SERVICE_GRADE=<json> python -m grader.service.grade_process

Started by `grader.service.executors.LocalExecutor`. Its first act, while it is one thread and
before anything of the grader is imported, is to put itself out of the service's reach for good
(`grader.child.confine`, inherited by every process it starts, the submission's included):

- Landlock: every path but the store's folder and the folder of every grade's job (this grade's
  own job and report folders are named back in); signals only to processes it started (not the
  worker, nor another grade);
- not dumpable: no process of the same user reads its memory, environment or open files through
  ``/proc``.

The report's path reaches it in the environment (read and removed before the grader starts), not
on its command line, which every process may read. The grader's own confinement of the
submission's process (`grader.confinement`) sits inside this one. Where the kernel has no
Landlock the grade still runs (the store's 0700 folder holds against other users only) and the
executor says so in the report.
"""

from __future__ import annotations

import json
import os
import runpy
import sys

SPEC_ENV = "GRADER_SERVICE_GRADE"


def confine(forbidden: list[str], writable: list[str]) -> str:
    """Confine this process and everything it starts: nothing under ``forbidden`` (but what is
    under ``writable``), no signal out of its domain, not dumpable. What was applied, in words."""
    from grader.child.confine import Policy, allow_all_but, apply, landlock_abi

    if landlock_abi():
        allowed = (*_not_into(allow_all_but(forbidden), forbidden), *writable)
        policy = Policy(read=allowed, write=allowed, execute=allowed, tcp=True,
                        scope_signals=True, scope_abstract_unix=False, seccomp=False,
                        no_dump=True)  # fmt: skip
    else:
        policy = Policy(seccomp=False, scope_signals=False, scope_abstract_unix=False, tcp=True,
                        no_dump=True)  # fmt: skip
    applied = apply(policy)
    return applied.detail or f"Landlock ABI {applied.abi}"


def _not_into(paths: tuple[str, ...], forbidden: list[str]) -> tuple[str, ...]:
    """``paths`` less the links among them that lead into (or above) a forbidden folder: a
    Landlock rule is made on what its path opens, so a link elsewhere whose target is the store
    (``pytest-current``, a user's ``~/store`` link) would grant the store itself. The link's
    target is covered, or not, as its own real path."""
    bad = [os.path.realpath(p) for p in forbidden]

    def meets(path: str) -> bool:
        real = os.path.realpath(path)
        return any(real == b or real.startswith(b.rstrip("/") + "/")
                   or b.startswith(real.rstrip("/") + "/") for b in bad)  # fmt: skip

    return tuple(p for p in paths if not meets(p))


def main() -> int:
    spec = json.loads(os.environ.pop(SPEC_ENV))
    confine(spec["forbidden"], spec["writable"])
    # ``python -m grader grade ...`` in this process, run by name: this module is imported by the
    # executors, which the grader's command line imports in turn (no import cycle).
    sys.argv = ["grader", "grade", spec["workspace"], "--json", spec["report"], *spec["args"]]
    try:
        runpy.run_module("grader", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if isinstance(exc.code, int) or exc.code is None:
            return exc.code or 0
        print(exc.code, file=sys.stderr)  # what sys.exit("...") prints
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
