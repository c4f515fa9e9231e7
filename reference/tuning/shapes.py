"""Shapes the tuner works on (the loop's input): `TuneShape`, and `ShapeGroup`, the timing shapes
of one dtype that share a shape class and hence one table entry. Read from a `scoring.yaml`
profile, or rebuilt from a table key for entries no profile shape maps to (reverify).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from grader.config import ScoringConfig
from reference.plans import shape_class


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
