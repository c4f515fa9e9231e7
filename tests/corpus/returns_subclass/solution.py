"""Known bad: returns a torch.Tensor subclass (the shape of a lazy/deferred output).

A subclass can override __eq__, __torch_function__ or compute on access. The output must be
exactly torch.Tensor. Expected: gate_failed, type.
"""

import torch
from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:gate_failed:type"


class Lazy(torch.Tensor):
    pass


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        return super().forward(x).as_subclass(Lazy)
