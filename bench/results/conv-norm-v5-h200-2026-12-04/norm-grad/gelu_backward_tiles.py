"""The GELU backward kernel of reference/norm_grad.py across row blocks and warps, against
PyTorch's gelu_backward, on the h200 shapes' hidden activation (the log beside it). From the
repository root, on a GPU: python <this folder>/gelu_backward_tiles.py
"""

import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import reference.norm_grad as ng  # noqa: E402

L, H, C = 8192, 256, 128


def measure(dtype: torch.dtype, batch: int) -> None:
    h = torch.randn(batch, L, H, device="cuda", dtype=dtype)
    dact = torch.randn_like(h)
    w1 = torch.randn(H, C, device="cuda", dtype=dtype)
    t = triton.testing.do_bench(lambda: torch.ops.aten.gelu_backward(dact, h), rep=200)
    print(dtype, f"torch gelu_backward {t:.3f} ms", flush=True)
    for rows in (2, 4, 8, 16, 32):
        for warps in (4, 8):
            def run(rows: int = rows, warps: int = warps) -> None:
                r = w1.float().sum(dim=1)
                dh = torch.empty_like(h)
                n_lb = triton.cdiv(L, rows)
                part = torch.empty((batch, n_lb, 2), dtype=torch.float32, device="cuda")
                ng._gelu_bwd_sums_kernel[(batch, n_lb)](dact, h, r, dh, part, L, H, n_lb,
                                                         BLOCK_L=rows, BLOCK_H=256,
                                                         num_warps=warps)
            t = triton.testing.do_bench(run, rep=200)
            print(dtype, "rows", rows, "warps", warps, f"{t:.3f} ms", flush=True)


measure(torch.bfloat16, 256)
measure(torch.float32, 64)
