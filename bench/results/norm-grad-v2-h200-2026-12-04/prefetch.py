"""Experiment: reference/norm_grad.py's GELU backward kernel with the next row block's loads
issued before this block's arithmetic (software pipelining by hand), hidden width ≤ BLOCK_H.
Timed beside the committed kernel by bench/gelu_backward.py --kernel-module <this file>."""

import triton
import triton.language as tl

from reference.norm_grad import _gelu_grad


@triton.jit
def _gelu_bwd_sums_kernel(DACT, H, R, DH, PART, L, HID, n_lb, ROWS: tl.constexpr,
                          BLOCK_L: tl.constexpr, BLOCK_H: tl.constexpr, FAST: tl.constexpr):
    b = tl.program_id(0)
    lb = tl.program_id(1)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < HID
    r = tl.load(R + cols, mask=col_ok, other=0.0)
    s1 = tl.zeros((BLOCK_L, BLOCK_H), dtype=tl.float32)
    s2 = tl.zeros((BLOCK_L, BLOCK_H), dtype=tl.float32)
    rows = lb * ROWS + tl.arange(0, BLOCK_L)
    ok = (rows < L)[:, None] & col_ok[None, :]
    offs = (b * L + rows).to(tl.int64)[:, None] * HID + cols[None, :]
    dact_next = tl.load(DACT + offs, mask=ok, other=0.0)
    h_next = tl.load(H + offs, mask=ok, other=0.0)
    for l0 in range(0, ROWS, BLOCK_L):
        dact = dact_next.to(tl.float32)
        h = h_next.to(tl.float32)
        here, here_ok = offs, ok
        rows = lb * ROWS + l0 + BLOCK_L + tl.arange(0, BLOCK_L)
        ok = ((rows < L) & (l0 + BLOCK_L < ROWS))[:, None] & col_ok[None, :]
        offs = (b * L + rows).to(tl.int64)[:, None] * HID + cols[None, :]
        dact_next = tl.load(DACT + offs, mask=ok, other=0.0)
        h_next = tl.load(H + offs, mask=ok, other=0.0)
        dgelu = _gelu_grad(h, FAST, DH.dtype.element_ty == tl.float32)
        dh = (dact * dgelu).to(DH.dtype.element_ty)
        tl.store(DH + here, dh, mask=here_ok)
        dh = dh.to(tl.float32)
        s1 += h * dh
        s2 += dh * r[None, :]
    out = PART + (b * n_lb + lb) * 2
    tl.store(out, tl.sum(tl.sum(s1, axis=1)))
    tl.store(out + 1, tl.sum(tl.sum(s2, axis=1)))
