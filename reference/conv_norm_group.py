"""The per-example statistics both conv+norm kernel families share (`reference/conv_norm.py`'s
loop kernels and `reference/conv_norm_chain.py`'s chain kernels): the shift K that keeps the
moments' digits, per-tile moments Chan-combined into a program's, and the group barrier that
combines a group's partials in member order (deterministic). The design and the numerics are
described in `reference/conv_norm.py`'s docstring.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _load_taps(W, cols, col_ok):
    """The three conv taps of each column as fp32 row vectors, shape (1, BLOCK_C)."""
    w0 = tl.load(W + cols * 3 + 0, mask=col_ok, other=0.0).to(tl.float32)
    w1 = tl.load(W + cols * 3 + 1, mask=col_ok, other=0.0).to(tl.float32)
    w2 = tl.load(W + cols * 3 + 2, mask=col_ok, other=0.0).to(tl.float32)
    return w0[None, :], w1[None, :], w2[None, :]



@triton.jit
def _example_shift(X_b, W, L, C, d, BLOCK_C: tl.constexpr):
    """K = mean of y over one row's first BLOCK_C channels: a typical value of the example.

    The row is l = d when all three taps of it are inside the example (2d < L; otherwise every
    row is an edge row and any will do): an edge row misses a tap, and with a large common
    offset its y sits a third of the offset away from the bulk. Tile sums of y − K then stay
    small, so the tile means keep their digits.
    """
    l_k = tl.minimum(d, tl.maximum(L - 1 - d, 0))
    cols = tl.arange(0, BLOCK_C)
    ok = cols < C
    w0, w1, w2 = _load_taps(W, cols, ok)
    x_m = tl.load(X_b + (l_k - d) * C + cols, mask=ok & (l_k >= d), other=0.0).to(tl.float32)
    x_0 = tl.load(X_b + l_k * C + cols, mask=ok, other=0.0).to(tl.float32)
    x_p = tl.load(X_b + (l_k + d) * C + cols, mask=ok & (l_k + d < L), other=0.0)
    y = w0 * x_m[None, :] + w1 * x_0[None, :] + w2 * x_p.to(tl.float32)[None, :]
    return tl.sum(y) / tl.minimum(C, BLOCK_C)


@triton.jit
def _take_ticket(SYNC, group):
    """This program's ticket from the launch's counter, its example b and its member index.

    Tickets are handed out in the order programs start, so every member of a group with an
    earlier ticket is already resident: what makes `_group_barrier` deadlock-free."""
    ticket = tl.atomic_add(SYNC, 1).to(tl.int64)
    return ticket, ticket // group, (ticket % group).to(tl.int32)


@triton.jit
def _group_barrier(ARRIVE, group):
    """Count this program in and spin until all ``group`` programs of the example arrived.

    Release on arrival publishes this program's partials; acquire while polling makes the
    others' partials visible. Waits only on programs with earlier or later tickets of the same
    example, all resident by the ticket order, so it cannot deadlock (see
    `reference/conv_norm.py`'s docstring).
    """
    # Every thread's partial stores must precede the (single-thread) releasing atomic.
    tl.debug_barrier()
    arrived = tl.atomic_add(ARRIVE, 1, sem="release", scope="gpu") + 1
    while arrived < group:
        arrived = tl.atomic_add(ARRIVE, 0, sem="acquire", scope="gpu")


@triton.jit
def _add_tile_moments(n_p, mean_p, m2_p, v, ok, n_t):
    """Chan-combine a tile's (count, mean, M2) into a running one. The tile's moments are
    two-pass (the tile is in registers), so any spread of tile means is safe; v is zero where
    not ok, and n_t counts the ok elements."""
    mean_t = tl.sum(v) / tl.maximum(n_t, 1.0)
    m2_t = tl.sum(tl.where(ok, (v - mean_t) * (v - mean_t), 0.0))
    n_pt = n_p + n_t
    delta = mean_t - mean_p
    mean_p += delta * n_t / tl.maximum(n_pt, 1.0)
    m2_p += m2_t + delta * delta * n_p * n_t / tl.maximum(n_pt, 1.0)
    return n_pt, mean_p, m2_p


@triton.jit
def _group_moments(PART, SYNC, ticket, b, group, n_p, mean_p, m2_p, eps,
                   BLOCK_G: tl.constexpr):
    """Publish this program's (count, mean, M2), wait for the example's group, and combine all
    of them in member order (deterministic): the example's mean (of the shifted values) and
    rstd. PART is (B·group, 3) fp32, SYNC the ticket counter then one arrival per example."""
    tl.store(PART + ticket * 3 + 0, n_p)
    tl.store(PART + ticket * 3 + 1, mean_p)
    tl.store(PART + ticket * 3 + 2, m2_p)
    _group_barrier(SYNC + 1 + b, group)
    g = tl.arange(0, BLOCK_G)
    P_b = PART + b * group * 3
    n_i = tl.load(P_b + g * 3 + 0, mask=g < group, other=0.0, cache_modifier=".cg")
    mean_i = tl.load(P_b + g * 3 + 1, mask=g < group, other=0.0, cache_modifier=".cg")
    m2_i = tl.load(P_b + g * 3 + 2, mask=g < group, other=0.0, cache_modifier=".cg")
    n = tl.sum(n_i)
    mean_s = tl.sum(n_i * mean_i) / n
    var = (tl.sum(m2_i) + tl.sum(n_i * (mean_i - mean_s) * (mean_i - mean_s))) / n
    return mean_s, 1.0 / tl.sqrt(var + eps)


@triton.jit
def _group_c1_c2(PART, SYNC, ticket, b, group, acc_1, acc_2, L, C, BLOCK_G: tl.constexpr):
    """Publish this program's Σ yhat·dyhat and Σ dyhat (the sums of acc_1 and acc_2, any
    shape), wait for the example's group, and sum all of them in member order: c1 and c2, the
    means over the example's L·C elements."""
    tl.store(PART + ticket * 2 + 0, tl.sum(acc_1))
    tl.store(PART + ticket * 2 + 1, tl.sum(acc_2))
    _group_barrier(SYNC + 1 + b, group)
    g = tl.arange(0, BLOCK_G)
    P_b = PART + b * group * 2
    n = L * C * 1.0  # fp32 count (L·C ≤ 2³¹)
    c1 = tl.sum(tl.load(P_b + g * 2 + 0, mask=g < group, other=0.0, cache_modifier=".cg")) / n
    c2 = tl.sum(tl.load(P_b + g * 2 + 1, mask=g < group, other=0.0, cache_modifier=".cg")) / n
    return c1, c2
