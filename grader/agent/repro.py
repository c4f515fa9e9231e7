"""``check --repro NAME``: a script that rebuilds one gate item from its public seed, runs the
agent's block on it and checks it as the gate does, outside the sandbox (so the whole traceback,
prints and a debugger work)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grader.config import ConfigError, ScoringConfig

# Where the grader's public part lives (scoring.yaml, PROMPT.md): the directory above `grader`.
KIT_ROOT = Path(__file__).resolve().parent.parent.parent


def _reproduce(item: Any) -> str:
    return f"python -m grader check --repro '{item.name}' writes a script that runs just this item"


def find_item(config: ScoringConfig, name: str) -> Any:
    """The gate item called ``name``: ``case#seed`` or ``case#seed/identity`` as a FAILED line
    names it, or a case name of ``scoring.yaml`` for its first public seed.

    Raises:
        ConfigError: No such case or seed.
    """
    from grader.gate import GateItem

    base, _, tail = name.partition("/")
    case_name, _, seed = base.partition("#")
    drift = config.correctness.drift.cases
    case = next((c for c in (*config.correctness.cases, *drift) if c.name == case_name), None)
    seeds = () if case is None else case.seeds
    if case is None or (seed and not (seed.isdigit() and int(seed) in seeds)) or tail not in (
            "", "identity"):  # fmt: skip
        raise ConfigError(f"no gate item named {name!r}: give a FAILED line's name (like "
                          "c1-l1#1101 or c1-l1#1101/identity) or a case name of scoring.yaml")
    kind = "identity" if tail else "drift" if case in drift else "case"
    public = int(seed) if seed else seeds[0]
    return GateItem(0, f"{case.name}#{public}{'/identity' if tail else ''}", kind, case, public)


_REPRO = '''"""Gate item {name}, rebuilt from its public seed: your block on its inputs, compared
with the fp64 oracle by the gate's own checks.

Written by python -m grader check --repro '{name}'. It runs your solution.py in this
process (no sandbox, no rule checks), so the whole traceback, your prints and a debugger
(python -m pdb) work. Run it from the workspace: python {script}
"""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the workspace: solution.py
sys.path.append({kit!r})  # the task kit (task/, grader/), if not on PYTHONPATH
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    # No GPU: Triton kernels run in its interpreter, which must be on before triton is imported.
    os.environ["TRITON_INTERPRET"] = "1"

from grader.checks import exact_check, forward_check, rel_l2_check  # noqa: E402
from grader.config import load_config  # noqa: E402
from solution import DilatedResidualBlock  # noqa: E402
from task.inputs import derive_seed, make_inputs  # noqa: E402
from task.oracle import oracle_sgd, oracle_step  # noqa: E402

inputs = make_inputs({inputs},
                     seed=derive_seed({seed}), device=DEVICE)
state = inputs.state_dict()  # conv.weight, fc1.weight, fc2.weight
{zero}block = DilatedResidualBlock({block})
block = block.to(device=DEVICE, dtype=inputs.x.dtype)
block.load_state_dict(state)
params = dict(block.named_parameters())
x = inputs.x.clone().requires_grad_(True)
budget = load_config().budget({dtype!r})
{body}
for check in checks:
    util = "exact" if check.utilisation is None else f"utilisation {{check.utilisation:.3g}}"
    line = f"{{'ok  ' if check.passed else 'FAIL'}} {{check.name}}: {{util}} {{check.detail}}"
    print(line.rstrip())
# Exit 1 when a check failed, so a script or a shell loop can tell.
sys.exit(0 if all(check.passed for check in checks) else 1)
'''

_REPRO_STEP = '''out = block(x)
out.backward(inputs.grad_out)
grads = {{"grad_x": x.grad, **{{f"grad_{{k.split('.')[0]}}": p.grad for k, p in params.items()}}}}
'''

_REPRO_CASE = _REPRO_STEP + '''weights = (w.cpu() for w in state.values())
ref = oracle_step(inputs.x.cpu(), *weights, inputs.grad_out.cpu(), {kwargs})
checks = [forward_check(out.detach().cpu(), ref.out, budget)]
checks += [rel_l2_check(k, g.detach().cpu(), getattr(ref, k), budget.grad_rel)
           for k, g in grads.items()]'''

_REPRO_IDENTITY = _REPRO_STEP + '''# With fc1 and fc2 zero the block is the identity, bit for bit.
checks = [exact_check("identity_out", out.detach().cpu(), inputs.x.cpu()),
          exact_check("identity_grad_x", grads.pop("grad_x").cpu(), inputs.grad_out.cpu())]
checks += [exact_check(f"identity_{{k}}", g.cpu(), torch.zeros_like(g.cpu()))
           for k, g in grads.items()]'''

_REPRO_DRIFT = '''# SGD in place, each update rounded once from fp64, as the gate does.
for step in range({steps}):
    block(x).backward(inputs.grad_out)
    with torch.no_grad():
        for p in params.values():
            p.copy_((p.double() - {lr!r} * p.grad.double()).to(p.dtype))
            p.grad = None
    x.grad = None
ref = oracle_sgd(inputs.x.cpu(), {{k: v.cpu() for k, v in state.items()}}, inputs.grad_out.cpu(),
                 steps={steps}, lr={lr!r}, {kwargs})
checks = [rel_l2_check(f"drift_{{k}}", params[k].detach().cpu().double() - w.cpu().double(),
                       ref[k].cpu() - w.cpu().double(), budget.drift_rel)
          for k, w in state.items()]'''


def write_repro(config: ScoringConfig, name: str, root: Path) -> Path:
    """Write ``scratch/repro_<item>.py`` in the workspace ``root``: a script that rebuilds gate
    item ``name`` from its public seed, runs the block on it and checks it as the gate does."""
    item = find_item(config, name)
    c = item.case
    kwargs = f"dilation={c.dilation}, eps={c.eps!r}, residual_scale={c.residual_scale!r}"
    body = {"case": _REPRO_CASE, "identity": _REPRO_IDENTITY, "drift": _REPRO_DRIFT}[item.kind]
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in item.name)
    path = root / "scratch" / f"repro_{safe}.py"
    zero = ('state = {**state, "fc1.weight": state["fc1.weight"] * 0, '
            '"fc2.weight": state["fc2.weight"] * 0}\n') if item.kind == "identity" else ""
    text = _REPRO.format(
        name=item.name, script=path.relative_to(root), kit=str(KIT_ROOT), seed=item.public_seed,
        inputs=f"batch={c.batch}, length={c.length}, channels={c.channels}, "
        f"expansion={c.expansion}, family={c.family!r}, dtype={c.dtype!r}",
        block=f"channels={c.channels}, expansion={c.expansion}, {kwargs}", dtype=c.dtype,
        zero=zero, body=body.format(kwargs=kwargs, steps=config.correctness.drift.steps,
                                    lr=config.correctness.drift.lr),
    )  # fmt: skip
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path

