"""A grader that lies, behind the service's `CommandExecutor`: the report a submission would write
if it reached the report's path, or the grader's report gone wrong.

    python tests/service_forged_grade.py WORKSPACE REPORT

MODE is the workspace's solution.py's last comment (``# killed``: `service_helpers.solution`'s
salt). Writes the fast fake grader's report (`tests/service_fake_grade.py`, status scored) to REPORT,
then per MODE: ``killed`` marks it 2.99 and dies by SIGKILL (a submission that forged it and
killed its grader); ``list`` writes ``[]``; ``garbage`` writes bytes that are not JSON;
``mismatch`` keeps it and exits 13 (gate_failed); ``score`` marks it 99.0 and exits 0; ``nan``
marks it NaN; ``extra`` adds a field the grader never writes; ``escape`` puts a terminal escape
in its status. Every mode but ``killed`` prints a fake green "scored" line first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

FAKE = Path(__file__).with_name("service_fake_grade.py")
GREEN = "\x1b[2K\r\x1b[32mstatus: scored    score: 9.9900\x1b[0m"


def main() -> int:
    workspace, report = sys.argv[1], Path(sys.argv[2])
    mode = (Path(workspace) / "solution.py").read_text().split("# ")[-1].strip()
    subprocess.run([sys.executable, str(FAKE), workspace, str(report)], check=True)
    data = json.loads(report.read_text())
    if mode == "killed":
        data.update(score=2.99)  # in range: only the exit status gives it away
        report.write_text(json.dumps(data))
        os.kill(os.getpid(), signal.SIGKILL)
    print(GREEN, flush=True)
    if mode == "list":
        report.write_text("[]")
    elif mode == "garbage":
        report.write_bytes(b"\x1b[32m{scored")
    elif mode == "mismatch":
        return 13
    elif mode == "score":
        data.update(score=99.0)
        report.write_text(json.dumps(data))
    elif mode == "nan":
        report.write_text(json.dumps(data).replace('"score": 0.5', '"score": NaN', 1))
    elif mode == "extra":
        data.update(best=True)
        report.write_text(json.dumps(data))
    elif mode == "escape":
        data.update(status=f"scored{GREEN}")
        report.write_text(json.dumps(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
