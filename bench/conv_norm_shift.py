"""An experiment (issue 17): conv+norm with the ±d shifts done in registers, not by reloading.

`reference/conv_norm.py` forms x at rows − d and rows + d by loading the tile three times, and its
backward recomputes dy on three shifted row sets (x on five, dyhat on three): 57 instructions an
element in bf16, which caps it near 83% of copy bandwidth at full issue
(`bench/results/conv-norm-v4-h200-2026-12-04/`). Sharing dy between neighbouring rows through
memory cost a barrier a tile and lost.

Here a tile is (C, P): all C channels of P consecutive positions of one chain (rows
r + d·(i0 + i)), and a program is one warp, so each thread holds whole chain segments of its
channels. A shift along the chain is then a permutation of a thread's own registers: split the
tile into even and odd positions and interleave again, log2(P) times (`_dn`, `_up`), which
compiles to register renaming (no shuffles, no shared memory, no barrier; checked in the SASS).
Only the rows one position beyond the tile come from memory, as (C,) vectors. So the forward
loads each x tile once, and the backward computes dy once per row (plus two halo rows) and
forms dx = w0·dy[i+1] + w1·dy[i] + w2·dy[i−1] from shifted registers.

Same math, statistics and barrier as conv_norm.py (per-tile two-pass moments around the
example's shift K, Chan-combined in member order; c1, c2 as plain sums; dw as per-program
partial rows summed in a fixed order). One channel block only (C a power of two ≤ 128).

Not timed yet: written when the session's GPU time was spent. Its machine code, without a GPU
(`python bench/conv_norm_sass.py --kernel shift --fwd 8x1 --bwd 8x1`, sm_90, tiles of 8 rows):
no block barrier in any loop; forward 26 (fp32) and 30 (bf16) instructions an element against
the reference's 36-37, backward 37 and 45 against 71-78, so bf16 is no longer capped below copy
bandwidth by issue (at most 107% and 144% at full issue); 128-154 registers a thread in the
backward (12-16 one-warp programs an SM), and 16-row tiles do not spill. On a GPU:

    python bench/conv_norm_shift.py --rows 8,16 --groups 33,66,132 --out shift.json
    OUT=$OUT bash bench/gpu_session.sh conv-norm-shift
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reference.conv_norm import (  # noqa: E402
    _add_tile_moments,
    _block_g,
    _empty,
    _example_shift,
    _group_c1_c2,
    _group_moments,
    _workspace,
    conv_norm_backward,
    conv_norm_forward,
)
from reference.plans import device_info, interpreting, next_pow2  # noqa: E402

# ----------------------------------------------------------------------------------------------
# Register shifts along a tile's chain axis
# ----------------------------------------------------------------------------------------------


@triton.jit
def _dn(v, h, C: tl.constexpr, P: tl.constexpr):
    """out[:, i] = v[:, i − 1], out[:, 0] = h[:, 0]. With v = interleave(e, o) (even and odd
    positions), out = interleave(_dn(o, h), e): a shift of half the length, log2(P) levels."""
    if P == 1:
        return h
    else:
        e, o = tl.split(tl.reshape(v, (C, P // 2, 2)))
        return tl.reshape(tl.join(_dn(o, h, C, P // 2), e), (C, P))


@triton.jit
def _up(v, h, C: tl.constexpr, P: tl.constexpr):
    """out[:, i] = v[:, i + 1], out[:, P − 1] = h[:, 0]; out = interleave(o, _up(e, h))."""
    if P == 1:
        return h
    else:
        e, o = tl.split(tl.reshape(v, (C, P // 2, 2)))
        return tl.reshape(tl.join(o, _up(e, h, C, P // 2)), (C, P))


# ----------------------------------------------------------------------------------------------
# Tiles: (C, P), chain positions i0 … i0 + P − 1 of residue r
# ----------------------------------------------------------------------------------------------


@triton.jit
def _chain_rows(t, n_pb, d, P: tl.constexpr):
    """Rows of tile t as a (P,) vector, and the tile's residue and first chain position."""
    r = t // n_pb
    i0 = (t % n_pb) * P
    return r + d * (i0 + tl.arange(0, P)), r, i0


@triton.jit
def _cols(C: tl.constexpr):
    """0 … C − 1, declared contiguous in runs of 4 only: Triton then vectorises 4 channels a
    thread in every dtype (16-byte loads in fp32, 8 in bf16), so a warp's 32 threads cover 128
    channels and each thread keeps its whole chain segment; with 8 bf16 channels a thread, two
    threads would share a segment and every shift would cross them through shared memory."""
    return tl.max_contiguous(tl.arange(0, C), 4)


@triton.jit
def _load_tile(PTR, rows, L, C: tl.constexpr):
    """(C, P) fp32 of the given rows, zero outside [0, L)."""
    c = _cols(C)
    ok = ((rows >= 0) & (rows < L))[None, :]
    return tl.load(PTR + rows[None, :] * C + c[:, None], mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _load_row(PTR, row, L, C: tl.constexpr):
    """(C, 1) fp32 of one row, zero outside [0, L)."""
    c = _cols(C)
    ok = (row >= 0) & (row < L)
    return tl.load(PTR + row * C + c, mask=ok, other=0.0).to(tl.float32)[:, None]


@triton.jit
def _taps(W, C: tl.constexpr):
    c = tl.arange(0, C)
    w0 = tl.load(W + c * 3 + 0).to(tl.float32)[:, None]
    w1 = tl.load(W + c * 3 + 1).to(tl.float32)[:, None]
    w2 = tl.load(W + c * 3 + 2).to(tl.float32)[:, None]
    return w0, w1, w2


@triton.jit
def _conv_shifted(X_b, rows, r, i0, d, L, w0, w1, w2, C: tl.constexpr, P: tl.constexpr):
    """y on the tile's rows from one tile load of x and its two halo rows."""
    x_0 = _load_tile(X_b, rows, L, C)
    x_m = _dn(x_0, _load_row(X_b, r + d * (i0 - 1), L, C), C, P)
    x_p = _up(x_0, _load_row(X_b, r + d * (i0 + P), L, C), C, P)
    return x_m, x_0, x_p, w0 * x_m + w1 * x_0 + w2 * x_p


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------


@triton.jit
def _conv_norm_fwd_shift_kernel(X, W, YHAT, MEAN, RSTD, PART, SYNC, L, d, eps, n_tiles, n_pb,
                                group, C: tl.constexpr, P: tl.constexpr,
                                BLOCK_G: tl.constexpr):
    """conv → per-example mean/rstd → yhat; one warp a program, shifts in registers."""
    ticket = tl.atomic_add(SYNC, 1).to(tl.int64)
    b = ticket // group
    member = (ticket % group).to(tl.int32)
    X_b = X + b * L * C
    shift = _example_shift(X_b, W, L, C, d, C)
    w0, w1, w2 = _taps(W, C)
    n_p = 0.0
    mean_p = 0.0
    m2_p = 0.0
    for t in range(member, n_tiles, group):
        rows, r, i0 = _chain_rows(t, n_pb, d, P)
        ok = (rows < L)[None, :]
        _, _, _, y = _conv_shifted(X_b, rows, r, i0, d, L, w0, w1, w2, C, P)
        v = tl.where(ok, y - shift, 0.0)
        n_t = tl.sum((rows < L).to(tl.float32)) * C
        n_p, mean_p, m2_p = _add_tile_moments(n_p, mean_p, m2_p, v, ok, n_t)
    mean_s, rstd = _group_moments(PART, SYNC, ticket, b, group, n_p, mean_p, m2_p, eps, BLOCK_G)
    if member == 0:
        tl.store(MEAN + b, shift + mean_s)
        tl.store(RSTD + b, rstd)

    YHAT_b = YHAT + b * L * C
    c = _cols(C)
    for t in range(member, n_tiles, group):
        rows, r, i0 = _chain_rows(t, n_pb, d, P)
        _, _, _, y = _conv_shifted(X_b, rows, r, i0, d, L, w0, w1, w2, C, P)
        yhat = ((y - shift) - mean_s) * rstd
        tl.store(YHAT_b + rows[None, :] * C + c[:, None], yhat.to(YHAT.dtype.element_ty),
                 mask=(rows < L)[None, :])


# ----------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------


@triton.jit
def _dy_row(X_b, DYHAT_b, row, d, L, w0, w1, w2, mean, rstd, c1, c2, C: tl.constexpr):
    """dy on one row (a halo), (C, 1); zero outside [0, L)."""
    y = (w0 * _load_row(X_b, row - d, L, C) + w1 * _load_row(X_b, row, L, C)
         + w2 * _load_row(X_b, row + d, L, C))
    dy = rstd * (_load_row(DYHAT_b, row, L, C) - c1 * (y - mean) * rstd - c2)
    return tl.where((row >= 0) & (row < L), dy, 0.0)


@triton.jit
def _conv_norm_bwd_shift_kernel(X, W, DYHAT, RES, MEAN, RSTD, DX, DWPART, PART, SYNC, L, d,
                                n_tiles, n_pb, group, HAS_RES: tl.constexpr, C: tl.constexpr,
                                P: tl.constexpr, BLOCK_G: tl.constexpr):
    """c1, c2 per example → dy once per row → dx from register-shifted dy, dw partials."""
    ticket = tl.atomic_add(SYNC, 1).to(tl.int64)
    b = ticket // group
    member = (ticket % group).to(tl.int32)
    X_b = X + b * L * C
    DYHAT_b = DYHAT + b * L * C
    mean = tl.load(MEAN + b)
    rstd = tl.load(RSTD + b)
    w0, w1, w2 = _taps(W, C)

    # Accumulators per channel: a tile's P rows of a channel are one thread's, so summing them
    # first is register-local, and it keeps 2·4 registers live instead of 2·4·P.
    acc_1 = tl.zeros((C,), dtype=tl.float32)
    acc_2 = tl.zeros((C,), dtype=tl.float32)
    for t in range(member, n_tiles, group):
        rows, r, i0 = _chain_rows(t, n_pb, d, P)
        _, _, _, y = _conv_shifted(X_b, rows, r, i0, d, L, w0, w1, w2, C, P)
        yhat = tl.where((rows < L)[None, :], (y - mean) * rstd, 0.0)
        dyhat = _load_tile(DYHAT_b, rows, L, C)
        acc_1 += tl.sum(yhat * dyhat, axis=1)
        acc_2 += tl.sum(dyhat, axis=1)
    c1, c2 = _group_c1_c2(PART, SYNC, ticket, b, group, acc_1, acc_2, L, C, BLOCK_G)

    DX_b = DX + b * L * C
    RES_b = RES + b * L * C
    c = _cols(C)
    dw0 = tl.zeros((C,), dtype=tl.float32)
    dw1 = tl.zeros((C,), dtype=tl.float32)
    dw2 = tl.zeros((C,), dtype=tl.float32)
    for t in range(member, n_tiles, group):
        rows, r, i0 = _chain_rows(t, n_pb, d, P)
        ok = (rows < L)[None, :]
        x_m, x_0, x_p, y = _conv_shifted(X_b, rows, r, i0, d, L, w0, w1, w2, C, P)
        dyhat = _load_tile(DYHAT_b, rows, L, C)
        dy_0 = tl.where(ok, rstd * (dyhat - c1 * ((y - mean) * rstd) - c2), 0.0)
        lo = _dy_row(X_b, DYHAT_b, r + d * (i0 - 1), d, L, w0, w1, w2, mean, rstd, c1, c2, C)
        hi = _dy_row(X_b, DYHAT_b, r + d * (i0 + P), d, L, w0, w1, w2, mean, rstd, c1, c2, C)
        dx = w0 * _up(dy_0, hi, C, P) + w1 * dy_0 + w2 * _dn(dy_0, lo, C, P)
        offs = rows[None, :] * C + c[:, None]
        if HAS_RES:
            dx += tl.load(RES_b + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(DX_b + offs, dx.to(DX.dtype.element_ty), mask=ok)
        dw0 += tl.sum(dy_0 * x_m, axis=1)
        dw1 += tl.sum(dy_0 * x_0, axis=1)
        dw2 += tl.sum(dy_0 * x_p, axis=1)
    DW_p = DWPART + ticket * 3 * C + c
    tl.store(DW_p, dw0)
    tl.store(DW_p + C, dw1)
    tl.store(DW_p + 2 * C, dw2)


# ----------------------------------------------------------------------------------------------
# Host launchers
# ----------------------------------------------------------------------------------------------


def shift_tiling(length: int, channels: int, dilation: int, rows: int) -> dict[str, int]:
    """P chain positions a tile (a power of two, at most the chain), tiles a chain, tiles.

    Raises:
        ValueError: Channels that are not a power of two up to 128 (one warp, one block).
    """
    if channels != next_pow2(channels) or channels > 128:
        raise ValueError(f"channels={channels} must be a power of two ≤ 128 here")
    chain = -(-length // dilation)
    p = min(rows, next_pow2(chain))
    n_pb = -(-chain // p)
    return {"P": p, "n_pb": n_pb, "n_tiles": min(dilation, length) * n_pb}


def _group(requested: int, n_tiles: int, device: torch.device) -> int:
    if interpreting():
        return 1
    return max(1, min(requested, n_tiles, device_info(device).sm_count))


def forward_shift(x: torch.Tensor, weight: torch.Tensor, dilation: int, eps: float, rows: int,
                  group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The shift forward on contiguous inputs: (yhat, mean, rstd) as conv_norm_forward's."""
    batch, length, channels = x.shape
    tiling = shift_tiling(length, channels, dilation, rows)
    group = _group(group, tiling["n_tiles"], x.device)
    yhat = _empty(tuple(x.shape), x.dtype, x.device)
    stats = _empty((2, batch), torch.float32, x.device)
    sync, part = _workspace(batch, group, 3, x.device)
    _conv_norm_fwd_shift_kernel[(batch * group,)](
        x, weight, yhat, stats[0], stats[1], part, sync, length, dilation, eps,
        tiling["n_tiles"], tiling["n_pb"], group, C=channels, P=tiling["P"],
        BLOCK_G=_block_g(group), num_warps=1, num_stages=1)
    return yhat, stats[0], stats[1]


def backward_shift(dyhat: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                   mean: torch.Tensor, rstd: torch.Tensor, dilation: int,
                   residual_grad: torch.Tensor | None, rows: int,
                   group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The shift backward on contiguous inputs: (dx, dw) as conv_norm_backward's."""
    batch, length, channels = x.shape
    tiling = shift_tiling(length, channels, dilation, rows)
    group = _group(group, tiling["n_tiles"], x.device)
    dx = _empty(tuple(x.shape), x.dtype, x.device)
    dw_part = _empty((batch * group, 3, channels), torch.float32, x.device)
    sync, part = _workspace(batch, group, 2, x.device)
    _conv_norm_bwd_shift_kernel[(batch * group,)](
        x, weight, dyhat, residual_grad if residual_grad is not None else dyhat, mean, rstd,
        dx, dw_part, part, sync, length, dilation, tiling["n_tiles"], tiling["n_pb"], group,
        HAS_RES=residual_grad is not None, C=channels, P=tiling["P"],
        BLOCK_G=_block_g(group), num_warps=1, num_stages=1)
    # Fixed-order fp32 sum over programs: deterministic, as the reference's.
    return dx, dw_part.sum(dim=0).t().reshape(channels, 1, 3).to(weight.dtype)


# ----------------------------------------------------------------------------------------------
# The measurement
# ----------------------------------------------------------------------------------------------


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a − b| over the largest |b|."""
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _measure(shape: object, rows_list: list[int], groups: list[int], rounds: int,
             flush: Callable[[], None]) -> dict[str, object]:
    """One shape: copy, the reference's loop kernels and every (P, group) shift variant."""
    from grader.config import load_config
    from reference.plans import plan_for
    from reference.tuning.timing import conv_norm_inputs, quantiles, time_interleaved
    from task.inputs import DTYPES

    eps, channels = load_config().block.eps, load_config().block.channels
    d = shape.dilation
    x, w, g = conv_norm_inputs(shape.batch, shape.length, channels, DTYPES[shape.dtype],
                               torch.device("cuda"), seed=2)
    n_bytes = x.numel() * x.element_size()
    plan = plan_for(x.device, x.dtype, shape.batch, shape.length, channels, d)
    yhat, mean, rstd = conv_norm_forward(x, w, d, eps, plan)
    dx, dw = conv_norm_backward(g, x, w, mean, rstd, d, plan)
    dst = torch.empty_like(x)
    fns: dict[str, Callable[[], object]] = {
        "copy": lambda: dst.copy_(x),
        "fwd:loop": lambda: conv_norm_forward(x, w, d, eps, plan),
        "bwd:loop": lambda: conv_norm_backward(g, x, w, mean, rstd, d, plan)}
    checks: dict[str, dict[str, float]] = {}
    for rows in rows_list:
        for group in groups:
            tag = f"P{rows}g{group}"
            y2, _, r2 = forward_shift(x, w, d, eps, rows, group)
            dx2, dw2 = backward_shift(g, x, w, mean, rstd, d, None, rows, group)
            checks[tag] = {"yhat": _rel(y2, yhat), "rstd": _rel(r2, rstd), "dx": _rel(dx2, dx),
                           "dw": _rel(dw2, dw)}
            fns[f"fwd:{tag}"] = (lambda rows=rows, group=group:
                                 forward_shift(x, w, d, eps, rows, group))
            fns[f"bwd:{tag}"] = (lambda rows=rows, group=group:
                                 backward_shift(g, x, w, mean, rstd, d, None, rows, group))
    med = {k: quantiles(v)["median"]
           for k, v in time_interleaved(fns, rounds, 3, flush, hide_launch=True).items()}
    copy_gbs = 2 * n_bytes / med["copy"] / 1e6
    fraction = {k: (2 if k.startswith("fwd") else 4) * n_bytes / t / 1e6 / copy_gbs
                for k, t in med.items() if k != "copy"}
    print(f"{shape.label} (plan {plan.to_dict()}) copy {copy_gbs:.0f} GB/s", flush=True)
    for k in fraction:
        print(f"  {k:14s} {med[k]:.3f} ms {fraction[k]:5.0%}  "
              f"{checks.get(k.split(':')[1], '')}", flush=True)
    return {"shape": shape.label, "plan": plan.to_dict(), "median_ms": med,
            "copy_gbs": copy_gbs, "copy_fraction": fraction, "vs_loop": checks}


def main(argv: list[str] | None = None) -> int:
    from bench.step_limit import select_shapes
    from reference.tuning.timing import HIDE_LAUNCH_FLUSH_BYTES, make_l2_flush

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="h200")
    p.add_argument("--shapes", default="", help="comma-separated labels; default: every shape")
    p.add_argument("--rows", default="8,16", help="chain positions a tile (P) to try")
    p.add_argument("--groups", default="33,66,132", help="programs an example to try")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench/conv_norm_shift.py times GPU kernels: it needs a CUDA GPU")
    shapes = select_shapes(args.profile, args.shapes)
    flush = make_l2_flush(torch.device("cuda"), HIDE_LAUNCH_FLUSH_BYTES)
    rows_list = [int(r) for r in args.rows.split(",")]
    groups = [int(n) for n in args.groups.split(",")]
    results = [_measure(s, rows_list, groups, args.rounds, flush) for s in shapes]
    if args.out is not None:
        args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(),
                                        "torch": torch.__version__, "rounds": args.rounds,
                                        "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
