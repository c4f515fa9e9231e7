"""Known bad: writes into its input.

The naive Triton block, which then zeroes the caller's x in place (through .data, so autograd's
version counter does not notice). The check of the inputs after the step catches it.
Expected: gate_failed, input_unchanged.
"""

from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:gate_failed:input_unchanged"


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        out = super().forward(x).clone()
        x.data.zero_()
        return out
