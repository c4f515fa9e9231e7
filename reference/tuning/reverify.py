"""Stage 5, re-verify: what happens to a frozen table entry when it is gated and re-timed
against a fresh heuristic and its neighbours (`--reverify`): kept, replaced by the best fresh plan,
or removed so the run-time falls back to the heuristic. Pure: no GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from reference.plans import Plan
from reference.tuning.freeze import decide_promotion
from reference.tuning.prove import GateResult
from reference.tuning.timing import median

# Reverify: a frozen entry is demoted when a fresh plan beats it by more than this, beyond noise.
DEFAULT_DRIFT = 0.05


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
    best = min(fresh, key=lambda n: median(samples[n])) if fresh else None

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
