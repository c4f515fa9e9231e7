"""The scoring reference: conv+norm fused in Triton, the MLP in PyTorch's own ops.

This is the block the grader times as "the reference" (CONTRACT §8): the task fixes what it is.
It has the frozen `task.model.DilatedResidualBlock`'s constructor signature, state-dict keys and
default initialisation, and:

- the convolution and the normalization run through `reference.conv_norm.conv_norm_skip`
  (Triton) forward and backward, on CUDA tensors or, with ``TRITON_INTERPRET=1`` set before
  import, on CPU tensors through the Triton interpreter; there is no PyTorch fallback for conv
  or norm. What belongs to conv+norm is all its own: the chain kernels, the per-GPU plans, and
  the residual's gradient added into dx inside the conv+norm backward kernel (`conv_norm_skip`
  returns x as a view beside ŷ; the residual add uses that view, so the gradient reaching x
  through it is handed to the backward kernel instead of summed by autograd in a pass of its
  own);
- the MLP runs in PyTorch's own ops under PyTorch's default flags: ``F.linear``, ``F.gelu``
  (exact, erf) and ``torch.addmm``, with autograd's backward of each. The residual add is folded
  into the second linear: ``out = x + s·(act·W2ᵀ) = addmm(x, act, (s·W2)ᵀ)``, one cuBLAS call
  instead of a matmul, a scale and an add (the scale lands on the small weight), and with zero
  weights it returns x bit for bit.

It has no switches: the block that scores is one thing. The whole-step block, whose MLP also
moved into Triton (fp32 products on tensor cores, the GELU and its backward carrying the
normalization's gradient sums), is `reference.ceiling.CeilingBlock`: what a whole-step kernel can
reach, published as information and never timed in a grade.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reference.conv_norm import conv_norm_skip
from reference.plans import Plan


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
        # conv+norm's launch parameters; None lets `reference.plans.plan_for` choose per input.
        self.plan: Plan | None = None

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() != 3 or x.shape[2] != self.channels:
            raise ValueError(
                f"x.shape={tuple(x.shape)} must be (batch, length, channels={self.channels})"
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block.

        Args:
            x: (batch, length, channels), fp32, bf16 or fp16, the module's dtype.

        Returns:
            Tensor of the same shape, dtype and device as ``x``.

        Raises:
            ValueError: If x is not (batch, length, channels) with channels = self.channels.
        """
        self._check_input(x)
        yhat, x = conv_norm_skip(x, self.conv.weight, self.dilation, self.eps, self.plan)
        rows = x.shape[0] * x.shape[1]
        act = F.gelu(F.linear(yhat, self.fc1.weight))
        w2 = self.fc2.weight * self.residual_scale
        out = torch.addmm(x.reshape(rows, self.channels), act.reshape(rows, -1), w2.t())
        return out.view_as(x)

    def extra_repr(self) -> str:
        return (
            f"channels={self.channels}, dilation={self.dilation}, expansion={self.expansion}, "
            f"eps={self.eps}, residual_scale={self.residual_scale}"
        )


__all__ = ["DilatedResidualBlock"]
