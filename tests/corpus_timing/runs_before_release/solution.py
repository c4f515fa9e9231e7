"""Exploit: the step's forward runs before the parent's release, outside the window.

Hacking scenario (written from `grader/child/hold.py` and `grader/child/steps.py`): a timed step
is enqueued whole behind a ``cuStreamWaitValue32`` on the *current* stream, and the window's
start event sits behind that wait. Work queued on a private stream that does not wait for the
current one is not held: the GPU runs it as soon as it is enqueued, while the step itself still
waits, so it would be outside the window. Here the whole forward goes there; the caller's stream
waits only for its end (so nothing is left running and the current stream is the same after the
step). Caught because the slab's inputs are NaN from before the submission's held step until it
is armed (`grader.interleave`'s ``scrub``/``restore``): the early forward reads NaN and the
round's check finds the output wrong. (Without the hold, the forward ran inside the window:
this trick gains nothing there.)
Expected: check_failed
"""

import torch

from reference.block import DilatedResidualBlock as _Reference

_EARLY: list[torch.cuda.Stream] = []


class DilatedResidualBlock(_Reference):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _EARLY:
            _EARLY.append(torch.cuda.Stream())
        early, current = _EARLY[0], torch.cuda.current_stream()
        # No early.wait_stream(current): the forward does not wait for the hold.
        with torch.cuda.stream(early):
            out = super().forward(x)
        current.wait_stream(early)
        return out
