"""A timed step held on the GPU until the parent releases it (`grader.interleave`'s held steps).

Both timing children hold each step the same way: `grader.child.steps.run_step` calls `arm`
before the step's first GPU work, the host enqueues the whole step, the child answers ``armed``,
and the parent releases it by writing the step's number to the child's page. `HostHold` plays
the same protocol in a CPU dry run.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The hold's page: the parent writes the number of the step it releases at offset 0 (uint32).
HOLD_BYTES = 4096
_CU_MEMHOSTREGISTER_PORTABLE, _CU_MEMHOSTREGISTER_DEVICEMAP = 0x01, 0x02
_CU_STREAM_WAIT_VALUE_GEQ = 0x0


def hold_value(page: Any) -> int:
    """The step number the hold's page holds."""
    return int(struct.unpack_from("<I", page, 0)[0])


def _map(path: str) -> mmap.mmap:
    """The page at ``path``, mapped shared (the file's descriptor is not kept)."""
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, HOLD_BYTES)
    finally:
        os.close(fd)


class HoldPage:
    """The parent's side of one child's page: a new file of zeros, mapped here; the parent alone
    writes it (`write`), and `value` must still be what it `written` last."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.page = _map(str(path))
        self.written = 0

    @classmethod
    def create(cls, directory: Path) -> HoldPage:
        fd, name = tempfile.mkstemp(prefix="grader-hold-", dir=directory)
        try:
            os.write(fd, bytes(HOLD_BYTES))
        finally:
            os.close(fd)
        return cls(Path(name))

    @property
    def value(self) -> int:
        return hold_value(self.page)

    def write(self, step: int) -> None:
        struct.pack_into("<I", self.page, 0, step)
        self.written = step

    def close(self) -> None:
        """Unmap it and remove its file (idempotent)."""
        with contextlib.suppress(BufferError, ValueError):
            self.page.close()
        self.path.unlink(missing_ok=True)


class Hold:
    """A step's work held on the GPU until the parent releases it.

    The parent's page (a file it shares with this process, in ``/dev/shm``) is mapped here and
    registered with the driver; `arm` puts a wait on the current stream (the driver's stream
    memory operation ``cuStreamWaitValue32``: the stream's front end polls the page, no kernel
    runs) until the page holds at least the step's number. The host then enqueues the whole step
    at its own pace, and the device runs it only when the parent writes the number: what the
    window measures is the GPU's work, not this process's host (on an H200 a reference step's
    window held 0.24-0.34 ms of waiting for the host, and that share moved from one visit and
    one process to the next: bench/results/hold-h200-2026-12-02).
    """

    def __init__(self, torch: Any, page: mmap.mmap, dptr: int, wait: Any) -> None:
        self.torch = torch
        self.page = page
        self.dptr = dptr
        self._wait = wait

    @classmethod
    def open(cls, torch: Any, path: str) -> tuple[Hold | None, str]:
        """The hold on ``path``, or None and why (no CUDA driver entry points, registration
        refused, stream memory operations unsupported): the parent then times unheld."""
        try:
            page = _map(path)
            lib = ctypes.CDLL("libcuda.so.1")
            register = lib.cuMemHostRegister_v2
            register.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
            get_dptr = lib.cuMemHostGetDevicePointer_v2
            get_dptr.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p,
                                 ctypes.c_uint]
            wait = getattr(lib, "cuStreamWaitValue32_v2", None) or lib.cuStreamWaitValue32
            wait.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            # The driver's context current on this thread.
            torch.zeros(1, device="cuda").add_(1)
            torch.cuda.synchronize()
            host = ctypes.addressof(ctypes.c_char.from_buffer(page))
            flags = _CU_MEMHOSTREGISTER_PORTABLE | _CU_MEMHOSTREGISTER_DEVICEMAP
            if (err := register(host, HOLD_BYTES, flags)) != 0:
                return None, f"cuMemHostRegister failed (CUresult {err})"
            dptr = ctypes.c_uint64()
            if (err := get_dptr(ctypes.byref(dptr), host, 0)) != 0:
                return None, f"cuMemHostGetDevicePointer failed (CUresult {err})"
            hold = cls(torch, page, int(dptr.value), wait)
            # A wait already met: the entry point works on this device and driver.
            stream = torch.cuda.current_stream().cuda_stream
            if (err := wait(stream, hold.dptr, hold_value(page), 0)) != 0:
                return None, f"cuStreamWaitValue32 failed (CUresult {err})"
            torch.cuda.synchronize()
        except (OSError, AttributeError, RuntimeError, ValueError) as exc:
            return None, f"no hold: {exc!r}"
        return hold, "held"

    def arm(self, step: int, armed: Callable[[], None] | None) -> Callable[[], None] | None:
        """Hold the current stream's later work until the page holds ``step``; the caller
        calls the returned ``armed`` once the step is enqueued."""
        stream = self.torch.cuda.current_stream().cuda_stream
        err = self._wait(stream, self.dptr, step & 0xFFFFFFFF, _CU_STREAM_WAIT_VALUE_GEQ)
        if err != 0:
            raise RuntimeError(f"cuStreamWaitValue32 failed (CUresult {err})")
        return armed


class HostHold:
    """A CPU dry run's hold: nothing is enqueued on a CPU, so ``armed`` is answered at once and
    the step starts when the parent's release is seen on the page (the parent's protocol is the
    same as on a GPU)."""

    POLL_S = 0.0002

    def __init__(self, page: mmap.mmap) -> None:
        self.page = page

    @classmethod
    def open(cls, path: str) -> tuple[HostHold | None, str]:
        try:
            return cls(_map(path)), "held (host)"
        except (OSError, ValueError) as exc:
            return None, f"no hold: {exc!r}"

    def arm(self, step: int, armed: Callable[[], None] | None) -> None:
        if armed is not None:
            armed()
        while hold_value(self.page) < step:
            time.sleep(self.POLL_S)
        return None


# How a host thread waits for the device in a synchronization: the primary context's
# CU_CTX_SCHED_* flag (cuda.h). A timed window ends with an event recorded once this process's
# synchronize has returned, so the window holds how late the host noticed the device idle: on an
# H200 40-180 µs, more the longer the wait (bench/results/held-h200-2026-12-03/).
HOST_WAITS = {"auto": 0x0, "spin": 0x1, "yield": 0x2, "blocking": 0x4}

# A grade's timing children spin: a submission that set spin on its own context (cuCtxSetFlags
# through ctypes) could otherwise change its own windows' tails while the baselines' stayed as
# the driver left them; with both spinning it has nothing to change. What it measured on an
# H200 (bench/results/spin-h200-2026-12-03/): tails no shorter with the census and the guard on
# (held 0.12-0.19 ms under both), the reference's copy in the submission's process still slower
# than the baselines' (ln(t_sub/t_ref) +1.2e-3 on average over 9 grades, +1.6e-3 over 9 under
# auto: within the noise). Its cost: the one child waiting on the device holds a core meanwhile.
DEFAULT_HOST_WAIT = "spin"


def host_wait_flag(name: str) -> int:
    """The driver's flag of the host wait ``name``; ValueError when it is not one of
    `HOST_WAITS` (the parent asks before it starts a child, the child before it sets it)."""
    if name not in HOST_WAITS:
        raise ValueError(f"host wait {name!r} is not one of {sorted(HOST_WAITS)}")
    return HOST_WAITS[name]


def set_host_wait(name: str) -> str:
    """Give the device's primary context the host wait ``name`` (`HOST_WAITS`), before this
    process makes its context; what was done, or why not (the child then waits as the driver
    decides, and says so). ``auto`` does nothing.

    Raises:
        ValueError: ``name`` is not one of `HOST_WAITS`.
    """
    flag = host_wait_flag(name)
    if name == "auto":
        return "auto"
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        dev = ctypes.c_int()
        # Device 0 of those CUDA_VISIBLE_DEVICES lets this process see: the one it times on.
        for call, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(dev), 0)),
                           ("cuDevicePrimaryCtxSetFlags_v2", (dev, flag))):
            if (err := getattr(lib, call)(*args)) != 0:
                return f"auto: {call} failed (CUresult {err})"
    except (OSError, AttributeError) as exc:
        return f"auto: no driver ({exc!r})"
    return name


def open_hold(torch: Any, job: dict[str, Any]) -> tuple[Hold | HostHold | None, str]:
    """This process's hold from the job's ``hold_path`` (None and why where there is none)."""
    path = job.get("hold_path")
    if not path:
        return None, "no hold page in the job"
    if job["device"] == "cuda":
        return Hold.open(torch, str(path))
    return HostHold.open(str(path))


__all__ = ["DEFAULT_HOST_WAIT", "HOLD_BYTES", "HOST_WAITS", "Hold", "HoldPage", "HostHold",
           "hold_value", "host_wait_flag", "open_hold", "set_host_wait"]
