"""Why a block's steps cost more around their event windows than another's (a diagnostic).

A held step (`grader.child.steps.Hold`) is enqueued whole behind a GPU-side wait before the
parent releases it; the parent's wall then runs from the release. A block whose step makes the
host wait on the GPU mid-step (a synchronizing call: a copy to the host, ``cudaFree`` from the
caching allocator, a blocking query) cannot be enqueued ahead: its host finishes enqueueing only
after the release, and that time lands outside the event window but inside the wall.

For each block (plain `task.model`, the scoring `reference.block`, `reference.ceiling`), on one
shape: the host's time to enqueue one step with the device idle and with the device busy behind
``torch.cuda._sleep`` (equal when nothing in the step waits for the device; about the sleep
when something does), and the synchronizing calls PyTorch itself reports
(``torch.cuda.set_sync_debug_mode``).

    python bench/timing/held_step_diag.py --shape 32x4096x128:d1:float32
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from reference.block import DilatedResidualBlock as ScoringBlock  # noqa: E402
from reference.ceiling import CeilingBlock  # noqa: E402
from task.model import DilatedResidualBlock as PlainBlock  # noqa: E402

BLOCKS = {"plain": PlainBlock, "scoring": ScoringBlock, "ceiling": CeilingBlock}


def enqueue_ms(block: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor,
               sleep_cycles: int) -> float:
    """Host time to enqueue one forward and backward, the device busy for ``sleep_cycles``."""
    torch.cuda.synchronize()
    leaf = x.detach().requires_grad_(True)
    for p in block.parameters():
        p.grad = None
    if sleep_cycles:
        torch.cuda._sleep(sleep_cycles)
    t0 = time.perf_counter()
    out = block(leaf)
    out.backward(grad)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return 1e3 * (t1 - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="32x4096x128:d1:float32", help="BxLxC:dD:dtype")
    p.add_argument("--sleep-ms", type=float, default=30.0)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    dims, dil, dtype = args.shape.split(":")
    b, length, c = (int(v) for v in dims.split("x"))
    dtype_ = getattr(torch, dtype)
    clock_khz = torch.cuda.get_device_properties(0).clock_rate  # kHz
    cycles = int(args.sleep_ms * clock_khz)
    x = torch.randn(b, length, c, device="cuda", dtype=dtype_)
    grad = torch.randn_like(x)
    rows = {}
    for name, cls in BLOCKS.items():
        torch.manual_seed(0)
        block = cls(channels=c, dilation=int(dil[1:])).to("cuda", dtype_)
        for _ in range(3):
            enqueue_ms(block, x, grad, 0)
        idle = [enqueue_ms(block, x, grad, 0) for _ in range(args.reps)]
        busy = [enqueue_ms(block, x, grad, cycles) for _ in range(args.reps)]
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            enqueue_ms(block, x, grad, 0)
        torch.cuda.set_sync_debug_mode("default")
        rows[name] = {"idle_ms": sorted(idle)[len(idle) // 2],
                      "busy_ms": sorted(busy)[len(busy) // 2],
                      "syncs": sorted({str(w.message)[:160] for w in caught})}
        print(f"{name}: enqueue {rows[name]['idle_ms']:.3f} ms idle, "
              f"{rows[name]['busy_ms']:.3f} ms behind a {args.sleep_ms:g} ms sleep; "
              f"syncs reported: {rows[name]['syncs']}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"shape": args.shape, "sleep_ms": args.sleep_ms,
                                        "blocks": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
