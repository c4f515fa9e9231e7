"""Runs reference-kernel checks and reports each check's error over its budget (utilisation).

Used two ways:
- CPU tests start it as a subprocess under ``TRITON_INTERPRET=1`` (the interpreter detects no
  out-of-bounds access and must be set before the kernels are imported, so every interpreted
  run gets a fresh process with a timeout): ``python tests/reference_runner.py '<json specs>'``
  prints one JSON result per spec.
- GPU tests import `kernel_check` and `block_check` and call them in-process.

A spec is a dict with ``kind`` "kernel" (conv_norm alone against an fp64 autograd reference)
or "block" (the whole reference block against `task.oracle.oracle_step`).
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
    split_mlp (the reference block's ``split_mlp``; absent: the device's default path),
    optional norm_grad_from_mlp and norm_grad_min_elements (the block's attributes of those
    names; absent: its defaults).
    """
    import reference.conv_norm as cn
    from reference.block import DilatedResidualBlock

    cn.POISON_OUTPUTS = True
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
        if spec.get("split_mlp") is not None:
            block.split_mlp = spec["split_mlp"]
        if cls is DilatedResidualBlock:
            _set_norm_grad(block, spec)
        x = inp.x.clone().requires_grad_()
        out = block(x)
        out.backward(inp.grad_out)
        return step_utilisation(block, x, out, ref, budget)

    result = step_util(DilatedResidualBlock, _plan(spec))
    if spec.get("plain"):
        from task.model import DilatedResidualBlock as PlainBlock

        result.update({f"plain_{key}": util for key, util in step_util(PlainBlock).items()})
    return result


def _set_norm_grad(block: Any, spec: dict[str, Any]) -> None:
    """The spec's choice of the block's normalization backward (`reference.norm_grad`), where
    it makes one."""
    for key in ("norm_grad_from_mlp", "norm_grad_min_elements"):
        if spec.get(key) is not None:
            setattr(block, key, spec[key])


def identity_check(spec: dict[str, Any]) -> dict[str, float]:
    """Zero fc weights: out == x and x.grad == grad_out bit for bit, other grads exactly 0.

    Spec keys: batch, length, channels, dilation, dtype, seed, device (default "cpu"), optional
    split_mlp (absent: the device's default path), optional norm_grad_from_mlp and
    norm_grad_min_elements (absent: the block's defaults). Returns 0.0 per check that holds
    exactly, inf per check that does not.
    """
    from reference.block import DilatedResidualBlock

    device = spec.get("device", "cpu")
    inp = make_inputs(batch=spec["batch"], length=spec["length"], channels=spec["channels"],
                      expansion=2, family="normal", dtype=spec["dtype"],
                      seed=derive_seed(spec["seed"]), device=device)
    block = DilatedResidualBlock(spec["channels"], spec["dilation"]).to(
        device=device, dtype=DTYPES[spec["dtype"]])
    state = inp.state_dict()
    state["fc1.weight"] = torch.zeros_like(state["fc1.weight"])
    state["fc2.weight"] = torch.zeros_like(state["fc2.weight"])
    block.load_state_dict(state)
    block.split_mlp = spec.get("split_mlp")
    _set_norm_grad(block, spec)
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
    """The block's residual gradient fused into the conv+norm backward (``fuse_residual``, the
    default) against autograd's separate add (False), one training step each on the same inputs.

    Spec keys: batch, length, channels, dilation, dtype, seed, optional plan, device (default
    "cpu"). Returns ``grad_x``: the largest |difference| of x.grad over 8 unit roundoffs of the
    largest |x.grad| (≤ 0.5: within 4, as the separate add rounds dx and then the sum, where the
    kernel rounds the sum once; each rounding is at most one unit roundoff of a value about as
    large as the largest gradient); ``rest_equal``: 0.0 if the output and every weight gradient
    are bit for bit the same, else inf; ``fused``: 0.0 if the fused step handed the skip's
    gradient to the backward kernel (``residual_grad``) and the unfused one did not, else inf.
    """
    import reference.conv_norm as cn
    from reference.block import DilatedResidualBlock

    cn.POISON_OUTPUTS = True
    device = spec.get("device", "cpu")
    inp = make_inputs(batch=spec["batch"], length=spec["length"], channels=spec["channels"],
                      expansion=2, family="normal", dtype=spec["dtype"],
                      seed=derive_seed(spec["seed"]), device=device)
    steps = []
    with _recording_backward("residual_grad") as handed:
        for fuse in (True, False):
            block = DilatedResidualBlock(spec["channels"], spec["dilation"]).to(
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
    """The default block's choice of normalization backward by example size: c1 and c2 from the
    MLP (the backward kernel given ``c12``) for examples of at least
    `reference.norm_grad.MIN_EXAMPLE_ELEMENTS` values, its own first pass below.

    Spec keys: batch, length, channels, dilation, dtype, seed, device (default "cpu"). Returns
    ``as_sized``: 0.0 if the backward was given c12 exactly when length·channels reaches the
    floor, else inf.
    """
    from reference.block import DilatedResidualBlock
    from reference.norm_grad import MIN_EXAMPLE_ELEMENTS

    device = spec.get("device", "cpu")
    inp = make_inputs(batch=spec["batch"], length=spec["length"], channels=spec["channels"],
                      expansion=2, family="normal", dtype=spec["dtype"],
                      seed=derive_seed(spec["seed"]), device=device)
    with _recording_backward("c12") as given:
        block = DilatedResidualBlock(spec["channels"], spec["dilation"]).to(
            device=device, dtype=DTYPES[spec["dtype"]])
        block.load_state_dict(inp.state_dict())
        x = inp.x.clone().requires_grad_()
        block(x).backward(inp.grad_out)
    expected = spec["length"] * spec["channels"] >= MIN_EXAMPLE_ELEMENTS
    return {"as_sized": 0.0 if given == [expected] else math.inf}


def run(spec: dict[str, Any]) -> dict[str, float]:
    """Dispatch one spec by its ``kind``."""
    checks = {"kernel": kernel_check, "block": block_check, "identity": identity_check,
              "residual": residual_check, "skip": skip_check,
              "norm_grad_sums": norm_grad_sums_check, "norm_way": norm_way_check}
    if spec["kind"] not in checks:
        raise ValueError(f"spec kind={spec['kind']!r} is not one of {sorted(checks)}")
    return checks[spec["kind"]](spec)


if __name__ == "__main__":
    results = [run(spec) for spec in json.loads(sys.argv[1])]
    print(json.dumps(results))
