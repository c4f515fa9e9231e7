"""Your submission: the residual block of PROMPT.md, with its conv + normalization in Triton.

As you receive it, this file is the plain PyTorch block (the frozen ``task/model.py``): correct,
but it scores 0, because the convolution and the normalization run as PyTorch ops. The rules
(PROMPT.md §2) want them in Triton kernels defined in this workspace, forward and backward,
inside a ``torch.autograd.Function``. The MLP and the residual add may stay in PyTorch.

Where to work:

1. Write the kernels in the section marked ``YOUR TRITON KERNELS``.
2. Fill in ``ConvNormFunction.forward`` / ``.backward`` (they launch the kernels).
3. In ``DilatedResidualBlock.forward``, replace the marked plain-PyTorch lines with the one-line
   call shown there.

Keep the class name, the constructor signature and the state-dict keys (``conv.weight``,
``fc1.weight``, ``fc2.weight``) exactly as they are. You may split the code into more modules in
this workspace; the grader imports ``solution`` from the workspace root. Check with
``python -m grader check`` (README.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn

# =================================================================================================
# YOUR TRITON KERNELS (conv + normalization, forward and backward)
#
# Layout: x is (batch, length, channels), channels last, contiguous; w is (channels, 1, 3).
# Forward, per example b (N = length·channels):
#     y[l, c] = w[c,0]·x[l−d, c] + w[c,1]·x[l, c] + w[c,2]·x[l+d, c]   (zero outside [0, length))
#     ŷ = (y − mean) · rstd,  rstd = 1/sqrt(var + eps), mean and biased var over all N values.
#     Accumulate in fp32 and use a stable variance: the grader's "offset" inputs sit near 1000.
# Backward, given dŷ:
#     c1 = mean(ŷ·dŷ), c2 = mean(dŷ)   →   dy = rstd·(dŷ − c1·ŷ − c2)
#     dx[l, c] = w[c,0]·dy[l+d, c] + w[c,1]·dy[l, c] + w[c,2]·dy[l−d, c]
#     dw[c, k] = Σ_{b,l} dy[b,l,c] · x[b, l+(k−1)·d, c]
# Every channel count ≥ 1, length ≥ 1 and dilation ≥ 1 (also beyond the length) must work.
# =================================================================================================


@triton.jit
def _conv_norm_fwd_kernel(
    X,  # pointer to the input, (batch, length, channels)
    W,  # pointer to the conv taps, (channels, 3)
    YHAT,  # pointer to the normalized output, (batch, length, channels)
    length,  # L
    channels,  # C
    dilation,  # d
    eps,  # added to the variance
    BLOCK: tl.constexpr,
):
    """Skeleton: not launched yet. Compute ŷ for one example (or one tile) here."""
    pass


@triton.jit
def _conv_norm_bwd_kernel(
    DYHAT,  # pointer to the gradient arriving at ŷ, (batch, length, channels)
    X,  # pointer to the input
    W,  # pointer to the conv taps
    DX,  # pointer to the input gradient (output)
    DW,  # pointer to the taps' gradient, or per-program partial sums of it (output)
    length,
    channels,
    dilation,
    eps,
    BLOCK: tl.constexpr,
):
    """Skeleton: not launched yet. Compute dx and dw here (more kernels are fine)."""
    pass


class ConvNormFunction(torch.autograd.Function):
    """ŷ = normalize(depthwise_conv(x, w)), per example, by your Triton kernels.

    ``forward(ctx, x, weight, dilation, eps)`` returns ŷ with x's shape and dtype;
    ``backward(ctx, dyhat)`` returns ``(dx, dweight, None, None)``, one entry per forward
    argument (None for the two that are not tensors), dx like x and dweight like weight.
    """

    @staticmethod
    def forward(ctx, x, weight, dilation, eps):
        # Allocate outputs, launch your forward kernel(s), ctx.save_for_backward(...) what the
        # backward needs (e.g. x, weight and the per-example mean and rstd).
        raise NotImplementedError("ConvNormFunction.forward: launch your Triton kernels here")

    @staticmethod
    def backward(ctx, dyhat):
        # Launch your backward kernel(s); return dx, dweight, None, None.
        raise NotImplementedError("ConvNormFunction.backward: launch your Triton kernels here")


conv_norm = ConvNormFunction.apply


# =================================================================================================
# THE BLOCK (keep the name, the constructor signature and the parameters)
# =================================================================================================


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
        # The Conv1d holds the taps under the key the grader loads (conv.weight); once your
        # kernels run, its own forward is never called.
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block.

        Args:
            x: (batch, length, channels), fp32, bf16 or fp16, the module's dtype.

        Returns:
            Tensor of the same shape, dtype and device as ``x``.
        """
        # ---- conv + normalization: plain PyTorch (scores 0). Replace these four lines with
        #          yhat = conv_norm(x, self.conv.weight, self.dilation, self.eps)
        y = self.conv(x.transpose(1, 2)).transpose(1, 2)
        y32 = y.to(torch.promote_types(y.dtype, torch.float32))
        var, mean = torch.var_mean(y32, dim=(1, 2), unbiased=False, keepdim=True)
        yhat = ((y32 - mean) * torch.rsqrt(var + self.eps)).to(x.dtype)
        # ---- MLP and residual: may stay in PyTorch.
        h = self.fc2(F.gelu(self.fc1(yhat)))
        return x + self.residual_scale * h

    def extra_repr(self) -> str:
        return (
            f"channels={self.channels}, dilation={self.dilation}, expansion={self.expansion}, "
            f"eps={self.eps}, residual_scale={self.residual_scale}"
        )
