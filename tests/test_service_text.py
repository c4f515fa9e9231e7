"""Control characters from a submission or an agent never reach the operator's terminal raw."""

from __future__ import annotations

import io
import json
from pathlib import Path

from service_helpers import solution, tree_tar

from grader.service import runs
from grader.service.archive import UploadLimits, check_upload
from grader.service.store import Device, Store
from grader.service.text import printable
from grader.service.worker import Worker

FAKE_GREEN = "\x1b[2K\r\x1b[32mstatus: scored    score: 9.9900\x1b[0m"


def test_printable_escapes_controls_and_keeps_lines() -> None:
    assert printable(FAKE_GREEN) == ("\\x1b[2K\\x0d\\x1b[32mstatus: scored    score: 9.9900"
                                     "\\x1b[0m")  # fmt: skip
    assert printable("a\nb\tc") == "a\nb\tc"
    assert printable("a\nb", newlines=False) == "a\\x0ab"
    assert printable("\x9b31m \x7f \u202egnp.exe \u2028") == "\\x9b31m \\x7f \\u202egnp.exe \\u2028"
    assert printable("plain ünïcödé ✓") == "plain ünïcödé ✓"


def test_a_run_report_and_the_worker_log_print_no_escape(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    run, _ = store.create_run(f"name {FAKE_GREEN}")
    tree = check_upload(tree_tar(solution(0.5)), UploadLimits())
    store.add_submission(run.id, commit="c" * 40, tree=tree.tree, archive=tree.archive,
                         files=len(tree.files))  # fmt: skip
    job = store.claim("w", Device("cpu", "w"), lease_s=30)
    assert job is not None
    store.finish(job, json.dumps({"status": f"crashed{FAKE_GREEN}", "score": 0.0,
                                  "reasons": [FAKE_GREEN]}))  # fmt: skip
    text = runs.render_run_report(runs.run_report(store, run.id))
    assert "\x1b" not in text and "\r" not in text and "\\x1b[32m" in text
    log = io.StringIO()

    class Forged:
        def run(self, request: object, alive: object) -> str:
            raise RuntimeError(f"the grader's output ended with:\n{FAKE_GREEN}")

    Worker(store, Device("cpu", "w"), Forged(), name="w", log=log).grade(  # type: ignore[arg-type]
        store.claim("w", Device("cpu", "w"), 30) or _regrade(store, job.submission.id))
    assert "\x1b" not in log.getvalue() and "\\x1b[32m" in log.getvalue()


def _regrade(store: Store, submission: int):  # type: ignore[no-untyped-def]
    store.regrade(submission)
    return store.claim("w", Device("cpu", "w"), 30)
