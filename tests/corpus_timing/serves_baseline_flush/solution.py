"""Exploit: leave a step's work running and let the flush its own process serves drain it.

Hacking scenario (issue 37, class 3, by an author who read grader/interleave.py as it was before
it): the L2 flush before each baseline's step was run by the submission's process (``flush``:
``zero_()`` then ``synchronize``), so every step began with a switch of the GPU's context. That
synchronize waits for all of the process's work: a step whose ``done`` went out before its GPU
work ended (sent right after ``armed`` through the harness's own writer, the harness's own
dropped, as in corpus_timing/ends_window_early_via_harness) had that work drain inside the flush,
a command nobody timed, before the baseline's step began clean. The block (the reference copied
into the workspace) does that on one step in five (under the quarter of disagreeing steps that
made a shape implausible) and counts on being asked to flush before the next baseline's step.
Why it fails now: the submission's process never flushes (the baselines process probes the
device and flushes before every step, whichever block's; a ``flush`` sent to the submission's
process is an unknown command); it is stopped from its ``done`` on, and its step's wall runs
until the trusted probe finds the device free of its work (`grader.idle.drain`). The
CPU dry run: the stopped host never finishes a cut step, and the round's check reads evidence of
another round: check_failed. On a GPU the same, or the cut steps are timed by the wall to the
drained device: no gain.
Expected: check_failed or ok
"""

import torch

from reference.block import DilatedResidualBlock

sys = torch.sys  # reached, not imported: sys is not on the import list (issue 37)

_MAIN = sys.modules.get("__main__")
_SENSOR = getattr(_MAIN, "Sensor", None)
_EARLY: set[int] = set()
_HELD = [0]  # held steps of the submission's so far


def _wrap(channel) -> None:
    writer = type(channel).send

    def send(event, blobs=(), **fields):
        if event == "done" and fields.get("step") in _EARLY:
            return None
        writer(channel, event, blobs, **fields)
        if event == "armed":
            _HELD[0] += 1
            if _HELD[0] % 5 == 1:  # one step in five
                _EARLY.add(fields["step"])
                writer(channel, "done", step=fields["step"], window_ms=0.5, tail_ms=0.0)
        return None

    channel.send = send


if _SENSOR is not None:
    _go = _SENSOR.go

    def go(self, *args, **kwargs):
        if "send" not in vars(self.channel):
            _wrap(self.channel)
        return _go(self, *args, **kwargs)

    _SENSOR.go = go

__all__ = ["DilatedResidualBlock"]
