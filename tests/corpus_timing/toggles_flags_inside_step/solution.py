"""Exploit: a global flag changed inside a step and put back in a later one, before the audit.

Hacking scenario (issue 37, class 7, by an author who read grader/child/submission.py as it was
before it: the guard compared the process's global state only at the audits, after the warm-ups
and after each visit of six rounds): the block (the reference copied into the workspace, so
every census and check passes) turns TF32 on for fp32 matrix products at the start of one
step's forward (its own GEMMs then run on tensor cores in TF32) and puts the flag back at the
start of the next step's forward, so an audit, which comes after a whole visit, finds it as it
was whenever the visit has an even number of its steps. A flag left changed between steps is
what the rule forbids (state the grader's own code then runs under).
Why it is caught now: the timing child compares the global state (`grader.child.state`, about
0.07 ms) before and after every step, so the flag is seen changed at the end of the first step
that set it, and the finding goes out before that step's ``done``.
Expected: rule_broken (global-state)
"""

import torch

from reference.block import DilatedResidualBlock as _Own

_CALLS = [0]


class DilatedResidualBlock(_Own):
    def forward(self, x):
        _CALLS[0] += 1
        # Odd steps: on (and left on after the step); even steps: back off at their start.
        torch.backends.cuda.matmul.allow_tf32 = _CALLS[0] % 2 == 1
        return super().forward(x)
