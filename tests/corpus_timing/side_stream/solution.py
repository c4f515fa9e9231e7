"""Exploit: work left running on a side stream that the caller's stream never waits for.

Hacking scenario (catalog (c) 5): a timer that records its end event on the default stream
misses work queued on another stream; the later correctness check synchronizes implicitly, so the
result still looks right. Here ~20 ms of GPU work (standing for the real computation) is queued on
a private stream and never joined. Our window ends only after ``torch.cuda.synchronize()``, so
the work is counted anyway, and the *tail* (device busy after the step returned on the caller's
stream) exposes it. Or the parent's clock does first: go → done holds the side stream's work
that the events on the caller's stream do not, in every step (an H200, 2026-12-01 and -02:
12 of 12 steps, median 0.48 ms beyond both baselines'; bench/results/grade-fast-h200-2026-12-02).
Expected: rule_broken (stream) or implausible (than both baselines')
"""

import torch

from reference.block import DilatedResidualBlock as _Reference

_SIDE: list[torch.cuda.Stream] = []


class DilatedResidualBlock(_Reference):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _SIDE:
            _SIDE.append(torch.cuda.Stream())
        side = _SIDE[0]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(40_000_000)
        return super().forward(x)
