"""CPU tests of `bench/timing/publish_g.py` (issue 41): a reproducibility run's medians become a
measured entry that `check` reads, and a run that cannot back them is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from file_modules import load_module

from grader.agent import estimate
from grader.config import load_config

ROOT = Path(__file__).resolve().parent.parent
publish_g = load_module(ROOT / "bench" / "timing" / "publish_g.py", "bench_publish_g")


def _run(ok: int = 2, within: bool = True, drop: int = 0) -> dict:
    labels = [s.label for s in load_config().timing.profiles["h200"].shapes]
    return {
        "meta": {"profile": "h200", "gpu": "NVIDIA H200", "uuid": "GPU-1234567890ab-cd",
                 "torch": "2.11.0", "triton": "3.6.0", "host_wait": "spin",
                 "date": "2026-12-07T10:11:12+00:00", "command": "python x.py"},
        "summary": {"runs": 2, "ok_runs": ok, "statuses": ["ok: "] * ok,
                    "shapes": {label: {"g": [2.0, 2.2 + i]} for i, label in
                               enumerate(labels[drop:])},
                    "reference_expectation": [{"within_ci": within}] * ok},
    }


def test_medians_become_a_measured_entry_check_reads(tmp_path: Path) -> None:
    entry = publish_g.entry_from_run(_run(), "reference", "bench/results/x/")
    assert entry["basis"] == "measured" and entry["measured_at"] == "2026-12-07T10:11Z"
    assert list(entry["g"].values())[:2] == [2.1, 2.6]
    assert "the scoring reference" in entry["source"] and "bench/results/x/" in entry["source"]
    path = tmp_path / "p.json"
    path.write_text((ROOT / "grader" / "published_speedups.json").read_text())
    run = tmp_path / "run.json"
    run.write_text(json.dumps(_run()))
    assert publish_g.main([str(run), "--record", "r", "--write", str(path)]) == 0
    published = estimate.load_published("h200", path)
    assert published is not None and published.g == entry["g"]
    assert estimate.load_ceiling("h200", path) == estimate.load_ceiling("h200")


@pytest.mark.parametrize(("run", "match"), [
    (_run(ok=1), "1 of 2 timing phases were ok"),
    (_run(drop=1), "the profile h200 has"),
    (_run(within=False), "outside its own interval"),
])
def test_a_run_that_cannot_back_its_g_is_refused(run: dict, match: str) -> None:
    with pytest.raises(SystemExit, match=match):
        publish_g.entry_from_run(run, "reference", "r")
