"""What `bench/step/reference_step.py` measured, judged and written out: the shapes and results it
records, issue 17's targets (and CONTRACT §8's floor of beating torch.compile) judged on them, and
the markdown report. Apart from the measuring so each stays under the layout's 700 lines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.step.step_limit import COMPILE_MODES, LimitShape, StepLimit

# Targets the reference must meet on h200-profile shapes (issue 17; CONTRACT §8).
COPY_FRACTION_TARGET = 0.80
STEP_LIMIT_TARGET = {"float32": 1.3, "bfloat16": 2.0}  # reference step ≤ this × step limit
COMPILE_SPEEDUP_TARGET = 2.0  # the faster compile mode's step ≥ this × the reference's
TARGET_PROFILE = "h200"
STEP_NAMES = ("eager", *COMPILE_MODES, "reference", "reference_again")


@dataclass(frozen=True)
class BenchShape(LimitShape):
    """One timed shape, with the profiles it belongs to."""

    profiles: tuple[str, ...]


@dataclass
class ShapeResult:
    """Everything measured on one shape (times in ms)."""

    shape: BenchShape
    step: dict[str, dict[str, float]] = field(default_factory=dict)
    ratios: dict[str, dict[str, float]] = field(default_factory=dict)
    # Per compile mode: the first compiled step in the timed process, and the same in a parallel
    # warm-up process with cold caches.
    compile_s: dict[str, float] = field(default_factory=dict)
    compile_cold_s: dict[str, float] = field(default_factory=dict)
    limit: StepLimit | None = None
    vs_limit: dict[str, float] = field(default_factory=dict)  # each step's median / limit
    kernels: dict[str, dict[str, float]] = field(default_factory=dict)
    bandwidth_gbs: dict[str, float] = field(default_factory=dict)
    copy_fraction: dict[str, float] = field(default_factory=dict)
    plan: dict[str, int] = field(default_factory=dict)
    plan_source: str = ""
    heuristic: dict[str, int] = field(default_factory=dict)
    vs_eager_rel: dict[str, float] = field(default_factory=dict)
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def compile_speedup(result: ShapeResult) -> float | None:
    """How many times faster the reference's step is than the faster compile mode's (median
    paired ratio), or None unless every compile mode was timed."""
    ratios = [result.ratios.get(f"{name}/reference") for name in COMPILE_MODES]
    if any(r is None for r in ratios):
        return None
    return min(r["value"] for r in ratios if r is not None)


def _overall(per_shape: dict[str, bool]) -> bool | None:
    return all(per_shape.values()) if per_shape else None


def block_bwd_fraction(result: ShapeResult) -> float:
    """The backward as the block runs it, as a fraction of copy (results from before it was
    timed have only the standalone ``bwd``)."""
    return result.copy_fraction.get("bwd_block:ref", result.copy_fraction["bwd:ref"])


def targets(results: Sequence[ShapeResult]) -> dict[str, Any]:
    """Issue 17's targets, and CONTRACT §8's floor of beating torch.compile, on every shape of the
    target profile: per shape and overall (None: no such shape measured)."""
    shapes = [r for r in results if TARGET_PROFILE in r.shape.profiles and not r.error]
    within_limit = {r.shape.label: r.vs_limit["reference"] <= STEP_LIMIT_TARGET[r.shape.dtype]
                    for r in shapes
                    if "reference" in r.vs_limit and r.shape.dtype in STEP_LIMIT_TARGET}
    speedups = {r.shape.label: compile_speedup(r) for r in shapes}
    speedups = {label: s for label, s in speedups.items() if s is not None}
    beats_compile = {label: s >= COMPILE_SPEEDUP_TARGET for label, s in speedups.items()}
    no_slower = {label: s >= 1.0 for label, s in speedups.items()}
    roofline = {r.shape.label: min(r.copy_fraction["fwd:ref"], block_bwd_fraction(r))
                >= COPY_FRACTION_TARGET for r in shapes if "fwd:ref" in r.copy_fraction}
    faster = f"reference_ge_{COMPILE_SPEEDUP_TARGET:g}x_faster_than_compile"
    return {
        "step_limit_bound": dict(STEP_LIMIT_TARGET),
        f"reference_le_step_limit_bound_on_{TARGET_PROFILE}_shapes": _overall(within_limit),
        "reference_le_step_limit_bound_per_shape": within_limit,
        f"{faster}_on_{TARGET_PROFILE}_shapes": _overall(beats_compile),
        f"{faster}_per_shape": beats_compile,
        f"reference_le_compile_on_{TARGET_PROFILE}_shapes": _overall(no_slower),
        "reference_le_compile_per_shape": no_slower,
        f"conv_norm_ge_{COPY_FRACTION_TARGET:.0%}_copy_on_{TARGET_PROFILE}_shapes":
            _overall(roofline),
        "conv_norm_per_shape": roofline,
    }


def _fmt(q: dict[str, float] | None) -> str:
    if not q:
        return "–"
    return f"{q['median']:.3f} ({q['p20']:.3f}–{q['p80']:.3f})"


def _secs(value: float | None) -> str:
    return "–" if value is None or value != value else f"{value:.1f}"


def _fmt_ratio(r: dict[str, float] | None) -> str:
    if not r:
        return "–"
    return f"{r['value']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Markdown table lines; a row shorter than the head is padded with empty cells."""
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        lines.append("| " + " | ".join([*row, *[""] * (len(head) - len(row))]) + " |")
    return lines


def _step_rows(results: Sequence[ShapeResult]) -> list[list[str]]:
    rows = []
    for r in results:
        cells = [r.shape.label, ",".join(r.shape.profiles)]
        if r.error:
            rows.append([*cells, f"error: {r.error}"])
            continue
        cells += [_fmt(r.step.get(name)) for name in STEP_NAMES]
        cells += [_fmt_ratio(r.ratios.get("eager/reference")),
                  _fmt_ratio(r.ratios.get("noise reference/reference_again"))]
        cells += [f"{_secs(r.compile_cold_s.get(name))} / {_secs(r.compile_s.get(name))}"
                  for name in COMPILE_MODES]
        cells.append(f"{max(r.vs_eager_rel.values(), default=float('nan')):.1e}")
        rows.append(cells)
    return rows


def _limit_rows(results: Sequence[ShapeResult]) -> list[list[str]]:
    rows = []
    for r in results:
        if r.error or r.limit is None:
            continue
        judged = TARGET_PROFILE in r.shape.profiles
        bound = STEP_LIMIT_TARGET.get(r.shape.dtype) if judged else None
        vs_limit = r.vs_limit.get("reference")
        rows.append([r.shape.label, f"{r.limit.memory_ms:.3f}", f"{r.limit.compute_ms:.3f}",
                     f"{r.limit.limit_ms:.3f}", r.limit.bound,
                     "–" if vs_limit is None else f"{vs_limit:.2f}",
                     "–" if bound is None else f"≤ {bound:g}",
                     *[_fmt_ratio(r.ratios.get(f"{name}/reference")) for name in COMPILE_MODES]])
    return rows


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def _kernel_rows(results: Sequence[ShapeResult]) -> list[list[str]]:
    rows = []
    for r in results:
        if r.error:
            continue
        k, bw, fr = r.kernels, r.bandwidth_gbs, r.copy_fraction
        heur = ("–", "–") if not r.heuristic else (_fmt(k.get("fwd:heuristic")),
                                                    _fmt(k.get("bwd:heuristic")))
        rows.append([r.shape.label, r.plan_source, _fmt(k["fwd:ref"]), f"{bw['fwd:ref']:.0f}",
                     f"{fr['fwd:ref']:.0%}", _fmt(k["bwd:ref"]), f"{bw['bwd:ref']:.0f}",
                     f"{fr['bwd:ref']:.0%}", _fmt(k.get("bwd_block:ref")),
                     f"{block_bwd_fraction(r):.0%}", _fmt(k.get("bwd_ceiling:ref")),
                     _pct(fr.get("bwd_ceiling:ref")), f"{bw['copy']:.0f}", *heur])
    return rows


def markdown(meta: dict[str, Any], results: Sequence[ShapeResult], skipped: Sequence[str]) -> str:
    """The report as a markdown document."""
    lines = [f"# Reference benchmark ({meta['gpu']})", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k not in ("targets",)]
    lines += ["", "## Full training step (ms: median (p20–p80)); ratios: median [95% CI]", ""]
    lines += _table(["shape", "profiles", *STEP_NAMES, "eager/ref", "noise ref/ref",
                     *[f"{name} s (cold / in run)" for name in COMPILE_MODES],
                     "ref vs eager (max rel)"], _step_rows(results))
    lines += ["", "## Step limit (max of the memory and compute floors, rates measured in this "
              "run) and torch.compile; ratios: median [95% CI]", ""]
    lines += _table(["shape", "memory floor ms", "compute floor ms", "step limit ms", "bound",
                     "reference / limit", "target", *[f"{name}/ref" for name in COMPILE_MODES]],
                    _limit_rows(results))
    lines += ["", "## conv+norm kernels alone (bytes model: fwd 2·N·e, bwd 4·N·e, copy 2·N·e; "
              "bwd computes c1, c2 itself; block bwd also adds the residual's gradient, as the "
              "scoring reference runs it; ceiling bwd is given c1, c2 and adds the residual's "
              "gradient, as the ceiling runs it)", ""]
    lines += _table(["shape", "plan", "fwd ms", "fwd GB/s", "fwd % copy", "bwd ms", "bwd GB/s",
                     "bwd % copy", "block bwd ms", "block bwd % copy", "ceiling bwd ms",
                     "ceiling bwd % copy", "copy GB/s", "heuristic fwd ms", "heuristic bwd ms"],
                    _kernel_rows(results))
    lines += ["", f"## Targets on {TARGET_PROFILE} shapes (issue 17; CONTRACT §8)", ""]
    lines += [f"- {k}: {v}" for k, v in meta.get("targets", {}).items()]
    if skipped:
        lines += ["", f"Not run (deadline): {', '.join(skipped)}"]
    return "\n".join(lines) + "\n"


