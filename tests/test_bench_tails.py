"""bench/tail_estimators.py on a real H200 report: its 'window' count is the grader's own."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import tail_estimators  # noqa: E402

from grader.config import load_config  # noqa: E402

RUN = REPO / "bench/results/held-h200-2026-12-03"


def test_the_window_count_is_the_grades_and_the_others_differ_by_the_tail() -> None:
    path = RUN / "tails/reproducibility-H200-h200-2026-12-03.json"
    (report,) = tail_estimators.timing_reports(path)
    res = tail_estimators.analyze(report, load_config())
    window = res["window"]
    assert window["score"] == pytest.approx(report.score, abs=1e-12)
    assert window["score_ci"] == pytest.approx(report.score_ci, abs=1e-12)
    for row, shape in zip(window["shapes"], report.shapes, strict=True):
        assert (row["r"], row["g"]) == pytest.approx((shape.r, shape.g), abs=1e-12)
    # Without the tail every step is shorter, so r/g moves and the interval narrows.
    returned = res["returned"]
    assert all(0.998 < row["r_over_g"] < 1.0 for row in returned["shapes"])
    width = {k: res[k]["score_ci"][1] - res[k]["score_ci"][0] for k in res}
    assert width["returned"] < width["window"] / 5


def test_a_report_without_tails_is_refused() -> None:
    (report,) = tail_estimators.timing_reports(RUN / "ab-sequential-report.json")
    with pytest.raises(ValueError, match="keeps its tails"):
        tail_estimators.analyze(report, load_config())
