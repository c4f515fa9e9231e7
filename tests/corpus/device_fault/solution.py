"""Known bad (GPU only): a Triton kernel that stores far out of bounds: a device-side fault.

The illegal address poisons the child's CUDA context; only the child dies, and the report names
the case. The Triton interpreter does not detect out-of-bounds accesses, so this runs only in
tests/test_grader_gpu.py. Expected: crashed.
"""

import torch
import triton
import triton.language as tl
from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:crashed:"
GPU_ONLY = True


@triton.jit
def _wild_store(ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK).to(tl.int64) + (1 << 40)
    tl.store(ptr + offs, tl.zeros([BLOCK], dtype=tl.float32))


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        buf = torch.empty(16, device=x.device, dtype=torch.float32)
        _wild_store[(1,)](buf, BLOCK=16)
        torch.cuda.synchronize()
        return super().forward(x)
