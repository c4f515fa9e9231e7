"""Control for corpus_timing/second_context_spinner: a second CUDA context that never runs work.

The block (the reference copied into the workspace) makes a context of its own through the
driver API at its first forward, as the spinner does, and never launches anything in it. The
trusted probe (`grader.child.steps.Timer.probe`) must not read an idle context as a busy GPU:
no step of it is charged more than its own work, no round runs again, nothing is void, and it
is timed as the reference it is. (If the driver starts a thread for the new context, the thread
rule ends it first, as it would the spinner.) GPU only; in the CPU dry run it is the reference.
Since issue 37 no honest submission can make a second context: ctypes is not a module it
may use, however it reaches it (here ``torch.ctypes``), so this control became an
exploit caught at its first foreign call. The probe's idle-context behaviour it was
written to show is still measured by its timing, where the rule lets it run.
Expected: rule_broken (forbidden-import)
"""

import torch

from reference.block import DilatedResidualBlock as _Own

ctypes = torch.ctypes  # reached, not imported: ctypes is not on the import list

_MADE = [False]


def _second_context() -> None:
    """A context of this process's own beside torch's, then torch's current again."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return
    dev, prev, ctx = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
    create = getattr(lib, "cuCtxCreate_v2", None) or lib.cuCtxCreate
    if lib.cuInit(0) or lib.cuDeviceGet(ctypes.byref(dev), 0) \
            or lib.cuCtxGetCurrent(ctypes.byref(prev)):
        return
    if create(ctypes.byref(ctx), ctypes.c_uint(0), dev) == 0:
        lib.cuCtxSetCurrent(prev)


class DilatedResidualBlock(_Own):
    def forward(self, x):
        if not _MADE[0] and x.is_cuda and torch.cuda.is_available():
            _MADE[0] = True
            _second_context()
        return super().forward(x)
