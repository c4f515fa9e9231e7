"""Tuner for the reference conv+norm launch plans: propose, prove, time, freeze, re-verify.

Run as a module::

    python -m reference.tune [--profile h200|l4|smoke] [--out reference/plans/<gpu>.json]
                             [--reverify] [--llm-endpoint URL --llm-model NAME]

Steps, per dtype and shape class (`reference.plans.shape_class`) of the profile's timing shapes:

1. **Propose.** The incumbent (the frozen table's entry, else `heuristic_plan`), the heuristic, and
   deterministic neighbourhoods around the heuristic and the incumbent, interleaved (block rows,
   warps and group sizes moved by factors of two inside `plan_ranges`). Optionally an LLM
   behind any OpenAI-compatible chat-completions endpoint proposes more, after seeing the
   shape, the fields with their ranges and the times measured so far; it returns JSON plans
   only, and anything else is rejected with a logged reason. With no endpoint configured only
   the neighbourhoods run.
2. **Prove.** Every candidate goes through the correctness gate before it is timed: the
   reference block with that plan, on the class's shapes and on a few `scoring.yaml` cases of the
   same dtype, fresh random inputs, outputs poisoned with NaN, forward and all four gradients
   against `task.oracle.oracle_step` within the dtype's budgets.
3. **Time.** Survivors run interleaved: rounds in carry-over-balanced orders (`grader.orders`),
   L2 flushed before every sample, CUDA events around conv+norm forward+backward, medians over
   rounds.
4. **Freeze.** A candidate replaces the incumbent only when it passed the gate and is faster
   beyond noise: the bootstrap interval of the paired per-round ratio t_incumbent / t_candidate
   lies above 1 and its median is at least ``1 + min_gain``. Winners go into the plan table with
   the GPU, versions, date and command in its meta.

``--reverify`` re-checks a frozen table instead: each entry must still pass the gate and must
not be slower, beyond noise and a drift threshold, than a fresh re-time of the heuristic and its
neighbours. Entries that fail are demoted (replaced by the best fresh plan when that one beats
the heuristic, else removed so `plan_for` falls back to the heuristic), each with a log line.

Without a GPU (``TRITON_INTERPRET=1`` set before this module is imported) the gate runs in the
Triton interpreter and nothing is timed or promoted: timing needs a GPU.

The stages live in `reference.tuning`, one module each (`shapes`, `propose`, `llm`, `prove`,
`timing`, `freeze`, `reverify`, and `tuner`, which drives them); this module is the command line.
The pure logic (ranges and validation, neighbourhood, LLM request and response, promotion,
table merge and demotion) needs no GPU; `tests/test_tune.py` covers it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import secrets
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from grader.config import ScoringConfig, load_config
from reference.plans import (
    DTYPE_NAMES,
    Plan,
    PlanTable,
    device_info,
    interpreting,
    load_table,
    save_table,
)
from reference.tuning.freeze import (
    DEFAULT_MIN_GAIN,
    default_table_path,
    empty_table,
    merge_table,
    table_meta,
)
from reference.tuning.llm import LLMConfig, llm_config
from reference.tuning.propose import DEFAULT_MAX_CANDIDATES
from reference.tuning.prove import DEFAULT_GATE_CASES
from reference.tuning.reverify import DEFAULT_DRIFT
from reference.tuning.shapes import ShapeGroup, group_shapes, profile_shapes, shape_from_key
from reference.tuning.timing import DEFAULT_ROUNDS, DEFAULT_WARMUP, TIMING_NEEDS_GPU, precompile
from reference.tuning.tuner import GroupReport, Tuner, TuneSettings

log = logging.getLogger("reference.tune")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m reference.tune", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", help="scoring.yaml timing profile (default: the GPU's)")
    p.add_argument("--out", type=Path,
                   help="table to write (default: reference/plans/<gpu>.json; on CPU: none)")
    p.add_argument("--table", type=Path,
                   help="frozen table to start from (default: --out if it exists)")
    p.add_argument("--reverify", action="store_true",
                   help="re-check every entry of the frozen table and demote what fails or drifts")
    p.add_argument("--report", type=Path, help="write a JSON report of every decision here")
    p.add_argument("--dtypes", help="comma-separated dtypes to tune (default: all in the profile)")
    p.add_argument("--max-candidates", type=int, default=DEFAULT_MAX_CANDIDATES,
                   help="plans per shape class including incumbent and heuristic (default 6)")
    p.add_argument("--gate-cases", type=int, default=DEFAULT_GATE_CASES,
                   help="extra scoring.yaml cases of the same dtype per gate (default 2)")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                   help=f"interleaved timing rounds (default {DEFAULT_ROUNDS})")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                   help=f"untimed runs of each plan first (default {DEFAULT_WARMUP})")
    p.add_argument("--min-gain", type=float, default=DEFAULT_MIN_GAIN,
                   help="smallest median speedup over the incumbent that promotes, besides a "
                        f"bootstrap interval above 1 (default {DEFAULT_MIN_GAIN})")
    p.add_argument("--drift", type=float, default=DEFAULT_DRIFT,
                   help="reverify: slowdown against the best fresh plan that demotes "
                        f"(default {DEFAULT_DRIFT})")
    p.add_argument("--time-budget-s", type=float, default=math.inf,
                   help="start no new shape class after this many seconds")
    p.add_argument("--seed", type=int, help="secret mixed into gate inputs (default: random)")
    p.add_argument("--compile-workers", type=int,
                   help="processes that precompile the candidates' kernels (default on a GPU: "
                        "CPU count − 2, at most 12; 0 disables)")
    p.add_argument("--llm-endpoint", help="OpenAI-compatible base URL (or TUNE_LLM_ENDPOINT)")
    p.add_argument("--llm-model", help="model name (or TUNE_LLM_MODEL)")
    p.add_argument("--llm-max-plans", type=int, default=4)
    return p


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if interpreting():
        return torch.device("cpu")
    raise SystemExit("reference.tune needs a CUDA GPU, or TRITON_INTERPRET=1 set before the run "
                     "(gate only, on the CPU)")


def _frozen_table(args: argparse.Namespace, gpu: str) -> tuple[PlanTable, Path | None]:
    path = args.table or args.out or default_table_path(gpu)
    if path is not None and Path(path).exists():
        log.info("frozen table: %s", path)
        return load_table(path), Path(path)
    log.info("no frozen table (%s): every incumbent is the heuristic", path)
    return empty_table(gpu), None


def _groups_to_run(args: argparse.Namespace, config: ScoringConfig, profile: str,
                   table: PlanTable) -> list[ShapeGroup]:
    shapes = profile_shapes(config, profile, config.block.channels)
    if args.dtypes:
        wanted = set(args.dtypes.split(","))
        unknown = sorted(wanted - set(DTYPE_NAMES.values()))
        if unknown:
            raise SystemExit(f"--dtypes {unknown} not in {sorted(DTYPE_NAMES.values())}")
        shapes = [s for s in shapes if s.dtype in wanted]
    groups = group_shapes(shapes)
    if args.reverify:
        # Every frozen entry, with the profile's shape where one maps to it.
        known = {(g.dtype, g.key): g for g in groups}
        groups = [known.get((dtype, key)) or ShapeGroup(dtype, key, (shape_from_key(dtype, key),))
                  for dtype, entries in sorted(table.plans.items()) for key in sorted(entries)]
    return groups


def _method(argv: Sequence[str] | None, args: argparse.Namespace, llm: LLMConfig | None,
            settings: TuneSettings) -> str:
    command = "python -m reference.tune " + " ".join(argv if argv is not None else sys.argv[1:])
    mode = "reverify" if args.reverify else "tune"
    return (f"{command.strip()} ({mode}: heuristic + neighbours"
            f"{' + LLM ' + llm.model if llm else ''}, gate = block vs fp64 oracle on the class "
            f"shapes + {settings.gate_cases} scoring.yaml cases, poisoned outputs; timing = "
            f"conv+norm fwd+bwd, {settings.rounds} interleaved rounds, balanced orders, L2 "
            f"flush, CUDA events; promote if bootstrap CI of the paired speedup > 1 and median "
            f">= {1 + settings.min_gain:.2f}; drift threshold {settings.drift:.2f})")


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (0 ok, 1 a shape class has no passing plan)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    args = _parser().parse_args(argv)
    device = _device()
    config = load_config()
    info = device_info(device)
    profile = args.profile or config.timing.profile_for_gpu(
        info.name if device.type == "cuda" else None)
    llm = llm_config(args.llm_endpoint, args.llm_model, max_plans=args.llm_max_plans)
    secret = args.seed if args.seed is not None else secrets.randbits(62)
    settings = TuneSettings(args.max_candidates, args.gate_cases, args.rounds, args.warmup,
                            args.min_gain, args.drift, args.time_budget_s)
    log.info("device %s (%d SMs, L2 %d MiB), profile %s, secret %d, llm %s", info.name,
             info.sm_count, info.l2_bytes >> 20, profile, secret,
             f"{llm.model} at {llm.url}" if llm else "off (heuristic only)")
    if device.type != "cuda":
        log.warning("%s", TIMING_NEEDS_GPU)
    table, _ = _frozen_table(args, info.name)
    tuner = Tuner(config, device, settings, llm, secret)
    groups = _groups_to_run(args, config, profile, table)
    start = time.monotonic()
    workers = args.compile_workers
    if workers is None:
        workers = max(min((os.cpu_count() or 1) - 2, 12), 0) if device.type == "cuda" else 0
    if workers > 0:
        precompile(tuner.compile_tasks(groups, table), workers, config.block.eps, device.type)
    out = args.out or (default_table_path(info.name) if device.type == "cuda" else None)
    method = _method(argv, args, llm, settings)
    updates: dict[tuple[str, str], Plan | None] = {}
    reports: list[GroupReport] = []
    failed = False
    for group in groups:
        if time.monotonic() - start > settings.time_budget_s:
            log.warning("time budget %.0f s spent: %s %s not %s (left as is)",
                        settings.time_budget_s, group.dtype, group.key,
                        "reverified" if args.reverify else "tuned")
            continue
        frozen = table.plans.get(group.dtype, {}).get(group.key)
        if args.reverify:
            assert frozen is not None
            report, verdict = tuner.reverify_group(group, frozen)
            if verdict.action != "keep":
                updates[(group.dtype, group.key)] = verdict.plan
        else:
            report, plan = tuner.tune_group(group, frozen)
            failed |= report.action == "failed"
            if plan is not None and plan != frozen:
                updates[(group.dtype, group.key)] = plan
        reports.append(report)
        # Written after every class: a run stopped by a time limit keeps what it decided.
        _write_outputs(args, out, merge_table(table, updates, table_meta(info.name, method)),
                       reports, profile, secret, tuner.can_time, device)
    new_table = merge_table(table, updates, table_meta(info.name, method))
    _write_outputs(args, out, new_table, reports, profile, secret, tuner.can_time, device)
    if out is not None and (device.type == "cuda" or args.out is not None):
        log.info("wrote %s (%d change(s))", out, len(updates))
    if not tuner.can_time:
        log.warning("%s", TIMING_NEEDS_GPU)
    unproven = unproven_entries(new_table, reports)
    entries = sum(len(e) for e in new_table.plans.values())
    log.info("%d of %d table entries passed the gate in this run%s", entries - len(unproven),
             entries, f"; not proven: {unproven}" if unproven else "")
    return 1 if failed else 0


def _write_outputs(args: argparse.Namespace, out: Path | None, table: PlanTable,
                   reports: Sequence[GroupReport], profile: str, secret: int, timed: bool,
                   device: torch.device) -> None:
    if out is not None and (device.type == "cuda" or args.out is not None):
        save_table(out, table)
    if args.report is not None:
        args.report.write_text(json.dumps({
            "meta": table.meta, "profile": profile, "secret": secret, "timed": timed,
            "unproven_entries": unproven_entries(table, reports),
            "groups": [r.to_json() for r in reports],
        }, indent=1, default=str) + "\n")


def unproven_entries(table: PlanTable, reports: Sequence[GroupReport]) -> list[str]:
    """Entries of ``table`` whose plan was not gated, or failed the gate, in this run's reports."""
    proven = {
        (r.dtype, r.key, json.dumps(r.candidates[name], sort_keys=True))
        for r in reports for name, gate in r.gates.items() if gate.passed
    }
    return [f"{dtype}/{key}" for dtype, entries in sorted(table.plans.items())
            for key, plan in sorted(entries.items())
            if (dtype, key, json.dumps(plan.to_dict(), sort_keys=True)) not in proven]


if __name__ == "__main__":
    sys.exit(main())
