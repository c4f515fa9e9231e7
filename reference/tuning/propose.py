"""Stage 1, propose: the values every Plan field may take on a device, validation of a proposed
plan against them (`check_plan`, `InvalidProposal`), and the deterministic neighbourhood of a plan
that the tuner proposes without an LLM. Pure: no GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from reference.plans import DeviceInfo, Plan

# Plans per shape class, incumbent and heuristic included.
DEFAULT_MAX_CANDIDATES = 6
# Field ranges the tuner (and the LLM) may choose from. Rows and warps beyond these never fit
# the kernels' register budget; groups above the SM count are clamped by the launcher anyway.
ROW_CHOICES = (2, 4, 8, 16, 32, 64, 128)
BLOCK_C_CHOICES = (16, 32, 64, 128)
WARP_CHOICES = (1, 2, 4, 8, 16)
MAX_STAGES = 4


class InvalidProposal(ValueError):
    """A proposed plan is malformed or outside the valid ranges; the message says why."""


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
        "taps_once": (0, 1),
        "fwd_chain": (0, 1),
        "bwd_chain": (0, 1),
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
    """Neighbour moves in order of expected value: the other kernel family for both passes (the
    chain kernels won every h200 class, by up to 1.6×), the taps loaded once or per tile (same
    tiles, different machine code; its effect varied by class on the H200; moot when both
    passes are chain kernels), the L2 footprint (groups), one pass back to the loop kernel,
    then tile height with warps scaled alike (keeps rows per warp), then each alone, then
    pipelining. Moves that leave a Plan invalid (more than one warp in a chain pass) are
    dropped by `neighbourhood`."""
    b = base
    chain = {"fwd_chain": 1, "bwd_chain": 1, "fwd_block_rows": 8, "bwd_block_rows": 8,
             "fwd_num_warps": 1, "bwd_num_warps": 1, "taps_once": 0}
    loop = {"fwd_chain": 0, "bwd_chain": 0, "fwd_block_rows": 32, "bwd_block_rows": 8,
            "fwd_num_warps": 4, "bwd_num_warps": 4}
    if not (b.fwd_chain and b.bwd_chain):
        yield chain
    if b.fwd_chain or b.bwd_chain:
        yield loop
    if not (b.fwd_chain and b.bwd_chain):
        yield {"taps_once": 1 - b.taps_once}
    yield {"fwd_group": b.fwd_group * 2, "bwd_group": b.bwd_group * 2}
    yield {"fwd_group": b.fwd_group // 2, "bwd_group": b.bwd_group // 2}
    for pass_ in ("fwd", "bwd"):
        if getattr(b, f"{pass_}_chain"):
            yield {k: v for k, v in loop.items() if k.startswith(pass_)}
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
