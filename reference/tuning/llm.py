"""Stage 1, propose (optional): more plans from an LLM behind any OpenAI-compatible
chat-completions endpoint, over plain urllib. The request carries the shape, the field ranges and
the times so far; the reply must be JSON plans only, each checked by `propose.check_plan`.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from reference.plans import MAX_TILE_ELEMENTS, Plan
from reference.tuning.propose import InvalidProposal, check_plan, describe_ranges
from reference.tuning.shapes import TuneShape

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
    "taps_once": "loop kernels: 1 loads the conv taps once a program instead of every tile",
    "fwd_chain": ("1: forward on the chain kernel (tiles of fwd_block_rows positions of one "
                  "chain and all channels, the +-d shifts in registers, one warp a program; "
                  "up to 128 channels); 0: the loop kernel"),
    "bwd_chain": "the same for the backward (bwd_block_rows, one warp)",
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
            "fwd_num_warps = 1 where fwd_chain = 1, bwd_num_warps = 1 where bwd_chain = 1",
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
