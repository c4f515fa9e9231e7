"""A fast stand-in for ``python -m grader grade`` behind the service's `CommandExecutor`.

    python tests/service_fake_grade.py WORKSPACE REPORT [--final] [--sleep S] [--log FILE]

Writes a real `GradeReport` JSON to REPORT. The score is the workspace's ``SCORE = x`` line in
solution.py (0.5 without one), its interval ±0.01. Each call appends ``<tree> <purpose> <pid>``
to FILE first (how tests count grades), then sleeps S seconds (a grade in progress, to be killed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

# No import of the grader: a fake grade must cost milliseconds, and torch is slow to import. The
# JSON has GradeReport's fields (tests/test_service.py parses one with GradeReport.from_json).


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("workspace", type=Path)
    parser.add_argument("report", type=Path)
    parser.add_argument("--final", action="store_true")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--log", type=Path, default=None)
    args = parser.parse_args()
    tree = subprocess.run(["git", "-C", str(args.workspace), "rev-parse", "HEAD^{tree}"],
                          capture_output=True, text=True, check=True).stdout.strip()
    commit = subprocess.run(["git", "-C", str(args.workspace), "rev-parse", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()
    if args.log is not None:
        with open(args.log, "a") as log:
            log.write(f"{tree} {'final' if args.final else 'grade'} {os.getpid()}\n")
    time.sleep(args.sleep)
    source = (args.workspace / "solution.py").read_text()
    found = re.search(r"^SCORE = ([0-9.]+)", source, re.M)
    score = float(found.group(1)) if found else 0.5
    system = {"device": "fake", "python": "", "torch": "", "triton": "", "numpy": "",
              "platform": "", "hostname": "", "gpu_name": None, "gpu_uuid": None,
              "driver": None, "cuda": None}
    timing = {"profile": "fake", "shapes": [], "score": score, "status": "ok", "reason": "",
              "telemetry": {}, "score_ci": [score - 0.01, score + 0.01],
              "rounds": 12 if args.final else 6, "warmup": 0, "wall_s": args.sleep}
    report = {"status": "scored", "score": score, "reasons": [],
              "workspace": str(args.workspace), "commit": commit, "tree": tree,
              "uncommitted_changes_ignored": False, "checked": ["fake"], "not_checked": [],
              "cases": [], "max_utilisation": None, "findings": [], "system": system,
              "grader_version": "fake", "started_at": "", "wall_s": args.sleep,
              "timing": timing, "child_stderr_tail": ""}
    args.report.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
