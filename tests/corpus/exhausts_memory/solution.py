"""Known bad: allocates host memory without bound in the forward.

The watchdog sees the child's resident memory pass its limit and kills it (or the child catches
the allocator's failure itself). Expected: out_of_memory.
"""

import torch

from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:out_of_memory:memory"
GATE_MEMORY_MB = 3000

_hoard = []


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        while True:
            _hoard.append(torch.ones(64 << 20, dtype=torch.uint8))
