"""Statistics of interleaved timing samples: medians, paired ratios and bootstrap intervals.

Pure functions over raw per-round samples; the trusted parent computes every number of the report
from the samples the timing child sent, never from summaries the child computed itself.

A *ratio* is estimated from per-round paired ratios: in round i the three blocks ran back to back
on the same inputs, so ``t_plain[i] / t_sub[i]`` cancels whatever drifted between rounds (clocks,
temperature, a neighbour on the host). The estimate is the median of those ratios; its interval is
a percentile bootstrap that resamples whole rounds, so the pairing survives resampling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95
# The resampling seed is the grader's, fixed so that one set of samples always gives one
# interval; the submission never sees it and cannot change which rounds are drawn.
DEFAULT_SEED = 20261130


@dataclass(frozen=True)
class Interval:
    """A closed interval [low, high]."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not self.low <= self.high:
            raise ValueError(f"interval low={self.low!r} must be ≤ high={self.high!r}")

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def width(self) -> float:
        return self.high - self.low


@dataclass(frozen=True)
class RatioEstimate:
    """A speedup ratio ``t_baseline / t_candidate`` with its bootstrap interval.

    Attributes:
        value: Median of the per-round paired ratios.
        ci: Percentile bootstrap interval of that median.
    """

    value: float
    ci: Interval


def as_samples(values: Sequence[float], name: str) -> np.ndarray:
    """Check that ``values`` are positive finite times and return them as a float64 array.

    Raises:
        ValueError: Empty, or holding a non-finite or non-positive value (the message names it).
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name}: need a non-empty list of samples, got shape {arr.shape}")
    bad = ~(np.isfinite(arr) & (arr > 0))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"{name}: sample {i} is {float(arr[i])!r}; every time must be finite and > 0"
        )
    return arr


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence (the mean of the middle two for an even count)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("median of no samples")
    return float(np.median(arr))


def resample_indices(n_rounds: int, resamples: int = DEFAULT_RESAMPLES,
                     seed: int = DEFAULT_SEED) -> np.ndarray:
    """Round indices for a bootstrap: ``resamples`` rows of ``n_rounds`` draws with replacement.

    Sharing one index matrix between r and g (and the score) keeps them paired by round.
    """
    if n_rounds < 1 or resamples < 1:
        raise ValueError(f"need n_rounds ≥ 1 and resamples ≥ 1, got {n_rounds} and {resamples}")
    rng = np.random.default_rng(seed)
    return rng.integers(0, n_rounds, size=(resamples, n_rounds))


def paired_ratios(baseline: Sequence[float], candidate: Sequence[float]) -> np.ndarray:
    """Per-round ratios ``baseline[i] / candidate[i]``.

    Raises:
        ValueError: Different lengths, or a time that is not finite and positive.
    """
    base = as_samples(baseline, "baseline")
    cand = as_samples(candidate, "candidate")
    if base.shape != cand.shape:
        raise ValueError(f"paired samples differ in length: {base.size} and {cand.size}")
    return base / cand


def bootstrap_medians(values: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Median of ``values`` over each row of bootstrap ``indices``."""
    return np.median(values[indices], axis=1)


def percentile_interval(draws: np.ndarray, confidence: float = DEFAULT_CONFIDENCE) -> Interval:
    """Central ``confidence`` percentile interval of bootstrap draws."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    tail = 50.0 * (1.0 - confidence)
    low, high = np.percentile(draws, [tail, 100.0 - tail])
    return Interval(float(low), float(high))


def ratio_estimate(
    baseline: Sequence[float],
    candidate: Sequence[float],
    indices: np.ndarray | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
) -> RatioEstimate:
    """Median paired ratio ``baseline/candidate`` and its bootstrap interval.

    Args:
        baseline: Per-round times of the baseline (plain PyTorch).
        candidate: Per-round times of the candidate, same rounds.
        indices: Bootstrap round indices (`resample_indices`); drawn with the default seed if None.
        confidence: Coverage of the interval.
    """
    ratios = paired_ratios(baseline, candidate)
    if indices is None:
        indices = resample_indices(ratios.size)
    value = float(np.median(ratios))
    ci = percentile_interval(bootstrap_medians(ratios, indices), confidence)
    # A percentile interval of a median always holds the sample median only approximately;
    # widen it to hold the point estimate so "value in CI" is never false by construction.
    ci = Interval(min(ci.low, value), max(ci.high, value))
    return RatioEstimate(value=value, ci=ci)


def relative_spread(values: Sequence[float]) -> float:
    """Largest relative deviation from the median: ``max |v − median| / median``."""
    arr = np.asarray(values, dtype=np.float64)
    mid = float(np.median(arr))
    if mid == 0:
        raise ValueError("relative spread around a zero median")
    return float(np.max(np.abs(arr - mid)) / abs(mid))


__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_RESAMPLES",
    "DEFAULT_SEED",
    "Interval",
    "RatioEstimate",
    "as_samples",
    "bootstrap_medians",
    "median",
    "paired_ratios",
    "percentile_interval",
    "ratio_estimate",
    "relative_spread",
    "resample_indices",
]
