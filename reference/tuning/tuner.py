"""The loop itself: `Tuner` drives one shape class through propose → prove → time → freeze (or
re-verify), with the run-wide settings (`TuneSettings`) and a record of every decision
(`GroupReport`); `Tuner.tune_mlp` does the same for one dtype's MLP path (`mlp_path`).
`python -m reference.tune` builds one and runs it over a profile's classes and dtypes.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grader.config import ScoringConfig
from reference.plans import (
    MLP_PATHS,
    Plan,
    PlanTable,
    device_info,
    heuristic_mlp_path,
    heuristic_plan,
)
from reference.tuning.freeze import DEFAULT_MIN_GAIN, Decision, pick_winner
from reference.tuning.llm import LLMConfig, Measured, Opener, ProposalContext, ask_llm
from reference.tuning.mlp_path import MLP_NEEDS_GPU, MLPReport, block_step
from reference.tuning.propose import DEFAULT_MAX_CANDIDATES, neighbourhood, plan_ranges
from reference.tuning.prove import DEFAULT_GATE_CASES, Gate, GateCase, GateResult, gate_cases_for
from reference.tuning.reverify import DEFAULT_DRIFT, Verdict, reverify_verdict
from reference.tuning.shapes import ShapeGroup, TuneShape
from reference.tuning.timing import (
    DEFAULT_ROUNDS,
    DEFAULT_WARMUP,
    HIDE_LAUNCH_FLUSH_BYTES,
    TIMING_NEEDS_GPU,
    conv_norm_step,
    make_l2_flush,
    median,
    quantiles,
    time_interleaved,
)
from task.inputs import DTYPES

log = logging.getLogger(__name__)


@dataclass
class GroupReport:
    """What happened to one shape class (JSON-ready through `to_json`)."""

    dtype: str
    key: str
    timed_shape: str
    incumbent: str
    candidates: dict[str, dict[str, int]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    gates: dict[str, GateResult] = field(default_factory=dict)
    timings: dict[str, dict[str, float]] = field(default_factory=dict)
    decisions: dict[str, Decision] = field(default_factory=dict)
    llm_rejections: list[str] = field(default_factory=list)
    winner: str = ""
    action: str = ""
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["gates"] = {k: dataclasses.asdict(v) for k, v in self.gates.items()}
        out["decisions"] = {k: dataclasses.asdict(v) for k, v in self.decisions.items()}
        return out


@dataclass(frozen=True)
class TuneSettings:
    """Knobs of one tuner run (see the CLI for their meaning)."""

    max_candidates: int = DEFAULT_MAX_CANDIDATES
    gate_cases: int = DEFAULT_GATE_CASES
    rounds: int = DEFAULT_ROUNDS
    warmup: int = DEFAULT_WARMUP
    min_gain: float = DEFAULT_MIN_GAIN
    drift: float = DEFAULT_DRIFT
    time_budget_s: float = math.inf


class Tuner:
    """Holds the device, config and run-wide state; one method per mode."""

    def __init__(self, config: ScoringConfig, device: torch.device, settings: TuneSettings,
                 llm: LLMConfig | None, secret: int, opener: Opener = urllib.request.urlopen
                 ) -> None:
        self.config = config
        self.device = device
        self.settings = settings
        self.llm = llm
        self.secret = secret
        self.opener = opener
        self.info = device_info(device)
        self.ranges = plan_ranges(self.info)
        self.can_time = device.type == "cuda"
        self._flush: Callable[[], None] | None = None

    def _gate_cases(self, group: ShapeGroup) -> list[GateCase]:
        # The interpreter takes seconds per small case: only the smoke cases are feasible there.
        return gate_cases_for(group, self.config, self.settings.gate_cases,
                              smoke_only=self.device.type != "cuda")

    def _gate(self, group: ShapeGroup) -> Gate:
        return Gate(self._gate_cases(group), self.config.budgets, self.device, self.secret)

    def _heuristic(self, shape: TuneShape) -> Plan:
        return heuristic_plan(self.info, DTYPES[shape.dtype], shape.batch, shape.length,
                              shape.channels, shape.dilation)

    def _time(self, plans: Mapping[str, Plan], shape: TuneShape) -> dict[str, list[float]]:
        if not self.can_time:
            return {name: [] for name in plans}
        if self._flush is None:
            self._flush = make_l2_flush(self.device, HIDE_LAUNCH_FLUSH_BYTES)
        fns = {name: conv_norm_step(plan, shape, self.device) for name, plan in plans.items()}
        # Plans change device time, not host overhead: time the device alone (less noise).
        return time_interleaved(fns, self.settings.rounds, self.settings.warmup, self._flush,
                                hide_launch=True)

    def _prove_and_time(self, report: GroupReport, gate: Gate, plans: Mapping[str, Plan],
                        sources: Mapping[str, str], shape: TuneShape
                        ) -> dict[str, list[float]]:
        """Gate every plan (logging each verdict), then time the survivors interleaved."""
        for name, plan in plans.items():
            if name in report.gates:  # proven earlier in this run (an LLM round re-times it)
                continue
            report.candidates[name] = plan.to_dict()
            report.sources[name] = sources[name]
            result = gate.check(plan)
            report.gates[name] = result
            verdict = "passed" if result.passed else f"FAILED ({result.reason})"
            log.info("  gate %-14s %s max util %.3g at %s  %s", name, verdict, result.max_util,
                     result.worst, plan.to_dict())
        survivors = {n: p for n, p in plans.items() if report.gates[n].passed}
        samples = self._time(survivors, shape)
        for name, values in samples.items():
            if values:
                report.timings[name] = quantiles(values)
                log.info("  time %-14s median %.4f ms (p20 %.4f, p80 %.4f)", name,
                         report.timings[name]["median"], report.timings[name]["p20"],
                         report.timings[name]["p80"])
        return {name: samples.get(name, []) for name in plans}

    def _candidates(self, incumbent: Plan, heuristic: Plan, first: str = "incumbent"
                    ) -> tuple[dict[str, Plan], dict[str, str]]:
        """The incumbent (named ``first``), the heuristic when it differs, and neighbours up to
        ``max_candidates`` plans in all: the heuristic's neighbourhood, interleaved with the
        incumbent's when that is a different (frozen) plan, so a run both explores around the
        heuristic and hill-climbs from the best plan known."""
        plans: dict[str, Plan] = {first: incumbent}
        sources = {first: "frozen" if first == "frozen" or incumbent != heuristic else "heuristic"}
        if heuristic != incumbent:
            plans["heuristic"], sources["heuristic"] = heuristic, "heuristic"
        room = max(self.settings.max_candidates - len(plans), 0)
        around_heuristic = neighbourhood(heuristic, self.ranges, room + 2)
        around_incumbent = (neighbourhood(incumbent, self.ranges, room + 2)
                            if incumbent != heuristic else [])
        merged = [p for pair in itertools.zip_longest(around_heuristic, around_incumbent)
                  for p in pair if p is not None]
        count = 0
        for plan in dict.fromkeys(merged):
            if count >= room:
                break
            if plan in plans.values():
                continue
            count += 1
            plans[f"neighbour{count}"], sources[f"neighbour{count}"] = plan, "neighbour"
        return plans, sources

    def compile_tasks(self, groups: Sequence[ShapeGroup], table: PlanTable
                      ) -> list[tuple[Plan, TuneShape]]:
        """Every (plan, shape) the run will launch before any LLM round, for `precompile`."""
        tasks: dict[tuple[Plan, TuneShape], None] = {}
        for group in groups:
            frozen = table.plans.get(group.dtype, {}).get(group.key)
            heuristic = self._heuristic(group.timed)
            plans, _ = self._candidates(frozen or heuristic, heuristic)
            shapes = [case.shape for case in self._gate_cases(group)]
            for plan in plans.values():
                for shape in shapes:
                    tasks[(plan, shape)] = None
        return list(tasks)

    def _llm_round(self, report: GroupReport, gate: Gate, plans: dict[str, Plan],
                   samples: dict[str, list[float]], heuristic: Plan, shape: TuneShape
                   ) -> dict[str, list[float]]:
        """Ask the LLM with the times so far; prove and time its plans against the incumbent and
        the best so far in fresh interleaved rounds. Returns those rounds' samples (or the
        earlier ones when the LLM proposed nothing usable)."""
        assert self.llm is not None
        measured = tuple(
            Measured(plan, quantiles(samples[n])["median"] if samples[n] else None,
                     "timed" if samples[n] else f"failed gate: {report.gates[n].reason}")
            for n, plan in plans.items())
        ctx = ProposalContext(self.info.name, shape, heuristic, self.ranges, measured,
                              self.llm.max_plans)
        parsed = ask_llm(self.llm, ctx, self.opener)
        for why in parsed.rejections:
            log.warning("  llm proposal rejected: %s", why)
        report.llm_rejections.extend(parsed.rejections)
        if not parsed.plans:
            return samples
        timed = [n for n in plans if samples[n]]
        best = min(timed, key=lambda n: median(samples[n])) if timed else None
        second = {n: plans[n] for n in dict.fromkeys(["incumbent", best]) if n is not None}
        new = {f"llm{i + 1}": p for i, p in enumerate(parsed.plans)}
        sources = {**{n: report.sources[n] for n in second}, **{n: "llm" for n in new}}
        plans.update(new)
        log.info("  llm proposed %d valid plan(s); re-timing with %s", len(new), list(second))
        return self._prove_and_time(report, gate, {**second, **new}, sources, shape)

    def tune_group(self, group: ShapeGroup, frozen: Plan | None) -> tuple[GroupReport, Plan | None]:
        """Tune one shape class. Returns its report and the plan to freeze (None: leave as is)."""
        shape = group.timed
        heuristic = self._heuristic(shape)
        incumbent = frozen if frozen is not None else heuristic
        report = GroupReport(group.dtype, group.key, shape.label,
                             "frozen" if frozen is not None else "heuristic")
        log.info("%s %s (timed on %s; incumbent: %s)", group.dtype, group.key, shape.label,
                 report.incumbent)
        gate = self._gate(group)
        plans, sources = self._candidates(incumbent, heuristic)
        samples = self._prove_and_time(report, gate, plans, sources, shape)
        if self.llm is not None:
            samples = self._llm_round(report, gate, plans, samples, heuristic, shape)
        if not self.can_time:
            report.action, report.reason = "untimed", TIMING_NEEDS_GPU
            return report, None
        timed = {n: samples[n] for n in samples}
        winner, decisions = pick_winner("incumbent", timed, report.gates, self.settings.min_gain)
        report.decisions = decisions
        for name, decision in decisions.items():
            log.info("  decide %-12s %s", name, decision.reason)
        report.winner = winner
        if winner == "incumbent":
            if not report.gates["incumbent"].passed:
                report.action = "failed"
                report.reason = "incumbent failed the gate and no candidate passed"
                log.error("  %s %s: %s", group.dtype, group.key, report.reason)
                return report, None
            report.action, report.reason = "kept", "no candidate beat the incumbent beyond noise"
            log.info("  keep incumbent (%s)", report.incumbent)
            # Frozen even when it is the heuristic: the table then records what was measured,
            # and a later change of the heuristic cannot silently change a tuned shape.
            return report, incumbent
        report.action, report.reason = "promoted", decisions[winner].reason
        log.info("  PROMOTE %s: %s", winner, decisions[winner].reason)
        return report, plans[winner]

    def reverify_group(self, group: ShapeGroup, frozen: Plan) -> tuple[GroupReport, Verdict]:
        """Re-check one frozen entry against the gate and a fresh heuristic/neighbour re-time."""
        shape = group.timed
        heuristic = self._heuristic(shape)
        report = GroupReport(group.dtype, group.key, shape.label, "frozen")
        log.info("reverify %s %s (on %s)", group.dtype, group.key, shape.label)
        gate = self._gate(group)
        plans, sources = self._candidates(frozen, heuristic, first="frozen")
        if "heuristic" not in plans:  # the frozen entry is the heuristic: time it twice anyway
            plans["heuristic"], sources["heuristic"] = heuristic, "heuristic"
        samples = self._prove_and_time(report, gate, plans, sources, shape)
        if not self.can_time:
            verdict = (Verdict("keep", frozen, f"passed the gate; {TIMING_NEEDS_GPU}")
                       if report.gates["frozen"].passed
                       else Verdict("remove", None,
                                    f"failed the gate: {report.gates['frozen'].reason}"))
        else:
            verdict = reverify_verdict(frozen, report.gates["frozen"], samples, report.gates,
                                       plans, drift=self.settings.drift)
        report.action, report.reason = verdict.action, verdict.reason
        level = logging.INFO if verdict.action == "keep" else logging.WARNING
        log.log(level, "  %s %s %s: %s", verdict.action.upper(), group.dtype, group.key,
                verdict.reason)
        return report, verdict

    def _time_paths(self, paths: Sequence[str], shape: TuneShape) -> dict[str, list[float]]:
        """The whole training step per MLP path, interleaved; host overhead stays in (the
        paths differ in launches and allocations too, and the grader's step includes them)."""
        if self._flush is None:
            self._flush = make_l2_flush(self.device, HIDE_LAUNCH_FLUSH_BYTES)
        block = self.config.block
        steps = {path: block_step(path, shape, self.device, block.expansion, block.eps,
                                  block.residual_scale) for path in paths}
        return time_interleaved({p: s[0] for p, s in steps.items()}, self.settings.rounds,
                                self.settings.warmup, self._flush,
                                prepare={p: s[1] for p, s in steps.items()})

    def tune_mlp(self, dtype: str, shapes: Sequence[TuneShape], entry: str | None,
                 reverify: bool = False) -> tuple[MLPReport, str | None]:
        """Decide one dtype's MLP path: every path gated on the dtype's largest shape and the
        gate's `scoring.yaml` cases, the survivors' whole steps timed interleaved, the incumbent
        (``entry``, else the heuristic's path) kept unless another is faster beyond noise (by
        at least the drift threshold when ``reverify``). Returns the report and the path to
        freeze (None: leave the table as it is)."""
        heuristic = heuristic_mlp_path(self.info, DTYPES[dtype])
        incumbent = entry or heuristic
        largest = max(shapes, key=lambda s: s.numel)
        report = MLPReport(dtype, largest.label, incumbent, "table" if entry else "heuristic")
        log.info("%s MLP path (timed on %s; incumbent: %s from the %s)", dtype, largest.label,
                 incumbent, report.source)
        if not self.can_time:
            report.action, report.reason = "untimed", MLP_NEEDS_GPU
            log.warning("  %s", MLP_NEEDS_GPU)
            return report, None
        gate = self._gate(ShapeGroup(dtype, "mlp", (largest,)))
        paths = [incumbent, *(p for p in MLP_PATHS if p != incumbent)]
        for path in paths:
            result = gate.check(None, mlp_path=path)
            report.gates[path] = result
            log.info("  gate %-8s %s max util %.3g at %s", path,
                     "passed" if result.passed else f"FAILED ({result.reason})",
                     result.max_util, result.worst)
        samples = self._time_paths([p for p in paths if report.gates[p].passed], largest)
        for path, values in samples.items():
            report.timings[path] = quantiles(values)
            log.info("  time %-8s median %.4f ms (p20 %.4f, p80 %.4f)", path,
                     report.timings[path]["median"], report.timings[path]["p20"],
                     report.timings[path]["p80"])
        gain = self.settings.drift if reverify else self.settings.min_gain
        winner, report.decisions = pick_winner(
            incumbent, {p: samples.get(p, []) for p in paths}, report.gates, gain)
        for path, decision in report.decisions.items():
            log.info("  decide %-8s %s", path, decision.reason)
        report.winner = winner
        if winner == incumbent:
            if not report.gates[incumbent].passed:
                report.action = "failed"
                report.reason = "no MLP path passed the gate"
                log.error("  %s MLP: %s", dtype, report.reason)
                return report, None
            report.action = "kept"
            report.reason = f"no other path beat {incumbent} beyond noise"
            log.info("  keep %s", incumbent)
            return report, incumbent  # frozen even when it is the heuristic's, like a plan
        report.action, report.reason = "promoted", report.decisions[winner].reason
        log.info("  PROMOTE %s MLP path %s: %s", dtype, winner, report.reason)
        return report, winner
