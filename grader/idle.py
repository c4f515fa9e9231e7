"""The parent's rules on the trusted probe of the device (CONTRACT §6: nothing the submission's
process says about time is believed).

The baselines process probes the device (`grader.child.steps.Timer.probe`: how long kernels of
its own waited for another context's time slices) while the submission's process is stopped
(`grader.conversation.Child.pause`):

- after every step of the submission's process (`drain`): its step's wall runs until the device
  is free of its work, so a ``done`` sent before that work finished gains nothing;
- after its import, each build and each audit (`settle`): what it left is waited out, nothing
  charged (no step's time is at stake);
- before every step, whichever block's (`busy_before`, on the baselines' ``flush`` or a held
  step's ``scrub``): work nobody trusted started, found there, runs the round again.

A device still busy after the probe's limit voids the grade: the parent cannot tell the
submission's own second context from another process on the GPU.
"""

from __future__ import annotations

from typing import Any

from grader.config import Timing
from grader.conversation import Child, Stop
from grader.measurements import Interleaved, number


def drain(base: Child, sub: Child, out: Interleaved, what: str, work: float,
          block: str) -> float:
    """After a step (``what``, of ``block``) of the submission's process: stop it, and have the
    baselines process probe the device until the step's GPU work is done; the parent's clock
    when the probe's answer was read, where the step's wall ends. What the probe found is kept,
    per block (``out.drain_by_block``)."""
    sub.pause()
    probed, _ = base.ask({"cmd": "probe"}, "probed", f"{what}: the device idle again", work)
    busy = number(probed, "busy_ms")
    if probed.get("idle") is not True:
        raise Stop("void", f"the GPU was still busy {busy:.4g} ms after {what} (work of the "
                   "submission's process, a second CUDA context of its own say, or another "
                   "process on the GPU): nothing here can be timed; regrade")
    out.drain_by_block.setdefault(block, []).append(busy)
    return float(probed["_received"])


def settle(base: Child, what: str) -> None:
    """After a command of the submission's process that is no step (``what``: an import, a
    build, an audit): whatever GPU work it left is waited out by the trusted probe before
    anything else runs, so the probes before the next steps find the device as the
    submission's steps left it."""
    probed, _ = base.ask({"cmd": "probe"}, "probed", f"after {what}: the device idle")
    if probed.get("idle") is not True:
        raise Stop("void", f"the GPU was still busy {number(probed, 'busy_ms'):.4g} ms after "
                   f"{what} (work of the submission's process, or another process on the "
                   "GPU): nothing here can be timed; regrade")


def busy_before(message: dict[str, Any], what: str, timing: Timing, out: Interleaved) -> bool:
    """Whether the round must run again: the probe before a step (``what``; ``message`` is the
    baselines' ``flushed`` or ``scrubbed``) found the device busy over ``timing.probe_busy_ms``
    (less is a hiccup of the probing host). The submission's process is stopped and its last
    step drained, so that is work it left to start later, or a neighbour's; more than
    ``timing.busy_reruns`` such rounds void the grade (``out.busy_ms`` keeps them)."""
    busy = number(message, "busy_ms")
    if message.get("idle") is not True:
        raise Stop("void", f"the GPU was still busy {busy:.4g} ms before {what} with work "
                   "nobody trusted started: nothing here can be timed; regrade")
    if not busy > timing.probe_busy_ms:
        return False
    out.busy_ms.append(busy)
    if len(out.busy_ms) > timing.busy_reruns:
        raise Stop("void", f"the GPU was busy with work nobody trusted started (the "
                   f"submission's process stopped, its steps drained) before "
                   f"{len(out.busy_ms)} steps, limit {timing.busy_reruns} (last: {busy:.3g} ms "
                   f"before {what}): work left to start later, or another process on the GPU; "
                   "regrade")
    return True


__all__ = ["busy_before", "drain", "settle"]
