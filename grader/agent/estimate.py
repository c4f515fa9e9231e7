"""The score a local check estimates: its measured r = t_plain / t_yours on each timed shape,
scored with the scoring reference's published speedups g (``grader/published_speedups.json``),
because the agent's environment has no reference to time (CONTRACT §5's formula).

The file has two sections (schema 2, issue 41): ``reference``, the scoring reference's g
(`reference.block`: conv+norm in Triton, the MLP in PyTorch's ops), the only g an estimate
scores with; and ``ceiling``, the whole-step block's (`reference.ceiling`), shown beside the
estimate as information and never in a score. Each profile's entry has a ``basis``: ``measured``
(timed on that GPU class) or ``modelled`` (predicted from DRAM bytes, `bench/step/l4_model.py`),
or ``g`` null with a ``source`` saying why there is none yet: then the check says it has no g
for the scoring reference and estimates no score, rather than borrow the ceiling's."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from grader.config import ConfigError, ScoringConfig
from grader.report import TimingReport

PUBLISHED_PATH = Path(__file__).resolve().parent.parent / "published_speedups.json"


# The bases a published g may have: timed on that GPU, or modelled from bytes measured on another.
BASES = ("measured", "modelled")
# The file's two sections: the scoring reference's g (what an estimate scores with) and the
# ceiling's (information only, never in a score).
SECTIONS = ("reference", "ceiling")


@dataclass(frozen=True)
class Published:
    """Published speedups of one block (the scoring reference or the ceiling) for one profile.

    Attributes:
        profile: Profile name in ``scoring.yaml``.
        g: Shape label → g = t_plain / t_block.
        basis: ``measured`` (timed on that GPU class) or ``modelled`` (predicted from DRAM
            bytes measured elsewhere, `bench/step/l4_model.py`).
        source: Where the numbers come from.
        block: ``reference`` or ``ceiling``.
    """

    profile: str
    g: dict[str, float]
    basis: str
    source: str
    block: str = "reference"


@dataclass(frozen=True)
class ShapeEstimate:
    """Estimated score of one timed shape.

    Attributes:
        label: Shape label (``dtype:BxL:dD``).
        weight: The shape's weight in the task score.
        t_plain_ms, t_sub_ms: Medians measured here.
        r: t_plain / t_yours (median of per-round ratios), with its 95% interval ``r_ci``.
        noise: Plain PyTorch timed against itself in the reference's slot: how far from 1 a
            ratio lands by chance on this machine.
        g: The reference's published speedup on this shape (None if none is published).
        target: The r that scores 1 (``max(margin·g, min_target)``).
        score: ``clamp(ln r / ln target, 0, cap)``, None without a published g.
        ceiling_g: The ceiling's published speedup on this shape (information only).
        vs_ceiling: r / ceiling_g: how far this block is from the ceiling (information only,
            never in a score); None without both.
    """

    label: str
    weight: float
    t_plain_ms: float | None
    t_sub_ms: float | None
    r: float | None
    r_ci: tuple[float, float] | None
    noise: float | None
    g: float | None
    target: float | None
    score: float | None
    ceiling_g: float | None = None
    vs_ceiling: float | None = None


@dataclass(frozen=True)
class ScoreEstimate:
    """The task score the timing predicts, from published g.

    Attributes:
        profile: Timing profile.
        score: Weighted mean of the shape estimates (0.0 if timing failed; None if no g).
        basis: ``measured`` or ``modelled`` (`Published.basis`); None when the scoring
            reference has no published g for the profile.
        source: Where the g come from, or why there are none.
        shapes: Per-shape estimates.
        ceiling_source: Where the ceiling's g come from ("" if none are published).
    """

    profile: str
    score: float | None
    basis: str | None
    source: str
    shapes: tuple[ShapeEstimate, ...]
    ceiling_source: str = ""


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the published speedups: {exc}") from exc
    if data.get("schema") != 2 or not all(isinstance(data.get(k), dict) for k in SECTIONS):
        raise ConfigError(f"{path}: schema={data.get('schema')!r}: expected schema 2 with "
                          f"sections {list(SECTIONS)}")
    return data


def published_entry(profile: str, block: str = "reference", path: Path = PUBLISHED_PATH
                    ) -> tuple[Published | None, str]:
    """The published g of ``block`` ("reference" or "ceiling") for ``profile``, and a sentence:
    the source when there are numbers, why there are none otherwise (no entry, or an entry
    whose ``g`` is null: not yet measured or modelled).

    Raises:
        ConfigError: The file exists but is malformed (schema, basis, g).
    """
    if block not in SECTIONS:
        raise ValueError(f"block={block!r} is not one of {list(SECTIONS)}")
    data = _read(path)
    if data is None:
        return None, f"no {path.name}"
    what = "the scoring reference" if block == "reference" else "the ceiling"
    entry = data[block].get("profiles", {}).get(profile)
    if entry is None:
        return None, f"no published g of {what} for profile {profile}"
    g = entry.get("g")
    if g is None:
        return None, (f"no published g of {what} for profile {profile}: "
                      f"{entry.get('source', 'not yet measured')}")
    if not isinstance(g, dict) or not g or not all(
        isinstance(v, int | float) and v > 0 for v in g.values()
    ):
        raise ConfigError(f"{path}: {block}.profiles.{profile}.g must map shape labels to "
                          "numbers > 0, or be null")
    basis = entry.get("basis")
    if basis not in BASES:
        raise ConfigError(f"{path}: {block}.profiles.{profile}.basis={basis!r} must be one of "
                          f"{list(BASES)}")
    source = str(entry.get("source", ""))
    return Published(profile=profile, g={str(k): float(v) for k, v in g.items()}, basis=basis,
                     source=source, block=block), source


def load_published(profile: str, path: Path = PUBLISHED_PATH) -> Published | None:
    """The scoring reference's published g for ``profile`` (None when there are none: never the
    ceiling's in their place).

    Raises:
        ConfigError: The file exists but is malformed.
    """
    return published_entry(profile, "reference", path)[0]


def load_ceiling(profile: str, path: Path = PUBLISHED_PATH) -> Published | None:
    """The ceiling's published g for ``profile``: information only, never in a score."""
    return published_entry(profile, "ceiling", path)[0]


def estimate(timing: TimingReport, published: Published | None, config: ScoringConfig,
             ceiling: Published | None = None, why_none: str = "") -> ScoreEstimate:
    """Score each timed shape with the measured r and the scoring reference's published g
    (CONTRACT §5's formula); with ``ceiling``, also r against the ceiling's g, as information
    that enters no score. ``why_none`` says why ``published`` is None (`published_entry`)."""
    if published is not None and published.block != "reference":
        raise ValueError(f"published.block={published.block!r}: an estimate scores with the "
                         "scoring reference's g only")
    shapes = []
    for s in timing.shapes:
        dtype = s.label.split(":", 1)[0]
        weight = config.score.dtype_weights.get(dtype, 1.0)
        g = published.g.get(s.label) if published else None
        ok = timing.status == "ok" and s.status == "ok" and s.r is not None
        score = None
        if g is not None:
            score = config.score.shape_score(s.r, g) if ok and s.r is not None else 0.0
        ceiling_g = ceiling.g.get(s.label) if ceiling else None
        vs_ceiling = s.r / ceiling_g if ok and ceiling_g and s.r is not None else None
        shapes.append(ShapeEstimate(
            label=s.label, weight=weight, t_plain_ms=s.t_plain_ms, t_sub_ms=s.t_sub_ms, r=s.r,
            r_ci=s.r_ci, noise=s.g, g=g, target=None if g is None else config.score.target(g),
            score=score, ceiling_g=ceiling_g, vs_ceiling=vs_ceiling,
        ))  # fmt: skip
    scored = [s for s in shapes if s.score is not None]
    total = None
    if scored and len(scored) == len(shapes):
        total = sum(s.weight * s.score for s in scored) / sum(s.weight for s in scored)
    if timing.status != "ok":
        total = 0.0
    return ScoreEstimate(
        profile=timing.profile,
        score=total,
        basis=published.basis if published else None,
        source=published.source if published else (
            why_none or f"no published g of the scoring reference for profile {timing.profile}"),
        shapes=tuple(shapes),
        ceiling_source=ceiling.source if ceiling else "",
    )
