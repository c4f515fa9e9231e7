"""What to do next, in words an agent can act on: a hint per run-time rule, per input family of
a failing case and for values that are not finite, and the next steps a check ends with."""

from __future__ import annotations

from typing import Any

from grader.agent import worktree
from grader.agent.estimate import ScoreEstimate
from grader.child.imports import ALLOWED_STDLIB
from grader.report import Status

# What each run-time rule wants, in words an agent can act on (rule ids from grader.child.rules,
# grader.census, grader.child.gate, grader.interleave and grader.child.submission).
RULE_HINTS = {
    "torch-op-on-path": "the convolution and the normalization must run in your Triton kernels, "
    "not PyTorch ops (aten.convolution, var_mean, a sum or mean over the whole activation, a "
    "reduction done as a matrix product, arithmetic on the activation inside your "
    "autograd.Function...): call conv_norm(...) from DilatedResidualBlock.forward (solution.py "
    "marks the lines)",
    "channel-tampering": "leave the grader's result channel alone: every message is authenticated "
    "and numbered, and one the grader did not expect (written to its file descriptor, repeated, "
    "answering another step) ends the run",
    "census-tampered": "leave the profiler alone: the grader records every op of every step, and "
    "a step it cannot see (profiler stopped or restarted, record_function switched off) breaks "
    "the rule",
    "host-copy": "keep the activation on the GPU: the conv and the norm run in your kernels, not "
    "on the host",
    "no-triton-kernel": "no Triton kernel defined in your workspace ran in this phase: forward and "
    "backward of conv + norm must launch your own @triton.jit kernels",
    "no-autograd-function": "x and conv.weight must go straight into your torch.autograd.Function "
    "(ConvNormFunction.apply), whose backward launches your kernels",
    "foreign-triton-kernel": "only Triton kernels defined in your workspace's files may run",
    "forbidden-import": "import only your own files, torch, triton, numpy and the standard "
    "library's " + ", ".join(sorted(ALLOWED_STDLIB - {"__future__"})) + ": asking for any "
    "other module (import, __import__, importlib, find_spec) breaks the rule even when the import "
    "fails or the error is caught, and so does using one reached another way (ctypes calls, a "
    "module's code run by hand)",
    "constructor-signature": "keep DilatedResidualBlock.__init__(self, channels=128, dilation=1, "
    "expansion=2, eps=1e-5, residual_scale=0.5) exactly",
    "state-dict": "keep exactly the parameters conv.weight (C,1,3), fc1.weight (E·C,C), "
    "fc2.weight (C,E·C)",
    "global-state": "do not change global torch state (TF32/cuDNN flags, default dtype, matmul "
    "precision, RNG, grad mode)",
    "patched-module": "do not replace or add attributes of torch, triton or other modules",
    "new-thread": "do not start threads",
    "new-process": "do not start processes",
    "compiler": "torch.compile / Dynamo / Inductor are not allowed",
    "torchscript": "TorchScript is not allowed",
    "fx": "torch.fx is not allowed",
    "reads-grader": "do not read the grader's or the reference's files (the operating system "
    "refuses the open anyway; trying breaks the rule)",
    "foreign-code-name": "compile your code under your own file names: code given another file's "
    "name (a library's) is not your code to the grader",
    "guard-tampered": "leave the grader's objects in your process alone (its guard, its import "
    "watch): their switches are checked between every two steps",
    "introspection": "do not read frames or the garbage collector's objects (sys._getframe, "
    "tracebacks' frames, gc): the harness beside your code is the grader's",
    "reads-other-process": "do not read other processes",
    "timer-patched": "do not touch timers or synchronization functions",
    "stream-changed": "leave the current CUDA stream as you found it",
    "gpu-memory-hog": "free what you allocate; do not hold GPU memory across steps",
    "clock-mismatch": "the step's work must finish inside the timed window",
}

# What a failing case of each input family (task/inputs.py, PROMPT.md §3) usually means.
FAMILY_HINTS = {
    "offset": "offset cases (x ≈ 1000 + N(0,1): every channel's conv output sits near 1000) fail "
    "when the variance is E[y²]−E[y]² in fp32: use a numerically stable variance, e.g. subtract "
    "a shift (one sample of the example) before summing, or merge per-tile (count, mean, M2) "
    "with Welford/Chan",
    "tiny": "tiny cases (x ~ N(0,1e-3²): the variance is below eps) fail when eps is missing or "
    "misplaced: eps must be added to the variance before the rsqrt, rstd = 1/sqrt(var + eps)",
    "scale": "scale cases (x ~ N(0,100²)) fail on large magnitudes: squares and sums overflow "
    "fp16, so accumulate the statistics in fp32 (the plain block normalizes in fp32 for "
    "bf16/fp16)",
    "ramp": "ramp cases (from a row partway through, x's scale and offset grow to ×10 and ±50 at "
    "the last row) fail when the statistics assume tiles alike: merge per-tile (count, mean, M2) "
    "with Chan's combine, keeping its n_a·n_b/n·δ² term and a partial last tile's true count; do "
    "not normalize per tile or estimate from some of the rows",
    "burst": "burst cases (a window of L/6 to L/3 rows at ±100 + N(0,30²) among N(0,1) rows) fail "
    "when the statistics come from some rows or tiles only, or are applied per tile: reduce over "
    "every row of the example, in fp32",
    "outlier": "outlier cases (one example of the batch at ×50, its upstream gradient too) fail "
    "when the statistics are pooled across the batch or read from another example: the mean, "
    "the variance and the backward's two sums are per example",
}
NON_FINITE_HINT = ("values that are not finite: an example whose variance is 0 (length·channels "
                   "= 1, as in c1-l1) needs eps in rsqrt(var + eps); also look for a division by "
                   "zero, a masked load without other=0.0, or fp16 overflow")  # fmt: skip


def _next_invalid(reason: str) -> tuple[str, ...]:
    if "no solution.py" in reason:
        return ("put solution.py (defining DilatedResidualBlock) at the workspace root",)
    return ("fix what the reason names, then run python -m grader check again",)


def _next_steps(
    status: Status,
    result: Any,
    est: ScoreEstimate | None,
    on_gpu: bool,
    where: worktree.WorktreeState,
    commit: str | None,
    narrowed: bool = False,
) -> tuple[str, ...]:
    """What to do now; ``narrowed``: the check ran only the cases named with ``--case``."""
    steps: list[str] = []
    first = next((c for c in result.cases if not c.passed), None)
    case = first.name.split("#")[0] if first is not None else "NAME"
    if status is Status.LOAD_FAILED:
        steps.append("fix the error above (python -c 'import solution' in the workspace shows "
                     "the full traceback), then check again")
    elif status is Status.RULE_BROKEN:
        for rule in dict.fromkeys(f.rule for f in result.findings):
            steps.append(f"{rule}: {RULE_HINTS.get(rule, 'see PROMPT.md §2')}")
    elif status is Status.GATE_FAILED:
        steps.append(f"fix {case} first; rerun just it with "
                     f"python -m grader check --case {case} --no-time")
        steps.extend(_hints(result))
    elif status in (Status.CRASHED, Status.TIMED_OUT, Status.OUT_OF_MEMORY):
        what = {Status.CRASHED: "where it raised (the frames in your files, deepest last)",
                Status.TIMED_OUT: "which item ran past the gate's time limit (a loop that never "
                "ends, or a huge grid through the interpreter)",
                Status.OUT_OF_MEMORY: "which item ran out of memory"}[status]
        steps.append(f"read above {what}" if narrowed else
                     f"read above {what}; rerun just the first failing case with "
                     f"python -m grader check --case {case} --no-time")
        if any("InterpreterError" in c.reason for c in result.cases):
            steps.append("an InterpreterError comes from the Triton interpreter (CPU), which runs "
                         "kernels as Python; README.md lists its pitfalls (e.g. a range() loop "
                         "variable is a plain int there, so .to() fails on it)")
        if first is not None:
            steps.append(f"to debug it outside the sandbox (whole traceback, prints, pdb): "
                         f"python -m grader check --repro '{first.name}', then run the script "
                         "it writes")
    elif status.passed:
        if est is not None and est.score is not None:
            steps.append("faster = higher score: improve the shapes with the lowest r")
        if not on_gpu:
            steps.append("on the GPU the same check also times your block and estimates a score")
        if commit is None and where.dirty:
            steps.append("commit your changes (git add -A && git commit -m '...'); submit "
                         "sends only the committed HEAD")
        steps.append("run python -m grader check --full before you submit, then "
                     "python -m grader submit --wait" if on_gpu else
                     "python -m grader submit --wait (--full is slow here: it runs every case "
                     "through the Triton interpreter, tens of minutes; the GPU grade runs every "
                     "case anyway)")
    else:
        steps.append("read the reason above; see PROMPT.md §4")
    return tuple(steps)


def _hints(result: Any) -> list[str]:
    """One hint per input family with a failing case, and one for values that are not finite."""
    failed = {c.name for c in result.cases if not c.passed}
    families = dict.fromkeys(i.case.family for i in result.items if i.name in failed)
    hints = [FAMILY_HINTS[f] for f in families if f in FAMILY_HINTS]
    if any("not finite" in ch.detail for c in result.cases if not c.passed for ch in c.checks):
        hints.append(NON_FINITE_HINT)
    return hints

