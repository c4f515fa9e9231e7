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

The pure logic (ranges and validation, neighbourhood, LLM request and response, promotion,
table merge and demotion) lives in functions that need no GPU; `tests/test_tune.py` covers them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import itertools
import json
import logging
import math
import os
import re
import secrets
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from grader.config import Budget, Case, ScoringConfig, load_config
from grader.gate import step_utilisation
from grader.orders import williams_orders
from grader.stats import ratio_estimate
from reference.plans import (
    DTYPE_NAMES,
    MAX_TILE_ELEMENTS,
    PLANS_DIR,
    TABLE_FILES,
    DeviceInfo,
    Plan,
    PlanTable,
    device_info,
    heuristic_plan,
    interpreting,
    load_table,
    save_table,
    shape_class,
)
from task.inputs import DTYPES, derive_seed, make_inputs
from task.oracle import OracleResult, oracle_step

log = logging.getLogger("reference.tune")

# Promotion: the candidate's median paired speedup over the incumbent must be at least this
# (on top of its bootstrap interval lying above 1). Repeated H200 runs of one plan differ by
# 0.5–3% at GPU-bound shapes (SPEC §4), so 2% keeps noise from rewriting the table.
DEFAULT_MIN_GAIN = 0.02
# Reverify: a frozen entry is demoted when a fresh plan beats it by more than this, beyond noise.
DEFAULT_DRIFT = 0.05
DEFAULT_MAX_CANDIDATES = 6
DEFAULT_GATE_CASES = 2
DEFAULT_ROUNDS = 20
DEFAULT_WARMUP = 3
# L2 flush buffer: at least twice the L2 and never under this.
MIN_FLUSH_BYTES = 256 << 20
# Flush size when it must also cover the host's launch latency (see `time_interleaved`).
HIDE_LAUNCH_FLUSH_BYTES = 1 << 30
# Field ranges the tuner (and the LLM) may choose from. Rows and warps beyond these never fit
# the kernels' register budget; groups above the SM count are clamped by the launcher anyway.
ROW_CHOICES = (2, 4, 8, 16, 32, 64, 128)
BLOCK_C_CHOICES = (16, 32, 64, 128)
WARP_CHOICES = (1, 2, 4, 8, 16)
MAX_STAGES = 4
TIMING_NEEDS_GPU = "timing needs a GPU: candidates were gated, nothing was timed or promoted"


class InvalidProposal(ValueError):
    """A proposed plan is malformed or outside the valid ranges; the message says why."""


# ----------------------------------------------------------------------------------------------
# Shapes and their grouping
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TuneShape:
    """One input shape the tuner proves and times a plan on.

    Attributes:
        batch, length, channels, dilation: Input (B, L, C) and the conv's dilation.
        dtype: Table dtype name ("float32", "bfloat16", "float16").
    """

    batch: int
    length: int
    channels: int
    dilation: int
    dtype: str

    @property
    def numel(self) -> int:
        return self.batch * self.length * self.channels

    @property
    def key(self) -> str:
        """Shape-class key of this shape (`reference.plans.ShapeClass.key`)."""
        return shape_class(self.batch, self.length, self.channels, self.dilation).key

    @property
    def label(self) -> str:
        return f"{self.dtype}:{self.batch}x{self.length}x{self.channels}:d{self.dilation}"


@dataclass(frozen=True)
class ShapeGroup:
    """The timing shapes of one dtype that share a shape class, hence one table entry.

    Attributes:
        dtype: Table dtype name.
        key: Shape-class key.
        shapes: Members, largest first; the first is the one timed.
    """

    dtype: str
    key: str
    shapes: tuple[TuneShape, ...]

    @property
    def timed(self) -> TuneShape:
        return self.shapes[0]


def group_shapes(shapes: Sequence[TuneShape]) -> list[ShapeGroup]:
    """Group shapes by (dtype, shape class), in first-seen order, members largest first."""
    groups: dict[tuple[str, str], list[TuneShape]] = {}
    for shape in shapes:
        groups.setdefault((shape.dtype, shape.key), []).append(shape)
    return [
        ShapeGroup(dtype, key, tuple(sorted(members, key=lambda s: -s.numel)))
        for (dtype, key), members in groups.items()
    ]


def shape_from_key(dtype: str, key: str) -> TuneShape:
    """A representative shape for a table key (``c128-l4096-d16-b32``), for entries no profile
    shape maps to.

    Raises:
        ValueError: If the key is not of that form.
    """
    match = re.fullmatch(r"c(\d+)-l(\d+)-d(\d+)-b(\d+)", key)
    if match is None:
        raise ValueError(f"table key {key!r} is not of the form c<C>-l<L>-d<D>-b<B>")
    channels, length, dilation, batch = (int(v) for v in match.groups())
    return TuneShape(batch, length, channels, dilation, dtype)


def profile_shapes(config: ScoringConfig, profile: str, channels: int) -> list[TuneShape]:
    """The timing shapes of a `scoring.yaml` profile at the production width.

    Raises:
        ValueError: If the profile does not exist.
    """
    profiles = config.timing.profiles
    if profile not in profiles:
        raise ValueError(f"--profile {profile!r} is not one of {sorted(profiles)}")
    return [TuneShape(s.batch, s.length, channels, s.dilation, s.dtype)
            for s in profiles[profile].shapes]


# ----------------------------------------------------------------------------------------------
# Valid ranges, validation and the heuristic neighbourhood (pure)
# ----------------------------------------------------------------------------------------------


def plan_ranges(info: DeviceInfo) -> dict[str, tuple[int, ...]]:
    """Allowed values of every Plan field on a device (what the tuner and the LLM choose from)."""
    groups = tuple(range(1, max(info.sm_count, 1) + 1))
    return {
        "fwd_block_rows": ROW_CHOICES,
        "bwd_block_rows": ROW_CHOICES,
        "block_c": BLOCK_C_CHOICES,
        "fwd_num_warps": WARP_CHOICES,
        "bwd_num_warps": WARP_CHOICES,
        "fwd_group": groups,
        "bwd_group": groups,
        "num_stages": tuple(range(1, MAX_STAGES + 1)),
    }


def describe_ranges(ranges: Mapping[str, tuple[int, ...]]) -> dict[str, str]:
    """Ranges in words: contiguous integer spans as ``"1..132"``, others listed."""
    out = {}
    for name, values in ranges.items():
        contiguous = list(values) == list(range(values[0], values[-1] + 1))
        out[name] = f"{values[0]}..{values[-1]}" if contiguous and len(values) > 4 else (
            ", ".join(str(v) for v in values))
    return out


def check_plan(fields: Mapping[str, Any], base: Plan, ranges: Mapping[str, tuple[int, ...]]
               ) -> Plan:
    """Turn proposed fields into a Plan: unknown or non-integer fields, values outside the
    ranges and plans the Plan itself rejects all raise; omitted fields take ``base``'s value.

    Raises:
        InvalidProposal: With the field, its value and what was allowed.
    """
    if not isinstance(fields, Mapping):
        raise InvalidProposal(f"a plan must be a JSON object, got {type(fields).__name__}")
    known = {f.name for f in dataclasses.fields(Plan)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise InvalidProposal(f"unknown fields {unknown} (allowed: {sorted(known)})")
    merged = base.to_dict()
    for name, value in fields.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidProposal(f"{name}={value!r} must be an integer")
        allowed = ranges.get(name)
        if allowed is not None and value not in allowed:
            raise InvalidProposal(
                f"{name}={value} is outside its range {describe_ranges({name: allowed})[name]}")
        merged[name] = value
    try:
        return Plan(**merged)
    except ValueError as exc:
        raise InvalidProposal(str(exc)) from exc


def _moves(base: Plan) -> Iterator[dict[str, int]]:
    """Neighbour moves in order of expected value: the L2 footprint (groups) first, then tile
    height with warps scaled alike (keeps rows per warp), then each alone, then pipelining."""
    b = base
    yield {"fwd_group": b.fwd_group * 2, "bwd_group": b.bwd_group * 2}
    yield {"fwd_group": b.fwd_group // 2, "bwd_group": b.bwd_group // 2}
    yield {"fwd_block_rows": b.fwd_block_rows * 2, "fwd_num_warps": b.fwd_num_warps * 2,
           "bwd_block_rows": b.bwd_block_rows * 2, "bwd_num_warps": b.bwd_num_warps * 2}
    yield {"fwd_block_rows": b.fwd_block_rows // 2, "bwd_block_rows": b.bwd_block_rows // 2}
    yield {"fwd_num_warps": b.fwd_num_warps * 2, "bwd_num_warps": b.bwd_num_warps * 2}
    yield {"fwd_num_warps": b.fwd_num_warps // 2, "bwd_num_warps": b.bwd_num_warps // 2}
    yield {"fwd_block_rows": b.fwd_block_rows * 2, "bwd_block_rows": b.bwd_block_rows * 2}
    yield {"fwd_group": b.fwd_group * 4, "bwd_group": b.bwd_group * 4}
    yield {"num_stages": b.num_stages + 1}
    yield {"fwd_group": b.fwd_group * 2}
    yield {"bwd_group": b.bwd_group * 2}


def neighbourhood(base: Plan, ranges: Mapping[str, tuple[int, ...]], limit: int) -> list[Plan]:
    """Up to ``limit`` distinct valid plans one move away from ``base`` (base excluded).

    Deterministic: the same base and ranges always give the same list in the same order.
    A group move that leaves the range is clamped to its end, so a base already at the SM count
    still gets a "fewer groups" neighbour.
    """
    out: list[Plan] = []
    seen = {base}
    for move in _moves(base):
        if len(out) >= limit:
            break
        clamped = {}
        for name, value in move.items():
            allowed = ranges[name]
            clamped[name] = min(max(value, allowed[0]), allowed[-1]) if "group" in name else value
        try:
            plan = check_plan(clamped, base, ranges)
        except InvalidProposal:
            continue
        if plan not in seen:
            seen.add(plan)
            out.append(plan)
    return out


# ----------------------------------------------------------------------------------------------
# LLM proposals over an OpenAI-compatible chat-completions endpoint (plain urllib)
# ----------------------------------------------------------------------------------------------

# What code looks like: a response holding any of these is rejected whole, never half-parsed.
_SOURCE_PATTERN = re.compile(
    r"\bdef\s+\w+\s*\(|\bimport\s+\w|@triton|\btl\.\w+|\bclass\s+\w+\s*[:(]|```\s*python",
)
_FENCE = re.compile(r"^```(?:json)?\s*\n(.*)\n```\s*$", re.DOTALL)


@dataclass(frozen=True)
class LLMConfig:
    """Where to ask for proposals.

    Attributes:
        endpoint: Base URL (``http://host:port/v1``) or the full ``…/chat/completions`` URL.
        model: Model name sent in the request.
        api_key: Bearer token, or empty for none.
        timeout_s: Per-request timeout.
        max_plans: Most plans accepted from one response.
    """

    endpoint: str
    model: str
    api_key: str = ""
    timeout_s: float = 60.0
    max_plans: int = 4

    @property
    def url(self) -> str:
        base = self.endpoint.rstrip("/")
        return base if base.endswith("/chat/completions") else base + "/chat/completions"


def llm_config(endpoint: str | None, model: str | None, env: Mapping[str, str] = os.environ,
               max_plans: int = 4) -> LLMConfig | None:
    """The LLM configuration from arguments, else ``TUNE_LLM_ENDPOINT`` / ``TUNE_LLM_MODEL`` /
    ``TUNE_LLM_API_KEY``; None when no endpoint is configured (heuristic only).

    Raises:
        ValueError: An endpoint without a model.
    """
    endpoint = endpoint or env.get("TUNE_LLM_ENDPOINT", "")
    if not endpoint:
        return None
    model = model or env.get("TUNE_LLM_MODEL", "")
    if not model:
        raise ValueError(f"LLM endpoint {endpoint!r} is set but no model "
                         "(--llm-model or TUNE_LLM_MODEL)")
    return LLMConfig(endpoint=endpoint, model=model, api_key=env.get("TUNE_LLM_API_KEY", ""),
                     max_plans=max_plans)


@dataclass(frozen=True)
class Measured:
    """A plan already tried, as the LLM sees it.

    Attributes:
        plan: The plan.
        median_ms: Median conv+norm forward+backward time, or None if not timed.
        status: "timed", or why it was not (e.g. "failed gate: grad_x 2.1x budget").
    """

    plan: Plan
    median_ms: float | None
    status: str = "timed"


@dataclass(frozen=True)
class ProposalContext:
    """Everything the LLM is told about one shape class.

    Attributes:
        gpu: Device name.
        shape: The timed shape.
        base: The heuristic plan (fields omitted in a proposal take its values).
        ranges: Allowed values per field.
        measured: Plans tried so far with their times.
        max_plans: Most plans to ask for.
    """

    gpu: str
    shape: TuneShape
    base: Plan
    ranges: Mapping[str, tuple[int, ...]]
    measured: tuple[Measured, ...]
    max_plans: int = 4


@dataclass(frozen=True)
class ParsedProposals:
    """Plans accepted from an LLM response and the reasons for everything rejected."""

    plans: tuple[Plan, ...]
    rejections: tuple[str, ...]


FIELD_NOTES = {
    "fwd_block_rows": "rows (length positions) per forward tile",
    "bwd_block_rows": "rows per backward tile (the backward keeps ~10 tiles live)",
    "block_c": "channels per tile (min'd with the channel count)",
    "fwd_num_warps": "warps per forward program",
    "bwd_num_warps": "warps per backward program",
    "fwd_group": "forward programs per example (they meet at a barrier; L2 footprint)",
    "bwd_group": "backward programs per example",
    "num_stages": "software pipelining depth, both kernels",
}

SYSTEM_PROMPT = (
    "You tune launch parameters of two fused Triton kernels (a depthwise 3-tap dilated conv "
    "fused with a per-example normalization, forward and backward). Each example of L rows x C "
    "channels is processed by `group` programs that reduce statistics, meet at a barrier and "
    "make a second pass over the same tiles, which should still be in L2. Propose new plans "
    "that may run faster. Reply with one JSON object and nothing else: "
    '{"plans": [{"field": integer, ...}, ...]}. Never write source code or prose.'
)


def build_messages(ctx: ProposalContext) -> list[dict[str, str]]:
    """The chat messages for one shape class: fields with ranges, the baseline and the times."""
    problem = {
        "gpu": ctx.gpu,
        "dtype": ctx.shape.dtype,
        "shape": {"batch": ctx.shape.batch, "length": ctx.shape.length,
                  "channels": ctx.shape.channels, "dilation": ctx.shape.dilation},
        "fields": {name: {"meaning": FIELD_NOTES.get(name, ""), "allowed": allowed}
                   for name, allowed in describe_ranges(ctx.ranges).items()},
        "constraints": [
            "every value an integer from its allowed set",
            f"block_rows x block_c <= {MAX_TILE_ELEMENTS} for both directions",
            "fields you omit take the baseline's value",
        ],
        "baseline": ctx.base.to_dict(),
        "measured": [
            {"plan": m.plan.to_dict(), "median_ms": m.median_ms, "status": m.status}
            for m in ctx.measured
        ],
        "request": f"up to {ctx.max_plans} plans not in 'measured', most promising first",
    }
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": json.dumps(problem, indent=1)},
    ]


def build_request(cfg: LLMConfig, ctx: ProposalContext) -> urllib.request.Request:
    """The HTTP POST for an OpenAI-compatible chat-completions endpoint."""
    body = {"model": cfg.model, "messages": build_messages(ctx), "temperature": 0.2}
    headers = {"Content-Type": "application/json"}
    if cfg.api_key:
        headers["Authorization"] = f"Bearer {cfg.api_key}"
    return urllib.request.Request(cfg.url, data=json.dumps(body).encode(), headers=headers,
                                  method="POST")


def _response_content(raw: bytes) -> str:
    """``choices[0].message.content`` of a chat-completions response.

    Raises:
        InvalidProposal: The body is not that shape.
    """
    try:
        data = json.loads(raw)
        content = data["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise InvalidProposal(f"not a chat-completions response ({exc!r}): {raw[:200]!r}"
                              ) from exc
    if not isinstance(content, str):
        raise InvalidProposal(f"message content is {type(content).__name__}, not text")
    return content


def parse_content(content: str, ctx: ProposalContext, max_plans: int) -> ParsedProposals:
    """Accept the valid, new plans of a JSON reply; reject the rest, each with a reason.

    A reply that contains source code, or is not JSON of the form ``{"plans": [...]}`` (a bare
    list is accepted too), is rejected whole.
    """
    text = content.strip()
    if _SOURCE_PATTERN.search(text):
        return ParsedProposals((), ("reply contains source code; only JSON plans are accepted",))
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        data = json.loads(text)
    except ValueError as exc:
        return ParsedProposals((), (f"reply is not JSON ({exc}): {text[:120]!r}",))
    items = data.get("plans") if isinstance(data, dict) else data
    if not isinstance(items, list):
        return ParsedProposals((), (f"expected {{'plans': [...]}}, got {text[:120]!r}",))
    seen = {ctx.base, *(m.plan for m in ctx.measured)}
    plans: list[Plan] = []
    rejections: list[str] = []
    for i, item in enumerate(items):
        if len(plans) >= max_plans:
            rejections.append(f"plan {i}: beyond max_plans={max_plans}")
            continue
        try:
            plan = check_plan(item, ctx.base, ctx.ranges)
        except InvalidProposal as exc:
            rejections.append(f"plan {i}: {exc}")
            continue
        if plan in seen:
            rejections.append(f"plan {i}: already measured or proposed")
            continue
        seen.add(plan)
        plans.append(plan)
    return ParsedProposals(tuple(plans), tuple(rejections))


def parse_response(raw: bytes, ctx: ProposalContext, max_plans: int) -> ParsedProposals:
    """`parse_content` of a raw chat-completions response body."""
    try:
        content = _response_content(raw)
    except InvalidProposal as exc:
        return ParsedProposals((), (str(exc),))
    return parse_content(content, ctx, max_plans)


Opener = Callable[..., Any]


def ask_llm(cfg: LLMConfig, ctx: ProposalContext,
            opener: Opener = urllib.request.urlopen) -> ParsedProposals:
    """Ask the endpoint for plans; never raises: a dead endpoint is a rejection with its reason."""
    request = build_request(cfg, ctx)
    try:
        with opener(request, timeout=cfg.timeout_s) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        return ParsedProposals((), (f"endpoint {cfg.url} answered HTTP {exc.code}: {exc.reason}",))
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return ParsedProposals((), (f"endpoint {cfg.url} unreachable: {exc}",))
    return parse_response(raw, ctx, cfg.max_plans)


# ----------------------------------------------------------------------------------------------
# Promotion and demotion (pure)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateResult:
    """A plan's verdict from the correctness gate.

    Attributes:
        passed: Every check of every case within budget, every value finite.
        max_util: Largest error over budget seen (1.0 is the budget).
        worst: ``case/check`` of that largest utilisation.
        reason: Why it failed, empty if it passed.
    """

    passed: bool
    max_util: float
    worst: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Decision:
    """Whether a candidate beats the incumbent.

    Attributes:
        promote: Passed the gate and faster beyond noise.
        speedup: Median of the per-round ratios t_incumbent / t_candidate (nan if untimed).
        ci_low, ci_high: Bootstrap interval of that median.
        reason: Why, in words.
    """

    promote: bool
    speedup: float
    ci_low: float
    ci_high: float
    reason: str


def decide_promotion(incumbent_ms: Sequence[float], candidate_ms: Sequence[float],
                     gate: GateResult, min_gain: float = DEFAULT_MIN_GAIN) -> Decision:
    """Promote only a gated candidate whose paired speedup is above 1 beyond its bootstrap
    interval and at least ``1 + min_gain`` at the median.

    Args:
        incumbent_ms: Per-round times of the incumbent.
        candidate_ms: Per-round times of the candidate, same rounds.
        gate: The candidate's gate verdict.
        min_gain: Smallest relative gain that counts (guards against noise the interval misses).
    """
    if not gate.passed:
        return Decision(False, math.nan, math.nan, math.nan, f"failed the gate: {gate.reason}")
    if not candidate_ms or not incumbent_ms:
        return Decision(False, math.nan, math.nan, math.nan, "not timed")
    est = ratio_estimate(incumbent_ms, candidate_ms)
    low, high = est.ci.low, est.ci.high
    if high < 1.0:
        return Decision(False, est.value, low, high,
                        f"slower: speedup {est.value:.3f} (CI {low:.3f}–{high:.3f} below 1)")
    if low <= 1.0:
        return Decision(False, est.value, low, high,
                        f"speedup {est.value:.3f} within noise (CI {low:.3f}–{high:.3f} reaches 1)")
    if est.value < 1.0 + min_gain:
        return Decision(False, est.value, low, high,
                        f"speedup {est.value:.3f} below 1+min_gain={1.0 + min_gain:.3f}")
    return Decision(True, est.value, low, high,
                    f"speedup {est.value:.3f} (CI {low:.3f}–{high:.3f}) beyond noise")


def pick_winner(incumbent: str, samples: Mapping[str, Sequence[float]],
                gates: Mapping[str, GateResult], min_gain: float = DEFAULT_MIN_GAIN
                ) -> tuple[str, dict[str, Decision]]:
    """The candidate to freeze: the promotable one with the largest median speedup, else the
    incumbent. If the incumbent itself failed the gate, the fastest candidate that passed wins
    (and if none passed, the incumbent stays and the caller reports the failure).

    Returns:
        (winner name, decision per candidate other than the incumbent).
    """
    decisions: dict[str, Decision] = {}
    incumbent_ok = gates[incumbent].passed
    for name in samples:
        if name == incumbent:
            continue
        if incumbent_ok:
            decisions[name] = decide_promotion(samples[incumbent], samples[name], gates[name],
                                               min_gain)
        elif gates[name].passed and samples[name]:
            decisions[name] = Decision(True, math.nan, math.nan, math.nan,
                                       "incumbent failed the gate; this candidate passed")
        else:
            decisions[name] = decide_promotion((), (), gates[name], min_gain)
    promotable = [n for n, d in decisions.items() if d.promote]
    if not promotable:
        return incumbent, decisions
    if incumbent_ok:
        return max(promotable, key=lambda n: decisions[n].speedup), decisions
    return min(promotable, key=lambda n: _median(samples[n])), decisions


@dataclass(frozen=True)
class Verdict:
    """What happens to a frozen entry on reverify.

    Attributes:
        action: "keep", "replace" or "remove".
        plan: The plan the entry holds afterwards (None when removed).
        reason: Why, for the log.
    """

    action: str
    plan: Plan | None
    reason: str


def reverify_verdict(frozen: Plan, frozen_gate: GateResult, samples: Mapping[str, Sequence[float]],
                     gates: Mapping[str, GateResult], plans: Mapping[str, Plan],
                     frozen_name: str = "frozen", heuristic_name: str = "heuristic",
                     drift: float = DEFAULT_DRIFT) -> Verdict:
    """Keep a frozen entry, or demote it, from its gate and a fresh interleaved re-time.

    Demoted when it fails the gate, or when the best fresh plan (heuristic or neighbour, gated)
    is faster than it by more than ``drift`` beyond noise. A demoted entry is replaced by the best
    fresh plan when that plan itself beats the heuristic beyond noise, else removed (so the
    run-time falls back to the heuristic).

    Args:
        frozen: The table's plan.
        frozen_gate: Its gate verdict now.
        samples: Per-round times of the frozen plan and the fresh ones, same rounds.
        gates: Gate verdicts of the fresh plans.
        plans: The fresh plans by name.
        frozen_name, heuristic_name: Keys of the frozen plan and the heuristic in ``samples``.
        drift: Relative slowdown against the best fresh plan tolerated.
    """
    fresh = [n for n in samples if n != frozen_name and gates[n].passed and samples[n]]
    best = min(fresh, key=lambda n: _median(samples[n])) if fresh else None

    def demote(why: str) -> Verdict:
        if best is None:
            return Verdict("remove", None, f"{why}; no fresh plan passed the gate")
        if best == heuristic_name or plans[best] == plans.get(heuristic_name):
            return Verdict("remove", None, f"{why}; falls back to the heuristic")
        vs_heur = decide_promotion(samples[heuristic_name], samples[best], gates[best])
        if heuristic_name in samples and gates[heuristic_name].passed and not vs_heur.promote:
            return Verdict("remove", None,
                           f"{why}; best fresh plan {best} does not beat the heuristic "
                           f"({vs_heur.reason})")
        return Verdict("replace", plans[best], f"{why}; replaced by fresh plan {best}")

    if not frozen_gate.passed:
        return demote(f"failed the gate: {frozen_gate.reason}")
    if best is None:
        return Verdict("keep", frozen, "passed the gate; no fresh plan to compare with")
    check = decide_promotion(samples[frozen_name], samples[best], gates[best], drift)
    if check.promote:
        return demote(f"drifted: fresh plan {best} is {check.speedup:.3f}x faster "
                      f"(CI {check.ci_low:.3f}–{check.ci_high:.3f}, threshold {1 + drift:.2f})")
    return Verdict("keep", frozen,
                   f"passed the gate (max util {frozen_gate.max_util:.2f}); within drift of "
                   f"fresh plan {best}: {check.reason}")


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return 0.5 * (ordered[(n - 1) // 2] + ordered[n // 2])


def merge_table(table: PlanTable, updates: Mapping[tuple[str, str], Plan | None],
                meta: Mapping[str, str]) -> PlanTable:
    """A new table: ``updates`` set (Plan) or remove (None) entries by (dtype, key); others kept.

    The input table is not modified (its dicts are copied).
    """
    plans = {dtype: dict(entries) for dtype, entries in table.plans.items()}
    for (dtype, key), plan in updates.items():
        entries = plans.setdefault(dtype, {})
        if plan is None:
            entries.pop(key, None)
        else:
            entries[key] = plan
    return PlanTable(meta=dict(meta), plans=plans)


def empty_table(gpu: str) -> PlanTable:
    """A table with no entries (every shape falls back to the heuristic)."""
    return PlanTable(meta=table_meta(gpu, "empty"), plans={})


def table_meta(gpu: str, method: str) -> dict[str, str]:
    """Meta of a table written now: GPU, torch and triton versions, UTC date, method."""
    import triton

    return {
        "gpu": gpu,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "method": method,
    }


def default_table_path(gpu: str) -> Path | None:
    """``reference/plans/<gpu>.json`` for a GPU `reference.plans.TABLE_FILES` knows."""
    for tag, filename in TABLE_FILES.items():
        if tag.lower() in gpu.lower():
            return PLANS_DIR / filename
    return None


# ----------------------------------------------------------------------------------------------
# The correctness gate (runs the reference block; GPU or interpreter)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateCase:
    """One input the gate checks a plan on.

    Attributes:
        name: Label for the log.
        shape: Input shape and dtype.
        family: Input family (`task.inputs.FAMILIES`).
        seed: Public seed (mixed with the run's secret).
        expansion, eps, residual_scale: The block's other constructor arguments.
    """

    name: str
    shape: TuneShape
    family: str
    seed: int
    expansion: int = 2
    eps: float = 1e-5
    residual_scale: float = 0.5


def pick_gate_cases(cases: Sequence[Case], dtype: str, count: int, smoke_only: bool
                    ) -> list[Case]:
    """``count`` scoring.yaml cases of a dtype, spread from the smallest to the largest.

    Small odd widths exercise masking, large lengths the group barrier and the offset family the
    statistics, so the picks are spread over the size order rather than taken from one end.
    """
    pool = sorted((c for c in cases if c.dtype == dtype and (c.smoke or not smoke_only)),
                  key=lambda c: (c.numel, c.name))
    if count <= 0 or not pool:
        return []
    if count >= len(pool):
        return pool
    if count == 1:
        return [pool[-1]]
    step = (len(pool) - 1) / (count - 1)
    return [pool[round(i * step)] for i in range(count)]


def gate_cases_for(group: ShapeGroup, config: ScoringConfig, extra: int, smoke_only: bool
                   ) -> list[GateCase]:
    """The group's own shapes (normal family) plus ``extra`` scoring.yaml cases of its dtype."""
    out = [GateCase(f"timed:{s.label}", s, "normal", 9000 + i, config.block.expansion,
                    config.block.eps, config.block.residual_scale)
           for i, s in enumerate(group.shapes)]
    for case in pick_gate_cases(config.correctness.cases, group.dtype, extra, smoke_only):
        shape = TuneShape(case.batch, case.length, case.channels, case.dilation, case.dtype)
        out.append(GateCase(case.name, shape, case.family, case.seeds[0], case.expansion,
                            case.eps, case.residual_scale))
    return out


@contextlib.contextmanager
def poisoned_outputs() -> Iterator[None]:
    """NaN-fill every buffer the reference launchers allocate, so an unwritten element fails."""
    import reference.conv_norm as conv_norm

    before = conv_norm.POISON_OUTPUTS
    conv_norm.POISON_OUTPUTS = True
    try:
        yield
    finally:
        conv_norm.POISON_OUTPUTS = before


class Gate:
    """Proves plans on a fixed list of cases; draws each case's inputs and truth once per run.

    Args:
        cases: What to check on.
        budgets: Per-dtype budgets from scoring.yaml.
        device: Where the reference block runs.
        secret: Mixed into every case's seed (fresh per tuner run).
    """

    def __init__(self, cases: Sequence[GateCase], budgets: Mapping[str, Budget],
                 device: torch.device, secret: int) -> None:
        self.cases = tuple(cases)
        self.budgets = budgets
        self.device = device
        self.secret = secret
        self._truth: dict[str, tuple[Any, OracleResult]] = {}

    def _inputs(self, case: GateCase) -> tuple[Any, OracleResult]:
        if case.name not in self._truth:
            s = case.shape
            inputs = make_inputs(batch=s.batch, length=s.length, channels=s.channels,
                                 expansion=case.expansion, family=case.family, dtype=s.dtype,
                                 seed=derive_seed(case.seed, self.secret), device=self.device)
            ref = oracle_step(inputs.x, inputs.conv_weight, inputs.fc1_weight, inputs.fc2_weight,
                              inputs.grad_out, dilation=s.dilation, eps=case.eps,
                              residual_scale=case.residual_scale)
            self._truth[case.name] = (inputs, ref)
        return self._truth[case.name]

    def check(self, plan: Plan) -> GateResult:
        """Run every case with ``plan``; the first failing case ends the check."""
        worst, where = 0.0, ""
        for case in self.cases:
            try:
                utils = self._check_case(plan, case)
            except Exception as exc:  # noqa: BLE001 - any crash of a candidate is a gate failure
                return GateResult(False, math.inf, case.name, f"{case.name}: {exc!r}")
            for check, util in utils.items():
                util = math.inf if math.isnan(util) else util
                if util > worst:
                    worst, where = util, f"{case.name}/{check}"
                if util > 1.0:
                    return GateResult(False, util, f"{case.name}/{check}",
                                      f"{case.name}/{check} at {util:.3g}x its budget")
        return GateResult(True, worst, where)

    def _check_case(self, plan: Plan, case: GateCase) -> dict[str, float]:
        from reference.block import DilatedResidualBlock

        inputs, ref = self._inputs(case)
        s = case.shape
        block = DilatedResidualBlock(s.channels, s.dilation, case.expansion, case.eps,
                                     case.residual_scale).to(self.device, DTYPES[s.dtype])
        block.load_state_dict(inputs.state_dict())
        block.plan = plan
        x = inputs.x.clone().requires_grad_(True)
        with poisoned_outputs():
            out = block(x)
            out.backward(inputs.grad_out)
        budget = self.budgets[s.dtype]
        if not isinstance(out, torch.Tensor) or out.shape != x.shape or out.dtype != x.dtype:
            return {"forward": math.inf}
        return step_utilisation(block, x, out, ref, budget)


# ----------------------------------------------------------------------------------------------
# Timing (GPU): interleaved rounds, balanced orders, L2 flush, CUDA events
# ----------------------------------------------------------------------------------------------


def make_l2_flush(device: torch.device, min_bytes: int = MIN_FLUSH_BYTES) -> Callable[[], None]:
    """A function that evicts the L2 by writing a buffer of at least twice its size."""
    l2 = device_info(device).l2_bytes
    buf = torch.empty(max(2 * l2, min_bytes) // 4, dtype=torch.int32, device=device)

    def flush() -> None:
        buf.zero_()

    return flush


def time_interleaved(fns: Mapping[str, Callable[[], object]], rounds: int, warmup: int,
                     flush: Callable[[], None],
                     prepare: Mapping[str, Callable[[], object]] | None = None,
                     wall_clock: bool = False, hide_launch: bool = False
                     ) -> dict[str, list[float]]:
    """Per-round times (ms) of each function: warm-up, then rounds in carry-over-balanced orders
    (`grader.orders.williams_orders`: each name runs right after every other equally often).

    Each sample: run its ``prepare`` (e.g. clear gradients), flush L2, wait for the device, record
    a start event, run, record an end event, wait for it. Everything outside the two events stays
    out of the sample.

    Args:
        fns: What to time, by name.
        rounds: Samples per function.
        warmup: Untimed runs of each function first.
        flush: Evicts the L2.
        prepare: Optional per-name setup run before each sample (and each warm-up run).
        wall_clock: Time with ``time.perf_counter`` instead of CUDA events (CPU smoke runs only;
            such numbers say nothing about a GPU).
        hide_launch: Do not wait for the device between the flush and the start event: the
            flush (≥ 1 GiB written, ~0.25 ms on an H200) keeps the GPU busy while the host
            launches, so the sample is device time alone. Right for comparing kernels; a
            training step (as the grader times it) includes its host overhead, so leave it off.
    """
    names = list(fns)
    prepare = prepare or {}

    def setup(name: str) -> None:
        if name in prepare:
            prepare[name]()

    for _ in range(warmup):
        for name in names:
            setup(name)
            fns[name]()
    if not wall_clock:
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
    samples: dict[str, list[float]] = {name: [] for name in names}
    orders = williams_orders(names)
    for i in range(rounds):
        for name in orders[i % len(orders)]:
            setup(name)
            flush()
            if wall_clock:
                t0 = time.perf_counter()
                fns[name]()
                samples[name].append((time.perf_counter() - t0) * 1e3)
                continue
            if not hide_launch:
                torch.cuda.synchronize()
            start.record()
            fns[name]()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end))
    return samples


def quantiles(values: Sequence[float]) -> dict[str, float]:
    """Median, p20 and p80 of samples (linear interpolation)."""
    ordered = sorted(values)

    def q(p: float) -> float:
        pos = p * (len(ordered) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    return {"median": q(0.5), "p20": q(0.2), "p80": q(0.8)}


def conv_norm_step(plan: Plan, shape: TuneShape, device: torch.device, eps: float = 1e-5,
                   seed: int = 0) -> Callable[[], None]:
    """conv+norm forward then backward with ``plan`` on fresh random data of ``shape``."""
    from reference.conv_norm import conv_norm_backward, conv_norm_forward

    gen = torch.Generator().manual_seed(seed)
    dims = (shape.batch, shape.length, shape.channels)
    dtype = DTYPES[shape.dtype]
    x = torch.randn(dims, generator=gen).to(device, dtype)
    w = (torch.rand((shape.channels, 1, 3), generator=gen) - 0.5).to(device, dtype)
    dyhat = torch.randn(dims, generator=gen).to(device, dtype)

    def step() -> None:
        _, mean, rstd = conv_norm_forward(x, w, shape.dilation, eps, plan)
        conv_norm_backward(dyhat, x, w, mean, rstd, shape.dilation, plan)

    return step


def _compile_one(task: tuple[dict[str, int], tuple[int, int, int, int, str], float, str]) -> str:
    """Worker: launch conv+norm forward and backward once with a plan on a shape, so Triton
    compiles both kernels into its on-disk cache. Returns "" or the error."""
    fields, (batch, length, channels, dilation, dtype), eps, device = task
    try:
        step = conv_norm_step(Plan(**fields), TuneShape(batch, length, channels, dilation, dtype),
                              torch.device(device), eps)
        step()
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - reported back; the gate will fail it properly
        return repr(exc)[:300]
    return ""


def precompile(tasks: Sequence[tuple[Plan, TuneShape]], workers: int, eps: float = 1e-5,
               device: str = "cuda") -> None:
    """Compile the kernels of many (plan, shape) pairs in parallel worker processes.

    Triton compiles on first launch, single-threaded and holding the GIL (about 1.5–2.5 s per
    kernel variant), and every plan × shape is a variant; in one process a tuning run would
    spend most of its time compiling. The workers fill Triton's on-disk cache, which the main
    process then reads. Runs before any timing, so the workers' GPU work disturbs nothing.
    (On the CPU, under the interpreter, it only exercises the mechanism: nothing is compiled.)
    """
    if workers <= 0 or not tasks:
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    payloads = [(plan.to_dict(), (s.batch, s.length, s.channels, s.dilation, s.dtype), eps,
                 device) for plan, s in tasks]
    start = time.monotonic()
    ctx = multiprocessing.get_context("spawn")  # CUDA cannot be used in forked children
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx) as pool:
        errors = list(pool.map(_compile_one, payloads))
    for (plan, shape), error in zip(tasks, errors, strict=True):
        if error:
            log.warning("precompile %s %s: %s", shape.label, plan.to_dict(), error)
    log.info("precompiled %d plan×shape pairs with %d workers in %.1f s", len(tasks),
             min(workers, len(tasks)), time.monotonic() - start)


# ----------------------------------------------------------------------------------------------
# Driving a group: propose → gate → time → decide
# ----------------------------------------------------------------------------------------------


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
        best = min(timed, key=lambda n: _median(samples[n])) if timed else None
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


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------


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
