"""Stage 3, time (GPU): interleaved rounds in carry-over-balanced orders, the L2 flushed before
every sample, CUDA events around conv+norm forward+backward; plus `precompile`, which fills
Triton's cache in parallel before any timing. The benchmarks in `bench/` time with these too.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from grader.orders import williams_orders
from reference.plans import Plan, device_info
from reference.tuning.shapes import TuneShape
from task.inputs import DTYPES

log = logging.getLogger(__name__)

# Interleaved rounds per candidate, and untimed runs of each first.
DEFAULT_ROUNDS = 20
DEFAULT_WARMUP = 3
# L2 flush buffer: at least twice the L2 and never under this.
MIN_FLUSH_BYTES = 256 << 20
# Flush size when it must also cover the host's launch latency (see `time_interleaved`).
HIDE_LAUNCH_FLUSH_BYTES = 1 << 30
TIMING_NEEDS_GPU = "timing needs a GPU: candidates were gated, nothing was timed or promoted"


def make_l2_flush(device: torch.device, min_bytes: int = MIN_FLUSH_BYTES) -> Callable[[], None]:
    """A function that evicts the L2 by writing a buffer of at least twice its size."""
    l2 = device_info(device).l2_bytes
    buf = torch.empty(max(2 * l2, min_bytes) // 4, dtype=torch.int32, device=device)

    def flush() -> None:
        buf.zero_()

    return flush


def time_interleaved(fns: Mapping[str, Callable[[], object]], rounds: int, warmup: int,
                     flush: Callable[[], None],
                     prepare: Mapping[str, Callable[[], object]] | None = None,
                     wall_clock: bool = False, hide_launch: bool = False
                     ) -> dict[str, list[float]]:
    """Per-round times (ms) of each function: warm-up, then rounds in carry-over-balanced orders
    (`grader.orders.williams_orders`: each name runs right after every other equally often).

    Each sample: run its ``prepare`` (e.g. clear gradients), flush L2, wait for the device, record
    a start event, run, record an end event, wait for it. Everything outside the two events stays
    out of the sample.

    Args:
        fns: What to time, by name.
        rounds: Samples per function.
        warmup: Untimed runs of each function first.
        flush: Evicts the L2.
        prepare: Optional per-name setup run before each sample (and each warm-up run).
        wall_clock: Time with ``time.perf_counter`` instead of CUDA events (CPU smoke runs only;
            such numbers say nothing about a GPU).
        hide_launch: Do not wait for the device between the flush and the start event: the
            flush (≥ 1 GiB written, ~0.25 ms on an H200) keeps the GPU busy while the host
            launches, so the sample is device time alone. Right for comparing kernels; a
            training step (as the grader times it) includes its host overhead, so leave it off.
    """
    names = list(fns)
    prepare = prepare or {}

    def setup(name: str) -> None:
        if name in prepare:
            prepare[name]()

    for _ in range(warmup):
        for name in names:
            setup(name)
            fns[name]()
    if not wall_clock:
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
    samples: dict[str, list[float]] = {name: [] for name in names}
    orders = williams_orders(names)
    for i in range(rounds):
        for name in orders[i % len(orders)]:
            setup(name)
            flush()
            if wall_clock:
                t0 = time.perf_counter()
                fns[name]()
                samples[name].append((time.perf_counter() - t0) * 1e3)
                continue
            if not hide_launch:
                torch.cuda.synchronize()
            start.record()
            fns[name]()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end))
    return samples


def quantiles(values: Sequence[float]) -> dict[str, float]:
    """Median, p20 and p80 of samples (linear interpolation)."""
    ordered = sorted(values)

    def q(p: float) -> float:
        pos = p * (len(ordered) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    return {"median": q(0.5), "p20": q(0.2), "p80": q(0.8)}


def median(values: Sequence[float]) -> float:
    """Median of samples (the mean of the middle two for an even count)."""
    ordered = sorted(values)
    n = len(ordered)
    return 0.5 * (ordered[(n - 1) // 2] + ordered[n // 2])


def conv_norm_inputs(batch: int, length: int, channels: int, dtype: torch.dtype,
                     device: torch.device, seed: int = 0
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random (x, conv taps, dŷ) for timing conv+norm: x and dŷ standard normal, taps uniform
    in [-0.5, 0.5), drawn on the CPU from ``seed`` (the same values on any device)."""
    gen = torch.Generator().manual_seed(seed)
    dims = (batch, length, channels)
    x = torch.randn(dims, generator=gen).to(device, dtype)
    w = (torch.rand((channels, 1, 3), generator=gen) - 0.5).to(device, dtype)
    dyhat = torch.randn(dims, generator=gen).to(device, dtype)
    return x, w, dyhat


def conv_norm_step(plan: Plan, shape: TuneShape, device: torch.device, eps: float = 1e-5,
                   seed: int = 0) -> Callable[[], None]:
    """conv+norm forward then backward with ``plan`` on fresh random data of ``shape``."""
    from reference.conv_norm import conv_norm_backward, conv_norm_forward

    x, w, dyhat = conv_norm_inputs(shape.batch, shape.length, shape.channels,
                                   DTYPES[shape.dtype], device, seed)

    def step() -> None:
        _, mean, rstd = conv_norm_forward(x, w, shape.dilation, eps, plan)
        conv_norm_backward(dyhat, x, w, mean, rstd, shape.dilation, plan)

    return step


def _compile_one(task: tuple[dict[str, int], tuple[int, int, int, int, str], float, str]) -> str:
    """Worker: launch conv+norm forward and backward once with a plan on a shape, so Triton
    compiles both kernels into its on-disk cache. Returns "" or the error."""
    fields, (batch, length, channels, dilation, dtype), eps, device = task
    try:
        step = conv_norm_step(Plan(**fields), TuneShape(batch, length, channels, dilation, dtype),
                              torch.device(device), eps)
        step()
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - reported back; the gate will fail it properly
        return repr(exc)[:300]
    return ""


def precompile(tasks: Sequence[tuple[Plan, TuneShape]], workers: int, eps: float = 1e-5,
               device: str = "cuda") -> None:
    """Compile the kernels of many (plan, shape) pairs in parallel worker processes.

    Triton compiles on first launch, single-threaded and holding the GIL (about 1.5–2.5 s per
    kernel variant), and every plan × shape is a variant; in one process a tuning run would
    spend most of its time compiling. The workers fill Triton's on-disk cache, which the main
    process then reads. Runs before any timing, so the workers' GPU work disturbs nothing.
    (On the CPU, under the interpreter, it only exercises the mechanism: nothing is compiled.)
    """
    if workers <= 0 or not tasks:
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    payloads = [(plan.to_dict(), (s.batch, s.length, s.channels, s.dilation, s.dtype), eps,
                 device) for plan, s in tasks]
    start = time.monotonic()
    ctx = multiprocessing.get_context("spawn")  # CUDA cannot be used in forked children
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx) as pool:
        errors = list(pool.map(_compile_one, payloads))
    for (plan, shape), error in zip(tasks, errors, strict=True):
        if error:
            log.warning("precompile %s %s: %s", shape.label, plan.to_dict(), error)
    log.info("precompiled %d plan×shape pairs with %d workers in %.1f s", len(tasks),
             min(workers, len(tasks)), time.monotonic() - start)
