"""Exploit: the submission's process picks its own host wait (blocking sync) at import.

Hacking scenario: a reader of `grader.child.hold` sees that the timing children ask the driver for
a host wait (``CU_CTX_SCHED_SPIN``) before their contexts exist, and that a host which sleeps while
its GPU works wakes late. So it changes its own context's wait, hoping to shorten its windows, or
to make its own host cheaper while the baselines' spins. It cannot gain: a timed step is held on
the GPU until the parent releases it (`grader.child.hold.Hold`), and the children already spin (the
quickest wake the driver offers), so a host that waits differently can make its own step later,
never earlier; and the baselines' process is not reachable. On an H200 neither spin nor auto
changed a reference step's tail (bench/results/spin-h200-2026-12-03); blocking sync cost this block
time: it scored 0.744 where the reference against itself scores 0.877 on the corpus profile
(2026-12-03, bench/results/timing-corpus-h200-2026-12-03; where in the step it lost, not measured).
So the block, a copy of the reference, is scored as what it is, with no gain.
Since issue 37 ctypes is not a module a submission may use, however it reaches it (here
``torch.ctypes``, no import): its first foreign call is a broken rule, before the timing
defences this entry was written for are reached; they stay as the layer behind.
Expected: rule_broken (forbidden-import) or ok
"""

import torch

from reference.block import DilatedResidualBlock

ctypes = torch.ctypes  # reached, not imported: ctypes is not on the import list

_CU_CTX_SCHED_BLOCKING_SYNC = 0x04


def _set_blocking_sync() -> None:
    """The current context's wait (cuCtxSetFlags, CUDA ≥ 12.1), else the primary context's."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return  # no driver: the CPU dry run
    set_flags = getattr(lib, "cuCtxSetFlags", None)
    if set_flags is not None and set_flags(ctypes.c_uint(_CU_CTX_SCHED_BLOCKING_SYNC)) == 0:
        return
    dev = ctypes.c_int()
    if lib.cuInit(0) == 0 and lib.cuDeviceGet(ctypes.byref(dev), 0) == 0:
        lib.cuDevicePrimaryCtxSetFlags_v2(dev, ctypes.c_uint(_CU_CTX_SCHED_BLOCKING_SYNC))


_set_blocking_sync()

__all__ = ["DilatedResidualBlock"]
