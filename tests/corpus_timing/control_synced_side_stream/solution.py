"""Control: extra work on a side stream that the caller's stream waits for (legitimate).

Methodology: the reference's step, plus ~1 ms of GPU work on a private stream that the current
stream then waits on (``wait_stream``), as a correct multi-stream kernel would. The window counts
the work and nothing is left running after the step returns: no tail, no rule broken.
Expected: ok
"""

import torch

from reference.block import DilatedResidualBlock as _Reference

_SIDE: list[torch.cuda.Stream] = []


class DilatedResidualBlock(_Reference):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _SIDE:
            _SIDE.append(torch.cuda.Stream())
        side, current = _SIDE[0], torch.cuda.current_stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            torch.cuda._sleep(2_000_000)
        current.wait_stream(side)
        return super().forward(x)
