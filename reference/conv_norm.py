"""Fused dilated depthwise conv + whole-example normalization in Triton, forward and backward.

For x of shape (B, L, C), channels last, taps w of shape (C, 1, 3) and dilation d:

    y[l, c]  = w[c,0]·x[l−d, c] + w[c,1]·x[l, c] + w[c,2]·x[l+d, c]   (x outside [0, L) is 0)
    mean     = mean of y over the L·C values of the example
    rstd     = 1 / sqrt(mean((y − mean)²) + eps)
    yhat     = (y − mean)·rstd

Backward, per example, with N = L·C and upstream gradient dyhat = ∂loss/∂yhat:

    c1       = mean(yhat·dyhat),  c2 = mean(dyhat)
    dy       = rstd·(dyhat − c1·yhat − c2)
    dx[l]    = Σ_k w[:,k]·dy[l − (k−1)d]  =  w[:,0]·dy[l+d] + w[:,1]·dy[l] + w[:,2]·dy[l−d]
    dw[c, k] = Σ_{b,l} dy[l, c]·x[l + (k−1)d, c]

(dy is the gradient of the normalization: differentiate yhat = (y − mean)·rstd through mean and
rstd, both functions of every y of the example; dx and dw are the conv's transpose.)

Design, both directions: one launch, ``group`` programs per example. Each program takes a ticket
from an atomic counter (so a group's members are always dispatched in order, which makes the
barrier below deadlock-free whenever a group fits on the GPU at once), reduces the statistics of
its tiles, publishes them, waits at a per-example barrier for the rest of its group, combines
all partials in a fixed order, then makes a second pass over the same tiles. The example was
just read, so the second pass is meant to hit L2 and DRAM to see x (and dyhat) once (a design
intent; no counter has confirmed the hit rate, see reference/NOTES.md). Under the Triton
interpreter programs run one after another, so the launcher uses one program per example and the
barrier never waits.

The backward recomputes yhat from x with the saved mean and rstd instead of reading a saved
yhat: it needs x for dw anyway, so DRAM traffic is dyhat + x in and dx out.

Tiles: rows of a tile are ``r + d·i`` for BLOCK_R consecutive residues r and BLOCK_P consecutive
chain positions i, so a shift by ±d is a shift by one chain position inside the tile, and the
three shifted loads overlap (and can hit L1) for every dilation, not only small ones.

Two kernel families share this design, chosen per pass by the plan (`Plan.fwd_chain`,
`Plan.bwd_chain`): the loop kernels below, which form x at rows ± d by loading shifted tiles,
and the chain kernels of `reference/conv_norm_chain.py` (tiles of one chain and all channels in
a one-warp program, the shifts done in registers; up to 128 channels), which load each tile once
a pass. The statistics both use are in `reference/conv_norm_group.py`.

Numerics: loads are converted to fp32. Forward statistics are fp32 per-tile (count, mean, M2),
two-pass inside each tile and Chan-combined across tiles and programs, all around a per-example
shift K (the mean of y over one interior row), so a large common offset does not cancel; mean
and rstd are saved in fp32. (An earlier version kept per-lane sums of (y − K)² across tiles; it
failed the offset family by 28× when K came from an edge row, which is why the forward keeps
per-tile M2.) The backward's c1 and c2 are plain fp32 sums (per lane, then reduced), which need
no shift. The conv-tap gradient is reduced as per-program fp32 partial rows summed in a fixed
order (no float atomics), so it is deterministic.

References:
    Chan, Golub, LeVeque, "Updating formulae and a pairwise algorithm for computing sample
    variances" (1979). Triton tutorial 05 (layer norm) for the backward's c1/c2 form.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference.conv_norm_chain import (
    _conv_norm_bwd_chain_kernel,
    _conv_norm_fwd_chain_kernel,
    chain_applies,
    chain_tiling,
)
from reference.conv_norm_group import (
    _add_tile_moments,
    _example_shift,
    _group_c1_c2,
    _group_moments,
    _load_taps,
    _take_ticket,
)
from reference.norm_grad import NormGradStats
from reference.plans import Plan, device_info, interpreting, next_pow2, plan_for

# Per-example offsets are int32 inside the kernels (the example base is int64).
MAX_EXAMPLE_ELEMENTS = 2**31 - 1

# Test hook: when True, the launchers fill every float buffer they allocate with NaN before the
# kernels run, so an element a kernel fails to write shows up as NaN instead of stale memory.
POISON_OUTPUTS = False


# ----------------------------------------------------------------------------------------------
# Tile helpers (shared by both directions)
# ----------------------------------------------------------------------------------------------


@triton.jit
def _tile_coords(
    t,  # tile index within the example
    n_cb,  # channel blocks per example
    n_pb,  # chain-position blocks per example
    L,  # length
    C,  # channels
    d,  # dilation
    BLOCK_P: tl.constexpr,  # chain positions per tile
    BLOCK_R: tl.constexpr,  # consecutive residues per tile
    BLOCK_C: tl.constexpr,  # channels per tile
    EVEN_C: tl.constexpr,  # C == BLOCK_C: no column mask at all
):
    """Rows, columns and their validity for tile t: rows r + d·i, r < d, row < L."""
    if EVEN_C:
        # One channel block (n_cb == 1): two integer divisions less per tile.
        cb = 0
        rest = t
    else:
        cb = t % n_cb
        rest = t // n_cb
    pb = rest % n_pb
    rb = rest // n_pb
    k = tl.arange(0, BLOCK_P * BLOCK_R)
    r = rb * BLOCK_R + k % BLOCK_R
    rows = r + d * (pb * BLOCK_P + k // BLOCK_R)
    row_ok = (r < d) & (rows < L)
    if EVEN_C:
        # A constant-true column mask folds away, so masks vary by row only and loads vectorize.
        cols = tl.arange(0, BLOCK_C)
        col_ok = tl.full((BLOCK_C,), 1, tl.int1)
    else:
        cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        col_ok = cols < C
    return rows, row_ok, cols, col_ok


@triton.jit
def _load_rows(PTR, rows, row_ok, cols, col_ok, L, C):
    """Load rows (any of them possibly outside [0, L)) as fp32, zero where out of range."""
    ok = (row_ok & (rows >= 0) & (rows < L))[:, None] & col_ok[None, :]
    return tl.load(PTR + rows[:, None] * C + cols[None, :], mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _all_taps(W, C, BLOCK_C: tl.constexpr):
    """The taps of columns 0 … BLOCK_C − 1, loaded once before a tile loop (see `_tile_taps`)."""
    cols = tl.arange(0, BLOCK_C)
    return _load_taps(W, cols, cols < C)


@triton.jit
def _tile_taps(W, cols, col_ok, w0, w1, w2, EVEN_C: tl.constexpr, TAPS_ONCE: tl.constexpr):
    """The taps of a tile's columns. With one channel block (EVEN_C) every tile has the same
    columns, so under TAPS_ONCE the loop-invariant taps from `_all_taps` are returned as they
    are; otherwise they are loaded for this tile, which converts them to the tile's register
    layout through shared memory, two block barriers per tap (see `Plan.taps_once`)."""
    if not (EVEN_C and TAPS_ONCE):
        w0, w1, w2 = _load_taps(W, cols, col_ok)
    return w0, w1, w2


@triton.jit
def _conv_tile(X_b, w0, w1, w2, rows, row_ok, cols, col_ok, L, C, d):
    """y = conv(x) on the tile's rows (fp32, zero on invalid rows and columns)."""
    x_m = _load_rows(X_b, rows - d, row_ok, cols, col_ok, L, C)
    x_0 = _load_rows(X_b, rows, row_ok, cols, col_ok, L, C)
    x_p = _load_rows(X_b, rows + d, row_ok, cols, col_ok, L, C)
    return w0 * x_m + w1 * x_0 + w2 * x_p


# ----------------------------------------------------------------------------------------------
# Forward kernel
# ----------------------------------------------------------------------------------------------


@triton.jit
def _conv_norm_fwd_kernel(
    X,  # (B, L, C) input, contiguous
    W,  # (C, 1, 3) taps, contiguous
    YHAT,  # (B, L, C) output, x's dtype
    MEAN,  # (B,) fp32 saved mean
    RSTD,  # (B,) fp32 saved rstd
    PART,  # (B·group, 3) fp32 partials: count, mean of y − K, M2
    SYNC,  # (1 + B,) int32, zeroed: ticket counter, then one arrival counter per example
    L,  # length
    C,  # channels
    d,  # dilation
    eps,  # variance epsilon
    n_tiles,  # tiles per example
    n_cb,  # channel blocks per example
    n_pb,  # chain-position blocks per example
    group,  # programs per example
    BLOCK_P: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_G: tl.constexpr,  # power of two ≥ group (see _block_g)
    EVEN_C: tl.constexpr,  # C == BLOCK_C
    TAPS_ONCE: tl.constexpr,  # Plan.taps_once
):
    """conv → per-example mean/rstd → yhat, one group of programs per example."""
    # Tickets, not program ids, so a group's members start in order (see module docstring).
    ticket, b, member = _take_ticket(SYNC, group)
    X_b = X + b * L * C
    shift = _example_shift(X_b, W, L, C, d, BLOCK_C)

    # Phase 1: per-tile (count, mean, M2) of y − K, two-pass inside the tile (the tile is in
    # registers), Chan-combined across this program's tiles. Robust to any spread of tile means.
    n_p = 0.0
    mean_p = 0.0
    m2_p = 0.0
    a0, a1, a2 = _all_taps(W, C, BLOCK_C)
    for t in range(member, n_tiles, group):
        rows, row_ok, cols, col_ok = _tile_coords(t, n_cb, n_pb, L, C, d, BLOCK_P, BLOCK_R,
                                                  BLOCK_C, EVEN_C)
        ok = row_ok[:, None] & col_ok[None, :]
        w0, w1, w2 = _tile_taps(W, cols, col_ok, a0, a1, a2, EVEN_C, TAPS_ONCE)
        v = tl.where(ok, _conv_tile(X_b, w0, w1, w2, rows, row_ok, cols, col_ok, L, C, d) - shift,
                     0.0)
        if EVEN_C:
            n_t = tl.sum(row_ok.to(tl.float32)) * C
        else:
            n_t = tl.sum(row_ok.to(tl.float32)) * tl.minimum(C - (t % n_cb) * BLOCK_C, BLOCK_C)
        n_p, mean_p, m2_p = _add_tile_moments(n_p, mean_p, m2_p, v, ok, n_t)
    # The group's partials combined in member order (deterministic), around the same shift.
    mean_s, rstd = _group_moments(PART, SYNC, ticket, b, group, n_p, mean_p, m2_p, eps, BLOCK_G)
    if member == 0:
        tl.store(MEAN + b, shift + mean_s)
        tl.store(RSTD + b, rstd)

    # Phase 2: same tiles again (now in L2), normalize and write.
    YHAT_b = YHAT + b * L * C
    for t in range(member, n_tiles, group):
        rows, row_ok, cols, col_ok = _tile_coords(t, n_cb, n_pb, L, C, d, BLOCK_P, BLOCK_R,
                                                  BLOCK_C, EVEN_C)
        ok = row_ok[:, None] & col_ok[None, :]
        w0, w1, w2 = _tile_taps(W, cols, col_ok, a0, a1, a2, EVEN_C, TAPS_ONCE)
        y = _conv_tile(X_b, w0, w1, w2, rows, row_ok, cols, col_ok, L, C, d)
        yhat = ((y - shift) - mean_s) * rstd
        tl.store(YHAT_b + rows[:, None] * C + cols[None, :],
                 yhat.to(YHAT.dtype.element_ty), mask=ok)


# ----------------------------------------------------------------------------------------------
# Backward kernel
# ----------------------------------------------------------------------------------------------


@triton.jit
def _dy_rows(x_m, x_0, x_p, DYHAT_b, rows, row_ok, cols, col_ok, w0, w1, w2, mean, rstd, c1,
             c2, L, C):
    """dy on the given rows from x at rows−d, rows, rows+d; zero where rows is out of range."""
    ok = (row_ok & (rows >= 0) & (rows < L))[:, None] & col_ok[None, :]
    yhat = (w0 * x_m + w1 * x_0 + w2 * x_p - mean) * rstd
    dyhat = tl.load(DYHAT_b + rows[:, None] * C + cols[None, :], mask=ok, other=0.0)
    dy = rstd * (dyhat.to(tl.float32) - c1 * yhat - c2)
    return tl.where(ok, dy, 0.0)


@triton.jit
def _conv_norm_bwd_kernel(
    X,  # (B, L, C) forward input, contiguous
    W,  # (C, 1, 3) taps
    DYHAT,  # (B, L, C) upstream gradient, contiguous
    RES,  # (B, L, C) gradient added to dx (only read if HAS_RES)
    MEAN,  # (B,) fp32 saved mean
    RSTD,  # (B,) fp32 saved rstd
    DX,  # (B, L, C) output, x's dtype
    DWPART,  # (B·group, 3, C) fp32 per-program partial dw (zeroed if SPLIT_C)
    PART,  # (B·group, 2) fp32 partials: Σ yhat·dyhat, Σ dyhat
    SYNC,  # (1 + B,) int32, zeroed
    L,
    C,
    d,
    n_tiles,
    n_cb,
    n_pb,
    group,
    HAS_RES: tl.constexpr,  # add RES into dx (fuses the residual branch's gradient)
    SPLIT_C: tl.constexpr,  # channels span several blocks: accumulate dw per tile in memory
    BLOCK_P: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_G: tl.constexpr,
    EVEN_C: tl.constexpr,
    TAPS_ONCE: tl.constexpr,  # Plan.taps_once
):
    """c1, c2 per example → dy → dx and per-program dw partials, one group per example."""
    # Tickets, not program ids, so a group's members start in order (see module docstring).
    ticket, b, member = _take_ticket(SYNC, group)
    X_b = X + b * L * C
    DYHAT_b = DYHAT + b * L * C
    mean = tl.load(MEAN + b)
    rstd = tl.load(RSTD + b)

    # Phase 1: Σ yhat·dyhat and Σ dyhat over this program's tiles (yhat recomputed from x).
    # Per-lane accumulators, reduced once after the loop (as in the forward).
    acc_1 = tl.zeros((BLOCK_P * BLOCK_R, BLOCK_C), dtype=tl.float32)
    acc_2 = tl.zeros((BLOCK_P * BLOCK_R, BLOCK_C), dtype=tl.float32)
    a0, a1, a2 = _all_taps(W, C, BLOCK_C)
    for t in range(member, n_tiles, group):
        rows, row_ok, cols, col_ok = _tile_coords(t, n_cb, n_pb, L, C, d, BLOCK_P, BLOCK_R,
                                                  BLOCK_C, EVEN_C)
        ok = row_ok[:, None] & col_ok[None, :]
        w0, w1, w2 = _tile_taps(W, cols, col_ok, a0, a1, a2, EVEN_C, TAPS_ONCE)
        y = _conv_tile(X_b, w0, w1, w2, rows, row_ok, cols, col_ok, L, C, d)
        yhat = tl.where(ok, (y - mean) * rstd, 0.0)
        dyhat = _load_rows(DYHAT_b, rows, row_ok, cols, col_ok, L, C)
        acc_1 += yhat * dyhat
        acc_2 += dyhat
    c1, c2 = _group_c1_c2(PART, SYNC, ticket, b, group, acc_1, acc_2, L, C, BLOCK_G)

    # Phase 2: dy on rows−d, rows, rows+d (x on rows−2d … rows+2d), then dx and dw.
    DX_b = DX + b * L * C
    RES_b = RES + b * L * C
    # dw per lane (reduced over rows once at the end) unless channels are split across tiles.
    dw0 = tl.zeros((BLOCK_P * BLOCK_R, BLOCK_C), dtype=tl.float32)
    dw1 = tl.zeros((BLOCK_P * BLOCK_R, BLOCK_C), dtype=tl.float32)
    dw2 = tl.zeros((BLOCK_P * BLOCK_R, BLOCK_C), dtype=tl.float32)
    for t in range(member, n_tiles, group):
        rows, row_ok, cols, col_ok = _tile_coords(t, n_cb, n_pb, L, C, d, BLOCK_P, BLOCK_R,
                                                  BLOCK_C, EVEN_C)
        ok = row_ok[:, None] & col_ok[None, :]
        w0, w1, w2 = _tile_taps(W, cols, col_ok, a0, a1, a2, EVEN_C, TAPS_ONCE)
        x_mm = _load_rows(X_b, rows - 2 * d, row_ok, cols, col_ok, L, C)
        x_m = _load_rows(X_b, rows - d, row_ok, cols, col_ok, L, C)
        x_0 = _load_rows(X_b, rows, row_ok, cols, col_ok, L, C)
        x_p = _load_rows(X_b, rows + d, row_ok, cols, col_ok, L, C)
        x_pp = _load_rows(X_b, rows + 2 * d, row_ok, cols, col_ok, L, C)
        dy_m = _dy_rows(x_mm, x_m, x_0, DYHAT_b, rows - d, row_ok, cols, col_ok, w0, w1, w2,
                        mean, rstd, c1, c2, L, C)
        dy_0 = _dy_rows(x_m, x_0, x_p, DYHAT_b, rows, row_ok, cols, col_ok, w0, w1, w2,
                        mean, rstd, c1, c2, L, C)
        dy_p = _dy_rows(x_0, x_p, x_pp, DYHAT_b, rows + d, row_ok, cols, col_ok, w0, w1, w2,
                        mean, rstd, c1, c2, L, C)
        dx = w0 * dy_p + w1 * dy_0 + w2 * dy_m
        offs = rows[:, None] * C + cols[None, :]
        if HAS_RES:
            dx += tl.load(RES_b + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(DX_b + offs, dx.to(DX.dtype.element_ty), mask=ok)
        if SPLIT_C:
            # Only this program touches its partial row: a plain read-modify-write is race-free.
            DW_t = DWPART + ticket * 3 * C + cols
            tl.store(DW_t, tl.load(DW_t, mask=col_ok) + tl.sum(dy_0 * x_m, axis=0), mask=col_ok)
            tl.store(DW_t + C, tl.load(DW_t + C, mask=col_ok) + tl.sum(dy_0 * x_0, axis=0),
                     mask=col_ok)
            tl.store(DW_t + 2 * C, tl.load(DW_t + 2 * C, mask=col_ok)
                     + tl.sum(dy_0 * x_p, axis=0), mask=col_ok)
        else:
            dw0 += dy_0 * x_m
            dw1 += dy_0 * x_0
            dw2 += dy_0 * x_p
    if not SPLIT_C:
        cols = tl.arange(0, BLOCK_C)
        DW_p = DWPART + ticket * 3 * C + cols
        tl.store(DW_p, tl.sum(dw0, axis=0), mask=cols < C)
        tl.store(DW_p + C, tl.sum(dw1, axis=0), mask=cols < C)
        tl.store(DW_p + 2 * C, tl.sum(dw2, axis=0), mask=cols < C)


# ----------------------------------------------------------------------------------------------
# Host launchers
# ----------------------------------------------------------------------------------------------


def _check_inputs(x: torch.Tensor, weight: torch.Tensor, dilation: int) -> None:
    """Validate shapes, dtypes and devices; raise ValueError naming both values."""
    if x.dim() != 3:
        raise ValueError(f"x must be (batch, length, channels), got x.dim()={x.dim()}")
    channels = x.shape[2]
    if tuple(weight.shape) != (channels, 1, 3):
        raise ValueError(
            f"weight.shape={tuple(weight.shape)} must be (channels, 1, 3)=({channels}, 1, 3)"
        )
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x.dtype={x.dtype} must be float32, bfloat16 or float16")
    if weight.device != x.device:
        raise ValueError(f"weight.device={weight.device} must match x.device={x.device}")
    if dilation < 1:
        raise ValueError(f"dilation={dilation} must be ≥ 1")
    if min(x.shape) < 1:
        raise ValueError(f"x.shape={tuple(x.shape)} must have every size ≥ 1")
    if x.shape[1] * channels > MAX_EXAMPLE_ELEMENTS:
        raise ValueError(
            f"length×channels={x.shape[1] * channels} exceeds "
            f"MAX_EXAMPLE_ELEMENTS={MAX_EXAMPLE_ELEMENTS} (int32 in-example offsets)"
        )
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(
            f"x.device={x.device}: the Triton kernels need a CUDA tensor, or TRITON_INTERPRET=1 "
            "set before importing reference (CPU interpreter)"
        )


def _tiling(length: int, channels: int, dilation: int, block_rows: int,
            block_c: int) -> dict[str, int]:
    """Split a tile of block_rows rows into BLOCK_P chain positions × BLOCK_R residues.

    Chain positions come first (a ±d shift stays inside the tile); residues fill the rest only
    when chains are short (d close to or beyond L), so tiles are never mostly masked.
    """
    chain = -(-length // dilation)  # positions on the longest chain r, r+d, r+2d, … < L
    residues = min(dilation, length)
    block_p = min(block_rows, next_pow2(chain))
    block_r = min(block_rows // block_p, next_pow2(residues))
    block_c = min(block_c, next_pow2(channels))
    n_cb = -(-channels // block_c)
    n_pb = -(-chain // block_p)
    n_rb = -(-residues // block_r)
    return {
        "BLOCK_P": block_p,
        "BLOCK_R": block_r,
        "BLOCK_C": block_c,
        "n_cb": n_cb,
        "n_pb": n_pb,
        "n_tiles": n_cb * n_pb * n_rb,
    }


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.empty, or NaN-filled under POISON_OUTPUTS."""
    if POISON_OUTPUTS:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def _workspace(batch: int, group: int, width: int,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed (1 + B,) int32 counters and (B·group, width) fp32 partials in one allocation.

    One buffer means one allocation and one memset per launch (host time matters at these
    sizes); the partials need no zeroing, every program writes its row before anyone reads it.
    """
    counters = 1 + batch
    buf = torch.zeros(counters + batch * group * width, dtype=torch.int32, device=device)
    return buf[:counters], buf[counters:].view(torch.float32).view(batch * group, width)


def _group_size(requested: int, n_tiles: int, device: torch.device) -> int:
    """Clamp programs per example: ≤ tiles, ≤ SM count (barrier safety), 1 when interpreted."""
    if interpreting():
        return 1
    return max(1, min(requested, n_tiles, device_info(device).sm_count))


def _block_g(group: int) -> int:
    """Width of the partials' combine: one value for every group up to 256 programs, so trying
    another group size (a runtime argument) never compiles a new kernel. The interpreter, which
    compiles nothing and runs one program per example, gets the narrowest."""
    return next_pow2(group) if interpreting() else max(256, next_pow2(group))


def _resolve_plan(plan: Plan | None, x: torch.Tensor, dilation: int) -> Plan:
    if plan is not None:
        return plan
    batch, length, channels = x.shape
    return plan_for(x.device, x.dtype, batch, length, channels, dilation)


def conv_norm_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: int,
    eps: float,
    plan: Plan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the forward kernel.

    Args:
        x: (B, L, C) input, fp32/bf16/fp16.
        weight: (C, 1, 3) conv taps.
        dilation: Tap spacing d ≥ 1.
        eps: Variance epsilon.
        plan: Launch parameters; None picks `plan_for`'s.

    Returns:
        (yhat in x's dtype, mean (B,) fp32, rstd (B,) fp32).

    Raises:
        ValueError: On mismatched shapes, dtypes or devices, or an unsupported size.
    """
    _check_inputs(x, weight, dilation)
    plan = _resolve_plan(plan, x, dilation)
    x = x.contiguous()
    weight = weight.contiguous()
    batch, length, channels = x.shape
    yhat = _empty(tuple(x.shape), x.dtype, x.device)
    stats = _empty((2, batch), torch.float32, x.device)
    mean, rstd = stats[0], stats[1]
    if plan.fwd_chain and chain_applies(channels):
        tiling = chain_tiling(length, channels, dilation, plan.fwd_block_rows)
        group = _group_size(plan.fwd_group, tiling["n_tiles"], x.device)
        sync, part = _workspace(batch, group, 3, x.device)
        _conv_norm_fwd_chain_kernel[(batch * group,)](
            x, weight, yhat, mean, rstd, part, sync, length, channels, dilation, eps,
            tiling["n_tiles"], tiling["n_pb"], group,
            BLOCK_C=tiling["BLOCK_C"], P=tiling["P"], BLOCK_G=_block_g(group),
            EVEN_C=tiling["EVEN_C"], VEC=tiling["VEC"], num_warps=1, num_stages=plan.num_stages,
        )
        return yhat, mean, rstd
    tiling = _tiling(length, channels, dilation, plan.fwd_block_rows, plan.block_c)
    group = _group_size(plan.fwd_group, tiling["n_tiles"], x.device)
    sync, part = _workspace(batch, group, 3, x.device)
    _conv_norm_fwd_kernel[(batch * group,)](
        x, weight, yhat, mean, rstd, part, sync,
        length, channels, dilation, eps,
        tiling["n_tiles"], tiling["n_cb"], tiling["n_pb"], group,
        BLOCK_P=tiling["BLOCK_P"], BLOCK_R=tiling["BLOCK_R"], BLOCK_C=tiling["BLOCK_C"],
        BLOCK_G=_block_g(group), EVEN_C=channels == tiling["BLOCK_C"],
        TAPS_ONCE=plan.taps_once, num_warps=plan.fwd_num_warps, num_stages=plan.num_stages,
    )
    return yhat, mean, rstd


def conv_norm_backward(
    dyhat: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    dilation: int,
    plan: Plan | None = None,
    residual_grad: torch.Tensor | None = None,
    c12: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the backward kernel and reduce the conv-tap gradient.

    Args:
        dyhat: (B, L, C) gradient of yhat.
        x: (B, L, C) forward input.
        weight: (C, 1, 3) conv taps.
        mean: (B,) fp32 from the forward.
        rstd: (B,) fp32 from the forward.
        dilation: Tap spacing d ≥ 1.
        plan: Launch parameters; None picks `plan_for`'s.
        residual_grad: Optional (B, L, C) gradient added into dx inside the kernel.
        c12: Optional (B, 2) fp32 c1 and c2 of every example, computed elsewhere
            (`reference.norm_grad`): the chain kernel then makes one pass over x and dyhat,
            with no statistics pass and no barrier. The loop kernels compute them anyway.

    Returns:
        (dx in x's dtype, dw of shape (C, 1, 3) in weight's dtype).

    Raises:
        ValueError: On mismatched shapes, dtypes or devices, or an unsupported size.
    """
    _check_inputs(x, weight, dilation)
    if dyhat.shape != x.shape:
        raise ValueError(f"dyhat.shape={tuple(dyhat.shape)} must equal x.shape={tuple(x.shape)}")
    if residual_grad is not None and residual_grad.shape != x.shape:
        raise ValueError(
            f"residual_grad.shape={tuple(residual_grad.shape)} must equal x.shape={tuple(x.shape)}"
        )
    if c12 is not None and (c12.shape != (x.shape[0], 2) or c12.dtype != torch.float32):
        raise ValueError(f"c12 is {tuple(c12.shape)} {c12.dtype}; it must be "
                         f"({x.shape[0]}, 2) float32")
    plan = _resolve_plan(plan, x, dilation)
    x = x.contiguous()
    dyhat = dyhat.contiguous()
    weight = weight.contiguous()
    res = residual_grad.contiguous() if residual_grad is not None else dyhat
    batch, length, channels = x.shape
    dx = _empty(tuple(x.shape), x.dtype, x.device)
    if plan.bwd_chain and chain_applies(channels):
        tiling = chain_tiling(length, channels, dilation, plan.bwd_block_rows)
        group = _group_size(plan.bwd_group, tiling["n_tiles"], x.device)
        dw_part = _empty((batch * group, 3, channels), torch.float32, x.device)
        sync, part = _workspace(batch, group, 2, x.device)
        _conv_norm_bwd_chain_kernel[(batch * group,)](
            x, weight, dyhat, res, mean, rstd, dx, dw_part, part, sync,
            c12.contiguous() if c12 is not None else mean,
            length, channels, dilation, tiling["n_tiles"], tiling["n_pb"], group,
            HAS_RES=residual_grad is not None, GIVEN_C12=c12 is not None,
            BLOCK_C=tiling["BLOCK_C"], P=tiling["P"],
            BLOCK_G=_block_g(group), EVEN_C=tiling["EVEN_C"], VEC=tiling["VEC"],
            num_warps=1, num_stages=plan.num_stages,
        )
        return dx, _reduce_dw(dw_part, weight)
    tiling = _tiling(length, channels, dilation, plan.bwd_block_rows, plan.block_c)
    group = _group_size(plan.bwd_group, tiling["n_tiles"], x.device)
    split_c = tiling["n_cb"] > 1
    dw_shape = (batch * group, 3, channels)
    # Split channels accumulate into dw_part tile by tile, so it must start at zero.
    dw_part = (torch.zeros(dw_shape, dtype=torch.float32, device=x.device) if split_c
               else _empty(dw_shape, torch.float32, x.device))
    sync, part = _workspace(batch, group, 2, x.device)
    _conv_norm_bwd_kernel[(batch * group,)](
        x, weight, dyhat, res, mean, rstd, dx, dw_part, part, sync,
        length, channels, dilation,
        tiling["n_tiles"], tiling["n_cb"], tiling["n_pb"], group,
        HAS_RES=residual_grad is not None, SPLIT_C=split_c,
        BLOCK_P=tiling["BLOCK_P"], BLOCK_R=tiling["BLOCK_R"], BLOCK_C=tiling["BLOCK_C"],
        BLOCK_G=_block_g(group), EVEN_C=channels == tiling["BLOCK_C"],
        TAPS_ONCE=plan.taps_once, num_warps=plan.bwd_num_warps, num_stages=plan.num_stages,
    )
    return dx, _reduce_dw(dw_part, weight)


def _reduce_dw(dw_part: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(B·group, 3, C) per-program partials → (C, 1, 3) dw in weight's dtype. A fixed-order
    fp32 sum over programs: deterministic (torch's reductions use no atomics)."""
    return dw_part.sum(dim=0).t().reshape(weight.shape[0], 1, 3).to(weight.dtype)


# ----------------------------------------------------------------------------------------------
# autograd.Function
# ----------------------------------------------------------------------------------------------


def _forward_saving(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor,
                    weight: torch.Tensor, dilation: int, eps: float,
                    plan: Plan | None) -> torch.Tensor:
    """`conv_norm_forward`'s yhat, with what both Functions' backwards need kept on ctx."""
    yhat, mean, rstd = conv_norm_forward(x, weight, dilation, eps, plan)
    if any(ctx.needs_input_grad[:2]):
        ctx.save_for_backward(x, weight, mean, rstd)
    ctx.dilation = dilation
    ctx.plan = plan
    return yhat


class ConvNormFunction(torch.autograd.Function):
    """yhat = norm(conv(x, weight)) with the Triton kernels above in both directions."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        x: torch.Tensor,
        weight: torch.Tensor,
        dilation: int,
        eps: float,
        plan: Plan | None = None,
    ) -> torch.Tensor:
        return _forward_saving(ctx, x, weight, dilation, eps, plan)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, dyhat: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw = conv_norm_backward(dyhat, x, weight, mean, rstd, ctx.dilation, ctx.plan)
        # One entry per forward argument: x, weight, dilation, eps, plan.
        return dx, dw, None, None, None


class ConvNormSkipFunction(torch.autograd.Function):
    """(yhat, skip): `ConvNormFunction`'s yhat and x itself (a view of it) for the block's
    residual add, so the gradient that reaches x through the skip is added into dx inside the
    backward kernel (``residual_grad``). Without it autograd sums the two gradients of x in a
    separate elementwise pass that reads two tensors and writes one (3·N·e bytes, about as much
    as the conv+norm backward's own traffic). With ``stats`` (`reference.norm_grad`), c1 and c2
    left there by the MLP's GELU backward make the backward one pass (``c12``)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        x: torch.Tensor,
        weight: torch.Tensor,
        dilation: int,
        eps: float,
        plan: Plan | None = None,
        stats: NormGradStats | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        yhat = _forward_saving(ctx, x, weight, dilation, eps, plan)
        ctx.stats = stats
        # An unused output's gradient arrives as None, not as a tensor of zeros.
        ctx.set_materialize_grads(False)
        return yhat, x.view_as(x)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, dyhat: torch.Tensor | None,
        dskip: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, ...]:
        x, weight, mean, rstd = ctx.saved_tensors
        if dyhat is None:  # yhat unused: dx is the skip's gradient alone, dw zero
            dyhat = torch.zeros_like(x)
        c12 = None
        if ctx.stats is not None:  # taken, so a stale pair is never reused: each backward of
            # the graph runs the GELU's backward first, which leaves a fresh one
            c12, ctx.stats.c12 = ctx.stats.c12, None
        dx, dw = conv_norm_backward(dyhat, x, weight, mean, rstd, ctx.dilation, ctx.plan,
                                    residual_grad=dskip, c12=c12)
        return dx, dw, None, None, None, None


conv_norm = ConvNormFunction.apply
conv_norm_skip = ConvNormSkipFunction.apply

__all__ = ["ConvNormFunction", "ConvNormSkipFunction", "conv_norm", "conv_norm_backward",
           "conv_norm_forward", "conv_norm_skip"]
