"""CPU tests of `bench/conv_norm_shift.py` (conv+norm with the ±d shifts in registers, not yet
timed): its kernels agree with the reference's loop kernels through the Triton interpreter
(examples in one program, as the interpreter runs programs in turn), and compiled for sm_90 its
tile loops hold no block barrier and fewer instructions an element than the reference's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from interpreted import run_interpreted

ROOT = Path(__file__).resolve().parent.parent

CHECK = r"""
import json, math, sys
import torch
sys.path.insert(0, "bench")
from conv_norm_shift import backward_shift, forward_shift
from reference.conv_norm import conv_norm_backward, conv_norm_forward
from reference.plans import Plan

out = []
for dtype, (batch, length, channels, dilation, rows) in [
        (torch.float32, (2, 17, 8, 3, 4)), (torch.float32, (2, 33, 16, 1, 8)),
        (torch.float32, (3, 40, 8, 20, 8)), (torch.float32, (2, 9, 4, 12, 4)),
        (torch.float32, (1, 1, 2, 1, 8)), (torch.float16, (2, 70, 16, 2, 16))]:
    gen = torch.Generator().manual_seed(batch * length + channels)
    x = (torch.randn(batch, length, channels, generator=gen) + 0.5).to(dtype)
    w = (torch.randn(channels, 1, 3, generator=gen) / math.sqrt(3)).to(dtype)
    g = torch.randn(batch, length, channels, generator=gen).to(dtype)
    res = torch.randn(batch, length, channels, generator=gen).to(dtype)
    plan = Plan(fwd_block_rows=4, bwd_block_rows=4, block_c=channels)
    y1, m1, r1 = conv_norm_forward(x, w, dilation, 1e-5, plan)
    y2, m2, r2 = forward_shift(x, w, dilation, 1e-5, rows, 1)
    dx1, dw1 = conv_norm_backward(g, x, w, m1, r1, dilation, plan, res)
    dx2, dw2 = backward_shift(g, x, w, m1, r1, dilation, res, rows, 1)
    def rel(a, b):
        a, b = a.double(), b.double()
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
    out.append({"yhat": rel(y2, y1), "mean": rel(m2, m1), "rstd": rel(r2, r1),
                "dx": rel(dx2, dx1), "dw": rel(dw2, dw1)})
print(json.dumps(out))
"""


def test_shift_kernels_match_the_loop() -> None:
    """Dilations below, at and beyond the length, chains shorter than a tile, one row."""
    results = run_interpreted(["-c", CHECK], timeout=300)
    assert len(results) == 6
    for i, result in enumerate(results):
        bound = 1e-6 if i < 5 else 2e-3  # fp32 rounding; fp16 one rounding of its outputs
        assert all(v <= bound for v in result.values()), (i, result)


def test_shift_loops_have_no_barrier_and_fewer_instructions(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}

    def analyse(*args: str) -> list[dict]:
        out = tmp_path / "sass.json"
        proc = subprocess.run([sys.executable, "bench/conv_norm_sass.py", "--dtype",
                               "float32,bfloat16", *args, "--out", str(out)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(out.read_text())["kernels"]

    shift = analyse("--kernel", "shift", "--fwd", "8x1", "--bwd", "8x1", "--taps-once", "1")
    ref = analyse("--fwd", "32x4", "--bwd", "8x4", "--taps-once", "1")
    for code in shift:
        # The shifts are register renaming: no shared memory round trip, no barrier.
        assert [loop["barriers"] for loop in code["loops"]] == [0, 0], code
    per_element = {(c["kernel"], c["dtype"]): c["loop_instructions_per_element"] for c in ref}
    for code in shift:
        assert code["loop_instructions_per_element"] < per_element[code["kernel"], code["dtype"]]
