"""Publish measured g from a run of `bench/timing/reproducibility.py` (the reference graded as a
submission, several timing phases): each shape's median g over the run's ok phases becomes an
entry of ``grader/published_speedups.json`` with basis ``measured`` (issue 41).

Usage::

    python bench/timing/publish_g.py OUT/reproducibility-H200-h200-....json \\
        --record bench/results/scoring-reference-h200-<date>/ [--block reference] [--write FILE]

Refuses a run whose phases were not all ok or did not time every shape of its profile, and one
where the reference, timed against itself, did not score ln g / ln(1.1 g) inside its interval in
every phase (the run measured something else than it says). Prints the entry; ``--write`` puts it
in the file (default: print only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from grader.agent.estimate import SECTIONS  # noqa: E402
from grader.config import load_config  # noqa: E402

BLOCK_TEXT = {
    "reference": "the scoring reference (reference/block.py: conv+norm fused in Triton, the MLP "
                 "in PyTorch's own ops)",
    "ceiling": "the ceiling (reference/ceiling.py, the whole-step block)",
}


def entry_from_run(run: dict[str, Any], block: str, record: str) -> dict[str, Any]:
    """The published entry (basis measured) of a reproducibility run's JSON.

    Raises:
        SystemExit: A phase not ok, a shape of the profile not timed, or the reference outside
            its own interval.
    """
    meta, summary = run["meta"], run["summary"]
    profile = meta["profile"]
    if summary["ok_runs"] != summary["runs"] or summary["runs"] < 1:
        raise SystemExit(f"{summary['ok_runs']} of {summary['runs']} timing phases were ok: "
                         f"{summary['statuses']}")
    labels = {s.label for s in load_config().timing.profiles[profile].shapes}
    if set(summary["shapes"]) != labels:
        raise SystemExit(f"the run timed {sorted(summary['shapes'])}, the profile {profile} has "
                         f"{sorted(labels)}")
    outside = [c for c in summary.get("reference_expectation", ()) if not c["within_ci"]]
    if outside:
        raise SystemExit(f"the reference scored outside its own interval: {outside}")
    g = {label: round(statistics.median(s["g"]), 3) for label, s in summary["shapes"].items()}
    source = (f"Medians of g over the {summary['runs']} timing phases of {BLOCK_TEXT[block]} "
              f"graded as a submission, {meta['gpu']} ({meta.get('uuid', '?')[:12]}), torch "
              f"{meta['torch']}, triton {meta['triton']}, host wait {meta.get('host_wait', '?')}: "
              f"{meta['command']}, {record}")
    return {"basis": "measured", "source": source, "measured_at": meta["date"][:16] + "Z",
            "g": g}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="reproducibility-*.json")
    p.add_argument("--record", required=True, help="where the run's files are committed")
    p.add_argument("--block", choices=SECTIONS, default="reference")
    p.add_argument("--write", type=Path, help="put the entry in this published_speedups.json")
    args = p.parse_args(argv)
    run = json.loads(args.run.read_text())
    entry = entry_from_run(run, args.block, args.record)
    print(json.dumps(entry, indent=2))
    if args.write is not None:
        data = json.loads(args.write.read_text())
        data[args.block]["profiles"][run["meta"]["profile"]] = entry
        args.write.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
