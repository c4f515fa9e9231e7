"""The step-limit model (issue #17): the fastest a training step of the block could be on this GPU,
and how far eager PyTorch, torch.compile and the reference are from it.

For a timed shape (B, L, C) with N = B·L·C elements of e bytes and hidden width E·C:

    memory floor   = 5·N·e bytes / copy bandwidth
    compute floor  = 6 GEMMs × 2·(B·L)·C·(E·C) FLOPs / dense matmul rate
    step limit     = max(memory floor, compute floor)

The 5 tensor passes are the least a step must move: the forward reads x and writes out, the
backward reads x and grad_out and writes dx; ŷ, the statistics and the hidden activation can
all be recomputed on chip. The 6 GEMMs are fc1 and fc2 forward and each one's input and weight
gradient backward. Both rates are measured in the same run, on the same GPU: the copy bandwidth
from a large device-to-device copy (read + write, 2 bytes moved per byte copied), the matmul rate
from a large square product of the shape's dtype: for bf16 and fp16 ``torch.matmul`` under the
default flags; for fp32 the fastest product that meets the fp32 budgets (issue 41), of
``torch.matmul`` under the default flags (SIMT fp32: ``torch.backends.cuda.matmul.allow_tf32``
is False by default and this script never sets it; the flags are recorded) and three bf16
products on tensor cores (``bf16x3``: each operand split into bf16 hi + lo, A_hi·B_hi + A_hi·B_lo
+ A_lo·B_hi accumulated in fp32, `reference.split_linear.matmul`, within every fp32 budget on an
H200: bench/results/gemm-precision-h200-2026-12-03). Both fp32 rates are recorded
(``fp32_products``); the faster one sets the floor (``fp32_product`` names it). Plain TF32 is not
a candidate: it misses the fp32 budgets. On a CPU the bf16x3 product is three ``torch.matmul`` of
the bf16 halves (the smoke path runs; its rate means nothing). ``bench/step/reference_step.py``
reports the same limit next to its own step times, with the rates measured once in its run
(`measure_rates`, `Rates.limit`).

With ``--time``, every shape's full training step (forward, backward with a dense upstream
gradient, all four gradients) is timed for the chosen variants: ``eager`` (the frozen block),
``reference`` (`reference.block`, the scoring reference: conv+norm in Triton, the MLP in
PyTorch's ops), ``ceiling`` (`reference.ceiling.CeilingBlock`, the whole-step block, with the
MLP path its device's plan data picks; its ``/ limit`` column is the ceiling's ratio to the
floor), ``reference_fused_mlp`` (reference conv+norm with the fused
MLP of `reference/mlp.py`, built here so it can be timed before the block is wired to it),
``reference_resident_mlp`` (the same with the MLP's resident kernels, 64-row tiles),
``reference_bf16x3_mlp`` (the chunked kernels with fp32 products as three bf16 ones),
``ceiling_split_mlp`` (the ceiling with ``split_mlp`` True: both linears through
`reference.split_linear`, fp32 products as three bf16 ones), ``ceiling_cublas_mlp`` (with
``split_mlp`` False: both linears through cuBLAS), ``ceiling_unfused_residual`` (the
ceiling with ``fuse_residual`` False: autograd adds the residual's gradient to dx in a
pass of its own instead of the conv+norm backward kernel), ``ceiling_two_pass_norm``
(``norm_grad_from_mlp`` False: the normalization gradient's c1 and c2 from the conv+norm
backward's own first pass instead of the GELU's backward, `reference/norm_grad.py`; records
before issue 41 name these four ``reference_*``: the ceiling was then the reference),
``compile`` (torch.compile of the frozen block, default mode) and ``compile_max_autotune``
(mode ``max-autotune-no-cudagraphs``). Interleaved rounds in carry-over-balanced orders, the L2
flushed before every sample, CUDA events, host overhead included (as the grader times a step);
compile time is the first step's and is reported apart. Each variant's output and gradients are
compared with eager's (relative L2) as a sanity check of what was timed.

Usage::

    python bench/step/step_limit.py [--profile h200] [--time] [--variants eager,reference,...]
                               [--rounds 20] [--out-dir bench/results] [--tag h200]
    python bench/step/step_limit.py --dry --copy-gbs 4200 --tflops float32=50,bfloat16=700

``--dry`` needs no GPU: it prints the model's numbers for the given rates. Without ``--dry`` the
script needs CUDA and says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
# First, always: run as a script, this file's folder is sys.path[0].
sys.path.insert(0, str(ROOT))

from grader.config import load_config  # noqa: E402
from task.inputs import DTYPES  # noqa: E402

# Tensor passes of N·e bytes a step must make (see the module docstring).
MEMORY_PASSES = 5
# Matrix products of (B·L)·C·(E·C) multiply-adds in a step (see the module docstring).
GEMMS_PER_STEP = 6
# Copy: 1 GiB, far beyond any L2. Matmul: 8192² operands, large enough for the peak dense rate.
COPY_BYTES = 1 << 30
MATMUL_N = 8192
RATE_REPS = 20
VARIANTS = ("eager", "reference", "ceiling", "reference_fused_mlp", "reference_resident_mlp",
            "reference_bf16x3_mlp", "ceiling_split_mlp", "ceiling_cublas_mlp",
            "ceiling_unfused_residual", "ceiling_two_pass_norm", "compile",
            "compile_max_autotune")
DEFAULT_VARIANTS = ("eager", "reference", "ceiling", "compile", "compile_max_autotune")
# The products an fp32 floor may use: each meets the fp32 budgets (module docstring).
FP32_PRODUCTS = ("fp32", "bf16x3")
COMPILE_MODES = {"compile": None, "compile_max_autotune": "max-autotune-no-cudagraphs"}
LIMIT_MODEL = (f"memory {MEMORY_PASSES}·N·e / copy; compute {GEMMS_PER_STEP}·2·(B·L)·C·(E·C) / "
               "matmul (fp32: the faster of fp32 and bf16x3 products); limit = max")


# ----------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class LimitShape:
    """One timed shape of a profile."""

    batch: int
    length: int
    dilation: int
    dtype: str

    @property
    def label(self) -> str:
        return f"{self.dtype}:{self.batch}x{self.length}:d{self.dilation}"


@dataclass(frozen=True)
class StepLimit:
    """The model's floors for one shape (milliseconds) and which one binds."""

    memory_ms: float
    compute_ms: float
    limit_ms: float
    bound: str  # "memory" or "compute"


def memory_floor_ms(numel: int, element_bytes: int, copy_gbs: float) -> float:
    """MEMORY_PASSES·N·e bytes at the copy bandwidth (GB/s = 1e9 bytes/s), in ms."""
    return MEMORY_PASSES * numel * element_bytes / (copy_gbs * 1e9) * 1e3


def step_flops(rows: int, channels: int, expansion: int) -> int:
    """GEMMS_PER_STEP products of 2·rows·C·(E·C) FLOPs: a step's GEMM work."""
    return GEMMS_PER_STEP * 2 * rows * channels * expansion * channels


def compute_floor_ms(rows: int, channels: int, expansion: int, tflops: float) -> float:
    """`step_flops` at the matmul rate (TFLOP/s), in ms."""
    return step_flops(rows, channels, expansion) / (tflops * 1e12) * 1e3


def step_limit(shape: LimitShape, channels: int, expansion: int, copy_gbs: float,
               tflops: float) -> StepLimit:
    """Both floors of a shape and their maximum."""
    rows = shape.batch * shape.length
    element_bytes = torch.empty((), dtype=DTYPES[shape.dtype]).element_size()
    memory = memory_floor_ms(rows * channels, element_bytes, copy_gbs)
    compute = compute_floor_ms(rows, channels, expansion, tflops)
    return StepLimit(memory, compute, max(memory, compute),
                     "memory" if memory >= compute else "compute")


def profile_shapes(profile: str) -> list[LimitShape]:
    """The timing shapes of a scoring.yaml profile, in its order."""
    profiles = load_config().timing.profiles
    if profile not in profiles:
        raise SystemExit(f"profile {profile!r} is not one of {sorted(profiles)}")
    return [LimitShape(s.batch, s.length, s.dilation, s.dtype) for s in profiles[profile].shapes]


def select_shapes(profile: str, labels: str) -> list[LimitShape]:
    """The shapes of ``--shapes`` (comma-separated labels, in that order; empty: every shape of
    the profile, in its order).

    Raises:
        SystemExit: A label that is not a shape of the profile, with the profile's labels.
    """
    shapes = {s.label: s for s in profile_shapes(profile)}
    wanted = labels.split(",") if labels else list(shapes)
    unknown = sorted(set(wanted) - set(shapes))
    if unknown:
        raise SystemExit(f"--shapes {unknown} are not shapes of {profile!r}: {list(shapes)}")
    return [shapes[label] for label in wanted]


def parse_rates(text: str) -> dict[str, float]:
    """``float32=50,bfloat16=700`` → {"float32": 50.0, "bfloat16": 700.0}.

    Raises:
        SystemExit: On a malformed entry or an unknown dtype.
    """
    rates: dict[str, float] = {}
    for item in filter(None, text.split(",")):
        name, sep, value = item.partition("=")
        if not sep or name not in DTYPES:
            raise SystemExit(f"--tflops entry {item!r} must be <dtype>=<TFLOP/s>, dtype one of "
                             f"{sorted(DTYPES)}")
        rates[name] = float(value)
    return rates


# ----------------------------------------------------------------------------- measured rates


def _once_ms(fn: Callable[[], object], device: torch.device) -> float:
    """One run of ``fn``: CUDA events on a GPU, the wall clock elsewhere (a CPU smoke run, whose
    rates mean nothing)."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _median_ms(fn: Callable[[], object], reps: int, device: torch.device) -> float:
    """Median time of ``fn`` over reps, after one untimed run."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    times = sorted(_once_ms(fn, device) for _ in range(reps))
    return times[len(times) // 2]


def measure_copy_gbs(device: torch.device, nbytes: int = COPY_BYTES, reps: int = RATE_REPS
                     ) -> float:
    """Device-to-device copy bandwidth, GB/s, counting the read and the write."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = _median_ms(lambda: dst.copy_(src), reps, device)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def measure_matmul_tflops(device: torch.device, dtype: torch.dtype, n: int = MATMUL_N,
                          reps: int = RATE_REPS) -> float:
    """Dense rate of an n×n×n ``torch.matmul`` under the process's (default) flags, TFLOP/s."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn((n, n), generator=gen, device=device).to(dtype)
    b = torch.randn((n, n), generator=gen, device=device).to(dtype)
    ms = _median_ms(lambda: torch.matmul(a, b), reps, device)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def _bf16_halves(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """t ≈ hi + lo, both bf16: hi is t rounded, lo the rounding's remainder rounded."""
    hi = t.to(torch.bfloat16)
    return hi, (t - hi.float()).to(torch.bfloat16)


def bf16x3_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a·b of fp32 operands as three bf16 products (A_hi·B_hi + A_hi·B_lo + A_lo·B_hi): on a GPU
    `reference.split_linear.matmul`'s Triton kernel (one launch, fp32 accumulation on chip), on a
    CPU three fp32 ``torch.matmul`` of the bf16-valued halves (the same arithmetic as tensor
    cores: a product of two bf16 values is exact in fp32, the sums are fp32), for the smoke
    path."""
    if a.device.type == "cuda":
        from reference.split_linear import matmul

        return matmul(a, b, precision="bf16x3")
    (a_hi, a_lo), (b_hi, b_lo) = ((h.float(), lo.float()) for h, lo in
                                  (_bf16_halves(a), _bf16_halves(b)))
    return a_hi @ b_hi + a_hi @ b_lo + a_lo @ b_hi


def measure_bf16x3_tflops(device: torch.device, n: int = MATMUL_N, reps: int = RATE_REPS
                          ) -> float:
    """Rate of an n×n×n fp32 product as `bf16x3_matmul`, TFLOP/s (2·n³ useful FLOPs, not the
    three products' 6·n³: the rate an fp32 product runs at)."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn((n, n), generator=gen, device=device)
    b = torch.randn((n, n), generator=gen, device=device)
    ms = _median_ms(lambda: bf16x3_matmul(a, b), reps, device)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def matmul_flags() -> dict[str, Any]:
    """The flags that decide what an fp32 matmul runs on."""
    return {"allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


@dataclass(frozen=True)
class Rates:
    """What the step limit divides by: copy bandwidth (GB/s) and dense matmul rate per dtype name
    (TFLOP/s), with the matmul flags they were measured under and where they come from.

    ``fp32_products`` holds each fp32 candidate's rate (``FP32_PRODUCTS``) where they were
    measured, and ``fp32_product`` names the one ``matmul_tflops["float32"]`` is (the fastest);
    empty and "" when the fp32 rate was given (``--dry``) or no fp32 shape was measured.
    """

    copy_gbs: float
    matmul_tflops: dict[str, float]
    source: str
    flags: dict[str, Any] = field(default_factory=dict)
    fp32_products: dict[str, float] = field(default_factory=dict)
    fp32_product: str = ""

    def limit(self, shape: LimitShape, channels: int, expansion: int) -> StepLimit:
        """The step limit of a shape at these rates.

        Raises:
            ValueError: When no matmul rate was measured or given for the shape's dtype.
        """
        if shape.dtype not in self.matmul_tflops:
            raise ValueError(f"no matmul rate for {shape.dtype} ({shape.label}); rates are "
                             f"for {sorted(self.matmul_tflops)}")
        return step_limit(shape, channels, expansion, self.copy_gbs,
                          self.matmul_tflops[shape.dtype])


def _sig4(value: float) -> float:
    """Four significant figures: far below a rate's run-to-run spread, so a report shows the
    numbers its limits use (and a slow CPU smoke rate does not round to zero)."""
    return float(f"{value:.4g}")


def measure_rates(device: torch.device, dtypes: Sequence[str], copy_bytes: int = COPY_BYTES,
                  matmul_n: int = MATMUL_N, reps: int = RATE_REPS) -> Rates:
    """The copy bandwidth once and the matmul rate once per dtype name, on ``device``; for fp32
    both products of ``FP32_PRODUCTS``, the faster one as the dtype's rate."""
    copy_gbs = measure_copy_gbs(device, copy_bytes, reps)
    tflops = {name: _sig4(measure_matmul_tflops(device, DTYPES[name], matmul_n, reps))
              for name in sorted(set(dtypes))}
    fp32_products: dict[str, float] = {}
    fp32_product = ""
    if "float32" in tflops:
        fp32_products = {"fp32": tflops["float32"],
                         "bf16x3": _sig4(measure_bf16x3_tflops(device, matmul_n, reps))}
        fp32_product = max(FP32_PRODUCTS, key=fp32_products.__getitem__)
        tflops["float32"] = fp32_products[fp32_product]
    return Rates(_sig4(copy_gbs), tflops,
                 source=f"measured in this run ({copy_bytes >> 20} MiB copy, {matmul_n}² matmul, "
                        f"median of {reps})", flags=matmul_flags(),
                 fp32_products=fp32_products, fp32_product=fp32_product)


# ----------------------------------------------------------------------------- step timing


@dataclass
class ShapeReport:
    """Everything known about one shape (times in ms)."""

    shape: LimitShape
    limit: StepLimit
    steps: dict[str, dict[str, float]] = field(default_factory=dict)
    vs_limit: dict[str, float] = field(default_factory=dict)
    compile_s: dict[str, float] = field(default_factory=dict)
    vs_eager_rel: dict[str, float] = field(default_factory=dict)
    error: str = ""


@dataclass(frozen=True)
class StepSetup:
    """One shape's step inputs, and the weights every block timed on it starts from."""

    channels: int
    dilation: int
    dtype: torch.dtype
    device: torch.device
    state: dict[str, torch.Tensor]  # the frozen block's default init from seed 0
    x: torch.Tensor  # input (B, L, C), drawn on the device from seed 1
    grad: torch.Tensor  # dense upstream gradient, the next draw

    def build(self, cls: type) -> torch.nn.Module:
        """A block of ``cls`` (the frozen or the reference block) carrying these weights."""
        cfg = load_config().block
        block = cls(self.channels, self.dilation, cfg.expansion, cfg.eps, cfg.residual_scale)
        block = block.to(self.device, self.dtype)
        block.load_state_dict(self.state)
        return block


def step_setup(shape: LimitShape, channels: int, device: torch.device) -> StepSetup:
    """Same weights for every variant, so their agreement is a check of what was timed. The
    inputs are drawn on the device: the CPU draw of make_inputs costs seconds at these sizes."""
    from task.model import DilatedResidualBlock as FrozenBlock

    cfg = load_config().block
    dtype = DTYPES[shape.dtype]
    torch.manual_seed(0)
    state = FrozenBlock(channels, shape.dilation, cfg.expansion, cfg.eps,
                        cfg.residual_scale).to(device, dtype).state_dict()
    gen = torch.Generator(device=device).manual_seed(1)
    dims = (shape.batch, shape.length, channels)
    x = torch.randn(dims, generator=gen, device=device).to(dtype)
    grad = torch.randn(dims, generator=gen, device=device).to(dtype)
    return StepSetup(channels, shape.dilation, dtype, device, state, x, grad)


def _fused_mlp_step(block: torch.nn.Module, variant: str
                    ) -> Callable[[torch.Tensor], torch.Tensor]:
    """The reference block's forward with the MLP through `reference.mlp.fused_mlp`: the
    heuristic plan (``reference_fused_mlp``), its resident kernels where the weights fit
    (``reference_resident_mlp``) or its fp32 products split into bf16 (``..._bf16x3_mlp``)."""
    from reference.conv_norm import conv_norm
    from reference.mlp import MIN_BF16X3_BLOCK_N, fused_mlp, heuristic_mlp_plan
    from reference.plans import device_info

    def forward(x: torch.Tensor) -> torch.Tensor:
        yhat = conv_norm(x, block.conv.weight, block.dilation, block.eps, block.plan)
        hidden, channels = block.fc1.weight.shape
        plan = heuristic_mlp_plan(device_info(x.device), x.dtype, x.numel() // channels,
                                  channels, hidden)
        if variant == "reference_resident_mlp":
            plan = dataclasses.replace(plan, resident=True, block_m=64)
        elif variant == "reference_bf16x3_mlp":
            plan = dataclasses.replace(plan, fp32_precision="bf16x3",
                                       block_n=max(plan.block_n, MIN_BF16X3_BLOCK_N))
        return fused_mlp(yhat, x, block.fc1.weight, block.fc2.weight, block.residual_scale, plan)

    return forward


def time_steps(shape: LimitShape, variants: Sequence[str], channels: int, rounds: int,
               warmup: int, device: torch.device) -> tuple[dict[str, list[float]],
                                                           dict[str, float], dict[str, float]]:
    """Per-round step times of each variant, compile seconds, agreement with eager."""
    from reference.block import DilatedResidualBlock as ReferenceBlock
    from reference.ceiling import CeilingBlock
    from reference.tuning.timing import HIDE_LAUNCH_FLUSH_BYTES, make_l2_flush, time_interleaved
    from task.model import DilatedResidualBlock as FrozenBlock

    setup = step_setup(shape, channels, device)
    x, grad = setup.x, setup.grad
    torch._dynamo.reset()
    blocks: dict[str, torch.nn.Module] = {}
    forwards: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
    for name in variants:
        cls = (CeilingBlock if name.startswith("ceiling")
               else ReferenceBlock if name.startswith("reference") else FrozenBlock)
        blocks[name] = setup.build(cls)
        if name in ("reference_fused_mlp", "reference_resident_mlp", "reference_bf16x3_mlp"):
            forwards[name] = _fused_mlp_step(blocks[name], name)
        elif name in ("ceiling_split_mlp", "ceiling_cublas_mlp"):
            blocks[name].split_mlp = name == "ceiling_split_mlp"
            forwards[name] = blocks[name]
        elif name == "ceiling_unfused_residual":
            blocks[name].fuse_residual = False
            forwards[name] = blocks[name]
        elif name == "ceiling_two_pass_norm":
            blocks[name].norm_grad_from_mlp = False
            forwards[name] = blocks[name]
        elif name in COMPILE_MODES:
            forwards[name] = torch.compile(blocks[name], mode=COMPILE_MODES[name])
        else:
            forwards[name] = blocks[name]
    leaves = {name: x.clone().requires_grad_(True) for name in variants}

    def clear(name: str) -> Callable[[], None]:
        def run() -> None:
            blocks[name].zero_grad(set_to_none=True)
            leaves[name].grad = None
        return run

    def step(name: str) -> Callable[[], None]:
        def run() -> None:
            forwards[name](leaves[name]).backward(grad)
        return run

    compile_s: dict[str, float] = {}
    outputs: dict[str, dict[str, torch.Tensor]] = {}
    for name in variants:  # first step: compiles, and gives the agreement check its values
        clear(name)()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = forwards[name](leaves[name])
        out.backward(grad)
        torch.cuda.synchronize()
        if name in COMPILE_MODES:
            compile_s[name] = time.perf_counter() - t0
        outputs[name] = {"out": out.detach(), "grad_x": leaves[name].grad,
                         **{k: p.grad for k, p in blocks[name].named_parameters()}}
    agreement = {}
    if "eager" in outputs:
        for name in variants:
            agreement[name] = max(
                float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))
                for got, want in zip(outputs[name].values(), outputs["eager"].values(),
                                     strict=True))
    del outputs
    flush = make_l2_flush(device, HIDE_LAUNCH_FLUSH_BYTES)
    samples = time_interleaved({n: step(n) for n in variants}, rounds, warmup, flush,
                               prepare={n: clear(n) for n in variants})
    return samples, compile_s, agreement


# ----------------------------------------------------------------------------- report


def markdown(meta: dict[str, Any], reports: Sequence[ShapeReport], variants: Sequence[str]) -> str:
    """The report as a markdown document."""
    lines = [f"# Step limit ({meta.get('gpu', 'dry run')})", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    head = ["shape", "memory floor ms", "compute floor ms", "limit ms", "bound"]
    for name in variants:
        head += [f"{name} ms", f"{name} / limit"]
    lines += ["", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in reports:
        row = [r.shape.label, f"{r.limit.memory_ms:.3f}", f"{r.limit.compute_ms:.3f}",
               f"{r.limit.limit_ms:.3f}", r.limit.bound]
        for name in variants:
            q = r.steps.get(name)
            row += ([f"{q['median']:.3f} ({q['p20']:.3f}–{q['p80']:.3f})",
                     f"{r.vs_limit[name]:.2f}"] if q else ["–", "–"])
        if r.error:
            row[-1] += f" error: {r.error}"
        lines.append("| " + " | ".join(row) + " |")
    ceiling = [r for r in reports if "ceiling" in r.vs_limit]
    if ceiling:
        lines += ["", "The ceiling (`reference.ceiling`, information only) over the limit: "
                  + "; ".join(f"{r.shape.label} {r.vs_limit['ceiling']:.2f}×" for r in ceiling)
                  + f" (fp32's floor from the {meta.get('fp32_product') or 'given'} product)"]
    compiled = [r for r in reports if r.compile_s]
    if compiled:
        lines += ["", "Compile seconds (first step, in this run): " + "; ".join(
            f"{r.shape.label} " + ", ".join(f"{k} {v:.1f}" for k, v in r.compile_s.items())
            for r in compiled)]
    checked = [r for r in reports if r.vs_eager_rel]
    if checked:
        lines += ["", "Largest relative L2 difference from eager (output and four gradients): "
                  + "; ".join(f"{r.shape.label} " + ", ".join(
                      f"{k} {v:.1e}" for k, v in r.vs_eager_rel.items() if k != "eager")
                      for r in checked)]
    return "\n".join(lines) + "\n"


def _write(out_dir: Path, tag: str, meta: dict[str, Any], reports: Sequence[ShapeReport],
           variants: Sequence[str]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"step-limit-{tag}.json").write_text(json.dumps(
        {"meta": meta, "shapes": [asdict(r) for r in reports]}, indent=1, default=str) + "\n")
    md = out_dir / f"step-limit-{tag}.md"
    md.write_text(markdown(meta, reports, variants))
    return md


def _meta(command: str) -> dict[str, Any]:
    return {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": command, "torch": torch.__version__, "python": platform.python_version(),
            "model": LIMIT_MODEL}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="h200", help="scoring.yaml timing profile")
    p.add_argument("--dry", action="store_true",
                   help="no GPU: print the model for --copy-gbs and --tflops")
    p.add_argument("--copy-gbs", type=float, help="--dry: copy bandwidth, GB/s")
    p.add_argument("--tflops", default="", help="--dry: matmul rate per dtype, e.g. "
                                                "float32=50,bfloat16=700")
    p.add_argument("--time", action="store_true", help="also time the step variants")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help=f"comma-separated, of {','.join(VARIANTS)}")
    p.add_argument("--shapes", default="", help="only these shape labels, e.g. "
                                                "float32:64x8192:d1")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out-dir", type=Path, help="write step-limit-<tag>.json/.md here "
                                                "(default on a GPU: bench/results)")
    p.add_argument("--tag", help="file stem suffix (default: the GPU's last name word)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    given = argv if argv is not None else sys.argv[1:]
    command = "python bench/step/step_limit.py " + " ".join(given)
    block = load_config().block
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"--variants {unknown} are not among {list(VARIANTS)}")
    shapes = profile_shapes(args.profile)
    if args.shapes:
        wanted = set(args.shapes.split(","))
        if wanted - {s.label for s in shapes}:
            raise SystemExit(f"--shapes {sorted(wanted - {s.label for s in shapes})} are not "
                             f"shapes of {args.profile}: {[s.label for s in shapes]}")
        shapes = [s for s in shapes if s.label in wanted]
    meta = _meta(command.strip())

    if args.dry:
        rates = parse_rates(args.tflops)
        missing = sorted({s.dtype for s in shapes} - set(rates))
        if args.copy_gbs is None or missing:
            raise SystemExit(f"--dry needs --copy-gbs and --tflops for {missing or 'each dtype'}")
        given = Rates(args.copy_gbs, rates, source="given (--dry)")
        meta.update(copy_gbs=given.copy_gbs, matmul_tflops=given.matmul_tflops,
                    source=given.source)
        reports = [ShapeReport(s, given.limit(s, block.channels, block.expansion))
                   for s in shapes]
        if args.out_dir is not None:
            _write(args.out_dir, args.tag or "dry", meta, reports, [])
        print(markdown(meta, reports, []))
        return 0

    if not torch.cuda.is_available():
        raise SystemExit("bench/step/step_limit.py measures copy bandwidth and matmul rate on a "
                         "CUDA GPU and found none; use --dry --copy-gbs GBS "
                         "--tflops DTYPE=TFLOPS,... for the model's numbers without one")
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    measured = measure_rates(device, [s.dtype for s in shapes])
    meta.update(gpu=name, cuda=torch.version.cuda, copy_gbs=measured.copy_gbs,
                matmul_tflops=measured.matmul_tflops, matmul_flags=measured.flags,
                fp32_products=measured.fp32_products, fp32_product=measured.fp32_product,
                source=measured.source)
    if args.time:
        import triton

        meta.update(triton=triton.__version__, method=(
            f"{args.rounds} interleaved rounds after {args.warmup} warm-up steps, carry-over-"
            "balanced orders, L2 flushed before every sample, CUDA events, host overhead "
            "included; medians with p20–p80"))
    timed = variants if args.time else []
    out_dir = args.out_dir or ROOT / "bench" / "results"
    tag = args.tag or name.split()[-1].lower()
    reports: list[ShapeReport] = []
    for shape in shapes:
        report = ShapeReport(shape, measured.limit(shape, block.channels, block.expansion))
        if timed:
            try:
                samples, report.compile_s, report.vs_eager_rel = time_steps(
                    shape, timed, block.channels, args.rounds, args.warmup, device)
                from reference.tuning.timing import quantiles

                report.steps = {n: quantiles(v) for n, v in samples.items()}
                report.vs_limit = {n: q["median"] / report.limit.limit_ms
                                   for n, q in report.steps.items()}
            except Exception as exc:  # noqa: BLE001 - one broken shape must not lose the others
                report.error = repr(exc)[:300]
            torch.cuda.empty_cache()
        reports.append(report)
        print(f"{shape.label}: limit {report.limit.limit_ms:.3f} ms ({report.limit.bound})"
              + "".join(f", {n} {q['median']:.3f} ms" for n, q in report.steps.items())
              + (f" ERROR {report.error}" if report.error else ""), flush=True)
        # Written after every shape: a run stopped by its time limit keeps what it measured.
        md = _write(out_dir, tag, meta, reports, timed)
    print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
