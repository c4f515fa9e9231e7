"""Exploit: a second CUDA context of its own spins while the baselines run, after rounds included.

Hacking scenario (issue 37, class 4, by an author who read grader/timing.py as it was before it):
``torch.cuda.synchronize`` waits only for the process's own context, so work in a second context
(made through the driver API, ctypes) outlives the step that launched it and takes GPU time
slices from whatever runs next: the baselines' steps. The baselines' drift rule allowed their
interleaved medians to move by 3x the span between their alone medians before and after the
interleaved rounds, so a spinner that also ran through the "after" alone rounds widened its own
tolerance and the grade was never void. The block (the reference copied into the workspace)
launches from each step's forward a one-thread kernel in its own context that spins for
``SPIN_MS`` (longer than a step: it runs on into the baselines' steps), and every
``LONG_EVERY``-th step one that spins ``LONG_MS`` (into the alone rounds at the end).
Why it fails now: the submission's process is stopped after each ``done`` and its step's wall
runs until the trusted probe finds no other context on the GPU (`grader.idle.drain`),
so every spin is on the submission's own clock: its wall exceeds its window by the spin in every
step (implausible), or a device still busy after the probe's limit voids the grade. The
baselines are held to a fixed 3% of their alone medians *before* the import (scoring.yaml
``baseline_drift``): what the after rounds show no longer widens anything. GPU only (needs a
driver); in the CPU dry run it is the reference, and the drift rule is tested on fake numbers
(tests/test_timing_parent.py). (If the driver starts a thread for the new context, the thread
rule ends it first.)
Since issue 37 ctypes is not a module a submission may use, however it reaches it (here
``torch.ctypes``, no import): its first foreign call is a broken rule, before the timing
defences this entry was written for are reached; they stay as the layer behind.
Expected: rule_broken (forbidden-import) or implausible (unaccounted) or void (busy) or rule_broken (new-thread)
"""

import torch

from reference.block import DilatedResidualBlock as _Own

ctypes = torch.ctypes  # reached, not imported: ctypes is not on the import list

SPIN_MS = 30.0
LONG_MS = 2000.0
LONG_EVERY = 40
# Cycles of the SM clock per ms (an H200's boost clock is ~1.98 GHz; a little more spin is
# harmless).
CYCLES_PER_MS = 2_000_000
_PTX = b"""
.version 7.0
.target sm_80
.address_size 64
.visible .entry spin(.param .u64 cycles)
{
  .reg .u64 %t0, %t1, %c, %d;
  .reg .pred %p;
  ld.param.u64 %c, [cycles];
  mov.u64 %t0, %clock64;
LOOP:
  mov.u64 %t1, %clock64;
  sub.u64 %d, %t1, %t0;
  setp.lt.u64 %p, %d, %c;
  @%p bra LOOP;
  ret;
}
"""


class _Spinner:
    """A context of this process's own, beside torch's, with a spin kernel loaded in it."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self.lib = lib
        dev, prev = ctypes.c_int(), ctypes.c_void_p()
        self.ctx, mod, self.fn = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        self.stream = ctypes.c_void_p()
        create = getattr(lib, "cuCtxCreate_v2", None) or lib.cuCtxCreate
        for err in (lib.cuInit(0), lib.cuDeviceGet(ctypes.byref(dev), 0),
                    lib.cuCtxGetCurrent(ctypes.byref(prev))):
            if err:
                raise OSError(f"CUresult {err}")
        self.prev = prev
        if create(ctypes.byref(self.ctx), ctypes.c_uint(0), dev):
            raise OSError("cuCtxCreate failed")
        try:
            if (lib.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(_PTX))
                    or lib.cuModuleGetFunction(ctypes.byref(self.fn), mod, b"spin")
                    or lib.cuStreamCreate(ctypes.byref(self.stream), ctypes.c_uint(1))):
                raise OSError("loading the spin kernel failed")
        finally:
            lib.cuCtxSetCurrent(prev)  # torch's context current again

    def spin(self, ms: float) -> None:
        cycles = ctypes.c_uint64(int(ms * CYCLES_PER_MS))
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(cycles), ctypes.c_void_p))
        self.lib.cuCtxSetCurrent(self.ctx)
        try:
            self.lib.cuLaunchKernel(self.fn, 1, 1, 1, 1, 1, 1, 0, self.stream, params, None)
        finally:
            self.lib.cuCtxSetCurrent(self.prev)


_SPINNER: list = []
_STEPS = [0]


def _spinner():
    if not _SPINNER:
        try:
            _SPINNER.append(_Spinner() if torch.cuda.is_available() else None)
        except (OSError, AttributeError):
            _SPINNER.append(None)
    return _SPINNER[0]


class DilatedResidualBlock(_Own):
    def forward(self, x):
        spinner = _spinner() if x.is_cuda else None
        if spinner is not None:
            _STEPS[0] += 1
            spinner.spin(LONG_MS if _STEPS[0] % LONG_EVERY == 0 else SPIN_MS)
        return super().forward(x)
