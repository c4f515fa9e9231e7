"""Known bad: correct only on the shapes the timing profiles list.

For (batch, length, dilation, dtype) of any timed shape (scoring.yaml, channels 128) it runs the
honest naive kernels; everywhere else it "normalizes" with eps = 1 (a cheaper, wrong shortcut
standing in for any shape-specialized unsafe path). The gate's other shapes catch it.
Expected: gate_failed, forward.
"""

import torch.nn.functional as F
from naive_triton import DilatedResidualBlock as _Naive
from naive_triton import _ConvNorm

EXPECTED = "fail:gate_failed:forward"

TIMED = {
    (8, 4096, 1, "float32"), (16, 2048, 8, "float32"), (4, 8192, 64, "float32"),
    (32, 4096, 512, "float32"), (64, 1024, 2, "float32"), (8, 4096, 1, "bfloat16"),
    (32, 4096, 16, "bfloat16"), (16, 8192, 512, "bfloat16"), (32, 4096, 1, "float32"),
    (64, 4096, 16, "float32"), (32, 8192, 128, "float32"), (64, 8192, 512, "float32"),
    (32, 4096, 1, "bfloat16"), (64, 8192, 64, "bfloat16"), (64, 4096, 512, "bfloat16"),
    (2, 256, 1, "float32"), (2, 256, 4, "bfloat16"),
}


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        key = (x.shape[0], x.shape[1], self.dilation, str(x.dtype).removeprefix("torch."))
        eps = self.eps if key in TIMED and x.shape[2] == 128 else 1.0
        yhat = _ConvNorm.apply(x, self.conv.weight, self.dilation, eps)
        return x + self.residual_scale * self.fc2(F.gelu(self.fc1(yhat)))
