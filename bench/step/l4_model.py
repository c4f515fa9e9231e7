"""The modelled L4 g of the scoring reference (issue 41): each l4-profile shape's g predicted from
the DRAM bytes plain PyTorch and the scoring reference move per step, measured with Nsight
Compute on another GPU (`bench/step/step_ncu.py`), published with basis ``modelled``.

For each block X (plain, reference) and shape, from the ncu report of one step's kernels:

    t_kernels = Σ over non-GEMM kernels  bytes_k / BW
              + max(Σ over GEMM kernels bytes_k / BW,  step FLOPs / matmul rate)
    t_X       = max(t_kernels, host_X)
    g         = t_plain / t_reference

BW is the L4's DRAM bandwidth and the matmul rate its dense rate for the shape's dtype (both
given: ``--bw-gbs``, ``--tflops``; fp32 products run without TF32 in both blocks, PyTorch's
default). The step's FLOPs are six GEMMs of 2·(B·L)·C·(E·C) (`bench/step/step_limit.py`), in
the kernels whose names are cuBLAS's or CUTLASS's (``GEMM_KERNEL``). ``host_X`` is the host's
time to issue the step, measured on the profiling GPU's host (``--host-times``): where it
exceeds the kernels' time the step is launch-bound and the host sets it. Kernels run one after
another in a step (one stream), so their times add.

What the model leaves out, and which way it errs: the DRAM bytes are the H200's (its L2 holds
60 MB to the L4's 48 MB, so a step whose working set lies between them moves more on the L4,
for both blocks); each kernel runs at the full bandwidth or matmul rate (an L4's achieved share
is lower, and lower still for small kernels, which plain has more of); no kernel's latency
floor. So it is an estimate to replace with an L4's measurement as soon as one exists, and
``check`` says which basis its g has.

Usage::

    python bench/step/l4_model.py --ncu-dir OUT/ncu --host-times OUT/host-times.json \\
        --bw-gbs 300 --tflops float32=30.3,bfloat16=121 [--write grader/published_speedups.json]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.step.step_limit import parse_rates, profile_shapes, step_flops  # noqa: E402
from bench.step.step_ncu import BLOCKS, file_stem  # noqa: E402
from grader.config import load_config  # noqa: E402

# cuBLAS / CUTLASS kernel names (nvjet is cuBLAS's on Hopper): the step's GEMMs.
GEMM_KERNEL = re.compile(r"gemm|nvjet|cutlass|xmma|cublas", re.IGNORECASE)
BYTE_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
UNIT_BYTES = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12}


@dataclass(frozen=True)
class Kernel:
    """One kernel of a profiled step."""

    name: str
    dram_bytes: float

    @property
    def gemm(self) -> bool:
        return bool(GEMM_KERNEL.search(self.name))


def read_ncu_csv(text: str) -> list[Kernel]:
    """The kernels of ``ncu --import REP --csv --page raw`` output: one row per kernel launch,
    its DRAM bytes (read + write) in bytes whatever unit the columns carry.

    Raises:
        ValueError: No header with "Kernel Name" and both byte metrics.
    """
    rows = list(csv.reader(line for line in text.splitlines() if line.startswith('"')))
    for i, row in enumerate(rows):
        if "Kernel Name" in row and all(m in row for m in BYTE_METRICS):
            header, body = row, rows[i + 1:]
            break
    else:
        raise ValueError(f"no ncu raw-page header with 'Kernel Name' and {list(BYTE_METRICS)}")
    name_at = header.index("Kernel Name")
    cols = [header.index(m) for m in BYTE_METRICS]
    scale = [1.0] * len(cols)
    if body and not body[0][0].strip().isdigit():  # the units row
        scale = [UNIT_BYTES.get(body[0][c].strip().lower(), 1.0) for c in cols]
        body = body[1:]
    kernels = []
    for row in body:
        if len(row) != len(header):
            continue
        total = sum(float(row[c].replace(",", "")) * s for c, s in zip(cols, scale, strict=True))
        kernels.append(Kernel(row[name_at], total))
    return kernels


@dataclass(frozen=True)
class BlockModel:
    """One block's modelled step on the L4 (times in ms)."""

    kernels: int
    gemm_kernels: int
    dram_bytes: float
    memory_ms: float
    compute_ms: float
    kernels_ms: float
    host_ms: float
    step_ms: float
    bound: str  # "kernels" or "host"


def model_block(kernels: list[Kernel], flops: int, bw_gbs: float, tflops: float,
                host_ms: float) -> BlockModel:
    """The module docstring's t_X for one block's kernels."""
    gemm_bytes = sum(k.dram_bytes for k in kernels if k.gemm)
    other_bytes = sum(k.dram_bytes for k in kernels if not k.gemm)
    per_byte_ms = 1e3 / (bw_gbs * 1e9)
    compute_ms = flops / (tflops * 1e12) * 1e3
    kernels_ms = other_bytes * per_byte_ms + max(gemm_bytes * per_byte_ms, compute_ms)
    return BlockModel(
        kernels=len(kernels), gemm_kernels=sum(k.gemm for k in kernels),
        dram_bytes=gemm_bytes + other_bytes, memory_ms=(gemm_bytes + other_bytes) * per_byte_ms,
        compute_ms=compute_ms, kernels_ms=kernels_ms, host_ms=host_ms,
        step_ms=max(kernels_ms, host_ms), bound="host" if host_ms > kernels_ms else "kernels")


def model(ncu_dir: Path, host_times: dict, bw_gbs: float, tflops: dict[str, float],
          profile: str = "l4") -> dict[str, dict]:
    """Per shape label: each block's `BlockModel` and g. Reads ``<stem>.csv`` per (block, shape)
    (`bench.step.step_ncu.file_stem`).

    Raises:
        SystemExit: A shape's CSV or host time is missing, or a dtype has no matmul rate.
    """
    block_cfg = load_config().block
    out: dict[str, dict] = {}
    for shape in profile_shapes(profile):
        if shape.dtype not in tflops:
            raise SystemExit(f"--tflops has no rate for {shape.dtype} ({shape.label})")
        flops = step_flops(shape.batch * shape.length, block_cfg.channels, block_cfg.expansion)
        models = {}
        for block in BLOCKS:
            path = ncu_dir / f"{file_stem(block, shape.label)}.csv"
            if not path.is_file():
                raise SystemExit(f"{path}: missing (bench/gpu_session.sh scoring-reference-ncu)")
            host = host_times.get("shapes", {}).get(shape.label, {}).get(block)
            if host is None:
                raise SystemExit(f"no host time for {shape.label} {block} in --host-times")
            models[block] = model_block(read_ncu_csv(path.read_text()), flops, bw_gbs,
                                        tflops[shape.dtype], host["host_ms"])
        out[shape.label] = {"g": models["plain"].step_ms / models["reference"].step_ms,
                            **{b: asdict(m) for b, m in models.items()}}
    return out


def markdown(result: dict[str, dict], bw_gbs: float, tflops: dict[str, float]) -> str:
    lines = [f"# Modelled L4 g (bytes model; BW {bw_gbs} GB/s, matmul {tflops} TFLOP/s)", "",
             "| shape | plain MB | plain kernels | plain ms (bound) | ref MB | ref kernels | "
             "ref ms (bound) | g |", "|" + " --- |" * 8]
    for label, r in result.items():
        p, f = r["plain"], r["reference"]
        lines.append(f"| {label} | {p['dram_bytes'] / 1e6:.1f} | {p['kernels']} | "
                     f"{p['step_ms']:.3f} ({p['bound']}) | {f['dram_bytes'] / 1e6:.1f} | "
                     f"{f['kernels']} | {f['step_ms']:.3f} ({f['bound']}) | {r['g']:.3f} |")
    return "\n".join(lines) + "\n"


def write_entry(path: Path, result: dict[str, dict], source: str) -> None:
    """The scoring reference's l4 entry of the published speedups, basis ``modelled``."""
    data = json.loads(path.read_text())
    data["reference"]["profiles"]["l4"] = {
        "basis": "modelled", "source": source,
        "measured_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "g": {label: round(r["g"], 3) for label, r in result.items()},
    }
    path.write_text(json.dumps(data, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ncu-dir", type=Path, required=True, help="the <block>__<shape>.csv files")
    p.add_argument("--host-times", type=Path, required=True, help="bench/step/step_ncu.py's")
    p.add_argument("--bw-gbs", type=float, required=True, help="the L4's DRAM bandwidth, GB/s")
    p.add_argument("--tflops", required=True, help="the L4's dense matmul rates, TFLOP/s, e.g. "
                                                   "float32=30.3,bfloat16=121")
    p.add_argument("--out", type=Path, help="also write the model here as JSON")
    p.add_argument("--write", type=Path, help="publish the g as the scoring reference's l4 entry "
                                              "of this published_speedups.json")
    p.add_argument("--source", default="", help="where the bytes were measured (the record)")
    args = p.parse_args(argv)
    tflops = parse_rates(args.tflops)
    host = json.loads(args.host_times.read_text())
    result = model(args.ncu_dir, host, args.bw_gbs, tflops)
    print(markdown(result, args.bw_gbs, tflops))
    if args.out is not None:
        args.out.write_text(json.dumps({"bw_gbs": args.bw_gbs, "tflops": tflops,
                                        "host": host.get("meta", {}), "shapes": result},
                                       indent=1) + "\n")
    if args.write is not None:
        write_entry(args.write, result, (
            f"MODELLED, not measured on an L4: bench/step/l4_model.py (DRAM bytes per step of "
            f"plain PyTorch and the scoring reference under Nsight Compute on "
            f"{host.get('meta', {}).get('gpu', '?')}, host times of that host, L4 bandwidth "
            f"{args.bw_gbs} GB/s and matmul {tflops} TFLOP/s); {args.source}").rstrip("; "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
