"""One training step of plain PyTorch or the scoring reference, for Nsight Compute; and each
step's host time (issue 41: the modelled L4 g, `bench/step/l4_model.py`).

``--block plain|reference --shape LABEL``: warm-up steps compile the kernels and settle the
allocator outside the profiled range; then one step (forward, backward with a dense upstream
gradient, all four gradients, as the grader times it) runs between
``torch.cuda.profiler.start()`` and ``stop()``, so ``ncu --profile-from-start off`` sees that
step's kernels alone, and their DRAM bytes are the step's::

    ncu --profile-from-start off --cache-control none \\
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \\
        -o plain__float32_8x4096_d1 \\
        python bench/step/step_ncu.py --block plain --shape float32:8x4096:d1

``--cache-control none``: each kernel finds the L2 as the kernel before it left it, as in a
step, so the bytes are what the step moves, not what each kernel would move from a cold cache.

``--host-times FILE``: no profiler; for every shape of the profile and both blocks, the median
host time of issuing one step (the call returns before the GPU is done; the queue is drained
between samples) and of the whole step (synchronised), as JSON. Where the host time exceeds
what the bytes take on the slower GPU, the step is launch-bound there (`bench/step/l4_model.py`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.step.step_limit import LimitShape, select_shapes, step_setup  # noqa: E402
from grader.config import load_config  # noqa: E402

BLOCKS = ("plain", "reference")


def file_stem(block: str, label: str) -> str:
    """``plain__float32_8x4096_d1``: the name of a (block, shape)'s ncu report and CSV."""
    return f"{block}__{label.replace(':', '_')}"


def make_step(block: str, shape: LimitShape, device: torch.device
              ) -> Callable[[], None]:
    """One training step of ``block`` ("plain": the frozen `task.model` block; "reference": the
    scoring reference, `reference.block`) on ``shape``, the gradients dropped before each."""
    if block not in BLOCKS:
        raise SystemExit(f"--block {block!r} is not one of {list(BLOCKS)}")
    if block == "plain":
        from task.model import DilatedResidualBlock as cls
    else:
        from reference.block import DilatedResidualBlock as cls
    setup = step_setup(shape, load_config().block.channels, device)
    module = setup.build(cls)
    x = setup.x.clone().requires_grad_(True)

    def step() -> None:
        module.zero_grad(set_to_none=True)
        x.grad = None
        module(x).backward(setup.grad)

    return step


def profile_one(block: str, shape: LimitShape, warmup: int) -> None:
    """Warm-up steps, then one step inside the profiler's range."""
    step = make_step(block, shape, torch.device("cuda"))
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    step()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def host_times(shapes: list[LimitShape], samples: int, warmup: int) -> dict[str, dict]:
    """Per shape label and block: median ms to issue a step (host) and of the whole step."""
    out: dict[str, dict] = {}
    for shape in shapes:
        out[shape.label] = {}
        for block in BLOCKS:
            step = make_step(block, shape, torch.device("cuda"))
            for _ in range(warmup):
                step()
            issue, whole = [], []
            for _ in range(samples):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                step()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                issue.append((t1 - t0) * 1e3)
                whole.append((time.perf_counter() - t0) * 1e3)
            out[shape.label][block] = {"host_ms": statistics.median(issue),
                                       "step_ms": statistics.median(whole)}
            print(f"{shape.label} {block}: host {out[shape.label][block]['host_ms']:.3f} ms, "
                  f"step {out[shape.label][block]['step_ms']:.3f} ms", flush=True)
            del step
            torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="l4", help="scoring.yaml timing profile")
    p.add_argument("--block", choices=BLOCKS, help="profile one step of this block")
    p.add_argument("--shape", help="the shape's label, e.g. float32:8x4096:d1")
    p.add_argument("--host-times", type=Path, metavar="FILE",
                   help="write every shape's host and step times here instead")
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench/step/step_ncu.py runs steps on a CUDA GPU and found none")
    if args.host_times is not None:
        times = host_times(select_shapes(args.profile, ""), args.samples, args.warmup)
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                "profile": args.profile, "samples": args.samples}
        args.host_times.write_text(json.dumps({"meta": meta, "shapes": times}, indent=1) + "\n")
        return 0
    if args.block is None or args.shape is None:
        raise SystemExit("give --block and --shape (one step under the profiler), or "
                         "--host-times FILE")
    (shape,) = select_shapes(args.profile, args.shape)
    profile_one(args.block, shape, args.warmup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
