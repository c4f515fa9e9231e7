"""A picture of a timing report: per-shape speedups over plain PyTorch, with their intervals.

matplotlib is optional (it is not a grading dependency): without it `plot_speedups` writes
nothing and returns None, and the caller says so. The figure has one group per shape: the
submission's speedup r and the reference's g, each with its 95% bootstrap interval, a line at 1×
(plain PyTorch) and a tick at the shape's target max(margin·g, min_target), where the score is 1:
the target the report holds (`target`), else one computed from the score settings given (a
report written before shapes carried their targets).
"""

from __future__ import annotations

from pathlib import Path

from grader.config import Score
from grader.report import ShapeTiming, TimingReport

MISSING_MATPLOTLIB = "matplotlib is not installed: no plot written (pip install matplotlib)"


def target(shape: ShapeTiming, score: Score | None = None) -> float | None:
    """The r that scores 1 for ``shape``: the report's own (the settings it was scored with),
    else ``score``'s for its g, else None (nothing to draw)."""
    if shape.target is not None:
        return shape.target
    if score is not None and shape.g is not None:
        return score.target(shape.g)
    return None


def plot_speedups(
    report: TimingReport, path: str | Path, score: Score | None = None
) -> Path | None:
    """Write the per-shape speedup plot of ``report`` as a PNG.

    Args:
        report: A timing report.
        path: Where the PNG goes.
        score: The score settings, for the target ticks of shapes whose report holds none
            (`target`).

    Returns:
        The path written, or None when matplotlib is not importable.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on a grading machine
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    shapes = report.shapes
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(shapes) + 2), 4.5))
    xs = range(len(shapes))
    width = 0.38
    for offset, key, ci_key, label, color in (
        (-width / 2, "r", "r_ci", "submission r = t_plain / t_sub", "tab:blue"),
        (width / 2, "g", "g_ci", "reference g = t_plain / t_ref", "tab:gray"),
    ):
        values = [getattr(s, key) or 0.0 for s in shapes]
        cis = [getattr(s, ci_key) for s in shapes]
        low = [v - ci[0] if ci else 0.0 for v, ci in zip(values, cis, strict=True)]
        high = [ci[1] - v if ci else 0.0 for v, ci in zip(values, cis, strict=True)]
        ax.bar([x + offset for x in xs], values, width, yerr=[low, high], capsize=3,
               label=label, color=color)
    labelled = False
    for x, s in zip(xs, shapes, strict=True):
        tick = target(s, score)
        if tick is not None:
            ax.hlines(tick, x - width, x + width, colors="tab:green", linestyles="dashed",
                      label=None if labelled else "target (score 1)")
            labelled = True
    ax.axhline(1.0, color="black", linewidth=0.8, label="plain PyTorch (score 0)")
    for x, s in zip(xs, shapes, strict=True):
        text = f"{s.score:.2f}" if s.status == "ok" else s.status
        ax.annotate(text, (x, 0), xytext=(0, -28), textcoords="offset points", ha="center",
                    fontsize=8, annotation_clip=False)
    ax.set_xticks(list(xs), [s.label for s in shapes], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("speedup over plain PyTorch (×)")
    ci = "" if report.score_ci is None else f" [{report.score_ci[0]:.3f}, {report.score_ci[1]:.3f}]"
    device = report.telemetry.get("device", {}).get("name") or "unknown GPU"
    ax.set_title(f"{device}, profile {report.profile}: score {report.score:.3f}{ci} "
                 f"({report.status})", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


__all__ = ["MISSING_MATPLOTLIB", "plot_speedups", "target"]
