"""Exploit: ``done`` sent mid-step through the harness's own writer; the harness's own dropped.

Hacking scenario (issue 37, class 3, by an author who read grader/child/submission.py and
grader/interleave.py as they were before it): the harness runs as ``__main__``, so its
``Sensor`` class is in ``sys.modules["__main__"]``. The block (the reference copied into the
workspace, so every census and check passes) replaces ``Sensor.go``; on its first call it
replaces the instance's ``channel.send`` with a wrapper around the harness's own writer (no key
needed: the writer holds it). When a held step answers ``armed`` (the whole step enqueued, the
GPU about to run it on the parent's release), the wrapper sends ``done`` at once, with a small
forged window, and later drops the harness's own ``done`` for that step. The parent's clock used
to stop at that ``done``: the step's GPU work drained afterwards, in the next command (a flush
the submission's process served, after its own synchronize, or the next baseline's step).
Why it fails now: the parent stops the process (SIGSTOP) the moment its ``done`` is read, and the
step's wall runs on until the trusted baselines process's probe finds the device free of its
work (`grader.idle.drain`). In the CPU dry run the stopped host never finishes the
step, so the round's check reads evidence of another round (its parameters after the
step first): check_failed. On a GPU the host is
stopped inside its synchronize, before the harness enqueues the evidence copies: check_failed
too; a variant that enqueued them before ``armed`` is timed by the wall to the drained device,
its forged window disagreeing with it in every step: implausible.
Expected: check_failed or implausible (unaccounted)
"""

import torch

from reference.block import DilatedResidualBlock

sys = torch.sys  # reached, not imported: sys is not on the import list (issue 37)

_MAIN = sys.modules.get("__main__")
_SENSOR = getattr(_MAIN, "Sensor", None)
_EARLY: set[int] = set()  # steps whose done was sent early: the harness's own is dropped


def _wrap(channel) -> None:
    writer = type(channel).send  # the harness's own writer (its key, its sequence numbers)

    def send(event, blobs=(), **fields):
        if event == "done" and fields.get("step") in _EARLY:
            return None  # the harness's own done, after the step really ended: dropped
        writer(channel, event, blobs, **fields)
        if event == "armed":
            # The whole step is enqueued and held; it runs only once the parent releases it.
            _EARLY.add(fields["step"])
            writer(channel, "done", step=fields["step"], window_ms=0.5, tail_ms=0.0)
        return None

    channel.send = send  # on the instance: the class stays as the harness left it


if _SENSOR is not None:  # the timing child (a gate child's __main__ has no Sensor)
    _go = _SENSOR.go

    def go(self, *args, **kwargs):
        if "send" not in vars(self.channel):
            _wrap(self.channel)
        return _go(self, *args, **kwargs)

    _SENSOR.go = go

__all__ = ["DilatedResidualBlock"]
