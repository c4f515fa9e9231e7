"""Benchmark the scoring reference (`reference.block`) against eager PyTorch, torch.compile and
the step limit, and its conv+norm kernels against the copy roofline.

For every timing shape of the chosen `scoring.yaml` profiles (default ``h200`` then ``l4``):

1. **Full training step** (forward, then backward with a dense random upstream gradient, all four
   gradients) of the frozen block in eager PyTorch (``task.model``), ``torch.compile`` of the
   frozen block in two modes, ``compile`` (the default mode) and ``compile_max_autotune``
   (``mode="max-autotune-no-cudagraphs"``: Inductor also autotunes its matmul and kernel
   choices, without CUDA graphs), and the reference block (``reference.block``). Each compiled
   variant's compile time is measured on its first step and reported apart, never in the step
   time. The reference is entered twice under two names, so the ratio of the two is the run's
   noise floor. A cold compile costs tens of seconds per shape and mode (max-autotune more), so
   ``--warm-compile-only`` compiles every shape in both modes side by side in worker processes
   first (their cold times are what ``--compile-times`` reports) and the timed run then finds the
   graphs and autotuning choices in the on-disk caches; ``--compile-profiles h200`` limits
   compile to the profile whose target it is, where device time is short.
2. **Step limit** (`bench/step/step_limit.py`, whose functions this script calls): the fastest a
   step could be on this GPU, the larger of a memory floor, 5·N·e bytes over the copy bandwidth, and
   a compute floor, six GEMMs of 2·(B·L)·C·(E·C) FLOPs over the dense matmul rate of the shape's
   dtype (a large square ``torch.matmul`` under the default flags: fp32 without TF32). Both rates
   are measured in this run, once before the first shape (the matmul rate once per dtype), not
   per shape; every shape reports both floors, the limit, and each variant's step over it.
3. **conv+norm kernels alone**, forward and backward separately, with the plan the reference
   would pick (the frozen table, else the heuristic) and, where that differs, the heuristic plan,
   next to a device-to-device copy of the same tensor size, all in the same rounds. Bandwidth
   comes from a bytes model (CONTRACT §8):

       forward   reads x, writes ŷ               2·N·e bytes
       backward  reads dŷ, ŷ, x, writes dx       4·N·e bytes
       copy      reads src, writes dst           2·N·e bytes

   with N = B·L·C elements of e bytes (conv taps and per-example statistics are negligible).
   The reference backward recomputes ŷ from x rather than reading it, so its own DRAM minimum is
   3·N·e; the model's 4·N·e is what any implementation of the block's math is charged.
   Three backwards are timed: ``bwd``, the kernel alone computing the normalization's c1 and c2
   in a first pass of its own (two sweeps over x and dŷ); ``bwd_block``, the backward as the
   scoring reference (`reference.block`) runs it: the same, with the residual's gradient added
   into dx in the kernel; and ``bwd_ceiling``, the backward as the ceiling
   (`reference.ceiling`) runs it: c1 and c2 given (its GELU's backward computes them,
   `reference/norm_grad.py`) and the residual's gradient added, one sweep that reads dŷ, x and
   the residual gradient and writes dx. Each is charged 4·N·e. The target is judged on the
   forward and ``bwd_block`` (issue 41: the scoring reference's conv+norm at ≥ 80% of copy).

Timing: CUDA events around each sample, warm-up first, L2 flushed before every sample (outside
the window; 1 GiB written, which for the kernels alone also hides the host's launch latency so
they are charged device time only, while a full step waits for the device first and so includes
its host overhead, as the grader times it), interleaved rounds in carry-over-balanced orders
(each variant runs right after every other equally often), medians with p20/p80, and a paired
bootstrap interval for every ratio.

Targets printed, on every h200-profile shape (issue 17; CONTRACT §8):

- reference step ≤ 1.3 × step limit in float32, ≤ 2 × in bfloat16;
- reference step ≥ 2× faster than torch.compile, the faster of its two modes, and (CONTRACT §8's
  floor) no slower than it;
- conv+norm forward and backward (as the block runs it) each ≥ 80% of copy bandwidth.

Usage (GPU)::

    python bench/step/reference_step.py [--profiles h200,l4] [--rounds 24] [--out-dir bench/results]
                              [--tag h200] [--deadline-s 150]

``--smoke`` runs the smoke profile on the CPU through the Triton interpreter with wall-clock
timing (set ``TRITON_INTERPRET=1`` first): it exercises the script, rates and step limits
included, and its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
# The repository's root, for grader/, reference/, task/ and bench/ (run as a script, only this
# file's folder is on sys.path).
sys.path.insert(0, str(ROOT))

from bench.step.reference_report import (  # noqa: E402
    STEP_NAMES,
    BenchShape,
    ShapeResult,
    block_bwd_fraction,
    markdown,
    targets,
)
from bench.step.step_limit import (  # noqa: E402
    COMPILE_MODES,
    LIMIT_MODEL,
    LimitShape,
    Rates,
    StepLimit,
    measure_rates,
    step_setup,
)
from grader.config import load_config  # noqa: E402
from grader.stats import ratio_estimate  # noqa: E402
from reference.plans import (  # noqa: E402
    Plan,
    device_info,
    heuristic_plan,
    plan_for,
    shape_class,
    table_for_gpu,
)
from reference.tuning.shapes import TuneShape  # noqa: E402
from reference.tuning.timing import (  # noqa: E402
    HIDE_LAUNCH_FLUSH_BYTES,
    conv_norm_inputs,
    make_l2_flush,
    precompile,
    quantiles,
    time_interleaved,
)
from task.inputs import DTYPES  # noqa: E402

# Bytes per element moved by each kernel, in units of N·e (see the module docstring).
BYTES_MODEL = {"fwd": 2, "bwd": 4, "bwd_block": 4, "bwd_ceiling": 4, "copy": 2}
# CPU smoke: rates from sizes that take milliseconds there (meaningless, but the path runs).
SMOKE_RATES = {"copy_bytes": 8 << 20, "matmul_n": 256, "reps": 3}


def bench_shapes(profiles: Sequence[str]) -> list[BenchShape]:
    """Timing shapes of the profiles, in profile order, each shape once."""
    config = load_config()
    seen: dict[tuple[int, int, int, str], list[str]] = {}
    for name in profiles:
        if name not in config.timing.profiles:
            raise SystemExit(f"profile {name!r} is not one of {sorted(config.timing.profiles)}")
        for s in config.timing.profiles[name].shapes:
            seen.setdefault((s.batch, s.length, s.dilation, s.dtype), []).append(name)
    return [BenchShape(b, l, d, dt, tuple(p)) for (b, l, d, dt), p in seen.items()]


def model_bytes(kind: str, numel: int, element_size: int) -> int:
    """Bytes the bytes model charges a kernel (``fwd``, ``bwd`` or ``copy``)."""
    return BYTES_MODEL[kind] * numel * element_size


def _ratio(samples: dict[str, list[float]], num: str, den: str) -> dict[str, float]:
    est = ratio_estimate(samples[num], samples[den])
    return {"value": est.value, "ci_low": est.ci.low, "ci_high": est.ci.high}


# ----------------------------------------------------------------------------- full step


def _step(block: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        block(x).backward(grad)

    return run


def _clear(block: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        block.zero_grad(set_to_none=True)
        x.grad = None

    return run


@dataclass
class StepTimes:
    """What `measure_steps` measured on one shape."""

    samples: dict[str, list[float]]  # per-round step times (ms) by variant
    compile_s: dict[str, float]  # first step of each compiled variant, seconds
    vs_eager_rel: dict[str, float]  # the reference's agreement with eager, per tensor


def _first_step_s(step: Callable[[], None], clear: Callable[[], None],
                  device: torch.device) -> float:
    """Seconds of a compiled block's first step, which compiles its forward and backward graphs
    (or loads them from the on-disk caches)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    clear()
    sync()
    t0 = time.perf_counter()
    step()
    sync()
    return time.perf_counter() - t0


def measure_steps(shape: BenchShape, channels: int, device: torch.device, rounds: int,
                  warmup: int, flush: Callable[[], None], wall_clock: bool,
                  with_compile: bool) -> StepTimes:
    """Per-round step times of eager, both compile modes and the reference (twice); compile
    seconds; the reference's agreement with eager."""
    from reference.block import DilatedResidualBlock as ReferenceBlock
    from task.model import DilatedResidualBlock as FrozenBlock

    setup = step_setup(shape, channels, device)
    blocks: dict[str, torch.nn.Module] = {"eager": setup.build(FrozenBlock)}
    reference = setup.build(ReferenceBlock)
    blocks["reference"] = blocks["reference_again"] = reference
    modes = COMPILE_MODES if with_compile else {}
    if modes:
        torch._dynamo.reset()  # each shape compiles from a clean state: compile time is its own
    for name, mode in modes.items():
        blocks[name] = torch.compile(setup.build(FrozenBlock), mode=mode)
    leaves = {name: setup.x.clone().requires_grad_(True) for name in blocks}
    fns = {name: _step(block, leaves[name], setup.grad) for name, block in blocks.items()}
    prepare = {name: _clear(block, leaves[name]) for name, block in blocks.items()}
    compile_s = {name: _first_step_s(fns[name], prepare[name], device) for name in modes}
    order = [n for n in STEP_NAMES if n in fns]
    samples = time_interleaved({n: fns[n] for n in order}, rounds, warmup, flush,
                               prepare=prepare, wall_clock=wall_clock)
    return StepTimes(samples, compile_s, agreement(blocks["eager"], reference, setup.x,
                                                   setup.grad))


def agreement(eager: torch.nn.Module, reference: torch.nn.Module, x: torch.Tensor,
              grad: torch.Tensor) -> dict[str, float]:
    """Sanity check of what was timed: the reference's output and gradients against eager's
    (relative L2). The real proof is the tuner's gate against the fp64 oracle."""
    got = {}
    for name, block in (("eager", eager), ("reference", reference)):
        block.zero_grad(set_to_none=True)
        leaf = x.clone().requires_grad_(True)
        out = block(leaf)
        out.backward(grad)
        got[name] = {"out": out.detach(), "grad_x": leaf.grad,
                     **{k: p.grad for k, p in block.named_parameters()}}

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        a, b = a.double(), b.double()
        return float((a - b).norm() / b.norm().clamp_min(1e-30))

    return {k: rel(got["reference"][k], got["eager"][k]) for k in got["eager"]}


# ----------------------------------------------------------------------------- kernels


def measure_kernels(shape: BenchShape, channels: int, device: torch.device, plans: dict[str, Plan],
                    rounds: int, warmup: int, flush: Callable[[], None], wall_clock: bool
                    ) -> dict[str, list[float]]:
    """Per-round times of conv+norm forward and backward under each plan, and of a copy."""
    from reference.conv_norm import conv_norm_backward, conv_norm_forward

    x, w, dyhat = conv_norm_inputs(shape.batch, shape.length, channels, DTYPES[shape.dtype],
                                   device, seed=2)
    dst = torch.empty_like(x)
    eps = load_config().block.eps
    fns: dict[str, Callable[[], object]] = {"copy": lambda: dst.copy_(x)}
    # The block's backward (module docstring): c1, c2 given, the residual's gradient added.
    skip = torch.randn_like(dyhat)
    c12 = torch.randn(shape.batch, 2, device=device, dtype=torch.float32)
    for tag, plan in plans.items():
        _, mean, rstd = conv_norm_forward(x, w, shape.dilation, eps, plan)
        fns[f"fwd:{tag}"] = (lambda p=plan: conv_norm_forward(x, w, shape.dilation, eps, p))
        fns[f"bwd:{tag}"] = (lambda p=plan, m=mean, r=rstd:
                             conv_norm_backward(dyhat, x, w, m, r, shape.dilation, p))
        if tag == "ref":
            # The scoring block's backward: its own c1, c2 pass, the residual's gradient added.
            fns["bwd_block:ref"] = (lambda p=plan, m=mean, r=rstd: conv_norm_backward(
                dyhat, x, w, m, r, shape.dilation, p, residual_grad=skip))
            # The ceiling's: c1 and c2 given by its GELU's backward, one sweep.
            fns["bwd_ceiling:ref"] = (lambda p=plan, m=mean, r=rstd: conv_norm_backward(
                dyhat, x, w, m, r, shape.dilation, p, residual_grad=skip, c12=c12))
    # Device time alone: the flush hides the launchers' host overhead (bandwidth is a device
    # property; the full step above includes host overhead, as the grader times it).
    return time_interleaved(fns, rounds, warmup, flush, wall_clock=wall_clock,
                            hide_launch=not wall_clock)


def kernel_plans(shape: BenchShape, channels: int, device: torch.device
                 ) -> tuple[dict[str, Plan], str]:
    """The plan the reference picks (and whence), plus the heuristic's when it differs."""
    dtype = DTYPES[shape.dtype]
    info = device_info(device)
    chosen = plan_for(device, dtype, shape.batch, shape.length, channels, shape.dilation)
    heuristic = heuristic_plan(info, dtype, shape.batch, shape.length, channels, shape.dilation)
    table = table_for_gpu(info.name) if device.type == "cuda" else None
    cls = shape_class(shape.batch, shape.length, channels, shape.dilation)
    source = "table" if table is not None and table.lookup(dtype, cls) is not None else "heuristic"
    plans = {"ref": chosen}
    if heuristic != chosen:
        plans["heuristic"] = heuristic
    return plans, source


# ----------------------------------------------------------------------------- one shape


def run_shape(shape: BenchShape, channels: int, device: torch.device, rounds: int, warmup: int,
              flush: Callable[[], None], wall_clock: bool, with_compile: bool,
              rates: Rates) -> ShapeResult:
    """Every measurement of one shape, summarised."""
    result = ShapeResult(shape)
    times = measure_steps(shape, channels, device, rounds, warmup, flush, wall_clock, with_compile)
    summarise_steps(result, times, rates.limit(shape, channels, load_config().block.expansion))
    if device.type == "cuda":
        torch.cuda.empty_cache()
    plans, result.plan_source = kernel_plans(shape, channels, device)
    kernels = measure_kernels(shape, channels, device, plans, rounds, warmup, flush, wall_clock)
    summarise_kernels(result, kernels, plans, channels)
    return result


def summarise_steps(result: ShapeResult, times: StepTimes, limit: StepLimit) -> None:
    """Fill in ``result``'s step quantiles, its paired ratios and each step over the limit."""
    samples = times.samples
    result.step = {name: quantiles(v) for name, v in samples.items()}
    result.compile_s = dict(times.compile_s)
    result.vs_eager_rel = dict(times.vs_eager_rel)
    result.limit = limit
    result.vs_limit = {name: q["median"] / limit.limit_ms for name, q in result.step.items()}
    result.ratios["eager/reference"] = _ratio(samples, "eager", "reference")
    result.ratios["noise reference/reference_again"] = _ratio(samples, "reference",
                                                              "reference_again")
    for name in COMPILE_MODES:
        if name in samples:
            result.ratios[f"{name}/reference"] = _ratio(samples, name, "reference")
    if "compile" in samples:
        result.ratios["eager/compile"] = _ratio(samples, "eager", "compile")


def summarise_kernels(result: ShapeResult, kernels: dict[str, list[float]],
                      plans: dict[str, Plan], channels: int) -> None:
    """Fill in ``result``'s plans, kernel quantiles, bandwidths and fractions of the copy's."""
    result.plan = plans["ref"].to_dict()
    if "heuristic" in plans:
        result.heuristic = plans["heuristic"].to_dict()
    result.kernels = {name: quantiles(v) for name, v in kernels.items()}
    shape = result.shape
    numel = shape.batch * shape.length * channels
    elt = torch.empty((), dtype=DTYPES[shape.dtype]).element_size()
    for name, q in result.kernels.items():
        kind = name.split(":")[0]
        result.bandwidth_gbs[name] = model_bytes(kind, numel, elt) / (q["median"] * 1e-3) / 1e9
    for name, gbs in result.bandwidth_gbs.items():
        if name != "copy":
            result.copy_fraction[name] = gbs / result.bandwidth_gbs["copy"]
    if "heuristic" in plans:
        for kind in ("fwd", "bwd"):
            result.ratios[f"{kind} heuristic/ref plan"] = _ratio(kernels, f"{kind}:heuristic",
                                                                 f"{kind}:ref")


# ----------------------------------------------------------------------------- compile warm-up


def _limit_compile_threads() -> None:
    """Pool initializer: one Inductor compile thread per warm-up process (they run side by side)."""
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"


def _warm_compile_one(payload: tuple[int, int, int, str, int, str, str]
                      ) -> tuple[str, str, float, str]:
    """Worker: torch.compile the frozen block in one mode on one shape and run one step, filling
    the on-disk Inductor/AOTAutograd/Triton caches (max-autotune's choices included). Returns
    (label, compile variant, cold compile seconds, error)."""
    batch, length, dilation, dtype_name, channels, device_name, name = payload
    shape = LimitShape(batch, length, dilation, dtype_name)
    device = torch.device(device_name)
    try:
        from task.model import DilatedResidualBlock as FrozenBlock

        setup = step_setup(shape, channels, device)
        block = torch.compile(setup.build(FrozenBlock), mode=COMPILE_MODES[name])
        leaf = setup.x.clone().requires_grad_(True)
        seconds = _first_step_s(_step(block, leaf, setup.grad), _clear(block, leaf), device)
        return shape.label, name, seconds, ""
    except Exception as exc:  # noqa: BLE001 - reported; the main run compiles it itself
        return shape.label, name, float("nan"), repr(exc)[:300]


def warm_compile(shapes: Sequence[BenchShape], channels: int, workers: int, timeout_s: float,
                 device: str = "cuda") -> dict[str, dict[str, float]]:
    """Compile every shape's torch.compile graphs in both modes in parallel processes (cold), so
    the timed run finds them in the on-disk caches. Returns each compile variant's cold seconds
    per shape label, as measured in its worker (several compiling side by side: an upper bound on
    a lone cold compile). Shapes go in order, both modes of one before the next, so a timeout
    leaves the first profile's shapes compiled."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, wait

    payloads = [(s.batch, s.length, s.dilation, s.dtype, channels, device, name)
                for s in shapes for name in COMPILE_MODES]
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=max(1, min(workers, len(payloads))), mp_context=ctx,
                               initializer=_limit_compile_threads)
    futures = [pool.submit(_warm_compile_one, payload) for payload in payloads]
    done, pending = wait(futures, timeout=timeout_s)
    times: dict[str, dict[str, float]] = {name: {} for name in COMPILE_MODES}
    for future in done:
        label, name, seconds, error = future.result()
        times[name][label] = seconds
        print(f"warm compile {label} {name}: "
              + (f"ERROR {error}" if error else f"{seconds:.1f} s"), flush=True)
    if pending:
        print(f"warm compile: {len(pending)} compile(s) unfinished after {timeout_s:.0f} s",
              flush=True)
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()  # our own workers: they must not compete with the timed run
    pool.shutdown(wait=False, cancel_futures=True)
    return times


def read_cold_times(path: Path | None) -> dict[str, dict[str, float]]:
    """``--compile-times``: a --warm-compile-only run's cold seconds by compile variant, then
    shape label; empty when not given or not written (the warm-up may have been cut short).

    Raises:
        SystemExit: When the file maps labels straight to seconds, as before the second compile
            mode, or names a variant this script does not time.
    """
    if path is None or not path.exists():
        return {}
    cold = json.loads(path.read_text())
    unknown = sorted(set(cold) - set(COMPILE_MODES))
    flat = sorted(k for k, v in cold.items() if not isinstance(v, dict))
    if unknown or flat:
        raise SystemExit(f"{path}: keys {unknown} are not compile variants {list(COMPILE_MODES)}"
                         f" and {flat} do not map shape labels to seconds; write it again with "
                         "--warm-compile-only")
    return cold


def run_meta(device: torch.device, command: str, args: argparse.Namespace) -> dict[str, Any]:
    """GPU, versions, date, command and method."""
    import triton

    info = device_info(device)
    table = table_for_gpu(info.name) if device.type == "cuda" else None
    meta: dict[str, Any] = {
        "gpu": info.name,
        "sm_count": info.sm_count,
        "l2_mib": info.l2_bytes >> 20,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "method": (f"{args.rounds} interleaved rounds after {args.warmup} warm-up runs, order "
                   "balanced for carry-over (grader/orders.py), L2 flushed before every sample, "
                   + ("wall clock (CPU smoke: meaningless)" if args.smoke else "CUDA events")
                   + "; medians with p20–p80; ratios are medians of per-round paired ratios "
                   "with 95% bootstrap CIs"),
        "plan_table": table.meta if table is not None else "none (heuristic plans)",
    }
    if device.type == "cuda":
        from grader import telemetry

        gpu = telemetry.device_info()
        meta.update(uuid=gpu.uuid, driver=gpu.driver, max_sm_clock_mhz=gpu.max_sm_clock_mhz,
                    max_memory_clock_mhz=gpu.max_memory_clock_mhz,
                    state_before=telemetry.snapshot("before").to_dict())
    return meta


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profiles", default="h200,l4")
    p.add_argument("--shapes", default="",
                   help="only these comma-separated shape labels of the profiles, e.g. "
                        "bfloat16:128x8192:d1 (default: every shape)")
    p.add_argument("--rounds", type=int, default=24)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--tag", help="file stem suffix: reference-<tag>.md/json (default: GPU tag)")
    p.add_argument("--deadline-s", type=float, default=float("inf"),
                   help="start no new shape after this many seconds")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (both modes)")
    p.add_argument("--compile-profiles", default="all",
                   help="torch.compile only the shapes of these comma-separated profiles (a cold "
                        "compile costs tens of seconds per shape); default: every shape")
    p.add_argument("--compile-deadline-s", type=float, default=float("inf"),
                   help="shapes started after this many seconds skip torch.compile (it costs "
                        "seconds per shape; h200 shapes come first)")
    p.add_argument("--warm-compile-only", action="store_true",
                   help="only compile the profiles' shapes with torch.compile, in both modes, in "
                        "parallel worker processes (filling the on-disk caches) and write "
                        "compile-warm.json")
    p.add_argument("--warm-timeout-s", type=float, default=150.0)
    p.add_argument("--compile-times", type=Path,
                   help="compile-warm.json of a --warm-compile-only run: cold compile seconds")
    p.add_argument("--compile-workers", type=int, default=12,
                   help="processes that precompile the reference kernels first (0: none)")
    p.add_argument("--smoke", action="store_true",
                   help="CPU smoke run through the Triton interpreter (numbers are meaningless)")
    return p


def _should_compile(args: argparse.Namespace, shape: BenchShape, elapsed_s: float) -> bool:
    """torch.compile this shape: not disabled, a compile profile's shape, before the deadline."""
    wanted = set(args.compile_profiles.split(","))
    in_scope = "all" in wanted or bool(wanted & set(shape.profiles))
    return not args.no_compile and in_scope and elapsed_s <= args.compile_deadline_s


def _summary(result: ShapeResult, seconds: float) -> str:
    """One progress line per shape."""
    if result.error:
        return f"{result.shape.label}: {seconds:.1f} s ERROR {result.error}"
    steps = ", ".join(f"{name} {result.step[name]['median']:.3f} ms"
                      for name in STEP_NAMES if name in result.step)
    vs_limit = result.vs_limit.get("reference", float("nan"))
    return (f"{result.shape.label}: {seconds:.1f} s {steps}; reference {vs_limit:.2f}x the step "
            f"limit; conv+norm fwd {result.copy_fraction['fwd:ref']:.0%} bwd "
            f"{result.copy_fraction['bwd:ref']:.0%} block bwd {block_bwd_fraction(result):.0%} "
            "of copy")


def _write(paths: tuple[Path, Path], meta: dict[str, Any], results: Sequence[ShapeResult],
           skipped: Sequence[str]) -> None:
    """Write the JSON and markdown results (targets recomputed from what is measured so far)."""
    meta["targets"] = targets(results)
    json_path, md_path = paths
    json_path.write_text(json.dumps({"meta": meta, "results": [r.to_json() for r in results],
                                     "skipped": list(skipped)}, indent=1, default=str) + "\n")
    md_path.write_text(markdown(meta, results, skipped))


def _selected_shapes(labels: str, profiles: Sequence[str]) -> list[BenchShape]:
    """The profiles' shapes, only those of the comma-separated ``labels`` if any are given."""
    shapes = bench_shapes(profiles)
    if not labels:
        return shapes
    wanted = labels.split(",")
    unknown = sorted(set(wanted) - {s.label for s in shapes})
    if unknown:
        raise SystemExit(f"--shapes {unknown} are not shapes of the profiles {list(profiles)}: "
                         f"{[s.label for s in shapes]}")
    return [s for s in shapes if s.label in wanted]


def _device(args: argparse.Namespace) -> tuple[torch.device, list[str], bool]:
    """(device, profiles, wall clock?) for this run."""
    if args.smoke:
        return torch.device("cpu"), ["smoke"], True
    if torch.cuda.is_available():
        return torch.device("cuda"), args.profiles.split(","), False
    raise SystemExit("bench/step/reference_step.py needs a CUDA GPU (or --smoke with "
                     "TRITON_INTERPRET=1)")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    given = argv if argv is not None else sys.argv[1:]
    command = "python bench/step/reference_step.py " + " ".join(given)
    device, profiles, wall_clock = _device(args)
    channels = load_config().block.channels
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.warm_compile_only:
        times = warm_compile(_selected_shapes(args.shapes, profiles), channels, 16,
                             args.warm_timeout_s, device.type)
        (args.out_dir / "compile-warm.json").write_text(json.dumps(times, indent=1) + "\n")
        return 0
    cold = read_cold_times(args.compile_times)
    flush = make_l2_flush(device, min_bytes=(8 << 20) if args.smoke else HIDE_LAUNCH_FLUSH_BYTES)
    tag = args.tag or ("smoke" if args.smoke else device_info(device).name.split()[-1].lower())
    paths = (args.out_dir / f"reference-{tag}.json", args.out_dir / f"reference-{tag}.md")
    meta = run_meta(device, command.strip(), args)
    results: list[ShapeResult] = []
    skipped: list[str] = []
    start = time.monotonic()
    shapes = _selected_shapes(args.shapes, profiles)
    if device.type == "cuda" and args.compile_workers > 0:
        # Triton compiles each plan × shape variant on first launch, serially; fill its cache
        # in parallel first (see reference.tuning.timing.precompile).
        tasks = [(plan, TuneShape(s.batch, s.length, channels, s.dilation, s.dtype))
                 for s in shapes for plan in kernel_plans(s, channels, device)[0].values()]
        precompile(tasks, args.compile_workers, load_config().block.eps)
    # Once per run, not per shape: the limits of all shapes then divide by the same rates.
    rates = measure_rates(device, [s.dtype for s in shapes], **(SMOKE_RATES if args.smoke else {}))
    meta["step_limit_rates"] = asdict(rates)
    meta["step_limit_model"] = LIMIT_MODEL
    for shape in shapes:
        if time.monotonic() - start > args.deadline_s:
            skipped.append(shape.label)
            print(f"deadline: {shape.label} not run", flush=True)
            continue
        t0 = time.monotonic()
        try:
            result = run_shape(shape, channels, device, args.rounds, args.warmup, flush,
                               wall_clock, _should_compile(args, shape, t0 - start), rates)
            result.compile_cold_s = {name: by_label[shape.label]
                                     for name, by_label in cold.items() if shape.label in by_label}
        except Exception as exc:  # noqa: BLE001 - one broken shape must not lose the others
            result = ShapeResult(shape, error=repr(exc)[:300])
        results.append(result)
        print(_summary(result, time.monotonic() - t0), flush=True)
        # Written after every shape: a run stopped by its time limit keeps what it measured.
        _write(paths, meta, results, skipped)
    if device.type == "cuda":
        from grader import telemetry

        meta["state_after"] = telemetry.snapshot("after").to_dict()
    _write(paths, meta, results, skipped)
    print(paths[1].read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
