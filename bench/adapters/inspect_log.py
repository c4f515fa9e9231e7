"""What an Inspect log of the task (`grader.adapters.inspect_task`) says: each grade the ``grade``
tool made (an intermediate score) and the sample's final score, the final regrade of the best.

    python bench/adapters/inspect_log.py LOG [LOG ...]      # .eval or .json logs of `inspect eval`

Exits 1 unless every log's final score is above 0 and comes from a timed final regrade.
"""

from __future__ import annotations

import sys

from inspect_ai.event import ScoreEvent
from inspect_ai.log import read_eval_log


def summarize(path: str) -> tuple[list[str], bool]:
    """Lines for people, and whether every sample's final score is > 0 from a timed regrade."""
    log = read_eval_log(path)
    lines = [f"log {path.rsplit('/', 1)[-1]}: {log.status}, model {log.eval.model}"]
    timed = bool(log.samples)
    for sample in log.samples or ():
        for event in sample.events:
            if isinstance(event, ScoreEvent) and event.intermediate:
                m = event.score.metadata or {}
                lines.append(f"  grade tool: submission {m.get('submission')} commit "
                             f"{str(m.get('commit'))[:12]} {m.get('status')} score "
                             f"{m.get('score')} interval {m.get('score_ci')}")  # fmt: skip
        for name, score in (sample.scores or {}).items():
            meta = score.metadata or {}
            final = meta.get("final") or {}
            ok = isinstance(score.value, int | float) and score.value > 0 and bool(final)
            ok = ok and final.get("status") == "scored" and meta.get("score_ci") is not None
            timed = timed and ok
            lines.append(
                f"  {name}: value {score.value}; {score.explanation}; final regrade "
                f"{final.get('status')} interval {meta.get('score_ci')}: "
                + ("a score > 0 from a timed grade" if ok else "NO TIMED SCORE > 0")
            )
    return lines, timed


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    every = True
    for path in argv:
        lines, timed = summarize(path)
        print("\n".join(lines))
        every = every and timed
    return 0 if every else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
