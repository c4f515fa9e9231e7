"""Score mapping and per-shape verdicts of the timing phase (grader/timing.py, CONTRACT §4–§5)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grader import plausibility
from grader.config import Score, Shape, load_config
from grader.samples import ShapeRaw, check_utilisation
from grader.timing import TimingStatus, analyze_shape, task_score

CONFIG = load_config()
SCORE = CONFIG.score
JUDGE = CONFIG.timing.judge
BOUND = CONFIG.timing.profiles["h200"].baseline_drift
H200 = plausibility.peak_bandwidth("NVIDIA H200", 3201.0, 6144)
SHAPE = Shape(batch=32, length=4096, dilation=1, dtype="float32")
ROUNDS = 40
ALONE = 12


def raw(plain: float, ref: float, sub: float, *, shape: Shape = SHAPE, noise: float = 0.01,
        seed: int = 0, tail: float = 0.02, util: float = 0.1, rounds: int = ROUNDS,
        base_tail: float = 0.02, overhead: float = 1.2, alone: tuple[float, float] | None = None,
        alone_rounds: int = ALONE) -> ShapeRaw:
    """Samples of one shape; ``tail`` is the submission's, ``base_tail`` the baselines'; every
    step's parent wall is its window plus ``overhead`` ms (± 0.02); the baselines alone take
    ``alone`` (default: their interleaved times)."""
    rng = np.random.default_rng(seed)
    drift = 1 + 0.1 * np.sin(np.arange(rounds))  # shared by the three blocks of a round
    windows = {n: list(t * drift * (1 + noise * rng.standard_normal(rounds)))
               for n, t in (("plain", plain), ("ref", ref), ("sub", sub))}
    walls = {n: [w + overhead + 0.02 * rng.standard_normal() for w in v]
             for n, v in windows.items()}
    plain_alone, ref_alone = alone if alone is not None else (plain, ref)
    return ShapeRaw(
        shape=shape,
        window_ms=windows,
        tail_ms={n: [tail if n == "sub" else base_tail] * rounds for n in windows},
        wall_ms=walls,
        alone_ms={n: list(t * (1 + noise * rng.standard_normal(alone_rounds)))
                  for n, t in (("plain", plain_alone), ("ref", ref_alone))},
        util=[[[util] * 5, [util] * 5] for _ in range(rounds)],
    )


def verdict(r: ShapeRaw):
    return analyze_shape(r, SCORE, H200, judge=JUDGE, channels=128, expansion=2,
                         rounds=len(r.window_ms["sub"]), alone_rounds=len(r.alone_ms["plain"]),
                         baseline_bound=BOUND)


# ------------------------------------------------------------------ the score function (CONTRACT §5)


def test_plain_scores_zero_and_slower_than_plain_clamps_at_zero() -> None:
    assert SCORE.shape_score(1.0, 3.0) == 0.0
    assert SCORE.shape_score(0.5, 3.0) == 0.0


@pytest.mark.parametrize("g", [1.5, 3.0, 8.0])
def test_reference_scores_ln_g_over_ln_1_1g_and_beating_it_by_10pc_scores_one(g: float) -> None:
    assert SCORE.shape_score(g, g) == pytest.approx(math.log(g) / math.log(1.1 * g))
    assert SCORE.shape_score(1.1 * g, g) == pytest.approx(1.0)


def test_cap_and_min_target() -> None:
    assert SCORE.shape_score(1e9, 2.0) == SCORE.cap
    # A reference slower than plain: the target is min_target, not margin·g.
    assert SCORE.shape_score(1.1, 0.5) == pytest.approx(1.0)
    assert SCORE.shape_score(math.nan, 2.0) == 0.0
    assert SCORE.shape_score(math.inf, 2.0) == 0.0


# ------------------------------------------------------------------ shape verdicts


def test_reference_as_submission_scores_its_expectation_within_the_interval() -> None:
    v = verdict(raw(10.0, 4.0, 4.0))
    assert v.status is TimingStatus.OK
    expected = math.log(2.5) / math.log(2.75)
    assert v.timing.g == pytest.approx(2.5, rel=0.02)
    assert v.timing.score == pytest.approx(expected, abs=0.03)
    assert v.timing.score_ci[0] <= expected <= v.timing.score_ci[1]
    # The report holds the r that scores 1 against its own g, under the settings it was scored
    # with: r at that target would score exactly 1.
    assert v.timing.target == pytest.approx(SCORE.target(v.timing.g))
    assert SCORE.shape_score(v.timing.target, v.timing.g) == pytest.approx(1.0)
    assert v.timing.r_ci[0] <= v.timing.r <= v.timing.r_ci[1]


def test_plain_as_submission_scores_zero() -> None:
    v = verdict(raw(10.0, 4.0, 10.0))
    assert v.status is TimingStatus.OK and v.timing.score == pytest.approx(0.0, abs=0.02)


def test_below_the_bandwidth_floor_is_implausible() -> None:
    floor = plausibility.floor_ms(
        plausibility.step_bytes(batch=32, length=4096, channels=128, expansion=2,
                                dtype="float32"), H200)
    v = verdict(raw(10.0, 4.0, floor / 3, noise=0.0))
    assert v.status is TimingStatus.IMPLAUSIBLE
    assert "faster than physically possible" in v.timing.reason and v.timing.score == 0.0


def test_an_event_window_longer_than_the_parents_wall_is_implausible() -> None:
    r = raw(10.0, 4.0, 4.0)
    r.wall_ms["sub"][3] = r.window_ms["sub"][3] - 2.0
    v = verdict(r)
    assert v.status is TimingStatus.IMPLAUSIBLE and "parent's clock" in v.timing.reason


def test_windows_shorter_than_the_wall_allows_are_timed_by_the_wall() -> None:
    """A forged window (the step took 6 ms by the parent's clock, the child says 2) counts as
    the wall less the baselines' handshake; in more than a quarter of the steps it is a lie."""
    honest = verdict(raw(10.0, 4.0, 6.0, noise=0.0))
    r = raw(10.0, 4.0, 6.0, noise=0.0)
    for i in range(5):  # a few steps: bounded by the wall, still scored
        r.window_ms["sub"][i] = 2.0
    few = verdict(r)
    assert few.status is TimingStatus.OK and few.timing.clock_disagreements == 5
    assert few.timing.t_sub_ms == pytest.approx(honest.timing.t_sub_ms, rel=0.02)
    for i in range(ROUNDS):
        r.window_ms["sub"][i] = 2.0
    v = verdict(r)
    assert v.status is TimingStatus.IMPLAUSIBLE and "than both baselines'" in v.timing.reason


def test_a_stretch_of_slow_handshakes_for_every_block_is_not_a_lie() -> None:
    """Half the rounds pay 1 ms more around every block's window (the host was busy): the
    submission's steps exceed the whole run's allowance there, but not the same round's
    baselines: scored, each slow step timed by its bound."""
    r = raw(10.0, 4.0, 6.0, noise=0.0)
    for i in range(ROUNDS // 2):
        for name in ("plain", "ref", "sub"):
            r.wall_ms[name][i] += 1.0
    v = verdict(r)
    assert v.status is TimingStatus.OK, v.timing.reason


def test_a_window_shortened_a_little_in_every_step_is_a_lie() -> None:
    """0.5 ms shaved off every window: within the run's allowance, but above the same round's
    baselines by more than the paired slack in every step."""
    r = raw(10.0, 4.0, 6.0, noise=0.0)
    for i in range(ROUNDS):
        r.window_ms["sub"][i] -= 0.5
    v = verdict(r)
    assert v.status is TimingStatus.IMPLAUSIBLE, v.timing.reason
    assert f"in {ROUNDS} of {ROUNDS} steps" in v.timing.reason


def test_baselines_that_move_once_the_submission_runs_void_the_grade() -> None:
    """Plain 10 ms alone and 11 ms beside the submission: something slowed it; void."""
    v = verdict(raw(11.0, 4.0, 4.0, alone=(10.0, 4.0)))
    assert v.status is TimingStatus.VOID and "plain took" in v.timing.reason
    assert "regrade" in v.timing.reason
    assert verdict(raw(10.2, 4.0, 4.0, alone=(10.0, 4.0))).status is TimingStatus.OK


def test_the_baselines_are_judged_against_their_alone_times_before_only() -> None:
    """Alone 3.6 ms before the import and 4.2 ms after: 2% slower interleaved is within the
    fixed 3% of before, 3.5% is not; the after rounds are information only. (`raw`'s drift
    over the rounds puts their median 0.7% above the value asked for.)"""
    r = raw(3.6 * 1.02 / 1.00706, 4.0, 4.0, alone=(3.6, 4.0), noise=0.0)
    r.alone_ms["plain"][:] = [3.6] * (ALONE // 2) + [4.2] * (ALONE // 2)
    assert verdict(r).status is TimingStatus.OK
    r = raw(3.6 * 1.035 / 1.00706, 4.0, 4.0, alone=(3.6, 4.0), noise=0.0)
    r.alone_ms["plain"][:] = [3.6] * (ALONE // 2) + [4.2] * (ALONE // 2)
    v = verdict(r)
    assert v.status is TimingStatus.VOID, v.timing.reason
    assert "3.6 ms alone before it was imported (+3.5%, limit ±3.0%; 4.2 ms alone after, " \
        "information only)" in v.timing.reason


def test_a_wide_spread_of_the_alone_rounds_does_not_widen_the_limit() -> None:
    """Alone rounds before and after 4% apart (the old rule allowed 12% beyond them): 9% above
    before is void all the same, as is 4% below it."""
    for interleaved in (10.9, 9.4):
        r = raw(interleaved, 4.0, 4.0, alone=(10.0, 4.0), noise=0.0)
        r.alone_ms["plain"][:] = [10.0] * (ALONE // 2) + [10.4] * (ALONE // 2)
        assert verdict(r).status is TimingStatus.VOID


def test_work_left_on_a_side_stream_breaks_a_rule() -> None:
    v = verdict(raw(10.0, 4.0, 4.0, tail=3.5))
    assert v.status is TimingStatus.RULE_BROKEN and "stream" in v.timing.reason


def test_a_neighbour_delaying_every_block_is_not_the_submissions_tail() -> None:
    """Another process time-sliced on the GPU delays every block's closing event alike: only
    the submission's tail beyond the baselines' counts."""
    assert verdict(raw(10.0, 4.0, 4.0, tail=3.5, base_tail=3.4)).status is TimingStatus.OK
    v = verdict(raw(10.0, 4.0, 4.0, tail=6.0, base_tail=3.4))
    assert v.status is TimingStatus.RULE_BROKEN and "more than the baselines'" in v.timing.reason


@pytest.mark.parametrize("util", [1.6, math.inf, "nan", None])
def test_timed_results_outside_the_budget_fail_the_check(util) -> None:
    """Utilisation is judged once (`grader.samples.check_utilisation`, by the driver as each
    round ends); the judge's row of the shape carries that verdict."""
    row = [0.1, util, 0.1, 0.1, 0.1]
    value, why = check_utilisation(row, 1.5, "plain PyTorch")
    assert value > 1.5 and why.startswith("timed grad_x differs from plain PyTorch")
    assert check_utilisation([0.1, 1.5, 0.1, 0.1, 0.1], 1.5, "plain PyTorch") == (1.5, "")
    r = raw(10.0, 4.0, 4.0)
    r.util.append([[0.1] * 5, row])
    r.check_failed = why
    v = verdict(r)
    assert v.status is TimingStatus.CHECK_FAILED and "grad_x" in v.timing.reason
    assert v.timing.utilisation == value


def test_a_shape_without_check_numbers_is_a_grader_error() -> None:
    r = raw(10.0, 4.0, 4.0)
    r.util.clear()
    v = verdict(r)
    assert v.status is TimingStatus.GRADER_ERROR and "no check numbers" in v.timing.reason


def test_a_missing_sample_is_a_grader_error() -> None:
    r = raw(10.0, 4.0, 4.0)
    r.window_ms["sub"].pop()
    assert verdict(r).status is TimingStatus.GRADER_ERROR


def test_task_score_is_the_weighted_mean_and_zero_if_any_shape_failed() -> None:
    fp32 = verdict(raw(10.0, 4.0, 4.4))
    bf16 = verdict(raw(10.0, 4.0, 10.0, shape=Shape(32, 4096, 1, "bfloat16")))
    value, ci = task_score([fp32, bf16])
    want = (2 * fp32.timing.score + 1 * bf16.timing.score) / 3
    assert value == pytest.approx(want) and ci[0] <= value <= ci[1]
    bad = verdict(raw(10.0, 4.0, 4.0, tail=3.5))
    assert task_score([fp32, bad]) == (0.0, None)
    assert task_score([]) == (0.0, None)


def test_score_settings_are_the_yaml_ones() -> None:
    assert isinstance(SCORE, Score)
    assert (SCORE.margin, SCORE.min_target, SCORE.cap) == (1.1, 1.1, 3.0)
