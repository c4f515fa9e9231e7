"""What a run looks like from outside: its submissions, best, final regrade and report, as the
JSON objects the HTTP API and ``python -m grader run … --json`` print, and as text."""

from __future__ import annotations

import math
from typing import Any

from grader.service.store import Grade, GradeState, Store, Submission
from grader.service.text import printable


def submission_view(store: Store, submission: Submission) -> dict[str, Any]:
    """A submission with its grades; its ``state``/``status``/``score`` are its latest ordinary
    grade's (a final regrade is shown beside, never in place of it)."""
    grades = store.grades(submission.id)
    ordinary = [g for g in grades if g.purpose == "grade"]
    latest = ordinary[-1] if ordinary else None
    state = "queued" if latest is None else (
        latest.state.value if latest.state is not GradeState.DONE else "graded")
    return {
        **submission.to_dict(),
        "state": state,
        "status": latest.status if latest else None,
        "score": latest.score if latest else None,
        "score_ci": list(latest.score_ci) if latest and latest.score_ci else None,
        "grades": [g.to_dict() for g in grades],
    }


def final_view(store: Store, final: Grade) -> dict[str, Any]:
    """The final regrade beside the grade that made its submission the best, and whether they
    disagree by more than their joint interval."""
    ordinary = [g for g in store.grades(final.submission)
                if g.purpose == "grade" and g.status == "scored"]  # fmt: skip
    first = max(ordinary, key=lambda g: g.score or 0.0) if ordinary else None
    view: dict[str, Any] = {"submission": final.submission, "final": final.to_dict(),
                            "grade": first.to_dict() if first else None}  # fmt: skip
    view.update(gap_check(first, final) if first else {"gap": None, "gap_flagged": False})
    return view


def gap_check(first: Grade, final: Grade) -> dict[str, Any]:
    """``gap``: final minus first score; ``gap_flagged`` when it is beyond their joint interval,
    the root-sum-square of the two intervals' half widths (the interval of a difference of two
    independent estimates); ``gap_note`` says it in words."""
    if final.score is None or first.score is None or final.state is not GradeState.DONE:
        return {"gap": None, "gap_flagged": False}
    gap = final.score - first.score
    if first.score_ci is None or final.score_ci is None:
        return {"gap": gap, "gap_flagged": False, "gap_note": "no interval to compare against"}
    half = math.hypot((first.score_ci[1] - first.score_ci[0]) / 2,
                      (final.score_ci[1] - final.score_ci[0]) / 2)  # fmt: skip
    flagged = abs(gap) > half
    note = (f"final {final.score:.4f} vs grade {first.score:.4f}: gap {gap:+.4f}, joint interval "
            f"±{half:.4f}" + (" — BEYOND IT: look into the host or the submission"
                              if flagged else ""))  # fmt: skip
    return {"gap": gap, "joint_half_width": half, "gap_flagged": flagged, "gap_note": note}


def run_status(store: Store, run_id: str) -> dict[str, Any]:
    run = store.run(run_id)
    subs = [submission_view(store, s) for s in store.submissions(run_id)]
    counts: dict[str, int] = {}
    for s in subs:
        counts[s["state"]] = counts.get(s["state"], 0) + 1
    best = store.best(run_id)
    final = store.final(run_id)
    return {"run": run.id, "name": run.name, "created_at": run.created_at,
            "submissions": len(subs), "by_state": counts,
            "best": best[0].id if best else None, "best_score": best[1].score if best else None,
            "final": final.to_dict() if final else None}  # fmt: skip


def render_status(status: dict[str, Any]) -> str:
    """`run_status` as lines of text (names escaped, `printable`)."""
    counts = ", ".join(f"{n} {state}" for state, n in sorted(status["by_state"].items()))
    final = status["final"]
    lines = [f"run {status['run']} ({printable(status['name'], newlines=False)}), created "
             f"{status['created_at']}",
             f"submissions: {status['submissions']}" + (f" ({counts})" if counts else ""),
             "best: none yet (no submission has a score)" if status["best"] is None
             else f"best: submission {status['best']}, score {status['best_score']:.4f}",
             "final regrade: not requested" if final is None
             else f"final regrade: grade {final['id']} of submission {final['submission']}, "
             f"{final['state']}" + (f", {printable(final['status'], newlines=False)}"
                                     if final.get("status") else "")
             + (f" {final['score']:.4f}" if final.get("score") is not None else "")]  # fmt: skip
    return "\n".join(lines)


def run_report(store: Store, run_id: str) -> dict[str, Any]:
    """``{"run", "name", "submissions": [...], "best": id or null, "final": {...} or null}``."""
    run = store.run(run_id)
    best = store.best(run_id)
    final = store.final(run_id)
    return {
        "run": run.id,
        "name": run.name,
        "submissions": [submission_view(store, s) for s in store.submissions(run_id)],
        "best": best[0].id if best else None,
        "final": final_view(store, final) if final else None,
    }


def _score(view: dict[str, Any]) -> str:
    if view.get("score") is None:
        return "-"
    ci = view.get("score_ci")
    return f"{view['score']:.4f}" + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "")


def render_run_report(report: dict[str, Any]) -> str:
    """The run's report as text; every field a submission or an agent may have written (a name,
    a status) with its control characters escaped (`printable`)."""
    return printable("\n".join(_report_lines(report)))


def _report_lines(report: dict[str, Any]) -> list[str]:
    def p(value: object) -> str:
        return printable(value, newlines=False)

    lines = [f"run {report['run']} ({p(report['name'])}): {len(report['submissions'])} "
             "submission(s)",
             "", f"{'id':>5}  {'commit':<12}  {'state':<8}  {'status':<18}  score [95% interval]"]
    for s in report["submissions"]:
        mark = "  <- best" if s["id"] == report["best"] else ""
        lines.append(f"{s['id']:>5}  {s['commit'][:12]:<12}  {s['state']:<8}  "
                     f"{p(s['status'] or '-'):<18}  {_score(s)}{mark}")  # fmt: skip
    final = report.get("final")
    lines.append("")
    if report["best"] is None:
        lines.append("best: none yet (no submission has a score)")
    if final is None:
        lines.append("final regrade: not requested (python -m grader run finalize RUN)")
    else:
        g = final["final"]
        where = p(f"{g['gpu_name'] or '?'} {g['gpu_uuid'] or ''}".strip())
        if g["state"] != "done":
            lines.append(f"final regrade of submission {final['submission']}: {g['state']}")
        else:
            ci = g["score_ci"]
            score = "-" if g["score"] is None else f"{g['score']:.4f}"
            lines.append(f"final regrade of submission {final['submission']}: {p(g['status'])} "
                         f"{score}"
                         + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "") + f" on {where}")
            first = final.get("grade")
            if first:
                lines.append(f"  its grade: {first['score']:.4f} on {first['gpu_name']} "
                             f"{first['gpu_uuid']}")  # fmt: skip
            if final.get("gap_note"):
                lines.append(f"  {final['gap_note']}")
            if g["status"] == "scored":
                lines.append(f"RESULT: {g['score']:.4f} (the final regrade is the run's result)")
    return lines


__all__ = ["final_view", "gap_check", "render_run_report", "render_status", "run_report",
           "run_status", "submission_view"]  # fmt: skip
