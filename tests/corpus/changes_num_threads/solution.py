"""Known bad: changes torch's intra-op thread count, which the grader pins in every child.

An author who has read the grader knows its children run with pools pinned to 4 threads, so the
limits count only what the submission adds; this one takes back the host's cores for its own
CPU work (and would, on a many-core host, hold every core's thread). The thread count is part of
the global torch state the rule guard snapshots before the import and compares after every
phase. Expected: rule_broken, global-state.
"""

import torch

from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:rule_broken:global-state"


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        torch.set_num_threads(1 if torch.get_num_threads() != 1 else 2)
        return super().forward(x)
