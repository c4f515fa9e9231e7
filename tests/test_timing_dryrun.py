"""The timing phase end to end without a GPU: a dry run on the CPU (Triton interpreter).

The whole path (the trusted baselines process and the sandboxed submission process, the slab
they share as a file, the authenticated channel, the rule guard and the launch census on every
step, rounds with values drawn from the parent's seeds, per-round checks by the baselines
process, the parent's clock and verdicts) runs with the host clock in place of CUDA events; the
times mean nothing, and the clock and drift rules are not judged on them. The GPU-only defenses
(streams, events, memory, the floor) are in test_timing_gpu.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import time
from pathlib import Path

import pytest
from timing_workspace import CORPUS, make_workspace, with_profile

import grader.timing_run
from grader.config import Profile, Shape, load_config
from grader.timing_run import TimingStart, carry_cache, run_timing

# Two shapes, timed interleaved: two visits of one cycle (6 rounds) each.
PROFILE = Profile(gpus=(), peak_device_memory_gib=10.0, warmup=1, rounds=12, alone_rounds=2,
                  shapes=(Shape(2, 64, 3, "float32"), Shape(1, 16, 1, "float32")))
CONFIG = with_profile(load_config(), "dry", PROFILE)


@pytest.fixture(scope="module")
def triton_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("triton-cache")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "status", "reason"),
    [
        ("control_reference", "ok", ""),
        ("input_pointer_cache", "check_failed", "timed forward differs from"),
        # The reference runs in another process: there is nothing to borrow, and the block
        # runs its own copy.
        ("borrows_reference_kernels", "ok", ""),
        ("forges_channel_results", "rule_broken", "channel-tampering"),
        ("slows_baselines_via_autograd_hook", "rule_broken", "global-state"),
        # Set in one step, put back in the next: seen at the first step's end. Every audit
        # here comes after an even number of its steps (4 in the warm-ups, 12 per visit), so
        # the audits alone find the flag as it was.
        ("toggles_flags_inside_step", "rule_broken", "global-state: float32_matmul_precision"),
        # A done sent right after armed through the harness's own writer (every held step;
        # only where the old public order put a baseline next; one step in five): the parent
        # stops the process at that done, so the host never finishes the step and the round's
        # check reads another round's evidence (the parameters after the step first).
        ("ends_window_early_via_harness", "check_failed", "the submission's step changed its"),
        ("predicts_round_order", "check_failed", "the submission's step changed its"),
        ("serves_baseline_flush", "check_failed", "the submission's step changed its"),
    ],
)
def test_dry_run_on_cpu(case: str, status: str, reason: str, tmp_path, triton_cache) -> None:
    ws = make_workspace(tmp_path / "ws", (CORPUS / case / "solution.py").read_text())
    progress = io.StringIO()
    report = run_timing(ws, CONFIG, profile="dry", progress=progress, triton_cache=triton_cache,
                        dry_run_on_cpu=True)
    detail = f"{report.status}: {report.reason} | {report.telemetry.get('child_stderr_tail')}"
    assert report.status == status, detail
    assert reason in report.reason.lower(), detail
    assert report.telemetry["dry_run"] is True
    if status == "ok":
        # Held on the CPU too (the page polled by the host): the parent's protocol is the GPU's.
        assert report.telemetry["hold"] == "held", report.telemetry["hold"]
        for shape in report.shapes:
            assert shape.status == "ok" and shape.utilisation is not None
            assert shape.utilisation <= 1.5 and shape.t_sub_ms > 0
        # The baselines alone first, then both shapes warm up, then their timed rounds take
        # turns.
        lines = progress.getvalue().splitlines()
        a, b = (s.label for s in PROFILE.shapes)
        assert lines == [f"baselines alone: warming up 1/2 {a}",
                         f"baselines alone: warming up 2/2 {b}",
                         "baselines alone: 1 rounds of each shape",
                         f"warming up 1/2 {a}", f"warming up 2/2 {b}",
                         "1/2 timed visits (all 2 shapes in turn)",
                         "2/2 timed visits (all 2 shapes in turn)",
                         "baselines alone again: 1 rounds of each shape"], progress.getvalue()


@pytest.mark.slow
def test_a_hang_while_timed_ends_at_its_stage_deadline(tmp_path, triton_cache) -> None:
    """The hang comes after the warm-ups, in a timed step: the step's deadline ends it."""
    rule = dataclasses.replace(CONFIG.limits.deadlines.cpu, floor_s=30.0, plain_multiple=300.0)
    config = dataclasses.replace(CONFIG, limits=dataclasses.replace(
        CONFIG.limits, deadlines=dataclasses.replace(CONFIG.limits.deadlines, cpu=rule)))
    ws = make_workspace(tmp_path / "ws",
                        (CORPUS / "hangs_while_timed" / "solution.py").read_text())
    started = time.monotonic()
    report = run_timing(ws, config, profile="dry", progress=None, triton_cache=triton_cache,
                        dry_run_on_cpu=True)
    assert report.status == "timed_out", report.reason
    assert "ran past its deadline: a step of sub in" in report.reason, report.reason
    assert report.score == 0.0
    assert time.monotonic() - started < 240


# ------------------------------------------------------ a timing run begun beside the gate


def _lines(progress: io.StringIO) -> list[str]:
    return progress.getvalue().splitlines()


@pytest.mark.slow
def test_a_timing_started_beside_the_gate_runs_no_submission_code_before_finish(tmp_path,
                                                                                monkeypatch) -> None:  # fmt: skip
    """`TimingStart` (what a grade uses): the children start and the baselines warm up in a
    thread; the submission's process has only answered pings (harness code: it has imported
    nothing; the L2 is the baselines process's to flush) when that is done; `finish` then
    times it as `run_timing` would, its held-back progress said first, in order, and the gate
    child's Triton cache carried into the timing child's (no shared cache given)."""
    ws = make_workspace(tmp_path / "ws", (CORPUS / "control_reference" / "solution.py").read_text())
    gate_cache = tmp_path / "gate-triton"
    (gate_cache / "abc").mkdir(parents=True)
    (gate_cache / "abc" / "kernel.json").write_text("{}")
    carried: list[Path] = []

    def carry(source: Path, dest: Path) -> int:
        carried.extend(p.relative_to(dest) for p in dest.rglob("*.json"))  # nothing there yet
        # What was planted in the timing child's own directories during the gate is gone.
        assert not (dest / "planted").exists() and not (dest.parent / ".tmp" / "x.py").exists()
        n = carry_cache(source, dest)
        carried.extend(p.relative_to(dest) for p in dest.rglob("*.json"))
        return n

    monkeypatch.setattr(grader.timing_run, "carry_cache", carry)
    progress = io.StringIO()
    start = TimingStart(ws, CONFIG, profile="dry", progress=progress, dry_run_on_cpu=True)
    start.wait()  # the gate would run here
    assert start.error is None and start.started is not None
    assert set(start.started.run.sub.spent) == {"ping"}, start.started.run.sub.spent
    assert _lines(progress) == []  # held back: the gate's progress bar owns the terminal now
    sub_dir = start.started.sub_dir
    # The timing child's copy of the tree is held to the export; what a gate child (the
    # grader's user) could plant in it meanwhile is found, or removed (its own directories).
    digests = tuple((p.relative_to(ws).as_posix(), hashlib.sha256(p.read_bytes()).hexdigest())
                    for p in ws.rglob("*") if p.is_file() and ".git" not in p.parts)
    assert start.tree_changes(digests) == []
    (sub_dir / "fast_path.py").write_text("FAST = True\n")
    (sub_dir / ".triton" / "planted").mkdir(parents=True)
    (sub_dir / ".triton" / "planted" / "kernel.cubin").write_bytes(b"\0")
    (sub_dir / ".tmp" / "x.py").write_text("")
    assert start.tree_changes(digests) == ["fast_path.py was added"]
    (sub_dir / "fast_path.py").unlink()  # a grade stops at the finding; here timing goes on
    report = start.finish(gate_cache)

    assert report.status == "ok", f"{report.reason} | {report.telemetry.get('child_stderr_tail')}"
    a, b = (s.label for s in PROFILE.shapes)
    assert _lines(progress)[:4] == [f"baselines alone: warming up 1/2 {a}",
                                    f"baselines alone: warming up 2/2 {b}",
                                    "baselines alone: 1 rounds of each shape",
                                    f"warming up 1/2 {a}"]
    assert set(report.telemetry["command_s"]["submission"]) >= {"load", "build", "go", "audit"}
    assert carried == [Path("abc/kernel.json")]
    assert not sub_dir.exists()  # removed with the run


@pytest.mark.slow
def test_a_cancelled_timing_start_ends_both_children(tmp_path) -> None:
    ws = make_workspace(tmp_path / "ws", (CORPUS / "control_reference" / "solution.py").read_text())
    start = TimingStart(ws, CONFIG, profile="dry", progress=None, dry_run_on_cpu=True)
    start.cancel()  # the gate failed
    start.cancel()  # and again: nothing left to do
    out = start.started.run.out
    assert out.submission is not None and out.baselines is not None
    for child in (start.started.run.sub, start.started.run.base):
        assert child.process.ended
    assert not Path(start.tmp.name).exists()


def test_carry_cache_copies_regular_files_only_and_nothing_past_its_limit(tmp_path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    (src / "k1").mkdir(parents=True)
    (src / "k1" / "a.cubin").write_bytes(b"x" * 100)
    (src / "k1" / "a.json").write_text("{}")
    secret = tmp_path / "secret"
    secret.write_text("the parent's")
    (src / "k1" / "link").symlink_to(secret)
    (src / "dirlink").symlink_to(tmp_path)

    group = {"child_paths": {"a.cubin": str(src / "k1" / "a.cubin"),
                             "a.json": str(src / "k1" / "a.json"), "x.so": str(secret),
                             "up.so": f"{src}/k1/../../secret"}}
    (src / "k1" / "__grp__a.json").write_text(json.dumps(group))
    (src / "k2").mkdir()
    (src / "k2" / "__grp__b.json").write_text("not json")

    copied = carry_cache(src, dest)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == [
        "k1", "k1/__grp__a.json", "k1/a.cubin", "k1/a.json", "k2"]
    assert copied == sum(p.stat().st_size for p in src.rglob("*") if p.is_file()
                         and not p.is_symlink())  # fmt: skip
    # Triton finds the group's members in the timing child's cache, never the gate child's.
    assert json.loads((dest / "k1" / "__grp__a.json").read_text()) == {"child_paths": {
        "a.cubin": str(dest / "k1" / "a.cubin"), "a.json": str(dest / "k1" / "a.json")}}
    assert carry_cache(src, tmp_path / "small", limit=50) == 0
    assert not (tmp_path / "small").exists()


def test_a_carried_cache_is_found_by_tritons_own_cache_manager(tmp_path, monkeypatch) -> None:
    from triton import knobs
    from triton.runtime.cache import FileCacheManager

    src, dest = tmp_path / "gate", tmp_path / "timing"
    monkeypatch.setattr(knobs.cache, "dir", str(src))
    gate = FileCacheManager("k3y")
    members = {"k.cubin": gate.put(b"\x7fcubin", "k.cubin"), "k.json": gate.put("{}", "k.json")}
    gate.put_group("k.json", members)

    carry_cache(src, dest)
    monkeypatch.setattr(knobs.cache, "dir", str(dest))
    assert FileCacheManager("k3y").get_group("k.json") == {
        "k.cubin": str(dest / "k3y" / "k.cubin"), "k.json": str(dest / "k3y" / "k.json")}


def test_carry_cache_never_rewrites_a_file_the_child_has(tmp_path) -> None:
    """The timing child may have an entry of its own cache mapped (its Triton launcher's .so,
    built while it started beside the gate); the gate's copy of the same entry was written over
    it in place and every overlapped grade died with SIGSEGV on an H200 (2026-12-02)."""
    src, dest = tmp_path / "gate", tmp_path / "timing"
    (src / "k").mkdir(parents=True)
    (src / "k" / "launcher.so").write_bytes(b"gate's build")
    (src / "k" / "new.cubin").write_bytes(b"new")
    (dest / "k").mkdir(parents=True)
    mine = dest / "k" / "launcher.so"
    mine.write_bytes(b"child's own build")
    inode = mine.stat().st_ino
    with mine.open("rb") as mapped:  # held open, as a loaded library is
        carry_cache(src, dest)
        assert mine.stat().st_ino == inode and mine.read_bytes() == b"child's own build"
        assert mapped.read() == b"child's own build"
    assert (dest / "k" / "new.cubin").read_bytes() == b"new"
    # Each new entry arrives whole under its name: no temporary file is left behind.
    assert sorted(p.name for p in (dest / "k").iterdir()) == ["launcher.so", "new.cubin"]
