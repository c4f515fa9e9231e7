"""Command line: ``python -m grader grade PATH [--commit REV] [--profile NAME] [--json FILE]
[--gpu N] [--cpu] [--config FILE] [--quiet] [--keep]``.

Prints the report as a table on stdout, draws progress on stderr, writes JSON (and, when timed,
a plot of the per-shape speedups beside it) where asked, and exits with the
`grader.report.ExitCode` of the outcome.

``python -m grader check …`` and ``python -m grader submit …`` are the agent's tools
(`grader.agent.check`, `grader.agent.submit`); ``serve``, ``worker`` and ``run`` are the
operator's service (`grader.service.cli`), ``fleet`` its dispatcher to a Ray cluster
(`grader.service.fleet_cli`). Their arguments pass through unchanged. An installed package
(``pip install .``) has the same commands as the ``grader`` console script.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from grader.config import DEFAULT_PATH

if TYPE_CHECKING:
    from grader.report import GradeReport

# The agent's tools, reachable as subcommands; their own modules parse their arguments.
_AGENT_TOOLS = ("check", "submit")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grade", help="grade one workspace's committed tree")
    for tool in _AGENT_TOOLS:  # listed for --help; main() hands their arguments over untouched
        sub.add_parser(tool, help=f"the agent's {tool} (python -m grader {tool} --help)",
                       add_help=False)
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
    g.add_argument("--final", action="store_true",
                   help="a final regrade: the profile's final_rounds timed rounds")
    order = g.add_mutually_exclusive_group()
    order.add_argument("--overlap-timing", dest="overlap_timing", action="store_const",
                       const=True, default=None,
                       help="start the timing processes and warm the baselines up while the "
                            "gate runs (default: as the timing profile says; README \"How long "
                            "a grade takes\")")
    order.add_argument("--sequential-timing", dest="overlap_timing", action="store_const",
                       const=False, help="start the timing processes once the gate has passed")
    for verb, text in (("serve", "the operator's HTTP API"), ("worker", "a grading worker"),
                       ("run", "create, inspect and finalize runs"),
                       ("fleet", "grade the queue on a Ray cluster's GPUs")):
        sub.add_parser(verb, help=f"{text} (python -m grader {verb} --help)", add_help=False)
    return parser



def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in _AGENT_TOOLS:
        import importlib

        return int(importlib.import_module(f"grader.agent.{argv[0]}").main(argv[1:]))
    if argv and argv[0] in ("serve", "worker", "run"):
        from grader.service import cli as service_cli

        return service_cli.main(argv)
    if argv and argv[0] == "fleet":
        from grader.service import fleet_cli

        return fleet_cli.main(argv[1:])
    args = _parser().parse_args(argv)
    from grader.grade import GradeOptions, grade
    from grader.report import ExitCode, render_table

    unknown = unknown_profile(args.profile, args.config)
    if unknown:  # caught before the gate's minutes, not after them (or never, on a CPU)
        print(f"python -m grader grade: {unknown}", file=sys.stderr)
        return int(ExitCode.USAGE)

    options = GradeOptions(
        rev=args.commit, profile=args.profile, gpu=args.gpu, cpu=args.cpu,
        config_path=args.config, progress=not args.quiet, keep_dir=args.keep, final=args.final,
        overlap_timing=args.overlap_timing,
    )
    try:
        report = grade(args.path, options)
    except ValueError as exc:  # a bad --gpu, a malformed scoring.yaml: the operator's to fix
        print(f"python -m grader grade: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    if args.json is not None:
        report.write_json(args.json)
        if report.timing is not None and report.timing.shapes:
            _write_plot(report, args.json.with_suffix(".png"), args.config)
    print(render_table(report))
    sys.stdout.flush()
    return int(report.exit_code)


def unknown_profile(profile: str | None, config_path: Path) -> str:
    """Why ``--profile`` names no profile of the scoring file, naming those it has; "" when it
    does (or was not given, or the file does not load: the grade says why)."""
    from grader.config import ConfigError, load_config

    if profile is None:
        return ""
    try:
        known = sorted(load_config(config_path).timing.profiles)
    except (ConfigError, OSError):
        return ""
    if profile in known:
        return ""
    return (f"--profile {profile!r} is not a profile of {config_path.name} (known: "
            f"{', '.join(known)})")


def _write_plot(report: GradeReport, path: Path, config_path: Path) -> None:
    """The per-shape speedup plot beside the JSON report (skipped, with a note, without
    matplotlib)."""
    from grader.config import load_config
    from grader.plot import MISSING_MATPLOTLIB, plot_speedups

    if plot_speedups(report.timing, path, load_config(config_path).score) is None:
        print(f"python -m grader grade: {MISSING_MATPLOTLIB}", file=sys.stderr)
    else:
        print(f"plot: {path}", file=sys.stderr)


__all__ = ["main", "unknown_profile"]
