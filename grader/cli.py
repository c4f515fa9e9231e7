"""Command line: ``python -m grader grade PATH [--commit REV] [--profile NAME] [--json FILE]
[--gpu N] [--cpu] [--config FILE] [--quiet] [--keep]``.

Prints the report as a table on stdout, draws progress on stderr, writes JSON where asked, and
exits with the `grader.report.ExitCode` of the outcome.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader.config import DEFAULT_PATH


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grade", help="grade one workspace's committed tree")
    g.add_argument("path", type=Path, help="the workspace (a git repository)")
    g.add_argument("--commit", default="HEAD", help="commit to grade (default: HEAD)")
    g.add_argument("--profile", default=None, help="timing profile (default: the GPU's)")
    g.add_argument("--json", type=Path, default=None, help="write the report as JSON here")
    g.add_argument("--gpu", type=int, default=None, help="GPU index (default: 0 if any)")
    g.add_argument("--cpu", action="store_true",
                   help="force the CPU path (Triton interpreter, smoke cases, untimed)")
    g.add_argument("--config", type=Path, default=DEFAULT_PATH, help="scoring.yaml to use")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument("--keep", action="store_true", help="keep the private grading directory")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from grader.grade import GradeOptions, grade
    from grader.report import ExitCode, render_table

    options = GradeOptions(
        rev=args.commit, profile=args.profile, gpu=args.gpu, cpu=args.cpu,
        config_path=args.config, progress=not args.quiet, keep_dir=args.keep,
    )
    try:
        report = grade(args.path, options)
    except ValueError as exc:  # a bad --gpu, a malformed scoring.yaml: the operator's to fix
        print(f"python -m grader grade: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    if args.json is not None:
        report.write_json(args.json)
    print(render_table(report))
    sys.stdout.flush()
    return int(report.exit_code)


__all__ = ["main"]
