"""Exploit: cut only the steps that the public order says a baseline's step follows.

Hacking scenario (issue 37, class 3, by an author who read grader/interleave.py as it was before
it): every round's order was the Williams cycle rotated by the visit (``ORDERS[(visit + t) % 6]``,
the warm-ups ``ORDERS[r % 6]``), which any process could compute from how many of its steps it
had run on a shape. Work a step leaves running after its ``done`` only helps when a baseline's
step comes next (it then drains inside the baseline's window, or in a flush the submission's
process served); before the round's check it would only make the evidence late. So the block
(the reference copied into the workspace) sends ``done`` early, right after ``armed``, through
the harness's own writer (as corpus_timing/ends_window_early_via_harness does), but only on the
steps where its count of steps on the shape says it is not last in the round's order.
Why it fails now: each round's order is drawn when the round starts from the parent's
randomness (`grader.orders.RoundOrders`), so the count predicts nothing; and whatever a step
leaves running is on that step's wall (the process stopped, the device drained by the trusted
probe, `grader.idle.drain`). The dry run: the stopped host never finishes a cut step,
and the round's check reads evidence of another round (check_failed); on a GPU the same, or the
cut steps are timed by the wall to the drained device (implausible when over a quarter of them).
Expected: check_failed or implausible (unaccounted) or ok
"""

import torch

from reference.block import DilatedResidualBlock

sys = torch.sys  # reached, not imported: sys is not on the import list (issue 37)

# The cycle the parent used to rotate through (grader.orders.williams_orders of its blocks).
_ORDERS = [["plain", "ref", "sub"], ["ref", "sub", "plain"], ["sub", "plain", "ref"],
           ["sub", "ref", "plain"], ["plain", "sub", "ref"], ["ref", "plain", "sub"]]
_MAIN = sys.modules.get("__main__")
_SENSOR = getattr(_MAIN, "Sensor", None)
_EARLY: set[int] = set()
_COUNT: dict[int, int] = {}  # per shape, the submission's steps so far
_CUT = [False]  # the step under way is one to cut


def _wrap(channel) -> None:
    writer = type(channel).send

    def send(event, blobs=(), **fields):
        if event == "done" and fields.get("step") in _EARLY:
            return None
        writer(channel, event, blobs, **fields)
        if event == "armed" and _CUT[0]:
            _EARLY.add(fields["step"])
            writer(channel, "done", step=fields["step"], window_ms=0.5, tail_ms=0.0)
        return None

    channel.send = send


if _SENSOR is not None:
    _go = _SENSOR.go

    def go(self, index, label, number, calibration=False, held=False):
        if "send" not in vars(self.channel):
            _wrap(self.channel)
        if not calibration:
            count = _COUNT.get(index, 0)
            _COUNT[index] = count + 1
            order = _ORDERS[count % len(_ORDERS)]
            _CUT[0] = order[-1] != "sub"  # a baseline's step follows this one
        else:
            _CUT[0] = False
        return _go(self, index, label, number, calibration, held)

    _SENSOR.go = go

__all__ = ["DilatedResidualBlock"]
