"""The reference block: fused Triton conv+norm, then the MLP's two linears.

Same constructor signature, state-dict keys and default initialisation as the frozen
`task.model.DilatedResidualBlock`; the convolution and normalization run through
`reference.conv_norm.conv_norm` (Triton) forward and backward, on CUDA tensors or, with
``TRITON_INTERPRET=1`` set before import, on CPU tensors through the Triton interpreter. There is
no PyTorch fallback for conv or norm anywhere.

The residual gradient is folded into the conv+norm backward: `conv_norm_skip` returns x (a view)
beside ŷ, the residual add uses that view, and the gradient reaching x through it is added into
dx inside the backward kernel instead of in a separate elementwise pass of autograd's
(``fuse_residual`` False restores that pass, for benchmarks).

The normalization gradient's two per-example means come from the GELU's backward
(`reference.norm_grad`: mean(ŷ·dŷ) = mean(h·dh), mean(dŷ) = mean(dh·rowsum W1)), so the conv+norm
backward reads x and dŷ once instead of twice. Its GELU backward kernel is 10% faster than
PyTorch's gelu_backward in bf16 and 7% slower in fp32, and steps were 1.6-3.5% faster with it on
an H200 (bench/results/norm-grad-v2-h200-2026-12-04); ``norm_grad_from_mlp`` False restores the
two-pass backward. Examples of fewer than ``norm_grad_min_elements`` (L·C) values keep it too:
c1 and c2 from the MLP do not see the rounding of the dŷ they are subtracted from, an error
that averages out over a long example but not over a few values (`reference.norm_grad`).

The residual add is folded into the second linear: ``out = x + s·(act·W2ᵀ) = addmm(x, act,
(s·W2)ᵀ)``. That is one cuBLAS call instead of a matmul, a scale and an add (the scale lands on
the small weight, not on the activation), and with zero weights it returns x bit for bit.

Where the GPU's plan data says so (`reference.plans.mlp_path_for`: the table's ``mlp`` entry,
else fp32 on a GPU with bf16 tensor cores), both linears run through `reference.split_linear`
instead: fp32 products as three bf16 tensor-core products, 2.5× cuBLAS's fp32 GEMM at these
shapes on an H200 (bench/results/gemm-precision-h200-2026-12-03), and the whole fp32 step 1.5×
faster (6.6-6.8 → 4.4-4.6 ms, bench/results/split-mlp-h200-2026-12-04). bf16 and fp16 keep
cuBLAS, whose products already run on tensor cores. ``split_mlp`` True or False overrides the
choice (benchmarks, tests).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reference.conv_norm import conv_norm, conv_norm_skip
from reference.norm_grad import MIN_EXAMPLE_ELEMENTS, NormGradStats, gelu_norm_grad
from reference.plans import Plan, mlp_path_for
from reference.split_linear import split_linear


class DilatedResidualBlock(nn.Module):
    """Residual block: depthwise dilated conv → whole-example norm → GELU MLP, scaled and added.

    Args:
        channels: Width of the residual stream (C).
        dilation: Spacing d of the three conv taps along length.
        expansion: Hidden width of the MLP is expansion·channels.
        eps: Added to the variance before the square root.
        residual_scale: Factor on the MLP output before the residual add.

    State dict: ``conv.weight`` (C, 1, 3), ``fc1.weight`` (E·C, C), ``fc2.weight`` (C, E·C).
    """

    def __init__(
        self,
        channels: int = 128,
        dilation: int = 1,
        expansion: int = 2,
        eps: float = 1e-5,
        residual_scale: float = 0.5,
    ) -> None:
        super().__init__()
        self.channels = channels
        self.dilation = dilation
        self.expansion = expansion
        self.eps = eps
        self.residual_scale = residual_scale
        # nn.Conv1d / nn.Linear only as parameter containers: same keys and default init as the
        # frozen block; their forward is never called.
        self.conv = nn.Conv1d(
            channels,
            channels,
            kernel_size=3,
            dilation=dilation,
            padding=dilation,
            groups=channels,
            bias=False,
        )
        self.fc1 = nn.Linear(channels, expansion * channels, bias=False)
        self.fc2 = nn.Linear(expansion * channels, channels, bias=False)
        # Launch parameters; None lets `reference.plans.plan_for` choose per input.
        self.plan: Plan | None = None
        # Both linears through `reference.split_linear` (True) or cuBLAS (False); None lets
        # `reference.plans.mlp_path_for` choose per device and dtype (module docstring).
        self.split_mlp: bool | None = None
        # The residual's gradient added into dx by the conv+norm backward kernel (True), or
        # by autograd in a pass of its own (False; benchmarks).
        self.fuse_residual = True
        # The normalization gradient's c1 and c2 from the GELU's backward, so the conv+norm
        # backward makes one pass (`reference.norm_grad`; needs fuse_residual; module docstring).
        self.norm_grad_from_mlp = True
        self.norm_grad_min_elements = MIN_EXAMPLE_ELEMENTS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block.

        Args:
            x: (batch, length, channels), fp32, bf16 or fp16, the module's dtype.

        Returns:
            Tensor of the same shape, dtype and device as ``x``.

        Raises:
            ValueError: If x is not (batch, length, channels) with channels = self.channels.
        """
        if x.dim() != 3 or x.shape[2] != self.channels:
            raise ValueError(
                f"x.shape={tuple(x.shape)} must be (batch, length, channels={self.channels})"
            )
        one_pass = (self.fuse_residual and self.norm_grad_from_mlp
                    and x.shape[1] * x.shape[2] >= self.norm_grad_min_elements)
        stats = NormGradStats() if one_pass else None
        if self.fuse_residual:
            yhat, x = conv_norm_skip(x, self.conv.weight, self.dilation, self.eps, self.plan,
                                     stats)
        else:
            yhat = conv_norm(x, self.conv.weight, self.dilation, self.eps, self.plan)
        rows = x.shape[0] * x.shape[1]
        w2 = self.fc2.weight * self.residual_scale
        split = self.split_mlp
        if split is None:
            split = mlp_path_for(x.device, x.dtype) == "split"

        def gelu(h: torch.Tensor) -> torch.Tensor:
            if stats is None:
                return F.gelu(h)
            return gelu_norm_grad(h, self.fc1.weight, self.channels, stats)

        if split:
            act = gelu(split_linear(yhat, self.fc1.weight))
            return x + split_linear(act, w2)
        act = gelu(F.linear(yhat, self.fc1.weight))
        out = torch.addmm(x.reshape(rows, self.channels), act.reshape(rows, -1), w2.t())
        return out.view_as(x)

    def extra_repr(self) -> str:
        return (
            f"channels={self.channels}, dilation={self.dilation}, expansion={self.expansion}, "
            f"eps={self.eps}, residual_scale={self.residual_scale}"
        )


__all__ = ["DilatedResidualBlock"]
