"""The grading image's entrypoint: grade the workspace mounted at a fixed path, report to another.

    python -m grader.service.entrypoint (--cpu | --gpu N) [--final] [--config FILE]

Runs ``python -m grader grade /workspace --json /out/report.json --quiet`` in this process and
exits with its status (README's exit-code table). Before grading it writes what the container is
(`SystemInfo`'s versions, read from package metadata without importing torch) to
``/out/system.json``, so an executor that has to report a container it killed (out of memory,
past its deadline) can say what ran. The executor (`grader.service.docker_executor`) mounts the
workspace read-only, ``/out`` writable and, where an operator gives one, a ``scoring.yaml`` at
``/config/scoring.yaml``.

Outside a container the same command runs with the same paths under a directory given by
``GRADER_ENTRYPOINT_ROOT`` (``$ROOT/workspace``, ``$ROOT/out``, and an absolute ``--config`` is
read under ``$ROOT`` too): how the image's exact command is tried on a GPU host without Docker
(README "Grading in Docker").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

ROOT = Path(os.environ.get("GRADER_ENTRYPOINT_ROOT") or "/")
WORKSPACE = ROOT / "workspace"
OUT = ROOT / "out"
REPORT = OUT / "report.json"
SYSTEM = OUT / "system.json"
CONFIG = ROOT / "config" / "scoring.yaml"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def system_facts() -> dict[str, str]:
    """`SystemInfo`'s version fields for this interpreter, without importing torch."""
    return {
        "python": platform.python_version(), "torch": _version("torch"),
        "triton": _version("triton"), "numpy": _version("numpy"),
        "platform": platform.platform(), "hostname": socket.gethostname(),
    }  # fmt: skip


def rooted(path: Path) -> Path:
    """An absolute path of the container's, under ``ROOT`` (itself inside a container)."""
    return ROOT / path.relative_to("/") if path.is_absolute() else path


def grade_argv(args: argparse.Namespace, workspace: Path = WORKSPACE, report: Path = REPORT,
               ) -> list[str]:  # fmt: skip
    argv = ["grade", str(workspace), "--json", str(report), "--quiet"]
    argv += ["--cpu"] if args.gpu is None else ["--gpu", str(args.gpu)]
    if args.final:
        argv.append("--final")
    if args.config is not None:
        argv += ["--config", str(rooted(args.config))]
    return argv


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grader.service.entrypoint",
                                     description=__doc__.split("\n")[0])  # fmt: skip
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--gpu", type=int, help="the GPU's index inside the container (0)")
    where.add_argument("--cpu", action="store_true", help="the Triton interpreter (untimed)")
    parser.add_argument("--final", action="store_true", help="a final regrade")
    parser.add_argument("--config", type=Path, default=None,
                        help=f"scoring.yaml (the executor mounts one at {CONFIG})")  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    if not (WORKSPACE / ".git").exists():
        print(f"{WORKSPACE} holds no git repository: mount the workspace there (read-only)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        SYSTEM.write_text(json.dumps(system_facts()) + "\n")
    except OSError as exc:
        print(f"{OUT} is not writable by uid {os.getuid()}, gid {os.getgid()}: {exc}",
              file=sys.stderr)  # fmt: skip
        return 2
    from grader.cli import main as grader_main

    return grader_main(grade_argv(args))


if __name__ == "__main__":
    sys.exit(main())
