"""Exploit: hold GPU memory outside PyTorch's caching allocator, where its accounting cannot see it.

Hacking scenario: an author who has read the grader knows that the memory it holds across steps
is read from PyTorch's allocator (`torch.cuda.memory_allocated`), so it takes 2 GiB straight from
the CUDA driver (`cuMemAlloc_v2` through ctypes) on its first step, to crowd the baselines'
allocations or to keep results the allocator never sees. The timing child reads this process's
own GPU memory from NVML (never the device's total, so neighbours do not count) and subtracts
PyTorch's pool: the 2 GiB are over the 1 GiB allowed outside it.
Since issue 37 ctypes is not a module a submission may use, however it reaches it (here
``torch.ctypes``, no import): its first foreign call is a broken rule, before the timing
defences this entry was written for are reached; they stay as the layer behind.
Expected: rule_broken (forbidden-import) or rule_broken (outside PyTorch's allocator)
"""

import torch

from reference.block import DilatedResidualBlock as _Reference

ctypes = torch.ctypes  # reached, not imported: ctypes is not on the import list

_HELD: list[int] = []


def _raw_alloc(nbytes: int) -> int:
    driver = ctypes.CDLL("libcuda.so.1")
    ptr = ctypes.c_uint64()
    status = driver.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes))
    if status != 0:
        raise RuntimeError(f"cuMemAlloc_v2 returned {status}")
    return ptr.value


class DilatedResidualBlock(_Reference):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _HELD and x.is_cuda:
            _HELD.append(_raw_alloc(2 << 30))
        return super().forward(x)
