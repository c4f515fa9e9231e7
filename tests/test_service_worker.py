"""A GPU worker starts a grade only when the device has its profile's peak memory free, and a
grade that ended grader_error on a crowded device is graded again (no verdict on the submission).
With a fake free-memory probe and a fake executor: no GPU here."""

from __future__ import annotations

import io
import json
from pathlib import Path

from service_helpers import solution, tree_tar

from grader import device_memory as dm
from grader.config import load_config
from grader.service.archive import UploadLimits, check_upload
from grader.service.store import Device, GradeState, Store
from grader.service.worker import Worker, WorkerOptions, gpu_room

GIB = dm.GIB
H200 = Device("NVIDIA H200", "GPU-aaaa", 0)
HOG = dm.GpuProcess(4242, 130 * GIB, "python3")


def _submit(store: Store) -> int:
    run, _ = store.create_run("r")
    tree = check_upload(tree_tar(solution(0.5)), UploadLimits())
    sub, _ = store.add_submission(run.id, commit="c" * 40, tree=tree.tree, archive=tree.archive,
                                  files=len(tree.files))  # fmt: skip
    return sub.id


class Scored:
    """An executor that records when it ran and returns a scored report."""

    def __init__(self, report: dict | None = None) -> None:
        self.runs = 0
        self.report = report or {"status": "scored", "score": 0.5, "reasons": []}

    def run(self, request: object, alive: object) -> str:
        self.runs += 1
        return json.dumps(self.report)


def test_gpu_room_reads_the_profiles_peak() -> None:
    config = load_config()
    peak = config.timing.profiles["h200"].peak_device_memory_gib
    asked: list[dict] = []

    def full(**where: object) -> dm.DeviceMemory:
        asked.append(where)
        return dm.DeviceMemory(140 * GIB, 6 * GIB, (HOG,))

    why = gpu_room(H200, config, read=full)()
    assert why.startswith("device short: ") and "pid 4242 python3 130.0 GiB" in why
    assert f"the grade needs {peak:.1f} GiB" in why and asked == [{"uuid": "GPU-aaaa", "index": 0}]
    assert gpu_room(H200, config, read=lambda **_: dm.DeviceMemory(140 * GIB, 139 * GIB))() == ""
    assert gpu_room(H200, config, read=lambda **_: None)() == ""  # NVML cannot tell: it tries
    # A UUID that is not NVML's (no telemetry when the worker started) is asked by index.
    gpu_room(Device("NVIDIA H200", "host:cuda:1", 1), config, read=full)()
    assert asked[-1] == {"uuid": None, "index": 1}


def test_a_worker_waits_for_room_before_it_starts_a_grade(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    sub = _submit(store)
    looks = iter(["device short: 1 other process holds 130.0 GiB (pid 4242 python3 130.0 GiB)"] * 4)
    executor = Scored()

    def room() -> str:
        why = next(looks, "")
        assert executor.runs == 0 or not why  # no grade started while the device was short
        return why

    log = io.StringIO()
    options = WorkerOptions(poll_s=0.01, room_wait_max_s=0.04, once=True)
    graded = Worker(store, H200, executor, name="w", log=log, options=options,  # type: ignore[arg-type]
                    room=room).run()  # fmt: skip
    assert graded == 1 and executor.runs == 1
    grade = store.grades(sub)[-1]
    assert grade.state is GradeState.DONE and grade.status == "scored" and grade.attempts == 1
    lines = log.getvalue().splitlines()
    waits = [line for line in lines if "not starting a grade: device short" in line]
    # Said when the wait grows (0.01, 0.02, 0.04 s), not at every look; then room again.
    assert [w.rsplit("again in ", 1)[1] for w in waits] == ["0.01 s", "0.02 s", "0.04 s"]
    assert "pid 4242 python3" in waits[0] and any("has room again" in line for line in lines)


def test_a_once_worker_on_a_short_device_with_nothing_queued_exits(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    graded = Worker(store, H200, Scored(), name="w", log=io.StringIO(),  # type: ignore[arg-type]
                    options=WorkerOptions(once=True), room=lambda: "device short: x").run()
    assert graded == 0


def test_a_crowded_grade_is_graded_again_by_the_worker(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    sub = _submit(store)
    crowded = {"status": "grader_error", "score": 0.0,
               "reasons": ["device short: 1 other process holds 130.0 GiB (pid 4242 python3 "
                           "130.0 GiB); 1.0 GiB of 140.0 GiB free now"]}  # fmt: skip
    executor = Scored(crowded)
    log = io.StringIO()
    worker = Worker(store, H200, executor, name="w", log=log)  # type: ignore[arg-type]
    job = store.claim("w", H200, 30)
    assert job is not None
    assert worker.grade(job).state is GradeState.QUEUED  # no verdict on the submission
    assert "attempt 1): queued again: attempt 1: w: device short: " in log.getvalue()
    executor.report = {"status": "scored", "score": 0.7, "reasons": []}
    job = store.claim("w", H200, 30)
    assert job is not None and job.attempt == 2
    done = worker.grade(job)
    assert done.state is GradeState.DONE and done.status == "scored" and done.score == 0.7
    assert "pid 4242 python3" in store.grades(sub)[-1].history[0]
