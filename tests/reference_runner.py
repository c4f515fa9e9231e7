"""Runs reference-kernel checks and reports each check's error over its budget (utilisation).

Used two ways:
- CPU tests start it as a subprocess under ``TRITON_INTERPRET=1`` (the interpreter detects no
  out-of-bounds access and must be set before the kernels are imported, so every interpreted
  run gets a fresh process with a timeout): ``python tests/reference_runner.py '<json specs>'``
  prints one JSON result per spec.
- GPU tests import `kernel_check` and `block_check` and call them in-process.

A spec is a dict with ``kind`` "kernel" (conv_norm alone against an fp64 autograd reference)
or "block" (the whole reference block against `task.oracle.oracle_step`), among others (`run`).
Block checks take ``block``: "scoring" (the default: `reference.block.DilatedResidualBlock`, the
block the grader times) or "ceiling" (`reference.ceiling.CeilingBlock`, the whole-step block,
whose switches ``split_mlp``, ``norm_grad_from_mlp`` and ``norm_grad_min_elements`` a spec may
set; a scoring spec that names them is refused, since that block has none).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from grader.checks import forward_utilisation, grad_utilisation, step_utilisation  # noqa: E402
from grader.config import load_config  # noqa: E402
from task.inputs import DTYPES, derive_seed, make_inputs  # noqa: E402
from task.oracle import conv_fp64, oracle_step  # noqa: E402


def _plan(spec: dict[str, Any]) -> Any:
    from reference.plans import Plan

    return Plan(**spec["plan"]) if spec.get("plan") else None


# The keys a spec may set on the ceiling's switches (`reference.ceiling.CeilingBlock`).
CEILING_SWITCHES = ("split_mlp", "norm_grad_from_mlp", "norm_grad_min_elements")


def block_class(spec: dict[str, Any]) -> type:
    """The block a spec names (``block``: "scoring", the default, or "ceiling").

    Raises:
        ValueError: An unknown ``block``, or a scoring spec that sets a ceiling switch.
    """
    which = spec.get("block", "scoring")
    if which == "ceiling":
        from reference.ceiling import CeilingBlock

        return CeilingBlock
    if which != "scoring":
        raise ValueError(f"spec block={which!r} is not 'scoring' or 'ceiling'")
    switches = [key for key in CEILING_SWITCHES if spec.get(key) is not None]
    if switches:
        raise ValueError(f"spec block='scoring' sets {switches}: the scoring block has no "
                         "switches (only the ceiling has)")
    from reference.block import DilatedResidualBlock

    return DilatedResidualBlock


def _set_switches(block: Any, spec: dict[str, Any]) -> None:
    """The spec's choice of the ceiling's switches (absent: the block's defaults)."""
    for key in CEILING_SWITCHES:
        if spec.get(key) is not None:
            setattr(block, key, spec[key])


def kernel_check(spec: dict[str, Any]) -> dict[str, float]:
    """conv_norm forward, dx and dw against fp64 autograd through the same math.

    Spec keys: batch, length, channels, dilation, dtype, family ("normal" or "offset"), seed,
    optional plan (Plan fields), device (default "cpu").
    """
    import reference.conv_norm as cn

    cn.POISON_OUTPUTS = True
    device = spec.get("device", "cpu")
    dtype = DTYPES[spec["dtype"]]
    budget = load_config().budget(spec["dtype"])
    gen = torch.Generator().manual_seed(spec["seed"])
    shape = (spec["batch"], spec["length"], spec["channels"])
    offset = 1000.0 if spec.get("family") == "offset" else 0.0
    x = (offset + torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype)
    if offset:
        w = 1 / 3 + 1e-3 * torch.randn((shape[2], 1, 3), generator=gen, dtype=torch.float64)
    else:
        w = torch.randn((shape[2], 1, 3), generator=gen, dtype=torch.float64) / math.sqrt(3)
    w = w.to(dtype)
    g = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    eps = 1e-5

    xt = x.to(device, copy=True).requires_grad_()
    wt = w.to(device, copy=True).requires_grad_()
    yhat = cn.conv_norm(xt, wt, spec["dilation"], eps, _plan(spec))
    yhat.backward(g.to(device))

    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_()
    y = conv_fp64(x64, w64, spec["dilation"])
    var, mean = torch.var_mean(y, dim=(1, 2), unbiased=False, keepdim=True)
    ref = (y - mean) / torch.sqrt(var + eps)
    ref.backward(g.double())
    result = {
        "forward": forward_utilisation(yhat.cpu(), ref.detach(), budget),
        "grad_x": grad_utilisation(xt.grad.cpu(), x64.grad, budget),
        "grad_conv": grad_utilisation(wt.grad.cpu(), w64.grad, budget),
    }
    if shape[2] == 1 and spec["dilation"] >= shape[1]:
        # One channel and no tap reaching another row: the conv is a pure scale, which the
        # normalization removes, so the true tap gradient is O(eps)·rounding and a relative
        # error against it measures nothing. Forward and dx still count.
        del result["grad_conv"]
    if shape[1] * shape[2] <= 2:
        # At most two values per example: the normalized output is ±1 (or 0) whatever the input,
        # so the true input gradient is also O(eps); only the forward is meaningful.
        result.pop("grad_x")
        result.pop("grad_conv", None)
    return result


def block_check(spec: dict[str, Any]) -> dict[str, float]:
    """The reference block against the fp64 oracle on a scoring.yaml case.

    Spec keys: case (name), seed (public), optional dtype, batch, length, dilation (override
    the case's), optional plan, device (default "cpu"), optional plain (also report the frozen
    PyTorch block's utilisation on the same inputs, under ``plain_<check>`` keys), optional
    block and, for the ceiling, its switches (module docstring).
    """
    import reference.conv_norm as cn

    cn.POISON_OUTPUTS = True
    ref_cls = block_class(spec)
    device = spec.get("device", "cpu")
    cfg = load_config()
    cases = {c.name: c for c in (*cfg.correctness.cases, *cfg.correctness.drift.cases)}
    case = cases[spec["case"]]
    dtype = spec.get("dtype", case.dtype)
    inp = make_inputs(
        batch=spec.get("batch", case.batch), length=spec.get("length", case.length),
        channels=case.channels, expansion=case.expansion, family=case.family, dtype=dtype,
        seed=derive_seed(spec["seed"]), device=device,
    )
    dilation = spec.get("dilation", case.dilation)
    ref = oracle_step(inp.x, inp.conv_weight, inp.fc1_weight, inp.fc2_weight, inp.grad_out,
                      dilation=dilation, eps=case.eps, residual_scale=case.residual_scale)
    budget = cfg.budget(dtype)

    def step_util(cls: type, plan: Any = None) -> dict[str, float]:
        """One training step of a block of this class on the case's inputs, against the oracle."""
        block = cls(case.channels, dilation, case.expansion, case.eps,
                    case.residual_scale).to(device=device, dtype=DTYPES[dtype])
        block.load_state_dict(inp.state_dict())
        if plan is not None:
            block.plan = plan
        if cls is ref_cls:
            _set_switches(block, spec)
        x = inp.x.clone().requires_grad_()
        out = block(x)
        out.backward(inp.grad_out)
        return step_utilisation(block, x, out, ref, budget)

    result = step_util(ref_cls, _plan(spec))
    if spec.get("plain"):
        from task.model import DilatedResidualBlock as PlainBlock

        result.update({f"plain_{key}": util for key, util in step_util(PlainBlock).items()})
    return result


def identity_check(spec: dict[str, Any]) -> dict[str, float]:
    """Zero fc weights: out == x and x.grad == grad_out bit for bit, other grads exactly 0.

    Spec keys: batch, length, channels, dilation, dtype, seed, device (default "cpu"), optional
    block and, for the ceiling, its switches (module docstring). Returns 0.0 per check that
    holds exactly, inf per check that does not.
    """
    cls = block_class(spec)
    device = spec.get("device", "cpu")
    inp = make_inputs(batch=spec["batch"], length=spec["length"], channels=spec["channels"],
                      expansion=2, family="normal", dtype=spec["dtype"],
                      seed=derive_seed(spec["seed"]), device=device)
    block = cls(spec["channels"], spec["dilation"]).to(device=device, dtype=DTYPES[spec["dtype"]])
    state = inp.state_dict()
    state["fc1.weight"] = torch.zeros_like(state["fc1.weight"])
    state["fc2.weight"] = torch.zeros_like(state["fc2.weight"])
    block.load_state_dict(state)
    _set_switches(block, spec)
    x = inp.x.clone().requires_grad_()
    out = block(x)
    out.backward(inp.grad_out)

    def exact(ok: bool) -> float:
        return 0.0 if ok else math.inf

    grads = (block.conv.weight.grad, block.fc1.weight.grad, block.fc2.weight.grad)
    return {
        "out_is_x": exact(torch.equal(out, inp.x)),
        "grad_x_is_grad_out": exact(torch.equal(x.grad, inp.grad_out)),
        "other_grads_zero": exact(all(g is not None and not g.any() for g in grads)),
    }


def residual_check(spec: dict[str, Any]) -> dict[str, float]:
    """conv_norm_backward(..., residual_grad=r) equals the plain dx plus r (fp32 rounding only).

    Spec keys: batch, length, channels, dilation, seed, optional plan, device (default "cpu");
    fp32. Returns the max |difference| relative to max |dx + r| (0 when exact).
    """
    import reference.conv_norm as cn

    cn.POISON_OUTPUTS = True
    device = spec.get("device", "cpu")
    gen = torch.Generator().manual_seed(spec["seed"])
    shape = (spec["batch"], spec["length"], spec["channels"])
    x, dyhat, res = (torch.randn(shape, generator=gen).to(device) for _ in range(3))
    w = torch.randn((shape[2], 1, 3), generator=gen).to(device)
    plan = _plan(spec)
    _, mean, rstd = cn.conv_norm_forward(x, w, spec["dilation"], 1e-5, plan)
    dx, dw = cn.conv_norm_backward(dyhat, x, w, mean, rstd, spec["dilation"], plan)
    dx_r, dw_r = cn.conv_norm_backward(dyhat, x, w, mean, rstd, spec["dilation"], plan,
                                       residual_grad=res)
    want = dx + res
    err = float((dx_r - want).abs().max() / want.abs().max())
    return {"dx_plus_residual": err / 1e-6, "dw_unchanged": 0.0 if torch.equal(dw, dw_r)
            else math.inf}


# Unit roundoff of each dtype: the checks below count their errors in roundings of the dtype.
UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


@contextmanager
def _recording_backward(keyword: str) -> Iterator[list[bool]]:
    """`reference.conv_norm.conv_norm_backward`, as the block's Functions call it, replaced by
    one that records for every call whether ``keyword`` (``residual_grad``, ``c12``) was given."""
    import reference.conv_norm as cn

    backward = cn.conv_norm_backward
    given: list[bool] = []

    def recording_backward(*args: Any, **kwargs: Any) -> Any:
        given.append(kwargs.get(keyword) is not None)
        return backward(*args, **kwargs)

    cn.conv_norm_backward = recording_backward
    try:
        yield given
    finally:
        cn.conv_norm_backward = backward


def skip_check(spec: dict[str, Any]) -> dict[str, float]:
    """The residual gradient fused into the conv+norm backward (the scoring block's way, and the
    ceiling's ``fuse_residual`` default) against autograd's separate add (the ceiling's
    ``fuse_residual`` False), one training step each on the same inputs. Both steps are the
    ceiling's, with ``norm_grad_from_mlp`` False: so the fused one is the scoring block's step.

    Spec keys: batch, length, channels, dilation, dtype, seed, optional plan, device (default
    "cpu"). Returns ``grad_x``: the largest |difference| of x.grad over 8 unit roundoffs of the
    largest |x.grad| (≤ 0.5: within 4, as the separate add rounds dx and then the sum, where the
    kernel rounds the sum once; each rounding is at most one unit roundoff of a value about as
    large as the largest gradient); ``rest_equal``: 0.0 if the output and every weight gradient
    are bit for bit the same, else inf; ``fused``: 0.0 if the fused step handed the skip's
    gradient to the backward kernel (``residual_grad``) and the unfused one did not, else inf.
    """
    import reference.conv_norm as cn
    from reference.ceiling import CeilingBlock

    cn.POISON_OUTPUTS = True
    device = spec.get("device", "cpu")
    inp = make_inputs(batch=spec["batch"], length=spec["length"], channels=spec["channels"],
                      expansion=2, family="normal", dtype=spec["dtype"],
                      seed=derive_seed(spec["seed"]), device=device)
    steps = []
    with _recording_backward("residual_grad") as handed:
        for fuse in (True, False):
            block = CeilingBlock(spec["channels"], spec["dilation"]).to(
                device=device, dtype=DTYPES[spec["dtype"]])
            block.load_state_dict(inp.state_dict())
            block.plan = _plan(spec)
            block.fuse_residual = fuse
            # Both steps' c1 and c2 from the two-pass backward, so that the fused residual is
            # the only difference (without fuse_residual there are no c1, c2 from the MLP).
            block.norm_grad_from_mlp = False
            x = inp.x.clone().requires_grad_()
            out = block(x)
            out.backward(inp.grad_out)
            steps.append((x.grad, out, *(p.grad for p in block.parameters())))
    (gx_fused, *rest_fused), (gx_plain, *rest_plain) = steps
    scale = 8 * UNIT_ROUNDOFF[spec["dtype"]] * float(gx_plain.abs().max())
    err = float((gx_fused.double() - gx_plain.double()).abs().max())
    same = all(torch.equal(a, b) for a, b in zip(rest_fused, rest_plain, strict=True))
    return {"grad_x": err / scale, "rest_equal": 0.0 if same else math.inf,
            "fused": 0.0 if handed == [True, False] else math.inf}


def norm_grad_sums_check(spec: dict[str, Any]) -> dict[str, float]:
    """`reference.norm_grad.gelu_backward_sums` against fp64: dh, and c1, c2 against the means of
    ŷ·dŷ and dŷ with dŷ = dh·W1 (the identity the module relies on).

    Spec keys: batch, length, channels, hidden, dtype, seed, device (default "cpu"), h_scale
    (default 1: h of unit size; larger reaches the GELU's tails, where e^(−h²/2) underflows).
    Returns ``dh``: the largest |error| over 8 unit roundoffs of the largest |dh|; ``c1``, ``c2``: the
    |error| over 8 unit roundoffs of the mean |term| (|ŷ·dŷ|, |dŷ|); ≤ 0.5 is within 4.
    """
    from reference.norm_grad import gelu_backward_sums

    device = spec.get("device", "cpu")
    dtype = DTYPES[spec["dtype"]]
    gen = torch.Generator().manual_seed(spec["seed"])
    b, length, c, hidden = spec["batch"], spec["length"], spec["channels"], spec["hidden"]
    yhat = torch.randn(b, length, c, generator=gen, dtype=torch.float64)
    w1 = torch.randn(hidden, c, generator=gen, dtype=torch.float64) / math.sqrt(c)
    w1 = w1 * spec.get("h_scale", 1.0)
    dact = torch.randn(b, length, hidden, generator=gen, dtype=torch.float64)
    yhat, w1, dact = (t.to(dtype) for t in (yhat, w1, dact))
    h = yhat.double() @ w1.double().t()
    dh, c12 = gelu_backward_sums(dact.to(device), h.to(dtype).to(device), w1.to(device), c)
    hr = h.to(dtype).double()  # the h the kernel sees, as fc1 stores it
    phi = 0.5 * (1 + torch.erf(hr / math.sqrt(2)))
    dh_ref = dact.double() * (phi + hr * torch.exp(-hr * hr / 2) / math.sqrt(2 * math.pi))
    dyhat = dh_ref @ w1.double()
    c1 = (yhat.double() * dyhat).mean(dim=(1, 2))
    c2 = dyhat.mean(dim=(1, 2))
    u8 = 8 * UNIT_ROUNDOFF[spec["dtype"]]
    got = c12.double().cpu()
    return {
        "dh": float((dh.double().cpu() - dh_ref).abs().max() / (u8 * dh_ref.abs().max())),
        "c1": float((got[:, 0] - c1).abs().max() / (u8 * (yhat.double() * dyhat).abs().mean())),
        "c2": float((got[:, 1] - c2).abs().max() / (u8 * dyhat.abs().mean())),
    }


def norm_way_check(spec: dict[str, Any]) -> dict[str, float]:
    """The ceiling's default choice of normalization backward by example size: c1 and c2 from the
    MLP (the backward kernel given ``c12``) for examples of at least
    `reference.norm_grad.MIN_EXAMPLE_ELEMENTS` values, its own first pass below.

    Spec keys: batch, length, channels, dilation, dtype, seed, device (default "cpu"). Returns
    ``as_sized``: 0.0 if the backward was given c12 exactly when length·channels reaches the
    floor, else inf.
    """
    from reference.ceiling import CeilingBlock
    from reference.norm_grad import MIN_EXAMPLE_ELEMENTS

    device = spec.get("device", "cpu")
    inp = make_inputs(batch=spec["batch"], length=spec["length"], channels=spec["channels"],
                      expansion=2, family="normal", dtype=spec["dtype"],
                      seed=derive_seed(spec["seed"]), device=device)
    with _recording_backward("c12") as given:
        block = CeilingBlock(spec["channels"], spec["dilation"]).to(
            device=device, dtype=DTYPES[spec["dtype"]])
        block.load_state_dict(inp.state_dict())
        x = inp.x.clone().requires_grad_()
        block(x).backward(inp.grad_out)
    expected = spec["length"] * spec["channels"] >= MIN_EXAMPLE_ELEMENTS
    return {"as_sized": 0.0 if given == [expected] else math.inf}


# The modules whose Triton kernels are conv+norm's own (the scoring block launches no other).
CONV_NORM_MODULES = ("reference.conv_norm", "reference.conv_norm_chain", "reference.conv_norm_group")


@contextmanager
def _recording_step() -> Iterator[dict[str, Any]]:
    """Record, while active, every Triton kernel launched (``kernels``: "module.name") and every
    aten op dispatched outside a launch (``ops``: overload packet names; the interpreter's own
    copies of a launch's arguments are not the step's ops)."""
    import triton.runtime.interpreter as interp
    import triton.runtime.jit as jit
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: dict[str, Any] = {"kernels": set(), "ops": set(), "in_launch": 0}

    def recording(run: Any) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            seen["kernels"].add(f"{self.fn.__module__}.{self.fn.__name__}")
            seen["in_launch"] += 1
            try:
                return run(self, *args, **kwargs)
            finally:
                seen["in_launch"] -= 1
        return wrapper

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            if not seen["in_launch"]:
                seen["ops"].add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    saved = [(cls, cls.run) for cls in (jit.JITFunction, interp.InterpretedFunction)]
    for cls, run in saved:
        cls.run = recording(run)
    try:
        with Ops():
            yield seen
    finally:
        for cls, run in saved:
            cls.run = run


def step_ops_check(spec: dict[str, Any]) -> dict[str, Any]:
    """What one training step of a block runs: the forward's and the backward's aten ops and
    Triton kernels, and the autograd graph's nodes (Python Functions by their class name, e.g.
    ``ConvNormSkipFunctionBackward``, and autograd's own, e.g. ``GeluBackward0``).

    Spec keys: batch, length, channels, dilation, dtype, seed, device (default "cpu"), optional
    block and, for the ceiling, its switches (module docstring). Returns lists, not
    utilisations: ``forward_ops``, ``backward_ops``, ``forward_kernels``, ``backward_kernels``,
    ``graph`` (sorted names), ``python_functions`` (the graph's custom autograd Functions).
    """
    cls = block_class(spec)
    device = spec.get("device", "cpu")
    inp = make_inputs(batch=spec["batch"], length=spec["length"], channels=spec["channels"],
                      expansion=2, family="normal", dtype=spec["dtype"],
                      seed=derive_seed(spec["seed"]), device=device)
    block = cls(spec["channels"], spec["dilation"]).to(device=device, dtype=DTYPES[spec["dtype"]])
    block.load_state_dict(inp.state_dict())
    _set_switches(block, spec)
    x = inp.x.clone().requires_grad_()
    with _recording_step() as fwd:
        out = block(x)
    graph: set[str] = set()
    python_functions: set[str] = set()
    # The nodes stay referenced (``kept``): a C++ node's Python wrapper may be made afresh at
    # each access, and one freed lets the next take its id (on torch 2.11 the walk ended after
    # three nodes, every later wrapper's id already "visited").
    stack, visited, kept = [out.grad_fn], set(), []
    while stack:
        node = stack.pop()
        if node is None or id(node) in visited:
            continue
        visited.add(id(node))
        kept.append(node)
        graph.add(type(node).__name__)
        if isinstance(node, torch.autograd.function.BackwardCFunction):
            python_functions.add(type(node).__name__)
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    with _recording_step() as bwd:
        out.backward(inp.grad_out)
    return {"forward_ops": sorted(fwd["ops"]), "backward_ops": sorted(bwd["ops"]),
            "forward_kernels": sorted(fwd["kernels"]), "backward_kernels": sorted(bwd["kernels"]),
            "graph": sorted(graph), "python_functions": sorted(python_functions)}


def determinism_check(spec: dict[str, Any]) -> dict[str, float]:
    """Two training steps of a block on the same inputs: the output and every gradient (x's and
    the three weights') bit for bit the same.

    Spec keys: batch, length, channels, dilation, dtype, seed, optional plan, device (default
    "cpu"), optional block and, for the ceiling, its switches. Returns 0.0 per tensor that is
    the same both times, inf per tensor that is not.
    """
    cls = block_class(spec)
    device = spec.get("device", "cpu")
    inp = make_inputs(batch=spec["batch"], length=spec["length"], channels=spec["channels"],
                      expansion=2, family="normal", dtype=spec["dtype"],
                      seed=derive_seed(spec["seed"]), device=device)
    steps = []
    for _ in range(2):
        block = cls(spec["channels"], spec["dilation"]).to(device=device,
                                                           dtype=DTYPES[spec["dtype"]])
        block.load_state_dict(inp.state_dict())
        block.plan = _plan(spec)
        _set_switches(block, spec)
        x = inp.x.clone().requires_grad_()
        out = block(x)
        out.backward(inp.grad_out)
        steps.append({"out": out, "grad_x": x.grad,
                      **{f"grad_{name}": p.grad for name, p in block.named_parameters()}})
    first, second = steps
    return {name: 0.0 if torch.equal(first[name], second[name]) else math.inf for name in first}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Dispatch one spec by its ``kind``."""
    checks = {"kernel": kernel_check, "block": block_check, "identity": identity_check,
              "residual": residual_check, "skip": skip_check,
              "norm_grad_sums": norm_grad_sums_check, "norm_way": norm_way_check,
              "step_ops": step_ops_check, "determinism": determinism_check}
    if spec["kind"] not in checks:
        raise ValueError(f"spec kind={spec['kind']!r} is not one of {sorted(checks)}")
    return checks[spec["kind"]](spec)


if __name__ == "__main__":
    results = [run(spec) for spec in json.loads(sys.argv[1])]
    print(json.dumps(results))
