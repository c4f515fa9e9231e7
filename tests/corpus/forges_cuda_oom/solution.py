"""Known bad: a wrong gradient hidden behind a forged CUDA out-of-memory error.

Written by someone who read `grader.device_memory`: an out-of-memory error within the process's
share is judged the device's (``grader_error``, "device short", graded again by the service, and
the same tree may then be sent again), not the submission's. So this block, whose conv-tap
gradient is wrong (`wrong_conv_grad`), raises torch's own ``OutOfMemoryError`` with a small
figure from its backward, before any check can see the gradient, holding almost nothing. The
device has its memory free, so nothing but the submission explains the error. Expected:
out_of_memory (on the CPU the child's out-of-memory exit is its own already; on a GPU the parent
finds the device with room: `blame`).
"""

import torch
import torch.nn.functional as F
from naive_triton import DilatedResidualBlock as _Naive
from naive_triton import _ConvNorm

EXPECTED = "fail:out_of_memory:out of memory"

_FORGED = ("CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of "
           "139.81 GiB of which 1.00 MiB is free. Including non-PyTorch memory, this process has "
           "120.00 MiB memory in use.")


class _ForgedOom(_ConvNorm):
    @staticmethod
    def backward(ctx, dyhat):
        raise torch.OutOfMemoryError(_FORGED)


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        yhat = _ForgedOom.apply(x, self.conv.weight, self.dilation, self.eps)
        return x + self.residual_scale * self.fc2(F.gelu(self.fc1(yhat)))
