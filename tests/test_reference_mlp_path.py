"""How the reference block's two linears run on a GPU: plan data, not code (issue 17).

The plan table's optional ``mlp`` entry names the path per dtype; GPUs without a table take
`heuristic_mlp_path`; the tuner's MLP stage (`Tuner.tune_mlp`) decides the entries. All but the
last two tests run on the CPU (DeviceInfo made by hand, the stage's gate and timing faked); those
two run the stage for real on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

import reference.plans as plans
import reference.split_linear as split_linear
from grader.config import load_config
from reference.plans import (
    DeviceInfo,
    Plan,
    PlanTable,
    heuristic_mlp_path,
    load_table,
    mlp_path_for,
    save_table,
)
from reference.tune import unproven_entries
from reference.tuning.freeze import merge_table, table_meta
from reference.tuning.mlp_path import MLP_NEEDS_GPU, MLPReport
from reference.tuning.prove import GateResult
from reference.tuning.shapes import TuneShape
from reference.tuning.tuner import Tuner, TuneSettings

ROOT = Path(__file__).resolve().parent.parent
H200 = DeviceInfo(name="NVIDIA H200", sm_count=132, l2_bytes=60 << 20, capability=(9, 0),
                  smem_per_block=232448)
L4 = DeviceInfo(name="NVIDIA L4", sm_count=58, l2_bytes=48 << 20, capability=(8, 9),
                smem_per_block=101376)
V100 = DeviceInfo(name="Tesla V100-SXM2-16GB", sm_count=80, l2_bytes=6 << 20,
                  capability=(7, 0), smem_per_block=98304)
CPU = DeviceInfo(name="cpu", sm_count=1, l2_bytes=0)


def _meta() -> dict[str, str]:
    return {"gpu": "X", "torch": "t", "triton": "3.6.0", "date": "d", "method": "test"}


def test_table_mlp_round_trips_and_is_optional(tmp_path: Path) -> None:
    table = PlanTable(meta=_meta(), plans={"float32": {"c128-l4096-d1-b32": Plan()}},
                      mlp={"float32": "split", "bfloat16": "cublas"})
    path = tmp_path / "t.json"
    save_table(path, table)
    assert json.loads(path.read_text())["mlp"] == {"bfloat16": "cublas", "float32": "split"}
    assert load_table(path) == table
    # A table without the entry (every table before issue 17) loads with an empty one.
    save_table(path, PlanTable(meta=_meta(), plans={}))
    assert "mlp" not in json.loads(path.read_text())
    assert load_table(path).mlp == {}


@pytest.mark.parametrize("mlp, fragment", [
    (["split"], "mlp is a list"),
    ({"float64": "split"}, "mlp.float64='split'"),
    ({"float32": "tf32"}, "mlp.float32='tf32'"),
])
def test_table_mlp_rejects_with_the_key_and_value(tmp_path: Path, mlp: object,
                                                  fragment: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"meta": _meta(), "plans": {}, "mlp": mlp}))
    with pytest.raises(ValueError, match="bad.json") as err:
        load_table(path)
    assert fragment in str(err.value)
    path.write_text(json.dumps({"meta": _meta(), "plans": {}, "extra": 1}))
    with pytest.raises(ValueError, match=r"\['extra', 'meta', 'plans'\]"):
        load_table(path)


def test_committed_h200_table_names_its_measured_mlp_paths() -> None:
    table = load_table(ROOT / "reference" / "plans" / "h200.json")
    assert table.mlp == {"float32": "split", "bfloat16": "cublas"}
    # Decided by the tuner's MLP stage, whose source names the command and both paths' times.
    source = table.meta["mlp_source"]
    assert "python -m reference.tune" in source and "float32 split (kept: split" in source


def test_heuristic_mlp_path_by_capability_and_dtype() -> None:
    assert heuristic_mlp_path(H200, torch.float32) == "split"
    assert heuristic_mlp_path(L4, torch.float32) == "split"
    # Half dtypes already run on tensor cores in cuBLAS; the split was slower there.
    for dtype in (torch.bfloat16, torch.float16):
        assert heuristic_mlp_path(H200, dtype) == "cublas"
    # No bf16 tensor cores before sm_80, and the CPU interpreter's bf16 dot is not the GPU's.
    assert heuristic_mlp_path(V100, torch.float32) == "cublas"
    assert heuristic_mlp_path(CPU, torch.float32) == "cublas"
    with pytest.raises(ValueError, match="float64"):
        heuristic_mlp_path(H200, torch.float64)


def test_mlp_path_for_prefers_the_table_then_the_heuristic(
        monkeypatch: pytest.MonkeyPatch) -> None:
    infos = {"cuda:0": H200, "cuda:1": V100, "cpu": CPU}
    monkeypatch.setattr(plans, "device_info", lambda device: infos[str(device)])
    # The table says cublas for H200 fp32: the table wins over the heuristic's "split".
    override = PlanTable(meta=_meta(), plans={}, mlp={"float32": "cublas"})
    monkeypatch.setattr(plans, "table_for_gpu",
                        lambda name: override if "H200" in name else None)
    mlp_path_for.cache_clear()
    try:
        assert mlp_path_for("cuda:0", torch.float32) == "cublas"
        assert mlp_path_for("cuda:0", torch.bfloat16) == "cublas"  # absent: heuristic
        assert mlp_path_for("cuda:1", torch.float32) == "cublas"   # no table, sm_70
        override.mlp["bfloat16"] = "split"
        mlp_path_for.cache_clear()
        assert mlp_path_for("cuda:0", torch.bfloat16) == "split"
        assert mlp_path_for("cpu", torch.float32) == "cublas"  # no table is looked up
    finally:
        mlp_path_for.cache_clear()


def test_a_tuned_mlp_path_records_its_source_and_quotes_the_ones_it_kept() -> None:
    start = PlanTable(meta={**table_meta("NVIDIA H200", "t"), "mlp_source": "old run"},
                      plans={}, mlp={"float32": "split", "bfloat16": "cublas"})
    merged = merge_table(start, {}, table_meta("NVIDIA H200", "t2"), {"float32": "cublas"},
                         "new run")
    assert merged.mlp == {"float32": "cublas", "bfloat16": "cublas"}
    assert merged.meta["mlp_source"] == "new run | bfloat16 from before: old run"
    assert start.mlp["float32"] == "split"  # input untouched
    every = merge_table(start, {}, table_meta("NVIDIA H200", "t3"),
                        {"float32": "split", "bfloat16": "cublas"}, "all again")
    assert every.meta["mlp_source"] == "all again"


def test_the_tuner_keeps_the_mlp_paths_and_their_source() -> None:
    start = PlanTable(meta={**table_meta("NVIDIA H200", "tuned"), "mlp_source": "measured"},
                      plans={}, mlp={"float32": "split"})
    merged = merge_table(start, {("float32", "c128-l4096-d1-b32"): Plan()},
                         table_meta("NVIDIA H200", "retuned"))
    assert merged.mlp == {"float32": "split"} and merged.mlp is not start.mlp
    assert merged.meta["mlp_source"] == "measured" and merged.meta["method"] == "retuned"
    bare = merge_table(PlanTable(meta=table_meta("NVIDIA H200", "t"), plans={}), {},
                       table_meta("NVIDIA H200", "t2"))
    assert bare.mlp == {} and "mlp_source" not in bare.meta


@pytest.mark.parametrize("info, stages", [(H200, 3), (L4, 2), (V100, 2)])
def test_split_plan_fits_the_gpu_shared_memory(monkeypatch: pytest.MonkeyPatch,
                                               info: DeviceInfo, stages: int) -> None:
    monkeypatch.setattr(split_linear, "device_info", lambda device: info)
    plan = split_linear.default_plan(torch.device("cuda"))
    assert plan.num_stages == stages
    # fp32 A and B tiles, one pair per stage, must fit in what one program may opt in to.
    tile_bytes = 4 * (plan.block_m + plan.block_n) * plan.block_k
    assert plan.num_stages * tile_bytes <= info.smem_per_block, (plan, info.smem_per_block)


# ----------------------------------------------------------------------------- the tuner's stage

PASS = GateResult(True, 0.2, "c1/forward")
FAIL = GateResult(False, 3.0, "c1/grad_x", "c1/grad_x at 3x its budget")
LARGE = TuneShape(64, 8192, 128, 1, "float32")
SMALL = TuneShape(32, 4096, 128, 16, "float32")


class PathGate:
    """Fails the paths named in ``failing``; records what it was asked to check."""

    def __init__(self, failing: Sequence[str] = ()) -> None:
        self.failing = set(failing)
        self.checked: list[tuple[Plan | None, str | None]] = []

    def check(self, plan: Plan | None, mlp_path: str | None = None) -> GateResult:
        self.checked.append((plan, mlp_path))
        return FAIL if mlp_path in self.failing else PASS


def path_tuner(monkeypatch: pytest.MonkeyPatch, ms: dict[str, float],
               failing: Sequence[str] = (), info: DeviceInfo = H200) -> tuple[Tuner, PathGate]:
    """A Tuner on a made-up GPU whose whole step takes ``ms`` per path, in 1% noise."""
    tuner = Tuner(load_config(), torch.device("cpu"), TuneSettings(rounds=30), None, 7)
    tuner.info, tuner.can_time = info, True
    gate = PathGate(failing)
    timed: list[TuneShape] = []

    def fake_gate(group: object) -> PathGate:
        timed[:] = group.shapes  # type: ignore[attr-defined]
        return gate

    monkeypatch.setattr(tuner, "_gate", fake_gate)

    def fake_time(paths: Sequence[str], shape: TuneShape) -> dict[str, list[float]]:
        assert shape == LARGE and timed == [LARGE]
        rng = np.random.default_rng(len(paths))
        return {p: list(ms[p] * (1 + 0.01 * rng.uniform(-1, 1, 30))) for p in paths}

    monkeypatch.setattr(tuner, "_time_paths", fake_time)
    return tuner, gate


def test_tune_mlp_keeps_the_heuristic_path_when_it_is_fastest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tuner, gate = path_tuner(monkeypatch, {"split": 4.4, "cublas": 6.7})
    report, path = tuner.tune_mlp("float32", [SMALL, LARGE], None)
    assert (path, report.action, report.incumbent, report.source) == (
        "split", "kept", "split", "heuristic")
    # Both paths gated with the block's own conv+norm plans, incumbent first, then both timed.
    assert gate.checked == [(None, "split"), (None, "cublas")]
    assert set(report.timings) == {"split", "cublas"}
    assert report.decisions["cublas"].reason.startswith("slower")
    assert json.dumps(report.to_json())


def test_tune_mlp_promotes_a_path_faster_than_the_table_entry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tuner, _ = path_tuner(monkeypatch, {"split": 4.4, "cublas": 6.7})
    report, path = tuner.tune_mlp("float32", [LARGE], "cublas")
    assert (path, report.action, report.source) == ("split", "promoted", "table")
    assert report.decisions["split"].promote and report.decisions["split"].speedup > 1.4


def test_tune_mlp_replaces_an_entry_failing_the_gate_however_fast(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tuner, _ = path_tuner(monkeypatch, {"split": 1.0, "cublas": 6.7}, failing=["split"])
    report, path = tuner.tune_mlp("float32", [LARGE], "split")
    assert (path, report.action) == ("cublas", "promoted")
    assert "split" not in report.timings and report.gates["split"] == FAIL
    tuner, _ = path_tuner(monkeypatch, {"split": 1.0, "cublas": 6.7},
                          failing=["split", "cublas"])
    report, path = tuner.tune_mlp("float32", [LARGE], "split")
    assert (path, report.action, report.timings) == (None, "failed", {})


def test_reverify_flips_an_mlp_path_only_beyond_the_drift_threshold(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """3.5% faster beats tuning's 2% minimum gain but not re-verify's 5% drift threshold."""
    ms = {"split": 6.7 / 1.035, "cublas": 6.7}
    tuner, _ = path_tuner(monkeypatch, ms)
    _, tuned = tuner.tune_mlp("float32", [LARGE], "cublas")
    report, kept = tuner.tune_mlp("float32", [LARGE], "cublas", reverify=True)
    assert (tuned, kept, report.action) == ("split", "cublas", "kept")
    assert "below 1+min_gain=1.050" in report.decisions["split"].reason


def test_tune_mlp_without_a_gpu_gates_and_decides_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tuner, gate = path_tuner(monkeypatch, {"split": 4.4, "cublas": 6.7})
    tuner.can_time = False
    report, path = tuner.tune_mlp("float32", [LARGE], "split")
    assert (path, report.action, report.reason, gate.checked) == (
        None, "untimed", MLP_NEEDS_GPU, [])


def test_unproven_entries_names_mlp_paths_this_run_did_not_gate() -> None:
    table = PlanTable(meta=_meta(), plans={}, mlp={"float32": "split", "bfloat16": "cublas"})
    proven = MLPReport("float32", LARGE.label, "split", "table",
                       gates={"split": PASS, "cublas": FAIL})
    assert unproven_entries(table, [], [proven]) == ["mlp/bfloat16"]
    proven.gates["split"] = FAIL
    assert unproven_entries(table, [], [proven]) == ["mlp/bfloat16", "mlp/float32"]


def test_mlp_only_cli_leaves_the_plans_and_their_meta(tmp_path: Path) -> None:
    """``--mlp-only`` in the interpreter: no plan gated, the table's meta and MLP paths kept,
    the report says why the paths were not decided."""
    start, out, report = tmp_path / "in.json", tmp_path / "out.json", tmp_path / "report.json"
    save_table(start, PlanTable(meta={**_meta(), "mlp_source": "measured"},
                                plans={"float32": {"c128-l4096-d1-b32": Plan()}},
                                mlp={"float32": "split"}))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "reference.tune", "--profile", "smoke", "--mlp-only",
         "--table", str(start), "--out", str(out), "--report", str(report), "--seed", "3"],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert MLP_NEEDS_GPU in proc.stderr
    assert load_table(out) == load_table(start)
    data = json.loads(report.read_text())
    assert data["groups"] == [] and {m["action"] for m in data["mlp"]} == {"untimed"}
    assert data["unproven_entries"] == ["float32/c128-l4096-d1-b32", "mlp/float32"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_tune_mlp_gates_and_times_both_paths(dtype: str) -> None:
    """The stage for real on a small shape: both paths pass the gate, both steps are timed,
    and the frozen path is one of them."""
    tuner = Tuner(load_config(), torch.device("cuda"), TuneSettings(rounds=6, gate_cases=1),
                  None, 11)
    shape = TuneShape(4, 1024, 128, 2, dtype)
    report, path = tuner.tune_mlp(dtype, [shape], None)
    assert all(g.passed for g in report.gates.values()), report.gates
    assert set(report.gates) == set(report.timings) == {"split", "cublas"}
    assert report.action in ("kept", "promoted") and path == report.winner
