"""The parent's side of timed steps: two children, one GPU, the parent's clock (CONTRACT §4, §6).

`run_interleaved` drives the trusted baselines process (`grader/child/baselines.py`: plain PyTorch
and the reference) and the submission's process (`grader/child/submission.py`: the submission
alone) through one command at a time each, and measures every step by its own clock:

1. Both start; the baselines process allocates the slab (inputs and evidence that the submission
   process maps) and says ``ready``; the submission process warms up, arms its task limit and
   waits.
2. **Baselines alone**: each shape's warm-up rounds of plain and the reference, then half of
   ``alone_rounds`` timed rounds of the two, the shapes in turns, while the submission process
   is idle (it has not imported the submission yet); the other half after the interleaved
   rounds and the memory report, the submission's process idle again. If the same blocks'
   times interleaved with the submission lie more than a fixed bound from what they took alone
   before, the grade is void (`grader.timing`; the rounds after are information only).
3. The submission process maps the slab, imports ``solution`` and builds a block per shape.
4. **Interleaved**: per shape, warm-up rounds; then every shape's timed rounds, in visits of
   one cycle of the Williams orders, the shapes in turns; which order of the cycle a round gets
   is drawn when it starts (`grader.orders.RoundOrders`). A round: ``fill`` (the baselines
   process draws the round's values from a seed the parent takes from the OS only now), then for
   each block in the round's order ``flush`` (the baselines process probes the device and
   flushes the L2, whichever block's step follows) and ``go`` to the process that owns it, and
   after a step of the submission's process ``probe`` (the baselines process waits until the
   device is free of that step's work: the step's wall ends then), then ``check`` (the
   baselines process compares the reference's and the submission's evidence with plain's,
   before the submission runs again).
5. After the warm-ups and after each visit the submission process is audited (guard, timers,
   stream, processes) and sends the op, kernel and launch census of every step since the last
   audit, which the parent judges (`grader.census`; each step was announced with a commitment
   to its census range before it ran); at the end it reports its GPU memory. The baselines
   process runs the same census and rule guard on its steps, unread, and restarts its census
   with every audit and at the same cadence in the alone rounds: what the harness costs a step
   is then the same for every block.

**Between its commands the submission's process is stopped** (SIGSTOP from each answer it owes
to the parent's next command, `grader.conversation.Child.pause`): nothing it runs, and nothing it
enqueues on the GPU, can fall outside its own windows. What it left running is on its step's
wall (``probe``; after an import, a build or an audit it is waited out: `grader.idle`); work
found before a later step (nobody trusted started it) runs the round again, and more than the
config's ``busy_reruns`` of those, or a device never idle, void the grade.

**Held steps** (where both children could set up a hold: `grader.child.hold.Hold`): a step is
enqueued whole behind a wait on the GPU and answered ``armed``; the parent then releases it by
writing the step's number to that child's page, and times it from the release. The window then
holds the GPU's work and not how fast a process's host enqueued it: on an H200 that host share
(0.24-0.34 ms of a 6.7 ms reference step) moved from one visit and one process to the next and
set the grade-to-grade spread of the score (bench/results/hold-h200-2026-12-02). Before the
submission's held step the baselines process overwrites the slab's inputs (``scrub``) and puts
the round's values back only once the step is armed (``restore``, with the L2 flush): nothing
the submission runs before the release sees the values. A step not armed within
`HOLD_RELEASE_S` (it waits on the GPU inside its step, so it cannot be held) is released and its
round runs again, and the second time for one block and shape the run goes on unheld for every
block. A block's first steps on a shape are never held (CUDA loads its kernels then).

Every step is timed by the parent (``wall_ms``: from ``go``, or from a held step's release, to
``done``): the child's CUDA-event window counts only where it agrees with that
(`grader.timing.analyze_shape`). Every command gets a
deadline (`grader.deadlines`); a message the protocol does not expect now (an extra, a repeat, one
out of order) ends the child as tampered.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import secrets
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader import census as census_rules
from grader import idle, telemetry
from grader.child.hold import DEFAULT_HOST_WAIT, HoldPage, host_wait_flag
from grader.config import DeadlineRule, Profile, ScoringConfig
from grader.confinement import Harness, child_policy, confine_child
from grader.conversation import Child, Stop
from grader.measurements import Interleaved, number
from grader.orders import RoundOrders, williams_orders
from grader.samples import BLOCKS, VISIT_ROUNDS, ShapeRaw, check_utilisation
from grader.sandbox import ARM_EVENT, ChildLimits, ChildProcess, ChildResult, Outcome

CHILD_DIR = Path(__file__).resolve().parent / "child"
REPO_ROOT = Path(__file__).resolve().parent.parent
ORDERS = williams_orders(BLOCKS)
# Orders of the baselines timed alone: each first half the time.
ALONE_ORDERS = (("plain", "ref"), ("ref", "plain"))
# The first half of the alone rounds: the submission's process also times steps of the
# harness's own block (plain PyTorch, "cal"), before it imports the submission: what the harness
# costs a step in that process, around its window, measured where nothing of the submission can
# have changed it (`grader.timing.analyze_shape`).
CALIBRATION_ORDERS = (("plain", "ref", "cal"), ("cal", "ref", "plain"))
# A round checked against the fp64 oracle (one in the judge's ``oracle_every``, drawn after its
# steps ran) costs about this many plain steps (fp64 on the GPU): its deadline's work.
ORACLE_WORK = 20
# A held step not armed this long after its ``go`` is released anyway: its host waits on the GPU
# inside the step, which waits for the release (a block's first step: CUDA's lazy loading of a
# library's kernels synchronizes; or a submission that reads a value back). The host enqueues a
# step in 2-3 ms on an H200's host (bench/timing/step_anatomy.py).
HOLD_RELEASE_S = 0.25
SHM_DIR = Path("/dev/shm")


@dataclass
class _Run:
    """The state of one interleaved run: the two children, what was measured, the census's
    ledger (steps announced, awaiting their summaries) and each announced step's dims."""

    config: ScoringConfig
    profile: Profile
    plain_s: Sequence[float]
    base: Child
    sub: Child
    out: Interleaved
    progress: Callable[[str], None]
    uuid: str | None
    launches: bool = True
    out_device: str = "cuda"
    # Per child, its steps so far: a step's number counts only its own process's steps, so the
    # gaps between the submission's numbers say nothing of how many steps the baselines ran
    # between two of its own (its position in the round, which is drawn when the round starts).
    steps: collections.Counter[str] = field(default_factory=collections.Counter)
    ledger: census_rules.CensusLedger = field(default_factory=census_rules.CensusLedger)
    dims: dict[str, census_rules.BlockDims] = field(default_factory=dict)
    harness_steps: set[str] = field(default_factory=set)  # census labels of "cal" steps
    block_dims: list[census_rules.BlockDims] = field(default_factory=list)
    ready: dict[str, Any] = field(default_factory=dict)  # the baselines process's ``ready``
    held: bool = False
    # Per child ("baselines", "submission"): its hold page.
    pages: dict[str, HoldPage] = field(default_factory=dict)
    # Per (block, shape): its held steps released before they were armed.
    late: collections.Counter[tuple[str, int]] = field(default_factory=collections.Counter)
    # The round in progress found the device busy before one of its steps
    # (`grader.idle.busy_before`).
    rerun: bool = False

    def release(self, child: Child, step: int) -> None:
        """Release ``child``'s held step ``step``: write its number to the child's page. The page
        must still hold what the parent wrote last: a child that writes a page (its own, or the
        other's, found in /dev/shm) to run before its release has tampered."""
        page = self.pages[child.who]
        if page.value != page.written:
            # Only the parent writes the pages, and the baselines process is trusted.
            self.sub.process.tamper(f"the {child.who} process's hold page holds {page.value}, "
                                    f"not {page.written} as the parent wrote it")
            raise self.sub.stop()
        page.write(step)

    def step(self, child: Child, command: dict[str, Any], what: str, work: float,
             index: int, held: bool) -> tuple[dict[str, Any], float, bool]:
        """One step, ``held`` or not: its ``done`` answer, the parent's wall in ms, and whether a
        held step was armed before its release (False: `HOLD_RELEASE_S` ran out first).

        A step of the submission's process ends on the parent's clock only once the trusted
        probe found the device free of its work (`grader.idle.drain`): its wall runs from the
        ``go`` or the release to then, not to a ``done`` it may have sent before its work
        finished."""
        early: list[float] = []
        if not held:
            start = child.send(command)
            message = child.wait("done", what, work)
            child.spent_on(command, start)
        else:
            step = int(command["step"])
            if child is self.sub:
                # The probe before this step is the scrub's: once the step is armed, its own
                # work waits on the GPU behind its hold, and the probe is for what is not.
                scrubbed, _ = self.base.ask({"cmd": "scrub", "shape": index}, "scrubbed",
                                            f"{what}: scrub", work)
                self.rerun = idle.busy_before(scrubbed, what, self.config.timing, self.out)
                if self.rerun:
                    return scrubbed, 0.0, True
            sent = child.send(command | {"held": True})

            def late() -> None:
                early.append(time.perf_counter())
                self.release(child, step)

            armed = child.wait("armed", f"{what} (enqueueing)", work, HOLD_RELEASE_S, late)
            if armed.get("step") != step:
                child.process.tamper(f"armed step {armed.get('step')!r} for step {step}")
                raise child.stop()
            if child is self.sub:
                self.base.ask({"cmd": "restore", "shape": index}, "restored",
                              f"{what}: the values back", work)
            start = time.perf_counter()
            if not early:
                self.release(child, step)
            message = child.wait("done", what, work)
            child.spent_on(command, sent)
            start = early[0] if early else start
        end = float(message.get("_received", start))
        if child is self.sub:
            end = idle.drain(self.base, self.sub, self.out, what, work,
                             block=str(command.get("block", "sub")))
        return message, 1e3 * (end - start), not early

    def round(self, index: int, order: Sequence[str], *, timed: bool, alone: bool,
              label: str, hold: bool = True) -> None:
        """One round of shape ``index``: fresh values, each block's step, the check; a round
        one of whose held steps was released before it was armed runs again. ``hold`` False:
        unheld even in a held run (a block's first steps on a shape, where CUDA loads the
        kernels it needs, synchronizing, and Triton compiles)."""
        while not self._round(index, order, timed=timed, alone=alone, label=label, hold=hold):
            pass

    def _round(self, index: int, order: Sequence[str], *, timed: bool, alone: bool,
               label: str, hold: bool) -> bool:
        raw = self.out.shapes[index]
        work = self.plain_s[index]
        self.base.ask({"cmd": "fill", "shape": index, "seed": secrets.randbits(63)}, "filled",
                      f"drawing the values of {label}", work)
        samples: list[tuple[str, float, float, float]] = []
        held = self.held and hold
        self.rerun = False
        for name in order:
            child = self.sub if name in ("sub", "cal") else self.base
            # The device probed and the L2 flushed before every step by the baselines process,
            # whichever block's (the submission's process is stopped meanwhile). A held step of
            # the submission's process is probed at the baselines' ``scrub`` (before its go)
            # and flushed by their ``restore``, after its values are back. (When the
            # submission's process flushed before the baselines' steps, its synchronize there
            # drained its own leftover work unseen; the steps of the submission's process now
            # alone begin with a switch of the GPU's context, which its calibration steps pay
            # too: `grader.timing.analyze_shape`.)
            if not (held and child is self.sub):
                flushed, _ = self.base.ask({"cmd": "flush"}, "flushed", "flushing the L2", work)
                self.rerun = idle.busy_before(flushed, f"a step of {name} in {label}",
                                              self.config.timing, self.out)
                if self.rerun:
                    return False  # the round runs again, from fresh values
            self.steps[child.who] += 1
            nth = self.steps[child.who]
            command = {"cmd": "go", "shape": index, "block": name, "step": nth}
            if name == "sub":
                command["label"] = label
                self.dims[f"step:{label}#{nth}"] = self.block_dims[index]
            elif name == "cal":
                command["label"] = f"calibration:{label}"
                self.harness_steps.add(f"step:calibration:{label}#{nth}")
            message, wall, armed = self.step(child, command, f"a step of {name} in {label}",
                                             work, index, held)
            if self.rerun:
                # Found busy before this step (its scrub's probe): the round runs again.
                return False
            if message.get("step") != nth:
                # A done that answers another step (one sent early, or a stale one) is the
                # harness's clock no longer being the step's.
                child.process.tamper(f"answered step {message.get('step')!r} to step "
                                     f"{nth}")
                raise child.stop()
            if not armed:
                # Released before it was armed: its host took over `HOLD_RELEASE_S` to enqueue
                # it, compiling or loading its kernels (a block's first step) or waiting on the
                # GPU inside its step (the GPU waited for the release). A submission's step
                # then ran on the scrubbed slab: the round runs again, this one unchecked and
                # untimed. The second time for one block and shape it is no first step: every
                # later step runs unheld.
                self.late[name, index] += 1
                if self.late[name, index] >= 2:
                    self.held = False
                    self.out.hold = (f"unheld from step {nth} on: the {name} step in "
                                     f"{label} was twice not enqueued within "
                                     f"{HOLD_RELEASE_S:g} s (it waits on the GPU inside its "
                                     "step)")
                    self.progress(self.out.hold)
                return False
            samples.append((name, number(message, "window_ms"), number(message, "tail_ms"),
                            wall))
        if timed:
            for name, window, tail, wall in samples:
                if name == "cal":
                    raw.calibration_ms.append(wall - window)
                elif alone:
                    raw.alone_ms[name].append(window)
                else:
                    raw.window_ms[name].append(window)
                    raw.tail_ms[name].append(tail)
                    raw.wall_ms[name].append(wall)
        # Drawn after the steps ran: nothing in the submission's process can know which rounds
        # are held to the fp64 oracle at the gate's budgets (the others: to plain's answer,
        # within the judge's ``plain_slack`` of the budgets).
        judge = self.config.timing.judge
        oracle = "sub" in order and secrets.randbelow(judge.oracle_every) == 0
        message, _ = self.base.ask({"cmd": "check", "shape": index, "sub": "sub" in order,
                                    "oracle": oracle}, "checked", f"checking {label}",
                                   work * ORACLE_WORK if oracle else work)
        changed = message.get("changed") or []
        if changed:
            raise Stop("check_failed", f"{label}: the submission's step changed its "
                        f"{', '.join(changed)}")
        if "sub" in order:
            if not oracle:
                raw.util.append(message["util"])
            # Judged here, once (the parent's slack, the baselines process's numbers): a wrong
            # answer ends the run instead of being timed for every remaining round; the verdict
            # stays with the shape's samples for the judge's row.
            limit, against = ((1.0, "the fp64 oracle") if oracle
                              else (judge.plain_slack, "plain PyTorch"))
            value, why = check_utilisation(message["util"][-1], limit, against)
            if why:
                raw.check_failed = why
                raise Stop("check_failed", f"{label}: {why}")
            if oracle:
                raw.oracle_util.append(value)
        return True

    def judge_census(self, message: dict[str, Any]) -> None:
        """One ``census`` message of the submission's process, judged here (`grader.census`)."""
        label = census_rules.message_label(message)
        # A step's dims are needed until its summary comes, once.
        dims = self.dims.pop(label, None) if census_rules.is_step(message) else self.dims.get(label)
        found = census_rules.judge_message(message, dims, self.ledger,
                                           gpu=self.out_device == "cuda",
                                           rules=label not in self.harness_steps)
        if found:
            first = found[0]
            raise Stop("rule_broken", f"{first.rule}: {first.message}")

    def collect(self, label: str) -> None:
        """The baselines process's census restart alone (in the alone rounds: the same cadence
        of restarts as in the interleaved ones, so its profiler's buffers are alike)."""
        self.base.ask({"cmd": "collect"}, "collected", f"the census after {label}")

    def audit(self, label: str, *, ran_steps: bool = True) -> None:
        """Audit the submission's process (and restart both censuses); ``ran_steps``: it ran
        steps since the last audit, so a census of one at least must have come."""
        # Both processes restart their profilers at once: the restart costs each of them
        # (stopping CUPTI, building the trace), and nothing is timed meanwhile.
        self.base.send({"cmd": "collect"})
        message, _ = self.sub.ask({"cmd": "audit", "label": label}, "audited",
                                  f"auditing after {label}")
        self.base.wait("collected", f"the census after {label}", 0.0)
        idle.settle(self.base, f"the audit after {label}")
        steps = message.get("steps")
        if not isinstance(steps, list) or not all(
                isinstance(st, dict) and isinstance(st.get("own"), int)
                and isinstance(st.get("foreign"), list) for st in steps):
            self.sub.process.tamper("sent a malformed launch census")
            raise self.sub.stop()
        for step in steps:
            foreign = step["foreign"]
            if foreign:
                raise Stop("rule_broken", f"foreign-triton-kernel: {str(foreign[0])[:300]} ran "
                            f"in {str(step.get('label'))[:100]} (not the submission's files)")
            if self.launches and not step["own"]:
                raise Stop("rule_broken", f"no-triton-kernel: no Triton kernel defined in the "
                            f"submission was launched in {step.get('label')}")
        # Every step announced since the last audit must have brought its census by now.
        found = self.ledger.close_item(label) if ran_steps else self.ledger.unsettled()
        if found:
            raise Stop("rule_broken", f"{found[0].rule}: {found[0].message}")

    def snapshot(self, what: str) -> None:
        self.out.snapshots.append(telemetry.snapshot(what, uuid=self.uuid))


def _label(profile: Profile, index: int) -> str:
    return profile.shapes[index].label


@dataclass
class Started:
    """Both timing children started and the baselines warmed up (`start_interleaved`): the
    submission's process is armed and idle, it has imported nothing of the submission. What
    `finish_interleaved` continues from, or `cancel_interleaved` ends.

    Attributes:
        run: The run's state.
        sub_dir: The submission process's private directory (its Triton cache is ``.triton``).
        stopped: How the start itself ended the run, if it did.
    """

    run: _Run
    sub_dir: Path
    stopped: Stop | None = None


def run_interleaved(*args: Any, **kwargs: Any) -> Interleaved:
    """`start_interleaved` then `finish_interleaved`, with the same arguments."""
    return finish_interleaved(start_interleaved(*args, **kwargs))


def start_interleaved(
    submission_root: Path,
    workdir: Path,
    config: ScoringConfig,
    profile: Profile,
    *,
    plain_s: Sequence[float],
    device: str,
    env: dict[str, str],
    rule: DeadlineRule,
    reference_module: str,
    census: bool = True,
    python: str,
    progress: Callable[[str], None],
    uuid: str | None = None,
    host_wait: str = DEFAULT_HOST_WAIT,
) -> Started:
    """Start both timing children and warm the baselines up (the module docstring's step 1 and
    the start of step 2): nothing here runs or times submission code, so it may run while the
    gate still runs (`grader.timing_run.TimingStart`).

    Args:
        submission_root: The exported submitted tree.
        workdir: A fresh directory for both children's private directories.
        config: The scoring config (block, budgets, limits).
        profile: The timing profile.
        plain_s: The plain block's step on each shape, as the parent measured it: the unit of
            every deadline.
        device: ``cuda`` or ``cpu`` (a dry run with the Triton interpreter).
        env: Added to both children's environments (``CUDA_VISIBLE_DEVICES``...).
        rule: The deadline rule.
        reference_module: Module of the reference block in the baselines process.
        census: Require a Triton kernel of the submission's own files in each of its steps.
        python: The children's interpreter.
        progress: Called with a line of progress.
        uuid: The GPU's UUID for telemetry snapshots.
        host_wait: How both children's hosts wait for the device (`grader.child.hold.HOST_WAITS`;
            the same for both, so what it costs a window is the same for every block; default
            `grader.child.hold.DEFAULT_HOST_WAIT`).
    """
    host_wait_flag(host_wait)  # an unknown wait is refused before any child starts
    shapes = profile.shapes
    out = Interleaved(shapes=[ShapeRaw(s) for s in shapes])
    base_dir, sub_dir = workdir / "baselines", workdir / "submission"
    base_dir.mkdir(parents=True)
    shutil.copytree(submission_root, sub_dir, ignore=shutil.ignore_patterns(".git"))
    job = {
        "device": device,
        "block": dataclasses.asdict(config.block),
        "shapes": [{"batch": s.batch, "length": s.length, "dilation": s.dilation,
                    "dtype": s.dtype} for s in shapes],
        "budgets": {name: {"forward_atol": b.forward_atol, "forward_rtol": b.forward_rtol,
                           "grad_rel": b.grad_rel} for name, b in config.budgets.items()},
        "reference_module": reference_module,
        "host_wait": host_wait,
        "probe_idle_ms": config.timing.probe_idle_ms,
        "probe_limit_s": config.timing.probe_limit_s,
        "probe_runs": config.timing.probe_runs,
    }
    if device == "cpu":
        # In a folder of its own: the submission's confinement names the folder, which must
        # exist before the child starts (the baselines process makes the file).
        (workdir / "shared").mkdir()
        job["slab_path"] = str(workdir / "shared" / "slab")
    # The driver pins the pages, which it does for shared memory (tmpfs): in /dev/shm where it
    # can be written, else in ``workdir`` (where a child may refuse it; the run is then unheld).
    where = SHM_DIR if SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK) else workdir
    pages = {who: HoldPage.create(where) for who in ("baselines", "submission")}
    sub_job = {k: job[k] for k in ("device", "block", "shapes", "host_wait")}
    sub_job["forbidden_dirs"] = [str(REPO_ROOT / "grader"), str(REPO_ROOT / "reference")]
    job["hold_path"] = str(pages["baselines"].path)
    sub_job["hold_path"] = str(pages["submission"].path)
    (workdir / "baselines.json").write_text(json.dumps(job))
    (workdir / "submission.json").write_text(json.dumps(sub_job))
    limits = ChildLimits.from_phase(config.limits.timing)
    base = Child("baselines", ChildProcess(CHILD_DIR / "baselines.py", base_dir,
                                            [str(REPO_ROOT), str(workdir / "baselines.json")],
                                            limits, env, python=python), rule, trusted=True)
    # The submission's process runs the harness's copy, confined by the operating system before
    # its first line (`grader.confinement`): its tree, its job, its hold page and the CPU slab.
    harness = Harness(workdir / "harness")
    own = [pages["submission"].path, *([workdir / "shared"] if device == "cpu" else [])]
    if env.get("TRITON_CACHE_DIR"):  # a cache the caller names instead of the child's own
        Path(env["TRITON_CACHE_DIR"]).mkdir(parents=True, exist_ok=True)
        own.append(Path(env["TRITON_CACHE_DIR"]))
    policy = child_policy(harness, sub_dir, gpu=device != "cpu",
                          read=[workdir / "submission.json"], write=own)
    sub = Child("submission", ChildProcess(CHILD_DIR / "submission.py", sub_dir,
                                            [str(harness.root), str(workdir / "submission.json")],
                                            limits, env, arm=True, python=python,
                                            confinement=confine_child(harness, policy)),
                 rule, trusted=False)
    run = _Run(config, profile, plain_s, base, sub, out, progress, uuid, census, device)
    run.pages = pages
    run.block_dims = [census_rules.BlockDims(s.batch, s.length, config.block.channels,
                                             config.block.expansion) for s in shapes]
    sub.on_census = run.judge_census
    started = Started(run, sub_dir)
    try:
        _warm_baselines(run)
    except Stop as stop:
        started.stopped = stop
    except BaseException:
        _end(run)
        raise
    return started


def finish_interleaved(started: Started) -> Interleaved:
    """Time the submission against the warmed-up baselines (steps 2-5), end both children."""
    run = started.run
    out = run.out
    try:
        if started.stopped is not None:
            raise started.stopped
        _drive(run)
    except Stop as stop:
        out.status, out.reason = stop.status, stop.reason
    finally:
        _end(run)
    if out.status == "ok" and out.submission.outcome is not Outcome.OK:
        out.status, out.reason = "crashed", f"the timing child {out.submission.detail}"
    return out


def cancel_interleaved(started: Started) -> None:
    """End both children of a run that will not be timed (the gate failed)."""
    _end(started.run)


def _end(run: _Run) -> None:
    """Tell both children to end, reap them, keep how they ended; once."""
    out = run.out
    if out.submission is not None:
        return
    for child in (run.sub, run.base):
        child.send({"cmd": "end"})
    out.submission = _finish(run.sub.process)
    out.baselines = _finish(run.base.process)
    out.command_s = {child.who: child.spent for child in (run.base, run.sub)}
    for page in run.pages.values():
        page.close()


def _finish(process: ChildProcess, grace_s: float = 10.0) -> ChildResult:
    """Let a child that was told ``end`` exit on its own for a while, then reap it."""
    until = time.monotonic() + grace_s
    while not process.ended and time.monotonic() < until:
        process.poll(0.05)
    return process.finish(kill=True)


def alone_rounds(run: _Run, count: int, orders: Sequence[Sequence[str]]) -> None:
    """``count`` timed rounds of the baselines alone (with ``orders`` in turns), the shapes in
    turns, their census restarted at the audits' cadence."""
    n = len(run.profile.shapes)
    for r in range(count):
        for index in range(n):
            run.round(index, orders[r % len(orders)], timed=True, alone=True,
                      label=_label(run.profile, index))
        if (r + 1) % VISIT_ROUNDS == 0 or r + 1 == count:
            run.collect(f"{r + 1} alone rounds")


def _warm_baselines(run: _Run) -> None:
    """Both children up and armed, the handshakes measured, every shape's warm-up rounds of
    the baselines alone (the submission's process idle)."""
    profile, out, base, sub = run.profile, run.out, run.base, run.sub
    n = len(profile.shapes)
    run.ready = base.wait("ready", "starting the baselines process", 0.0)
    out.device = dict(run.ready.get("device") or {})
    hello = sub.wait("hello", "starting the timing child", 0.0)
    out.host_wait = {"baselines": str(run.ready.get("host_wait")),
                     "submission": str(hello.get("host_wait"))}
    # Held only where both processes hold: the submission's process saying it cannot only
    # costs it the hold (its steps are then timed as the baselines' are, unheld).
    if run.ready.get("hold") is True and hello.get("hold") is True:
        run.held, out.hold = True, "held"
    else:
        out.hold = (f"unheld: baselines {run.ready.get('hold_how')!r}, submission "
                    f"{hello.get('hold_how')!r}")
    # Both children have mapped their pages by now: no path leads to them any more (another
    # grade's submission on this host, the same user outside a container, cannot find them).
    for page in run.pages.values():
        page.path.unlink(missing_ok=True)
    # The sandbox counts the child's tasks and answers; only then may commands follow.
    sub.wait(ARM_EVENT, "warming up the timing child", 0.0)
    sub.pause()  # from here on it runs only between a command of the parent's and its answer
    out.handshake_ms = {
        child.who: statistics.median(child.ask({"cmd": "ping"}, "pong", "a ping")[1]
                                     for _ in range(20))
        for child in (base, sub)}
    # Baselines alone, the submission's process idle (it has imported nothing of the
    # submission yet).
    for index in range(n):
        label = _label(profile, index)
        run.progress(f"baselines alone: warming up {index + 1}/{n} {label}")
        for r in range(profile.warmup):
            run.round(index, ALONE_ORDERS[r % 2], timed=False, alone=True, label=label,
                      hold=r > 0)
    run.collect("the baselines' warm-ups")


def _drive(run: _Run) -> None:
    profile, out, base, sub = run.profile, run.out, run.base, run.sub
    n = len(profile.shapes)
    ready = run.ready
    run.snapshot("baselines alone")
    # The submission's process maps the slab now: its calibration steps read their inputs from
    # it, as the submission's steps will.
    sub.ask({"cmd": "attach", "slab": ready["slab"]}, "attached", "mapping the inputs")
    half = profile.alone_rounds // 2
    # The harness's own block runs its first step on each shape in that process here, unheld
    # and untimed (CUDA loads its kernels then).
    for index in range(n):
        run.round(index, CALIBRATION_ORDERS[0], timed=False, alone=True,
                  label=_label(profile, index), hold=False)
    alone_rounds(run, half, CALIBRATION_ORDERS)
    # Their census is read before the submission exists (kept in the ledger, not judged).
    run.audit("the calibration steps")
    run.progress(f"baselines alone: {half} rounds of each shape")

    loaded, _ = sub.ask({"cmd": "load"}, "loaded", "importing solution.py")
    idle.settle(run.base, "the import")
    out.load_s = number(loaded, "seconds")
    # Every round's order is drawn when it starts, from the OS's randomness in this process
    # (`grader.orders.RoundOrders`): a shape's timed rounds are its whole cycles of orders all
    # the same, and nothing in the submission's process can know which step follows its own.
    warm = [RoundOrders(BLOCKS) for _ in range(n)]
    timed = [RoundOrders(BLOCKS) for _ in range(n)]
    for index in range(n):
        label = _label(profile, index)
        sub.ask({"cmd": "build", "shape": index}, "built", f"building the block of {label}")
        idle.settle(run.base, f"building the block of {label}")
        run.progress(f"warming up {index + 1}/{n} {label}")
        run.snapshot(f"before {label}")
        for r in range(profile.warmup):
            run.round(index, warm[index].draw(), timed=False, alone=False, label=label,
                      hold=r > 0)
    # One untimed round each, in the visiting order: the caching allocators have then seen every
    # shape's steps after another shape's.
    for index in range(n):
        run.round(index, warm[index].draw(), timed=False, alone=False,
                  label=_label(profile, index))
    run.audit("the warm-ups")
    visits = -(-profile.rounds // VISIT_ROUNDS)
    for visit in range(visits):
        for index in range(n):
            for _ in range(min(VISIT_ROUNDS, profile.rounds - visit * VISIT_ROUNDS)):
                run.round(index, timed[index].draw(), timed=True, alone=False,
                          label=_label(profile, index))
        run.audit(f"timed visit {visit + 1}")
        if visit in (0, visits - 1):
            run.snapshot(f"timed visit {visit + 1}/{visits}")
        run.progress(f"{visit + 1}/{visits} timed visits (all {n} shapes in turn)")
    memory, _ = sub.ask({"cmd": "memory"}, "memory", "reading the GPU memory")
    out.memory = memory
    # The other half of the alone rounds: the baselines' own drift over the run is then known
    # (`grader.timing.baseline_drift`). The submission's process is only flushing again, and is
    # audited once more after them.
    alone_rounds(run, half, ALONE_ORDERS)
    run.audit("the last alone rounds", ran_steps=False)
    run.progress(f"baselines alone again: {half} rounds of each shape")
    sub.leftover()
    base.leftover()


__all__ = ["ORDERS", "Started", "cancel_interleaved", "finish_interleaved", "run_interleaved",
           "start_interleaved"]
