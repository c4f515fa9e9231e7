"""The parent's conversation with one timing child (`grader.interleave`): a command, then exactly
the answer it expects, under a deadline; anything else the child sends is tampering.

`Child` wraps a `grader.sandbox.ChildProcess`; `Stop` is how a run ends early, with a status and
a reason. The submission's child is stopped (SIGSTOP) between the parent's commands: from the
answer it owes (`ask`, or a step's ``done``) to the next command. A held step's release
(`grader.interleave`) is the one thing the parent does while it waits: `Child.wait` calls it if
the answer is late.
"""

from __future__ import annotations

import collections
import json
import math
import time
from collections.abc import Callable
from typing import Any

from grader.config import DeadlineRule
from grader.device_memory import is_cuda_oom
from grader.sandbox import ChildExit, ChildProcess, Deadline, Outcome

# While the parent waits for an answer, the watchdog's scan of the child's processes waits this
# long first: a step's answer must be read when it comes, not after milliseconds of /proc.
QUIET_S = 1.0


class Stop(Exception):
    """The run ends here with ``status`` and ``reason``."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


# How the submission's process says it failed; anything else it names (a "harness" failure
# included) is its own crash, never the grader's.
_FAILURE_STATUS = {"rule": "rule_broken", "check": "check_failed", "oom": "out_of_memory",
                   "load": "crashed", "crash": "crashed"}
_OUTCOME_STATUS = {Outcome.TIMED_OUT: "timed_out", Outcome.OUT_OF_MEMORY: "out_of_memory",
                   Outcome.TAMPERED: "rule_broken", Outcome.TOO_MANY_TASKS: "rule_broken"}


class Child:
    """One child and its conversation: a command, then exactly the answer it expects."""

    def __init__(self, who: str, process: ChildProcess, rule: DeadlineRule,
                 trusted: bool) -> None:
        self.who = who
        self.process = process
        self.rule = rule
        self.trusted = trusted
        self.due: Deadline | None = None
        self.findings: list[dict[str, Any]] = []
        self.pending: collections.deque[dict[str, Any]] = collections.deque()
        self.taken = 0  # messages of the process moved to `pending` so far
        self.on_census: Callable[[dict[str, Any]], None] | None = None
        # Per command: how many were sent and the parent's seconds from sending to the answer
        # (telemetry: where a run's wall time goes).
        self.spent: dict[str, list[float]] = {}
        # The submission's process is stopped (SIGSTOP) from each answer it owes until the
        # parent's next command to it: it cannot run, or enqueue GPU work, outside its windows.
        self.pausable = not trusted
        self.paused = False
        process.deadline = lambda: self.due

    def wait(self, expect: str, what: str, work_s: float, late_s: float | None = None,
              on_late: Callable[[], None] | None = None) -> dict[str, Any]:
        """The next message, which must be ``expect``.

        Messages that came in the same read as an earlier answer wait their turn here, so a
        repeat or an extra is judged like any other message (tampering), never dropped. The
        watchdog's scan of the child's processes (milliseconds of reading /proc) is held off for
        `QUIET_S`, so a step's answer is read the moment it comes; the deadline, memory and task
        limits are judged from then on. ``on_late`` is called once if nothing came within
        ``late_s``.
        """
        self.due = Deadline(time.monotonic() + self.rule.seconds(work_s),
                            f"{what}: {self.rule.describe(work_s)}")
        quiet_until = time.monotonic() + QUIET_S
        late_at = time.monotonic() + late_s if late_s is not None else math.inf
        while True:
            while not self.pending:
                if on_late is not None and time.monotonic() > late_at:
                    on_late()
                    on_late = None
                if self.process.ended:
                    # What it wrote just before it exited (a failure and its reason) is read
                    # when it is reaped; those messages are judged like any others.
                    self.process.finish()
                    late = self.process.messages[self.taken:]
                    if not late:
                        raise self.stop()
                    self.pending.extend(late)
                    self.taken += len(late)
                    break
                new = self.process.poll(0.05, watch=time.monotonic() > quiet_until)
                self.pending.extend(new)
                self.taken += len(new)
            message = self.pending.popleft()
            if message.get("event") != "census":
                break
            # A step announced, or its census: judged by the run (the baselines' are not).
            if self.on_census is not None and not self.trusted:
                self.on_census(message)
        event = message.get("event")
        if event == "finding" and not self.trusted:
            self.findings.append(message)
            raise Stop("rule_broken", f"{message.get('rule')}: {message.get('message')}")
        if event == "failure":
            kind = str(message.get("kind"))
            status = "grader_error" if self.trusted else _FAILURE_STATUS.get(kind, "crashed")
            reason = str(message.get("reason", f"the {self.who} child failed"))
            if message.get("rule"):
                reason = f"{message['rule']}: {reason}"
            raise Stop(status, reason)
        if event != expect:
            self.process.tamper(f"sent {event!r} while the parent waited for {expect!r} "
                                f"({what})")
            raise self.stop()
        self.due = None
        return message

    def leftover(self) -> None:
        """At the end: a message nobody asked for is tampering."""
        new = self.process.poll(0.0, watch=False)
        self.pending.extend(new)
        self.taken += len(new)
        if self.pending:
            event = self.pending[0].get("event")
            self.process.tamper(f"sent {event!r} that no command asked for")
            raise self.stop()

    def pause(self) -> None:
        """Stop an untrusted child until the parent's next command (`send` continues it)."""
        if self.pausable and not self.paused and not self.process.ended:
            self.process.pause()
            self.paused = True

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.process.resume()

    def send(self, command: dict[str, Any]) -> float:
        """Write ``command`` (an untrusted child continued first, `pause`); the parent's clock
        just before it was written."""
        line = json.dumps(command) + "\n"
        self.resume()
        start = time.perf_counter()
        self.process.send(line)
        return start

    def spent_on(self, command: dict[str, Any], since: float) -> None:
        """Count ``command`` as answered now, ``since`` its `send` (`spent`)."""
        count_s = self.spent.setdefault(str(command.get("cmd")), [0, 0.0])
        count_s[0] += 1
        count_s[1] += time.perf_counter() - since

    def ask(self, command: dict[str, Any], expect: str, what: str,
            work_s: float = 0.0) -> tuple[dict[str, Any], float]:
        """Send ``command``; its answer and the parent's round trip in ms: from just before the
        command is written to when the answer's frame was read."""
        start = self.send(command)
        message = self.wait(expect, what, work_s)
        self.pause()
        self.spent_on(command, start)
        return message, 1e3 * (float(message.get("_received", start)) - start)

    def stop(self) -> Stop:
        result = self.process.finish()
        if self.trusted:
            return Stop("grader_error", f"the baselines child {result.detail or 'ended'}: "
                         f"{result.stderr_tail[-600:]}")
        if result.outcome is Outcome.TAMPERED:
            return Stop("rule_broken", f"channel-tampering: the timing child {result.detail}")
        if result.outcome is Outcome.TOO_MANY_TASKS:
            return Stop("rule_broken", f"new-thread: the timing child {result.detail}")
        if (result.exit_code == ChildExit.HARNESS_ERROR and result.armed_tasks is None
                and is_cuda_oom(result.stderr_tail)):
            # Before it armed, only the harness ran (its CUDA context on a full GPU, say).
            last = result.stderr_tail.strip().splitlines()[-1:] or [""]
            return Stop("grader_error", f"the timing child's harness ran out of GPU memory "
                        f"before the submission ran: {last[0][-300:]}")
        status = _OUTCOME_STATUS.get(result.outcome, "crashed")
        return Stop(status, f"the timing child {result.detail or 'ended before it finished'}")


__all__ = ["QUIET_S", "Child", "Stop"]
