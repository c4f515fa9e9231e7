"""The normalization gradient's two per-example means, computed by the MLP's GELU backward.

The conv+norm backward needs, per example, c1 = mean(ŷ·dŷ) and c2 = mean(dŷ) over its L·C
values before it can form any dx (`reference/conv_norm.py`), so it sweeps x and dŷ twice: once
for c1 and c2, once for dx, with a barrier between; the second sweep comes from DRAM on an H200
(bench/results/conv-norm-v5-h200-2026-12-04, ncu). Both means can be had from tensors the MLP's
backward already holds. With h = ŷ·W1ᵀ (fc1's output, (B, L, H)) and dh = ∂loss/∂h, fc1's
input gradient is dŷ = dh·W1, so per row

    Σ_c ŷ_c·dŷ_c = Σ_c ŷ_c Σ_j dh_j W1[j, c] = Σ_j dh_j·h_j
    Σ_c dŷ_c     = Σ_j dh_j·r_j,   r_j = Σ_c W1[j, c]

and dh is what the GELU's backward computes from h and ∂loss/∂gelu(h). `gelu_norm_grad` is that
GELU: its forward is PyTorch's exact GELU; its backward computes dh in a Triton kernel that also
sums h·dh and dh·r per example (partials per row block, summed in order: deterministic) and
leaves c1 and c2 in a `NormGradStats` the conv+norm Function reads when its backward runs, which
autograd runs after this one (it needs dŷ, which needs dh). The conv+norm backward then makes
one pass (`conv_norm_backward(..., c12=...)`).

Measured on an H200 (2026-12-04, bench/results/conv-norm-v5-h200-2026-12-04/norm-grad/): given
c1 and c2, the conv+norm backward takes 0.23 ms instead of 0.37-0.38 in fp32 and 0.44-0.45
instead of 0.74-0.76 in bf16 (110-115% of copy by the bytes model's 4·N·e; it moves 3). But this
kernel costs more than PyTorch's GELU backward it replaces (bf16 1.17 against 0.92 ms, fp32 0.45
against 0.37 at its best tiles), so the step gains about nothing: with 32-row tiles it was 3%
(fp32) and 6-7% (bf16) slower. The block keeps it off (`DilatedResidualBlock.norm_grad_from_mlp`)
until this kernel runs at PyTorch's speed; in bf16 it is bound by instructions issued (60 an
element for sm_90, mostly the erf's polynomial; `norm-grad/gelu_backward_sass.py` there).

Numerics: h and dh are the tensors fc1's products see (rounded to the dtype; the sums use dh as
stored), so c1 and c2 differ from sums over ŷ·dŷ by the products' rounding, a relative
2⁻⁸-scale error per term in bf16 that averages out over the example, far below the rounding of
dŷ itself. With zero weights h = dh = 0 and c1 = c2 = 0 exactly, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from reference.mlp import _gelu_and_grad
from reference.plans import interpreting, next_pow2

# Rows of an example a program takes; hidden columns are taken whole up to MAX_BLOCK_H. 8 rows
# at 4 warps was the fastest of 2-32 rows at 4 and 8 warps on an H200 in both dtypes (bf16
# 1.17 ms, fp32 0.45 ms at the h200 shapes; 32 rows took 1.59 and 0.65;
# bench/results/conv-norm-v5-h200-2026-12-04/norm-grad/gelu_backward_tiles.log).
BLOCK_ROWS = 8
MAX_BLOCK_H = 256


# ----------------------------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------------------------


@triton.jit
def _gelu_bwd_sums_kernel(
    DACT,  # (B·L, H) ∂loss/∂gelu(h), contiguous
    H,  # (B·L, H) h, contiguous
    R,  # (H,) fp32 row sums of W1
    DH,  # (B·L, H) out: ∂loss/∂h
    PART,  # (B, n_lb, 2) fp32 out: Σ h·dh and Σ dh·r over this program's rows
    L,
    HID,
    n_lb,  # row blocks an example
    BLOCK_L: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """dh = dact·gelu'(h) for BLOCK_L rows of example b, and their sums of h·dh and dh·r."""
    b = tl.program_id(0)
    lb = tl.program_id(1)
    rows = lb * BLOCK_L + tl.arange(0, BLOCK_L)
    row_ok = rows < L
    base = (b * L + rows).to(tl.int64) * HID
    s1 = tl.zeros((BLOCK_L,), dtype=tl.float32)
    s2 = tl.zeros((BLOCK_L,), dtype=tl.float32)
    for h0 in range(0, HID, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        col_ok = cols < HID
        ok = row_ok[:, None] & col_ok[None, :]
        offs = base[:, None] + cols[None, :]
        dact = tl.load(DACT + offs, mask=ok, other=0.0).to(tl.float32)
        h = tl.load(H + offs, mask=ok, other=0.0).to(tl.float32)
        _, dgelu = _gelu_and_grad(h)
        dh = (dact * dgelu).to(DH.dtype.element_ty)
        tl.store(DH + offs, dh, mask=ok)
        dh = dh.to(tl.float32)  # the sums see dh as fc1's products will
        r = tl.load(R + cols, mask=col_ok, other=0.0)
        s1 += tl.sum(h * dh, axis=1)
        s2 += tl.sum(dh * r[None, :], axis=1)
    out = PART + (b * n_lb + lb) * 2
    tl.store(out, tl.sum(s1))
    tl.store(out + 1, tl.sum(s2))


# ----------------------------------------------------------------------------------------------
# Launcher
# ----------------------------------------------------------------------------------------------


def gelu_backward_sums(dact: torch.Tensor, h: torch.Tensor, w1: torch.Tensor,
                       channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """dh = dact·gelu'(h) and every example's (c1, c2) as a (B, 2) fp32 tensor.

    Args:
        dact: (B, L, H) gradient of gelu(h).
        h: (B, L, H) fc1's output.
        w1: (H, C) fc1's weight.
        channels: C, the normalization's width (the means are over L·C values).

    Raises:
        ValueError: On shapes or dtypes that do not match.
    """
    if h.dim() != 3 or dact.shape != h.shape or w1.shape[0] != h.shape[2]:
        raise ValueError(f"dact {tuple(dact.shape)}, h {tuple(h.shape)} and w1 "
                         f"{tuple(w1.shape)} must be (B, L, H), (B, L, H) and (H, C)")
    if dact.dtype != h.dtype:
        raise ValueError(f"dact.dtype={dact.dtype} must equal h.dtype={h.dtype}")
    batch, length, hidden = h.shape
    dact, h = dact.contiguous(), h.contiguous()
    r = w1.float().sum(dim=1).contiguous()
    dh = torch.empty_like(h)
    n_lb = triton.cdiv(length, BLOCK_ROWS)
    part = torch.empty((batch, n_lb, 2), dtype=torch.float32, device=h.device)
    # The interpreter takes narrower column blocks, so its tests' hidden widths span several.
    block_h = min(next_pow2(hidden), MAX_BLOCK_H if not interpreting() else 64)
    _gelu_bwd_sums_kernel[(batch, n_lb)](dact, h, r, dh, part, length, hidden, n_lb,
                                         BLOCK_L=BLOCK_ROWS, BLOCK_H=block_h, num_warps=4)
    # Row blocks summed in order (torch's reductions use no atomics): deterministic.
    return dh, part.sum(dim=1) / (length * channels)


# ----------------------------------------------------------------------------------------------
# autograd.Function
# ----------------------------------------------------------------------------------------------


@dataclass
class NormGradStats:
    """Where `GeluNormGradFunction`'s backward leaves (B, 2) c1, c2 for the conv+norm backward
    (`reference.conv_norm.ConvNormSkipFunction`), which takes them and clears the slot."""

    c12: torch.Tensor | None = None


class GeluNormGradFunction(torch.autograd.Function):
    """act = gelu(h) (PyTorch's exact GELU); the backward also computes the normalization's c1
    and c2 (module docstring) into ``stats``."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, h: torch.Tensor, w1: torch.Tensor,
                channels: int, stats: NormGradStats) -> torch.Tensor:
        ctx.save_for_backward(h, w1)
        ctx.channels = channels
        ctx.stats = stats
        return F.gelu(h)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,
                 dact: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        h, w1 = ctx.saved_tensors
        dh, ctx.stats.c12 = gelu_backward_sums(dact, h, w1, ctx.channels)
        # w1's gradient comes through fc1's product; this node only reads it.
        return dh, None, None, None


def gelu_norm_grad(h: torch.Tensor, w1: torch.Tensor, channels: int,
                   stats: NormGradStats) -> torch.Tensor:
    """``F.gelu(h)`` whose backward leaves c1 and c2 in ``stats`` (`GeluNormGradFunction`)."""
    return GeluNormGradFunction.apply(h, w1, channels, stats)


__all__ = ["GeluNormGradFunction", "NormGradStats", "gelu_backward_sums", "gelu_norm_grad"]
