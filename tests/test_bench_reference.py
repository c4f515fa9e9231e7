"""CPU tests of the pure parts of `bench/reference.py`: shapes, bytes model, targets, markdown."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from file_modules import load_module

ROOT = Path(__file__).resolve().parent.parent
bench = load_module(ROOT / "bench" / "reference.py", "bench_reference", register=True)


def test_bench_shapes_cover_both_profiles_once_each() -> None:
    shapes = bench.bench_shapes(["h200", "l4"])
    labels = [s.label for s in shapes]
    assert len(labels) == len(set(labels))
    assert shapes[0].profiles[0] == "h200"
    assert any("l4" in s.profiles for s in shapes)
    with pytest.raises(SystemExit, match="not one of"):
        bench.bench_shapes(["a100"])


def test_bytes_model_matches_spec() -> None:
    n, e = 32 * 4096 * 128, 4
    assert bench.model_bytes("fwd", n, e) == 2 * n * e  # read x, write yhat
    assert bench.model_bytes("bwd", n, e) == 4 * n * e  # read dyhat, yhat, x; write dx
    assert bench.model_bytes("copy", n, e) == 2 * n * e  # read + write


def _result(label_dilation: int, compile_ratio: float, fwd: float, bwd: float):
    shape = bench.BenchShape(32, 4096, label_dilation, "float32", ("h200",))
    q = {"median": 1.0, "p20": 0.9, "p80": 1.1}
    r = bench.ShapeResult(shape, step={n: q for n in bench.STEP_NAMES}, compile_s=12.0,
                          kernels={"fwd:ref": q, "bwd:ref": q, "copy": q},
                          bandwidth_gbs={"fwd:ref": 1.0, "bwd:ref": 2.0, "copy": 3.0},
                          copy_fraction={"fwd:ref": fwd, "bwd:ref": bwd}, plan_source="table")
    ratio = {"value": compile_ratio, "ci_low": compile_ratio - 0.1, "ci_high": compile_ratio + 0.1}
    r.ratios = {"compile/reference": ratio, "eager/reference": ratio,
                "noise reference/reference_again": ratio}
    return r


def test_targets_and_markdown() -> None:
    good = _result(1, 1.4, 0.8, 0.75)
    slow = _result(16, 0.9, 0.8, 0.5)
    t = bench.targets([good, slow])
    assert t["reference_le_compile_on_h200_shapes"] is False
    assert t["reference_le_compile_per_shape"] == {good.shape.label: True, slow.shape.label: False}
    assert t["conv_norm_ge_70%_copy"] is False
    assert bench.targets([good])["conv_norm_ge_70%_copy"] is True
    text = bench.markdown({"gpu": "NVIDIA H200", "targets": t}, [good, slow], ["x"])
    assert "| float32:32x4096:d1 | h200 |" in text and "Not run (deadline): x" in text


@pytest.mark.slow
def test_warm_compile_pool_on_cpu(tmp_path: Path) -> None:
    """--warm-compile-only's spawn pool end to end (Inductor's CPU backend; a GPU run differs only
    in the device)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "reference.py"), "--smoke", "--warm-compile-only",
         "--out-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    times = json.loads((tmp_path / "compile-warm.json").read_text())
    assert set(times) == {s.label for s in bench.bench_shapes(["smoke"])}
    assert all(math.isfinite(t) and t > 0 for t in times.values()), (times, proc.stdout)
