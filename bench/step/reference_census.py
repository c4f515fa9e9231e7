"""The census of the scoring reference's step (issue 41): what the grader's own census
(`grader.child.census`, the parent's summaries `grader.census_trace`) sees in a training step of
`reference.block.DilatedResidualBlock`, and whether it is what the task defines.

For each shape (default: one h200 shape per dtype) one forward and one backward run under the
census, marked as the harness marks them, and each step's summary is checked:

- the autograd Functions: conv+norm's (``ConvNormSkipFunction``) and no other;
- PyTorch's own ops: the forward has ``aten::gelu`` and a linear (``aten::mm``/``aten::addmm``),
  the backward ``aten::gelu_backward`` and ``aten::mm``;
- kernels (on a GPU): every kernel is launched by an aten op (cuBLAS, PyTorch's elementwise
  kernels) or is one of conv+norm's Triton kernels (the ``@triton.jit`` functions of
  `reference.conv_norm`, `reference.conv_norm_chain` and `reference.conv_norm_group`), and at
  least one of those ran;
- the rules a submission must keep (`grader.census.judge_message`): no finding.

Prints a JSON summary (ops, Functions, kernels per step, the verdicts) and exits 1 if any check
failed. ``--device cpu`` with ``TRITON_INTERPRET=1`` runs it on the CPU (no kernels are recorded
there), for a smoke run at tiny shapes (``--shapes 2x64x8:d3:float32``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import grader.census as census_rules  # noqa: E402
from grader.census import BlockDims, CensusLedger, judge_message  # noqa: E402
from grader.child.census import MARKER_PREFIX, Census  # noqa: E402
from task.inputs import DTYPES  # noqa: E402

CONV_NORM_MODULES = ("reference.conv_norm", "reference.conv_norm_chain",
                     "reference.conv_norm_group")
DEFAULT_SHAPES = "64x8192x128:d1:float32,256x8192x128:d64:bfloat16"


def conv_norm_kernel_names() -> set[str]:
    """The names of conv+norm's Triton kernels (what CUPTI reports for a Triton launch)."""
    import importlib

    names = set()
    for module in CONV_NORM_MODULES:
        for name, value in vars(importlib.import_module(module)).items():
            if hasattr(value, "fn") and hasattr(value, "run"):  # a @triton.jit function
                names.add(name)
    return names


def parse_shape(text: str) -> tuple[int, int, int, int, str]:
    """``BxLxC:dD:dtype`` → (batch, length, channels, dilation, dtype)."""
    dims, dil, dtype = text.split(":")
    batch, length, channels = (int(v) for v in dims.split("x"))
    if not dil.startswith("d") or dtype not in DTYPES:
        raise SystemExit(f"shape {text!r} must be BxLxC:dD:dtype")
    return batch, length, channels, int(dil[1:]), dtype


def verdicts(way: str, summary: Any, conv_norm_kernels: set[str], gpu: bool) -> list[str]:
    """What is wrong with one step's summary (empty: it is the task's reference)."""
    wrong = []
    functions = {f.removesuffix("Backward") for f in summary.functions}
    if functions != {"ConvNormSkipFunction"}:
        wrong.append(f"{way}: autograd Functions {sorted(summary.functions)}, expected "
                     "conv+norm's alone")
    ops = {op.name for op in summary.ops}
    want = {"aten::gelu"} if way == "forward" else {"aten::gelu_backward", "aten::mm"}
    if not want <= ops or (way == "forward" and not ops & {"aten::mm", "aten::addmm"}):
        wrong.append(f"{way}: PyTorch's linear and GELU ops missing: {sorted(want - ops)}")
    if gpu:
        kernels = summary.kernels or ()
        # An unlinked library kernel is PyTorch's when the grader's own matching gives it a
        # recorded op (`grader.census.match_kernels`: kineto links none of some cuBLAS GEMMs,
        # nor a step's first fill); the step's range mirrored on the device is no kernel.
        unmatched = {k.name for k in census_rules.match_kernels(summary)}
        library = {k.name for k in kernels if census_rules.is_library_kernel(k.name)}
        outside = sorted({k.name for k in kernels
                          if not k.launched_by and k.name not in conv_norm_kernels
                          and not k.name.startswith(MARKER_PREFIX)
                          and (k.name in unmatched or k.name not in library)})
        if outside:
            wrong.append(f"{way}: kernels neither PyTorch's nor conv+norm's: {outside}")
        if not any(k.name in conv_norm_kernels for k in kernels):
            wrong.append(f"{way}: no conv+norm Triton kernel ran")
    return wrong


def census_of(shape: tuple[int, int, int, int, str], device: torch.device,
              block_name: str = "reference") -> dict[str, Any]:
    """One forward and one backward of the scoring block (``block_name`` "ceiling": the
    whole-step block, a control the verdicts must catch) under the census: summaries, findings
    and verdicts."""
    if block_name == "ceiling":
        from reference.ceiling import CeilingBlock as DilatedResidualBlock
    else:
        from reference.block import DilatedResidualBlock

    batch, length, channels, dilation, dtype = shape
    gpu = device.type == "cuda"
    seen: list[Any] = []
    summarize = census_rules.summarize

    def keep(*args: Any, **kwargs: Any) -> Any:
        seen.append(summarize(*args, **kwargs))
        return seen[-1]

    census_rules.summarize = keep
    census = Census(device)
    census.start()
    try:
        torch.manual_seed(0)
        block = DilatedResidualBlock(channels, dilation).to(device, DTYPES[dtype])
        x = torch.randn(batch, length, channels, device=device, dtype=DTYPES[dtype],
                        requires_grad=True)
        grad = torch.randn_like(x)
        for _ in range(2):  # warm-up: compile the kernels outside the census's steps
            block(x).backward(grad)
        census.collect()
        dims, ledger = BlockDims(batch, length, channels, 2), CensusLedger()
        res: dict[str, Any] = {}
        out: dict[str, Any] = {}
        conv_norm_kernels = conv_norm_kernel_names()
        for way, fn in (("forward", lambda: res.update(out=block(x))),
                        ("backward", lambda: res["out"].backward(grad))):
            label = f"{way}:census"
            mark = census.mark(label)
            found = judge_message({"label": label, "commit": mark.commit}, dims, ledger, gpu=gpu)
            before = len(seen)
            with mark:
                fn()
            if gpu:
                torch.cuda.synchronize()
            for message in census.collect():
                found += judge_message(json.loads(json.dumps(message)), dims, ledger, gpu=gpu)
            (summary,) = [s for s in seen[before:] if s.label == label]
            out[way] = {
                "functions": sorted(summary.functions),
                "ops": sorted({op.name for op in summary.ops}),
                "kernels": sorted({f"{k.name[:80]} <- {k.launched_by or 'python'}"
                                   for k in summary.kernels or ()}),
                "findings": sorted(f"{f.rule}: {f.message}" for f in found),
                "wrong": verdicts(way, summary, conv_norm_kernels, gpu),
            }
        return out
    finally:
        census.stop()
        census_rules.summarize = summarize


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="BxLxC:dD:dtype, comma-separated")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, help="also write the JSON here")
    p.add_argument("--block", choices=("reference", "ceiling"), default="reference",
                   help="ceiling: the whole-step block, a control that must fail the checks")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    result = {text: census_of(parse_shape(text), device, args.block)
              for text in args.shapes.split(",")}
    bad = [w for steps in result.values() for step in steps.values()
           for w in (*step["wrong"], *step["findings"])]
    text = json.dumps({"device": str(device), "block": args.block, "shapes": result,
                       "ok": not bad}, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print("census: " + ("the scoring reference's step is conv+norm in Triton and the MLP in "
                        "PyTorch's ops" if not bad else f"{len(bad)} problem(s): {bad}"))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
