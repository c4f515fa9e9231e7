"""Timing phase, trusted side (CONTRACT §4–§6): judge what the two timing children measured.

`grader.timing_run` measures the plain block, drives the children (`grader.interleave`: the
trusted baselines process and the submission's process, one step at a time, every step timed by
the parent's own clock) and hands what they measured to this module: per shape, the driver's own
`grader.samples.ShapeRaw`, read as it is (this module imports nothing of the driver;
tests/test_layout.py holds it so). Nothing the submission's process says is taken as a verdict.
Per shape:

- each step's time is its event window unless the parent's wall, less the most the baselines'
  steps cost around their windows (for the submission's: or what the harness's own steps cost in
  its process before the import, if more), is longer (`step_times`): a window shorter than the
  parent saw pass counts as the wall, and in more than the judge's ``disagree_limit`` of the
  steps it is implausible;
- medians of t_plain, t_ref and t_sub, and r = t_plain/t_sub, g = t_plain/t_ref as medians of
  per-round paired ratios with bootstrap intervals that resample whole visits (`grader.stats`
  says why: rounds of one visit share the device's slow state);
- the bandwidth floor: every step of every block must be at least the bytes a step must move
  over the GPU's peak bandwidth (`grader.plausibility`);
- the baselines against themselves: plain and the reference timed alone before the submission's
  process imported anything, and interleaved with it; if their interleaved median lies more than
  a fixed fraction (the profile's ``baseline_drift``) from what they took alone before, the
  grade is void (`baseline_drift`; the rounds alone after are information only);
- the check numbers from the baselines process (the submission's answers against plain's within
  the judge's ``plain_slack``, or against the fp64 oracle at the gate's budgets in sampled
  rounds), judged by the driver as each round ended (`grader.samples.check_utilisation`);
- the tail: work still running after the step returned on the caller's stream (a side stream
  the caller never waited for) is a broken rule, even though the window counted it;
- the GPU memory the submission holds (`memory_verdict`);
- the score of CONTRACT §5 and its bootstrap interval;

every threshold from `scoring.yaml` (``timing.judge``: `grader.config.Judge`).

Any failure makes the whole timing phase fail with score 0 and a reason: there is no partial
credit, because every failure here means a broken submission or a lie. Failed shapes keep their
own reasons in the report.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from grader import plausibility, stats
from grader.config import Judge, Profile, Score
from grader.report import ShapeSamples, ShapeTiming
from grader.samples import BASELINES, BLOCKS, UTIL_KEYS, VISIT_ROUNDS, ShapeRaw

# Every threshold a verdict here turns on is the contract's (`scoring.yaml` ``timing.judge``,
# `grader.config.Judge`), as is each profile's baselines' drift bound; what stays here decides
# only the intervals reported beside the score (the score itself is a median).
# Grades of one input shape on one GPU draw the same rounds in the bootstrap: intervals are a
# property of the samples, not of the draw.
BOOTSTRAP_SEED = stats.DEFAULT_SEED
# The between-process shifts' own seed (`process_shifts`): fixed, like the bootstrap's.
PROCESS_SEED = 20261203
# Whole visits are resampled, read as Hesterberg's expanded percentile interval (grader/stats.py
# says why; bench/timing/interval_coverage.py measures it against the others).
INTERVAL_METHOD = stats.IntervalMethod.VISITS


class TimingStatus(enum.StrEnum):
    """How the timing phase ended."""

    OK = "ok"  # every shape timed, checked and scored
    RULE_BROKEN = "rule_broken"  # a run-time rule broke while timed (timer patched, thread...)
    CHECK_FAILED = "check_failed"  # a timed step's result was wrong
    IMPLAUSIBLE = "implausible"  # a time below the bandwidth floor, or against the parent's clock
    VOID = "void"  # the baselines' times moved once the submission ran beside them: regrade
    CRASHED = "crashed"  # the child or the submission failed
    TIMED_OUT = "timed_out"  # past the timing phase's wall-clock limit
    OUT_OF_MEMORY = "out_of_memory"  # over a memory limit
    GRADER_ERROR = "grader_error"  # the grader failed, or the child's report was malformed
    NOT_TIMED = "not_timed"  # (a shape's status only) the run stopped before this shape


# ----------------------------------------------------------------------------- pure analysis


@dataclass(frozen=True)
class ShapeVerdict:
    """Analysis of one shape: the report row plus the bootstrap draws of its score.

    Attributes:
        timing: The report's row.
        status: ok, or why not.
        score_draws: The score in each resample of ``bootstrap`` (None unless ok).
        bootstrap: The grade's bootstrap the draws came from; `task_score` reads its interval
            with it.
    """

    timing: ShapeTiming
    status: TimingStatus
    score_draws: np.ndarray | None = None
    bootstrap: stats.Bootstrap | None = None


@dataclass(frozen=True)
class ShapeEstimate:
    """r, g and the score of one shape with their intervals, from one grade's bootstrap.

    Attributes:
        r: ``t_plain / t_sub``, median of per-round ratios, with its interval.
        g: ``t_plain / t_ref``, likewise.
        score: CONTRACT §5's score of (r, g).
        score_ci: Its interval: the score of each resample's (r, g), read as ``bootstrap`` says.
        score_draws: The score in each resample, for the task score's interval.
    """

    r: stats.RatioEstimate
    g: stats.RatioEstimate
    score: float
    score_ci: stats.Interval
    score_draws: np.ndarray


def score_from(score: Score, r: float, g: float) -> float:
    """CONTRACT §5's shape score (delegates to `grader.config.Score.shape_score`)."""
    return score.shape_score(r, g)


@functools.lru_cache(maxsize=16)
def grade_bootstrap(
    rounds: int,
    method: stats.IntervalMethod = INTERVAL_METHOD,
    resamples: int = stats.DEFAULT_RESAMPLES,
    visit_rounds: int = VISIT_ROUNDS,
) -> stats.Bootstrap:
    """The bootstrap every shape of a grade with ``rounds`` timed rounds shares.

    Drawn once (and cached): r, g and the score of every shape resample the same visits, so the
    task score's interval keeps the correlation of shapes timed in the same stretch of time.
    """
    boot = stats.Bootstrap.build(method, stats.visits_of(rounds, visit_rounds),
                                 resamples=resamples, seed=BOOTSTRAP_SEED)
    boot.indices.flags.writeable = False  # shared by every caller of the cache
    return boot


@functools.lru_cache(maxsize=4)
def process_shifts(resamples: int) -> np.ndarray:
    """One standard normal draw per resample, the same for every shape of a grade: the
    between-process offset of that resample (`estimate_shape`'s ``process_sd``)."""
    shifts = np.random.default_rng(PROCESS_SEED).standard_normal(resamples)
    shifts.flags.writeable = False
    return shifts


def estimate_shape(samples: ShapeSamples, score: Score,
                   bootstrap: stats.Bootstrap, process_sd: float = 0.0) -> ShapeEstimate:
    """r, g and the score of one shape's samples with the intervals of ``bootstrap``.

    The estimates are medians of per-round paired ratios whatever the bootstrap; only the
    intervals depend on it. ``process_sd`` (the profile's) widens r's: each resample's r is
    scaled by exp(process_sd · z), with z drawn once per resample for all shapes, since the
    submission's process is one process for every shape (g is timed in one process: no term).

    Raises:
        ValueError: A time that is not finite and positive, or a bootstrap of another length.
    """
    if bootstrap.indices.shape[1] != len(samples.plain_ms):
        raise ValueError(f"bootstrap resamples {bootstrap.indices.shape[1]} rounds, the shape "
                         f"has {len(samples.plain_ms)}")
    r_ratios = stats.paired_ratios(samples.plain_ms, samples.sub_ms)
    g_ratios = stats.paired_ratios(samples.plain_ms, samples.ref_ms)
    r_draws, g_draws = bootstrap.medians(r_ratios), bootstrap.medians(g_ratios)
    if process_sd:
        r_draws = r_draws * np.exp(process_sd * process_shifts(len(r_draws)))
    r_value, g_value = float(np.median(r_ratios)), float(np.median(g_ratios))
    draws = np.array([score.shape_score(a, b) for a, b in zip(r_draws, g_draws, strict=True)])
    value = score.shape_score(r_value, g_value)
    return ShapeEstimate(
        r=stats.RatioEstimate(r_value, bootstrap.interval(r_draws, r_value)),
        g=stats.RatioEstimate(g_value, bootstrap.interval(g_draws, g_value)),
        score=value, score_ci=bootstrap.interval(draws, value), score_draws=draws)


def weighted_score(weights: Sequence[float], scores: Sequence[float],
                   draws: Sequence[np.ndarray],
                   bootstrap: stats.Bootstrap) -> tuple[float, stats.Interval]:
    """CONTRACT §5's task score, the weighted mean of shape scores, and its interval.

    ``draws[s][k]`` is shape s's score in resample k of the one ``bootstrap`` every shape shares,
    so resample k's task score is the weighted mean over shapes of column k.
    """
    w = np.asarray(weights, dtype=np.float64)
    value = float(np.dot(w, np.asarray(scores, dtype=np.float64)) / w.sum())
    mean_draws = w @ np.stack(list(draws)) / w.sum()  # (shapes,) @ (shapes, resamples)
    return value, bootstrap.interval(mean_draws, value)


def _fail(label: str, status: TimingStatus, reason: str, **values: Any) -> ShapeVerdict:
    return ShapeVerdict(ShapeTiming(label=label, score=0.0, status=status.value, reason=reason,
                                    **values), status)


def step_times(window: np.ndarray, wall: np.ndarray,
               overhead_ms: float) -> tuple[np.ndarray, np.ndarray]:
    """The times a shape is scored on, and which steps disagreed with the parent's clock.

    A step's time is its event window unless the parent's wall time, less the most a step's
    handshake and evidence copies took for the baselines (``overhead_ms``), is longer: then the
    window said less than the parent saw, and the parent's bound is the time.
    """
    bound = wall - overhead_ms
    return np.maximum(window, bound), window < bound


def analyze_shape(
    raw: ShapeRaw,
    score: Score,
    bandwidth: plausibility.Bandwidth,
    *,
    judge: Judge,
    channels: int,
    expansion: int,
    rounds: int,
    alone_rounds: int,
    resamples: int = stats.DEFAULT_RESAMPLES,
    bootstrap: stats.Bootstrap | None = None,
    dry_run: bool = False,
    process_sd: float = 0.0,
    baseline_bound: float,
) -> ShapeVerdict:
    """Judge one shape: counts, the parent's clock, the floor, the baselines against themselves,
    checks, tail, then r, g and the score.

    The intervals come from ``bootstrap``, by default the grade's (`grade_bootstrap`: whole
    visits of `VISIT_ROUNDS` rounds resampled, shared by every shape). The verdict's row carries
    the samples from the first check on, so a failed shape's numbers can be looked at too.
    ``judge`` holds the thresholds; ``baseline_bound`` is the profile's ``baseline_drift``.
    """
    label = raw.shape.label
    for name in BLOCKS:
        for key, table, want in (("window", raw.window_ms, rounds), ("tail", raw.tail_ms, rounds),
                                 ("wall", raw.wall_ms, rounds)):
            got = len(table.get(name, ()))
            if got != want:
                return _fail(label, TimingStatus.GRADER_ERROR,
                             f"{name}: {got} {key} samples, {want} expected")
    for name in BASELINES:
        # The second half is missing where the run stopped after this shape's timed rounds.
        got = len(raw.alone_ms.get(name, ()))
        if got not in (alone_rounds, alone_rounds // 2):
            return _fail(label, TimingStatus.GRADER_ERROR,
                         f"{name}: {got} samples timed alone, {alone_rounds} expected")
    try:
        windows = {n: stats.as_samples(raw.window_ms[n], f"{n} window") for n in BLOCKS}
        walls = {n: stats.as_samples(raw.wall_ms[n], f"{n} wall") for n in BLOCKS}
        alone = {n: stats.as_samples(raw.alone_ms[n], f"{n} alone") for n in BASELINES}
    except ValueError as exc:
        return _fail(label, TimingStatus.IMPLAUSIBLE, str(exc))
    for name in BLOCKS:
        # The event window lies inside the parent's go → done; different clocks, so a margin.
        over = np.flatnonzero(windows[name]
                              > walls[name] * (1 + judge.wall_slack) + judge.wall_slack_ms)
        if over.size:
            i = int(over[0])
            return _fail(label, TimingStatus.IMPLAUSIBLE,
                         f"{name}: event window {windows[name][i]:.4g} ms is longer than the "
                         f"parent's clock's {walls[name][i]:.4g} ms for the same step")
    # What a step costs around its window (handshake, evidence copies, synchronizations) is the
    # same code for every block; the baselines' own say how much it can be. In the submission's
    # process it can cost more for reasons of the process, not of the submission (on an H200,
    # 0.1-0.3 ms more for the reference's own code, whatever the harness did alike in both):
    # there its harness steps before the import say how much. (Its walls also run on to the
    # trusted probe's answer after each step, `grader.idle.drain`, and each of its
    # steps begins with a switch of the GPU's context: its calibration steps' walls hold both.)
    overheads = np.concatenate([walls[n] - windows[n] for n in BASELINES])
    overhead = float(np.quantile(overheads, judge.overhead_quantile)) + judge.overhead_slack_ms
    allowed = dict.fromkeys(BLOCKS, overhead)
    # For the paired check below: what the submission's process costs a step more than the
    # baselines' by itself (``shift``), and how far above that a step may go (``slack``).
    shift, slack = 0.0, judge.paired_slack_ms
    calibration = np.asarray(raw.calibration_ms, dtype=np.float64)
    if calibration.size:
        # Its calibration steps (the harness's block before the import, the same code) say how
        # much the process costs around a window: its quantile is that block's allowance...
        own_q = float(np.quantile(calibration, judge.overhead_quantile))
        own_median = float(np.median(calibration))
        allowed["sub"] = max(overhead, own_q + judge.overhead_slack_ms)
        # ...its median less the baselines' is the shift...
        shift = max(0.0, own_median - float(np.median(overheads)))
        # ...and its spread widens the slack. On an H100 host (2026-12-06,
        # bench/results/scoring-reference-h100-2026-12-06/) the trusted probe after a step that
        # ran cuBLAS kernels found the GPU busy 0-1.2 ms (median 0.37) switching back from that
        # process's context, so honest steps of the naive control crossed 0.25 ms in 17-25 of 60
        # steps. The slack is the larger of the judge's and that spread (its overhead quantile
        # less its median), and a step over it is still timed by its wall above.
        slack = max(slack, own_q - own_median + judge.overhead_slack_ms)
    times, disagree = {}, {}
    for name in BLOCKS:
        times[name], disagree[name] = step_times(windows[name], walls[name], allowed[name])
    medians = {n: float(np.median(times[n])) for n in BLOCKS}
    boot = bootstrap if bootstrap is not None else grade_bootstrap(rounds, resamples=resamples)
    samples = ShapeSamples(plain_ms=tuple(times["plain"].tolist()),
                           ref_ms=tuple(times["ref"].tolist()),
                           sub_ms=tuple(times["sub"].tolist()),
                           visit=tuple(stats.visits_of(rounds, VISIT_ROUNDS).tolist()),
                           **{f"{n}_tail_ms": tuple(float(t) for t in raw.tail_ms[n])
                              for n in BLOCKS})
    # The yardstick: the rounds before the import (those after are information only).
    alone_medians = {n: float(np.median(alone[n][:alone_rounds // 2])) for n in BASELINES}
    values = dict(t_plain_ms=medians["plain"], t_ref_ms=medians["ref"], t_sub_ms=medians["sub"],
                  samples=samples, t_plain_alone_ms=alone_medians["plain"],
                  t_ref_alone_ms=alone_medians["ref"], overhead_ms=allowed["sub"],
                  clock_disagreements=int(disagree["sub"].sum()))
    # The paired check: less the process's own extra cost (``shift``, above), a step's wall
    # beyond its window by more than both baselines' in the same round, by over ``slack``.
    paired = (walls["sub"] - windows["sub"] - shift
              - np.maximum(walls["plain"] - windows["plain"], walls["ref"] - windows["ref"]))
    lied = paired > slack
    if float(lied.mean()) > judge.disagree_limit and not dry_run:
        return _fail(label, TimingStatus.IMPLAUSIBLE,
                     f"sub: the event window left more of the parent's go → done unaccounted "
                     f"than both baselines' in the same round, by over "
                     f"{slack:.3g} ms, in {int(lied.sum())} of {rounds} steps "
                     f"(median excess {float(np.median(paired)):.3g} ms; limit "
                     f"{judge.disagree_limit:.0%} of steps)",
                     **values)

    bytes_moved = plausibility.step_bytes(batch=raw.shape.batch, length=raw.shape.length,
                                          channels=channels, expansion=expansion,
                                          dtype=raw.shape.dtype)
    floor = plausibility.floor_ms(bytes_moved, bandwidth)
    values["floor_ms"] = floor
    for name in BLOCKS:
        check = plausibility.check_floor(list(times[name]), floor)
        if not check.ok:
            return _fail(label, TimingStatus.IMPLAUSIBLE, check.reason(name), **values)
    half = alone_rounds // 2
    for name in BASELINES:
        moved = baseline_drift(alone[name], times[name], half)
        if abs(moved) > baseline_bound and not dry_run:
            before = float(np.median(alone[name][:half]))
            after = (f"; {float(np.median(alone[name][half:])):.4g} ms alone after, "
                     "information only" if len(alone[name]) > half else "")
            return _fail(label, TimingStatus.VOID,
                         f"{name} took {medians[name]:.4g} ms a step interleaved with the "
                         f"submission, {before:.4g} ms alone before it was imported "
                         f"({moved:+.1%}, limit ±{baseline_bound:.1%}{after}): the baselines "
                         "moved, so nothing here can be scored; regrade", **values)

    # The check numbers were judged by the driver as each round ended
    # (`grader.samples.check_utilisation`); here only their worst is reported, with the verdict.
    worst = raw.worst_utilisation()
    if worst is None:
        return _fail(label, TimingStatus.GRADER_ERROR, f"no check numbers for {list(UTIL_KEYS)}",
                     **values)
    values["utilisation"] = worst
    if raw.check_failed:
        return _fail(label, TimingStatus.CHECK_FAILED, raw.check_failed, **values)

    tails = {n: float(np.median(np.asarray(raw.tail_ms[n], dtype=np.float64))) for n in BLOCKS}
    values["tail_ms"] = tails["sub"]
    # What the submission's tail holds beyond the baselines' in the same rounds: a neighbour on
    # the GPU (another grade, time-sliced with this one) delays every block's closing event
    # alike, and must not read as the submission's side-stream work.
    baseline_tail = max(tails["plain"], tails["ref"])
    tail = tails["sub"] - baseline_tail
    tail_limit = max(judge.tail_limit_ms, judge.tail_limit_fraction * medians["sub"])
    if tail > tail_limit:
        return _fail(label, TimingStatus.RULE_BROKEN,
                     f"work kept running for {tails['sub']:.3g} ms (median) after the step "
                     f"returned on the caller's stream, {tail:.3g} ms more than the baselines' "
                     f"{baseline_tail:.3g} ms (limit {tail_limit:.3g} ms): it ran on a stream the "
                     "caller never waited for", **values)

    est = estimate_shape(samples, score, boot, process_sd)
    timing = ShapeTiming(
        label=label,
        r=est.r.value,
        g=est.g.value,
        r_ci=(est.r.ci.low, est.r.ci.high),
        g_ci=(est.g.ci.low, est.g.ci.high),
        target=score.target(est.g.value),
        score=est.score,
        score_ci=(est.score_ci.low, est.score_ci.high),
        weight=score.dtype_weights[raw.shape.dtype],
        **values,
    )
    return ShapeVerdict(timing, TimingStatus.OK, est.score_draws, boot)


def baseline_drift(alone: np.ndarray, interleaved: np.ndarray, before: int) -> float:
    """How far a baseline's interleaved median lies from its median timed alone before the
    submission's process imported anything, as a fraction (+ slower interleaved).

    ``alone`` holds the ``before`` rounds timed before the import, then those after the
    interleaved rounds (information only: the submission's process exists then, and whatever it
    left running, a second CUDA context spinning say, would be in them). The caller holds the
    result to a fixed bound (`grader.config.Profile.baseline_drift`): a bound that grew with the
    spread between the before and after medians (as it did, 3× that span) let a spinner that
    also ran through the after rounds widen its own tolerance until nothing was ever void.
    """
    first = float(np.median(alone[:before]))
    return float(np.median(interleaved)) / first - 1.0


def task_score(verdicts: Sequence[ShapeVerdict]) -> tuple[float, tuple[float, float] | None]:
    """Weighted mean of shape scores (CONTRACT §5) and its bootstrap interval; 0 if any failed.

    Raises:
        ValueError: The shapes were resampled with different bootstraps (a grader bug: the task
            score's interval needs one resample to mean the same visits for every shape).
    """
    if not verdicts or any(v.status is not TimingStatus.OK for v in verdicts):
        return 0.0, None
    boot = verdicts[0].bootstrap
    for v in verdicts:
        if v.bootstrap is None or not (v.bootstrap is boot or (
                v.bootstrap.level == boot.level
                and np.array_equal(v.bootstrap.indices, boot.indices))):
            raise ValueError(f"{v.timing.label} was resampled with another bootstrap than "
                             f"{verdicts[0].timing.label}")
    value, ci = weighted_score([v.timing.weight for v in verdicts],
                               [v.timing.score for v in verdicts],
                               [v.score_draws for v in verdicts], boot)
    return value, (ci.low, ci.high)


def memory_verdict(memory: Mapping[str, Any], profile: Profile, channels: int,
                   judge: Judge) -> str:  # fmt: skip
    """Why the submission's GPU memory breaks the rule, or "" (it holds at most the judge's
    ``hog_activations`` of the largest shape's fp32 activations plus ``hog_fixed_mib`` across
    steps, and adds at most ``foreign_memory_mib`` outside PyTorch's allocator)."""
    largest = max(s.batch * s.length * channels for s in profile.shapes)
    allowed = judge.hog_activations * largest * 4 + (judge.hog_fixed_mib << 20)
    held = memory.get("held_bytes")
    if isinstance(held, int | float) and held > allowed:
        return (f"gpu-memory-hog: the submission holds {held / 2**20:.0f} MiB of GPU memory "
                f"across steps (allowed {allowed / 2**20:.0f} MiB)")
    foreign = memory.get("foreign_bytes")
    if isinstance(foreign, int | float) and foreign > judge.foreign_memory_mib << 20:
        return (f"gpu-memory-hog: {foreign / 2**20:.0f} MiB of GPU memory were taken outside "
                f"PyTorch's allocator (allowed {judge.foreign_memory_mib} MiB)")
    return ""


__all__ = [
    "INTERVAL_METHOD",
    "VISIT_ROUNDS",
    "ShapeEstimate",
    "ShapeVerdict",
    "TimingStatus",
    "analyze_shape",
    "estimate_shape",
    "grade_bootstrap",
    "process_shifts",
    "score_from",
    "task_score",
    "weighted_score",
]
