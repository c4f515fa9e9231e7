"""The gate's items over several children side by side (`Limits.gate_processes`): how many
children a host gets, how the items are dealt to them, and which child's ending speaks for the
gate when they end differently.

A submission compiles each kernel the first time it runs, on the CPU, one after another in one
process: in one child that was over half of a whole grade on an H200
(bench/results/grade-phases-h200-2026-12-02); two children halved the gate
(bench/results/grade-fast-h200-2026-12-02).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, TypeVar

from grader.sandbox import ChildExit, ChildResult, Outcome

# A `grader.gate.GateItem` (its ``index``, ``kind`` and ``case`` are read); generic so that this
# module needs nothing of the gate's.
Item = TypeVar("Item")


def gate_processes(configured: int) -> int:
    """How many gate children to run: ``configured`` (`Limits.gate_processes`), but never more
    than the CPUs this process may run on (its affinity mask, which a container's or a worker's
    CPU set narrows), so a small host compiles in fewer children instead of thrashing."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(configured, cpus))


def shard_items(items: Sequence[Item], processes: int) -> tuple[tuple[Item, ...], ...]:
    """Deal ``items`` to ``processes`` children (none empty; fewer when there are fewer cases).

    Items of one case (every seed, its identity check) stay in one child: they launch the same
    kernels with the same specialisations, so the compile that dominates a gate child's time
    (bench/results/grade-phases-h200-2026-12-02) happens once. Cases go largest group first to
    the child with the fewest so far (each group's weight: one compile plus its items), and each
    child keeps the job's order.
    """
    groups: dict[tuple[Any, ...], list[Item]] = {}
    for item in items:
        c = item.case  # type: ignore[attr-defined]
        key = (item.kind == "drift", c.dtype, c.batch, c.length, c.channels, c.expansion,
               c.dilation, c.eps, c.residual_scale)  # fmt: skip
        groups.setdefault(key, []).append(item)
    n = max(1, min(processes, len(groups)))
    load = [0.0] * n
    dealt: list[list[Item]] = [[] for _ in range(n)]
    def weight(group: list[Item]) -> float:
        return 1.0 + 0.1 * len(group)  # one compile, then each item's own run

    # Stable: equal weights keep the job's order, so a deal is the same on every host.
    for group in sorted(groups.values(), key=weight, reverse=True):
        k = min(range(n), key=lambda i: (load[i], i))
        load[k] += weight(group)
        dealt[k].extend(group)
    return tuple(tuple(sorted(d, key=lambda i: i.index)) for d in dealt if d)


# Which child's ending speaks for the gate when several ran: the order `grader.grade`'s verdict
# reads them in (a tampered channel before a hang before a crash ...).
_OUTCOME_RANK = (Outcome.TAMPERED, Outcome.TOO_MANY_TASKS, Outcome.TIMED_OUT,
                 Outcome.OUT_OF_MEMORY, Outcome.SIGNALED, Outcome.SPAWN_FAILED, Outcome.EXITED,
                 Outcome.OK)  # fmt: skip


def worst_child(children: Sequence[ChildResult]) -> ChildResult:
    """The child whose ending speaks for the gate: the first by `_OUTCOME_RANK`, and of children
    that exited, one whose exit status was not a clean one."""

    def rank(c: ChildResult) -> tuple[int, int]:
        clean_exit = c.exit_code in (ChildExit.OK, ChildExit.RULE_VIOLATION)
        return _OUTCOME_RANK.index(c.outcome), int(c.outcome is Outcome.EXITED and clean_exit)

    return min(children, key=rank)


__all__ = ["gate_processes", "shard_items", "worst_child"]
