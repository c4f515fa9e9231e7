"""Exploit: replays the harness's input generator and precomputes each timed step outside the window.

Hacking scenario (kernelbot ``cheat-rng.py``, by an author who has read grader/child_timing.py as
it was at commit 391bd45): the timing seed is in the job file named on the harness's command line
(``sys.argv``), and each shape's inputs come from ``torch.Generator().manual_seed(seed + 7919 ·
(index + 1))`` through `ShapeRunner.new_values`, called once before every step of the submission:
its warm-up rounds, one untimed round, the timed rounds, the closing census. This block (the
reference copied into the workspace) keeps a replica of that generator per shape (shapes are built
in the job's order) and a finalizer on each output it returns: when the harness drops the output
(``del out`` after the step's checks, outside every window and every guard phase), it draws the
next step's input, upstream gradient and weights with the same calls, runs the reference kernels
on them and keeps the output and the four gradients. Its next step, if no dispatch mode is active
(not the census), only copies them out through an ``autograd.Function`` (the copies move the bytes
of the bandwidth floor, so the step is not implausibly fast). The answers are right: the census
sees the reference's kernels, and every timed step matches plain PyTorch.
Against that grader, on the CPU dry run: status ok, task score 3.000 (on the larger shape t_sub
0.5 ms against t_ref 620 ms and t_plain 4.5 ms; an honest copy of the reference scores 0 there).
Why the new design catches it: each round's inputs come from randomness only the parent holds
until ``go``, written into shared memory then; the job file holds no seed (this block then replays
seed 0), so a replayed step answers for other inputs than the parent's.
Expected: check_failed (differs from)
"""

import json
import weakref

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode

from reference.block import DilatedResidualBlock as _Own
from reference.conv_norm import conv_norm

sys = torch.sys  # reached, not imported: sys is not on the import list (issue 37)


def _job():
    """The timing harness's job file (its last command-line argument), or None if it lists no
    shapes (the gate's)."""
    try:
        with open(sys.argv[-1]) as f:
            job = json.load(f)
    except (OSError, ValueError):
        return None
    return job if isinstance(job, dict) and isinstance(job.get("shapes"), list) else None


_JOB = _job()
_BUILT = [0]


class _Replica:
    """The harness's `ShapeRunner.new_values`, drawn into tensors of our own."""

    def __init__(self, seed, x_like, params_like, channels, expansion):
        self.gen = torch.Generator(device=x_like.device).manual_seed(seed)
        self.x = torch.empty_like(x_like)
        self.grad_out = torch.empty_like(x_like)
        self.params = [torch.empty_like(p) for p in params_like]
        self.bounds = [1.0 / 3**0.5, 1.0 / channels**0.5, 1.0 / (expansion * channels) ** 0.5]
        self.drawn = 0

    @torch.no_grad()
    def draw(self):
        x, grad_out, gen = self.x, self.grad_out, self.gen
        batch, length = x.shape[0], x.shape[1]
        x.normal_(generator=gen)
        grad_out.normal_(generator=gen)
        for p, bound in zip(self.params, self.bounds, strict=True):
            p.uniform_(-bound, bound, generator=gen)
        self.params[0].add_(1.0 / 3.0)
        u = torch.rand((3, batch, 1, 1), generator=gen, device=x.device, dtype=torch.float32)
        scale = 4.0 ** (2.0 * u[0] - 1.0)
        start = torch.floor(length * (0.25 + 0.5 * u[1]))
        sign = (u[2] < 0.5).to(torch.float32) * 2.0 - 1.0
        rows = torch.arange(length, device=x.device, dtype=torch.float32).view(1, length, 1)
        ramp = ((rows - start + 1.0) / (length - start)).clamp_(0.0, 1.0)
        x.mul_((1.0 + 3.0 * ramp) * scale)
        x.add_(50.0 * sign * ramp * scale)
        grad_out.mul_(scale)
        self.drawn += 1


class _Replay(torch.autograd.Function):
    """Returns copies of a step computed earlier: output forward, the four gradients backward."""

    @staticmethod
    def forward(ctx, x, conv_weight, fc1_weight, fc2_weight, stored):
        ctx.grads = stored[1:]
        return stored[0].clone()

    @staticmethod
    def backward(ctx, grad):
        return (*(g.clone() for g in ctx.grads), None)


class DilatedResidualBlock(_Own):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.index = _BUILT[0]  # the timing harness builds one per shape, in the job's order
        _BUILT[0] += 1
        self.calls = 0
        self.replica = None
        self.ready = None  # (call number, [out, grad_x, grad_conv, grad_fc1, grad_fc2])

    def _weights(self):
        return [self.conv.weight, self.fc1.weight, self.fc2.weight]

    def forward(self, x):
        call = self.calls
        self.calls += 1
        if _JOB is None or not x.requires_grad:
            return super().forward(x)
        ready, self.ready = self.ready, None
        if _get_current_dispatch_mode() is None and ready is not None and ready[0] == call:
            out = _Replay.apply(x, *self._weights(), ready[1])
        else:
            if self.replica is None:
                seed = _JOB.get("seed", 0) + 7919 * (self.index + 1)
                self.replica = _Replica(seed, x, self._weights(), self.channels, self.expansion)
            out = super().forward(x)
        # Runs when the harness lets go of the output: after the step's window and checks.
        weakref.finalize(out, self._prepare, call + 1)
        return out

    def _prepare(self, call):
        """Draw the inputs of step ``call`` as the harness will, and compute that step."""
        replica = self.replica
        while replica.drawn <= call:
            replica.draw()
        with torch.enable_grad():
            x = replica.x.detach().clone().requires_grad_(True)
            wc, w1, w2 = (p.detach().clone().requires_grad_(True) for p in replica.params)
            yhat = conv_norm(x, wc, self.dilation, self.eps, self.plan)
            act = F.gelu(F.linear(yhat, w1))
            rows = x.shape[0] * x.shape[1]
            out = torch.addmm(x.reshape(rows, self.channels), act.reshape(rows, -1),
                              (w2 * self.residual_scale).t()).view_as(x)
            out.backward(replica.grad_out)
        self.ready = (call, [out.detach(), x.grad, wc.grad, w1.grad, w2.grad])
