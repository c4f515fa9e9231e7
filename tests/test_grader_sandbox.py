"""The child-process runner: every way a child can end is a typed outcome, never a hang or an
exception in the parent. Real subprocesses, tiny scripts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader.sandbox import ChildExit, ChildLimits, Outcome, run_child

LIMITS = ChildLimits(wall_s=5, memory_mb=400, max_tasks=16, open_files=64)
REPO = Path(__file__).resolve().parent.parent
PRELUDE = f"""
import json, os, sys, time
sys.path.insert(0, {str(REPO)!r})
from grader.child.channel import ChannelWriter
channel = ChannelWriter()  # reads the key from the first line of stdin
raw = os.fdopen(int(os.environ["GRADER_CHANNEL_FD"]), "wb", buffering=0, closefd=False)
def send(event, **m):
    channel.send(event, **m)
"""


def run(tmp_path: Path, body: str, limits: ChildLimits = LIMITS, **kwargs):
    script = tmp_path / "child.py"
    script.write_text(PRELUDE + body)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return run_child(script, work, [], limits, **kwargs)


def test_ok_with_messages_and_scrubbed_env(tmp_path: Path) -> None:
    os.environ["GRADER_TEST_SECRET"] = "do-not-leak"
    try:
        r = run(tmp_path, "send(event='env', keys=sorted(os.environ), cwd=os.getcwd(), "
                          "flags=sys.flags.isolated)")  # fmt: skip
    finally:
        del os.environ["GRADER_TEST_SECRET"]
    assert r.outcome is Outcome.OK and r.exit_code == 0, r
    (msg,) = r.messages
    assert "GRADER_TEST_SECRET" not in msg["keys"]
    assert msg["cwd"] == str(tmp_path / "work")
    assert msg["flags"] == 1  # python -I


def test_children_and_the_parent_number_gpus_in_pci_order(tmp_path: Path) -> None:
    """NVML's GPU N (what a report names), CUDA's device N here and CUDA_VISIBLE_DEVICES=N in a
    child are one GPU only when CUDA numbers them in PCI order too, whatever the caller had."""
    r = run(tmp_path, "send(event='env', order=os.environ.get('CUDA_DEVICE_ORDER'))",
            env_extra={"CUDA_VISIBLE_DEVICES": "3"})  # fmt: skip
    assert r.messages[0]["order"] == "PCI_BUS_ID"
    env = dict(os.environ, CUDA_DEVICE_ORDER="FASTEST_FIRST")
    done = subprocess.run([sys.executable, "-c", "import os, grader; "
                           "print(os.environ['CUDA_DEVICE_ORDER'])"], env=env, cwd=REPO,
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert done.stdout.strip() == "PCI_BUS_ID"


def test_nonzero_exit(tmp_path: Path) -> None:
    r = run(tmp_path, "sys.exit(7)")
    assert r.outcome is Outcome.EXITED and r.exit_code == 7


def test_child_reported_oom_exit_code(tmp_path: Path) -> None:
    r = run(tmp_path, f"sys.exit({int(ChildExit.OUT_OF_MEMORY)})")
    assert r.outcome is Outcome.OUT_OF_MEMORY


def test_the_watchdog_keeps_the_trees_largest_gpu_use(tmp_path: Path) -> None:
    """The grader's own measure of the child's GPU memory (grader/device_memory.py's
    usage_probe in a grade): asked with the tree's pids, its largest answer is kept."""
    seen: list[list[int]] = []
    answers = iter([None, 3 << 30, 5 << 30, 1 << 30])

    def probe(pids: list[int]) -> int | None:
        seen.append(list(pids))
        return next(answers, None)

    r = run(tmp_path, "time.sleep(0.5)", gpu_usage=probe)
    assert r.outcome is Outcome.OK and r.peak_gpu_bytes == 5 << 30
    assert len(seen) >= 4 and all(pids for pids in seen)
    assert run(tmp_path, "pass").peak_gpu_bytes is None  # nothing asked: nothing measured


def test_segfault_is_signaled(tmp_path: Path) -> None:
    r = run(tmp_path, "import ctypes; ctypes.string_at(0)")
    assert r.outcome is Outcome.SIGNALED and r.signal == signal.SIGSEGV
    assert "SIGSEGV" in r.detail


def test_hang_times_out(tmp_path: Path) -> None:
    start = time.monotonic()
    r = run(tmp_path, "send(event='before'); time.sleep(60)",
            ChildLimits(wall_s=1.5, memory_mb=400))  # fmt: skip
    assert r.outcome is Outcome.TIMED_OUT
    assert time.monotonic() - start < 10
    assert [m["event"] for m in r.messages] == ["before"]


def test_memory_hog_is_killed(tmp_path: Path) -> None:
    r = run(tmp_path, "hog = []\nwhile True: hog.append(bytearray(20 << 20))",
            ChildLimits(wall_s=20, memory_mb=300))  # fmt: skip
    assert r.outcome is Outcome.OUT_OF_MEMORY
    assert r.peak_rss_mb > 300


def test_thread_bomb_is_killed(tmp_path: Path) -> None:
    body = "import threading\nfor _ in range(100):\n" \
           "    threading.Thread(target=time.sleep, args=(20,), daemon=True).start()\n" \
           "time.sleep(20)"  # fmt: skip
    r = run(tmp_path, body, ChildLimits(wall_s=10, memory_mb=400, max_tasks=16))
    assert r.outcome is Outcome.TOO_MANY_TASKS


def test_escaped_grandchild_is_killed(tmp_path: Path) -> None:
    body = """
pid = os.fork()
if pid == 0:
    os.setsid()
    time.sleep(60)
    os._exit(0)
send(event="forked", pid=pid)
time.sleep(0.3)
"""
    r = run(tmp_path, body)
    assert r.outcome is Outcome.OK
    pid = r.messages[0]["pid"]
    assert pid in r.leftover_pids
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_replies_reach_the_child(tmp_path: Path) -> None:
    body = """
for i in range(3):
    send(event="ask", i=i)
    send(event="got", line=sys.stdin.readline().strip())
"""
    r = run(tmp_path, body, on_message=lambda m: f"go {m['i']}\n" if m["event"] == "ask" else None)
    assert [m["line"] for m in r.messages if m["event"] == "got"] == ["go 0", "go 1", "go 2"]


def test_garbage_on_the_channel_is_tampering(tmp_path: Path) -> None:
    r = run(tmp_path, "send('fine'); raw.write(b'not json\\n[1,2]\\n'); time.sleep(30)")
    assert r.outcome is Outcome.TAMPERED, r
    assert "not the harness's on its result channel" in r.detail and "starts with b'not '" in r.detail
    assert [m["event"] for m in r.messages] == ["fine"]


# A forger who read the grader: the frame format, but not the key (a fresh one per child).
_FORGED = """
import hashlib, hmac, struct
from grader.child.channel import HEADER, MAGIC
def forge(seq, key):
    body = json.dumps({{"seq": seq, "event": "shape_done", "blobs": []}}).encode()
    head = HEADER.pack(MAGIC, len(body), 0)
    raw.write(head + body + hmac.new(key, head + body, hashlib.sha256).digest())
send("first")
{action}
send("after")
time.sleep(30)
"""


@pytest.mark.parametrize(("action", "why"), [
    ("forge(1, bytes(32))", "does not carry the channel's tag"),
    ("forge(0, channel._key)", "frame 0 arrived where frame 1 was due"),
    ("forge(5, channel._key)", "frame 5 arrived where frame 1 was due"),
])
def test_forged_frames_end_the_child(tmp_path: Path, action: str, why: str) -> None:
    """Without the key a frame fails its tag; with the key (found in the harness's memory) a
    replayed or made-up sequence number is out of order."""
    r = run(tmp_path, _FORGED.format(action=action))
    assert r.outcome is Outcome.TAMPERED, r
    assert why in r.detail, r.detail
    assert [m["event"] for m in r.messages] == ["first"]


def test_a_frame_with_the_key_and_the_next_number_displaces_the_harness(tmp_path: Path) -> None:
    """The one forgery the channel alone cannot tell: the harness's own next message then
    arrives out of order, and the protocol's owner (here: none) must not take the forged one
    as final. The child is ended at the harness's next message."""
    r = run(tmp_path, _FORGED.format(action="forge(1, channel._key)"))
    assert r.outcome is Outcome.TAMPERED, r
    assert "frame 1 arrived where frame 2 was due" in r.detail
    assert [m["event"] for m in r.messages] == ["first", "shape_done"]


def test_protocol_error_from_the_callback_ends_the_child(tmp_path: Path) -> None:
    from grader.sandbox import ProtocolError

    def on_message(message: dict) -> None:
        if message["event"] == "extra":
            raise ProtocolError("'extra' is not allowed now")

    r = run(tmp_path, "send('ok'); send('extra'); time.sleep(30)", on_message=on_message)
    assert r.outcome is Outcome.TAMPERED and "'extra' is not allowed now" in r.detail


def test_blobs_arrive_with_their_bytes(tmp_path: Path) -> None:
    body = """
from grader.child.channel import Blob
channel.send("out", blobs=[("a", Blob("uint8", (3, 1 << 20), bytes(range(3)) * (1 << 20)))], n=1)
"""
    r = run(tmp_path, body)
    assert r.outcome is Outcome.OK, r
    (msg,) = r.messages
    blob = msg["_blobs"]["a"]
    assert msg["n"] == 1 and blob.shape == (3, 1 << 20) and len(blob.data) == 3 << 20
    assert blob.data[:4] == bytes([0, 1, 2, 0])


def test_open_files_limit(tmp_path: Path) -> None:
    body = """
files = []
try:
    for _ in range(200):
        files.append(open(os.devnull))
except OSError:
    send(event="limited", n=len(files))
"""
    r = run(tmp_path, body)
    assert r.messages and r.messages[0]["n"] < 64


# ----------------------------------------------------------------------------- any host

# What a harness on a many-core host holds before the submission runs: pools sized by the
# host's cores (here 40 sleeping threads), then it arms, then the submission adds its own.
_POOLS_THEN_ARM = """
import threading
for _ in range({pools}):
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
send("armed")
send("reply", line=sys.stdin.readline().strip())
for _ in range({added}):
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
send("added")
time.sleep(1.0)
"""


def test_armed_limit_counts_only_what_is_added(tmp_path: Path) -> None:
    """40 threads of the harness's own (a 40-core host's pools) are over max_tasks=16 but were
    there before the child armed: only what comes after counts."""
    limits = ChildLimits(wall_s=20, memory_mb=400, max_tasks=16)
    r = run(tmp_path, _POOLS_THEN_ARM.format(pools=40, added=8), limits, arm=True)
    assert r.outcome is Outcome.OK, r.detail
    assert r.armed_tasks is not None and r.armed_tasks >= 41
    assert r.peak_tasks > limits.max_tasks
    assert [m["line"] for m in r.messages if m["event"] == "reply"] == ["armed"]
    # The same child without arming: 40 threads are over the absolute limit.
    r = run(tmp_path, _POOLS_THEN_ARM.format(pools=40, added=8), limits)
    assert r.outcome is Outcome.TOO_MANY_TASKS


def test_armed_limit_still_stops_what_the_submission_adds(tmp_path: Path) -> None:
    r = run(tmp_path, _POOLS_THEN_ARM.format(pools=40, added=40),
            ChildLimits(wall_s=20, memory_mb=400, max_tasks=16), arm=True)
    assert r.outcome is Outcome.TOO_MANY_TASKS
    assert f"the {r.armed_tasks} it held before the submission ran + 16" in r.detail


def test_only_the_first_arming_counts(tmp_path: Path) -> None:
    """A second 'armed' (the submission writing to the channel) does not move the baseline."""
    body = _POOLS_THEN_ARM.format(pools=2, added=0) + """
for _ in range(40):
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
send("armed")
time.sleep(1.0)
"""
    r = run(tmp_path, body, ChildLimits(wall_s=20, memory_mb=400, max_tasks=16), arm=True)
    assert r.outcome is Outcome.TOO_MANY_TASKS


def test_harness_limit_before_arming(tmp_path: Path) -> None:
    r = run(tmp_path, _POOLS_THEN_ARM.format(pools=60, added=0),
            ChildLimits(wall_s=20, memory_mb=400, max_tasks=16, harness_max_tasks=32), arm=True)
    assert r.outcome is Outcome.TOO_MANY_TASKS
    assert "over the harness's limit of 32" in r.detail


def test_deadline_ends_a_hang_before_the_wall(tmp_path: Path) -> None:
    """The caller's deadline moves with the child's progress; a step past it is a hang."""
    from grader.sandbox import Deadline

    due: list[Deadline] = []

    def on_message(message: dict) -> None:
        due[:] = [Deadline(time.monotonic() + 1.0, f"step {message['i']}: 1 s")]

    body = "for i in range(3):\n    send(event='step', i=i)\n    time.sleep(0.2 if i < 2 else 60)"
    start = time.monotonic()
    r = run(tmp_path, body, ChildLimits(wall_s=60, memory_mb=400), on_message=on_message,
            deadline=lambda: due[0] if due else None)
    assert r.outcome is Outcome.TIMED_OUT
    assert r.detail == "ran past its deadline: step 2: 1 s"
    assert time.monotonic() - start < 10


def test_pools_are_pinned_whatever_the_host(tmp_path: Path) -> None:
    """The child's pools are the parent's choice: 3 threads on this host whatever its cores,
    and torch's pools follow once a harness pins them."""
    body = """
import torch
from grader.sandbox import pin_pools
send(event="env", omp=os.environ.get("OMP_NUM_THREADS"), arena=os.environ.get("MALLOC_ARENA_MAX"),
     pinned=pin_pools(torch), intra=torch.get_num_threads(), inter=torch.get_num_interop_threads())
"""
    repo = Path(__file__).resolve().parent.parent
    r = run(tmp_path, f"sys.path.insert(0, {str(repo)!r})\n" + body,
            ChildLimits(wall_s=60, memory_mb=4000, pool_threads=3))
    assert r.outcome is Outcome.OK, r.stderr_tail
    (msg,) = r.messages
    assert msg == {"event": "env", "omp": "3", "arena": "3", "pinned": 3, "intra": 3, "inter": 3}


def test_a_paused_child_runs_nothing_until_resumed(tmp_path: Path) -> None:
    """`ChildProcess.pause` stops the whole process group (SIGSTOP, which the child cannot
    catch): a child that reports every 10 ms says nothing while paused, its state is stopped,
    the watchdog still reads it, and it goes on once resumed (the timing phase's submission's
    process between its commands, grader/conversation.py)."""
    from grader.sandbox import ChildProcess

    script = tmp_path / "child.py"
    script.write_text(PRELUDE + "import signal\nsignal.signal(signal.SIGCONT, signal.SIG_IGN)\n"
                      "for i in range(1000):\n    send('tick', i=i)\n    time.sleep(0.01)\n")
    work = tmp_path / "work"
    work.mkdir()
    child = ChildProcess(script, work, [], LIMITS)
    try:
        got: list = []
        while len(got) < 3:
            got += child.poll(0.05)
        child.pause()
        time.sleep(0.05)
        child.poll(0.05)  # what was written before the stop
        assert child.poll(0.3) == []
        with open(f"/proc/{child.pid}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] == "T"
        child.resume()
        later: list = []
        deadline = time.monotonic() + 5
        while not later and time.monotonic() < deadline:
            later += child.poll(0.05)
        assert later and later[0]["event"] == "tick"
    finally:
        child.finish(kill=True)


def test_a_child_dies_with_the_grader_that_started_it(tmp_path: Path) -> None:
    """A grader killed outright (its worker gone: SIGKILL) takes its child with it
    (PR_SET_PDEATHSIG): the child is in a session of its own, out of reach of a group kill."""
    script = tmp_path / "child.py"
    script.write_text(PRELUDE + "send(event='up', pid=os.getpid())\ntime.sleep(60)\n")
    work = tmp_path / "work"
    work.mkdir()
    grader = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom pathlib import Path\n"
         f"sys.path.insert(0, {str(REPO)!r})\n"
         "from grader.sandbox import ChildLimits, ChildProcess\n"
         f"child = ChildProcess(Path({str(script)!r}), Path({str(work)!r}), [], "
         "ChildLimits(wall_s=60, memory_mb=400, max_tasks=16, open_files=64))\n"
         "while True:\n    for m in child.poll():\n        print(m['pid'], flush=True)\n"],
        stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert grader.stdout is not None
    pid = int(grader.stdout.readline())
    os.kill(pid, 0)  # running
    grader.kill()
    grader.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            stat = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except (ProcessLookupError, FileNotFoundError):
            return
        if stat == "Z":  # dead, waiting for init to reap it
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"the child {pid} outlived the grader that started it")
