"""CPU tests of `bench/step/step_limit.py`: the model's arithmetic, the rates and the shared step setup
that bench/step/reference_step.py uses, its --dry mode, and the clear refusal to measure without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from file_modules import load_module

ROOT = Path(__file__).resolve().parent.parent
step_limit = load_module(ROOT / "bench" / "step" / "step_limit.py", "bench_step_limit", register=True)


def test_floors_by_hand() -> None:
    """fp32 64×8192 at C = 128, E = 2: N = 2²⁶ elements of 4 bytes; 6 GEMMs of 2·2¹⁹·128·256."""
    n = 64 * 8192 * 128
    assert step_limit.memory_floor_ms(n, 4, 4000.0) == pytest.approx(5 * n * 4 / 4e12 * 1e3)
    assert step_limit.memory_floor_ms(n, 4, 4000.0) == pytest.approx(0.33554432)
    rows = 64 * 8192
    assert step_limit.compute_floor_ms(rows, 128, 2, 50.0) == pytest.approx(
        6 * 2 * rows * 128 * 256 / 50e12 * 1e3)
    assert step_limit.compute_floor_ms(rows, 128, 2, 50.0) == pytest.approx(4.12316860416)


def test_limit_is_the_larger_floor() -> None:
    fp32 = step_limit.LimitShape(64, 8192, 1, "float32")
    bf16 = step_limit.LimitShape(256, 8192, 64, "bfloat16")
    slow_math = step_limit.step_limit(fp32, 128, 2, copy_gbs=4000.0, tflops=50.0)
    assert slow_math.bound == "compute" and slow_math.limit_ms == slow_math.compute_ms
    # bf16: 2 bytes per element; 5·2²⁸·2 bytes at 4 TB/s = 0.671 ms against 1.178 ms of matmul.
    limit = step_limit.step_limit(bf16, 128, 2, copy_gbs=4000.0, tflops=700.0)
    assert limit.memory_ms == pytest.approx(5 * 256 * 8192 * 128 * 2 / 4e12 * 1e3)
    assert limit.compute_ms == pytest.approx(1.1780481, rel=1e-6)
    fast_math = step_limit.step_limit(bf16, 128, 2, copy_gbs=4000.0, tflops=2000.0)
    assert fast_math.bound == "memory" and fast_math.limit_ms == fast_math.memory_ms


def test_rates_give_each_shape_its_dtype_limit() -> None:
    """`Rates.limit` (what bench/step/reference_step.py calls per shape) is the model at the dtype's rate."""
    rates = step_limit.Rates(4000.0, {"float32": 50.0, "bfloat16": 700.0}, source="given")
    fp32 = step_limit.LimitShape(64, 8192, 1, "float32")
    bf16 = step_limit.LimitShape(256, 8192, 64, "bfloat16")
    assert rates.limit(fp32, 128, 2) == step_limit.step_limit(fp32, 128, 2, 4000.0, 50.0)
    assert rates.limit(bf16, 128, 2).compute_ms == pytest.approx(1.1780481, rel=1e-6)
    assert rates.limit(fp32, 128, 2).limit_ms == pytest.approx(4.12316860416)
    with pytest.raises(ValueError, match=r"no matmul rate for float16 .* \['bfloat16', 'float32'\]"):
        rates.limit(step_limit.LimitShape(8, 4096, 1, "float16"), 128, 2)


def test_measure_rates_once_per_dtype_on_cpu() -> None:
    """Wall-clock rates on the CPU (meaningless numbers, but the smoke path must run): one copy,
    one matmul per distinct dtype, under the recorded default flags; for fp32 both products that
    meet its budgets, and the faster one as its rate (issue 41)."""
    rates = step_limit.measure_rates(torch.device("cpu"), ["float32", "bfloat16", "float32"],
                                     copy_bytes=1 << 20, matmul_n=64, reps=2)
    assert set(rates.matmul_tflops) == {"float32", "bfloat16"}
    assert rates.copy_gbs > 0 and all(v > 0 for v in rates.matmul_tflops.values())
    assert "1 MiB copy, 64² matmul, median of 2" in rates.source
    assert rates.flags["allow_tf32"] is False
    assert set(rates.fp32_products) == set(step_limit.FP32_PRODUCTS)
    assert all(v > 0 for v in rates.fp32_products.values())
    assert rates.fp32_product == max(rates.fp32_products, key=rates.fp32_products.__getitem__)
    assert rates.matmul_tflops["float32"] == rates.fp32_products[rates.fp32_product]
    half = step_limit.measure_rates(torch.device("cpu"), ["bfloat16"], copy_bytes=1 << 20,
                                    matmul_n=64, reps=2)
    assert half.fp32_products == {} and half.fp32_product == ""


def test_fp32_floor_takes_the_fastest_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fp32 compute floor divides by the faster of SIMT fp32 and bf16x3, whichever it is,
    and the report says which product set it."""
    for simt, split, want in ((50.0, 120.0, "bf16x3"), (60.0, 20.0, "fp32")):
        monkeypatch.setattr(step_limit, "measure_matmul_tflops", lambda *a, r=simt, **k: r)
        monkeypatch.setattr(step_limit, "measure_bf16x3_tflops", lambda *a, r=split, **k: r)
        monkeypatch.setattr(step_limit, "measure_copy_gbs", lambda *a, **k: 4000.0)
        rates = step_limit.measure_rates(torch.device("cpu"), ["float32", "bfloat16"])
        assert rates.fp32_product == want and rates.fp32_products == {"fp32": simt,
                                                                     "bf16x3": split}
        assert rates.matmul_tflops == {"float32": max(simt, split), "bfloat16": simt}
        fp32 = step_limit.LimitShape(64, 8192, 1, "float32")
        assert rates.limit(fp32, 128, 2).compute_ms == pytest.approx(
            step_limit.compute_floor_ms(64 * 8192, 128, 2, max(simt, split)))


def test_bf16x3_product_is_within_the_fp32_budget_on_cpu() -> None:
    """The CPU path of the bf16x3 product is the split's arithmetic: far closer to fp64 than one
    bf16 product, within the 4.4e-6 relative error measured on an H200 (order of magnitude)."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(96, 128, generator=gen), torch.randn(128, 80, generator=gen)
    want = a.double() @ b.double()

    def rel(got: torch.Tensor) -> float:
        return float((got.double() - want).norm() / want.norm())

    split = rel(step_limit.bf16x3_matmul(a, b))
    one = rel((a.bfloat16() @ b.bfloat16()).float())
    assert split < 2e-5 and split < one / 50, (split, one)


def test_step_setup_gives_every_block_the_same_weights() -> None:
    from reference.block import DilatedResidualBlock as ReferenceBlock
    from task.model import DilatedResidualBlock as FrozenBlock

    shape = step_limit.LimitShape(2, 16, 3, "float32")
    setup = step_limit.step_setup(shape, 8, torch.device("cpu"))
    again = step_limit.step_setup(shape, 8, torch.device("cpu"))
    assert setup.x.shape == setup.grad.shape == (2, 16, 8)
    assert torch.equal(setup.x, again.x) and torch.equal(setup.grad, again.grad)
    assert not torch.equal(setup.x, setup.grad)
    frozen, ref = setup.build(FrozenBlock), setup.build(ReferenceBlock)
    assert ref.dilation == 3 and next(ref.parameters()).dtype == torch.float32
    for (name, a), (_, b) in zip(frozen.named_parameters(), ref.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_select_shapes_keeps_the_order_asked_and_names_strangers() -> None:
    every = step_limit.profile_shapes("h200")
    assert step_limit.select_shapes("h200", "") == every
    picked = step_limit.select_shapes("h200", f"{every[4].label},{every[0].label}")
    assert picked == [every[4], every[0]]
    with pytest.raises(SystemExit, match=r"--shapes \['float32:1x1:d1'\] are not shapes of "):
        step_limit.select_shapes("h200", f"{every[0].label},float32:1x1:d1")


def test_profile_shapes_and_rates() -> None:
    shapes = step_limit.profile_shapes("h200")
    assert {s.dtype for s in shapes} == {"float32", "bfloat16"} and len(shapes) >= 4
    assert step_limit.parse_rates("float32=50,bfloat16=700.5") == {"float32": 50.0,
                                                                  "bfloat16": 700.5}
    with pytest.raises(SystemExit, match="must be <dtype>"):
        step_limit.parse_rates("fp8=1")
    with pytest.raises(SystemExit, match="not one of"):
        step_limit.profile_shapes("a100")


def test_markdown_has_every_variant_and_ratio() -> None:
    shape = step_limit.LimitShape(64, 8192, 1, "float32")
    limit = step_limit.step_limit(shape, 128, 2, 4000.0, 50.0)
    q = {"median": 2 * limit.limit_ms, "p20": 1.0, "p80": 9.0}
    report = step_limit.ShapeReport(shape, limit, steps={"eager": q}, vs_limit={"eager": 2.0},
                                    compile_s={"compile": 12.5})
    text = step_limit.markdown({"gpu": "X"}, [report], ["eager", "compile"])
    assert "| eager ms | eager / limit | compile ms | compile / limit |" in text
    assert "| 2.00 | – | – |" in text and "compile 12.5" in text
    assert "The ceiling" not in text
    report.steps["ceiling"], report.vs_limit["ceiling"] = q, 1.25
    text = step_limit.markdown({"gpu": "X", "fp32_product": "bf16x3"}, [report],
                               ["eager", "ceiling"])
    assert "| ceiling ms | ceiling / limit |" in text
    assert "over the limit: float32:64x8192:d1 1.25× (fp32's floor from the bf16x3 product)" in text


def test_the_variants_build_the_blocks_they_name() -> None:
    """``reference`` is the scoring block, ``ceiling*`` the whole-step block (issue 41)."""
    assert {"reference", "ceiling"} <= set(step_limit.DEFAULT_VARIANTS)
    assert not [v for v in step_limit.VARIANTS if v.startswith("reference_")
                and v.removeprefix("reference_") in ("split_mlp", "cublas_mlp",
                                                     "unfused_residual", "two_pass_norm")]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(ROOT / "bench" / "step" / "step_limit.py"), *args],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


def test_dry_run_prints_every_h200_shape(tmp_path: Path) -> None:
    proc = _run("--dry", "--copy-gbs", "4000", "--tflops", "float32=50,bfloat16=700",
                "--out-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    for shape in step_limit.profile_shapes("h200"):
        assert f"| {shape.label} |" in proc.stdout
    assert "| float32:64x8192:d1 | 0.336 | 4.123 | 4.123 | compute |" in proc.stdout
    assert (tmp_path / "step-limit-dry.json").exists()
    missing = _run("--dry", "--copy-gbs", "4000", "--tflops", "float32=50")
    assert missing.returncode != 0 and "bfloat16" in missing.stderr


def test_without_cuda_it_says_so() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = _run()
    assert proc.returncode != 0
    assert "CUDA GPU" in proc.stderr and "--dry" in proc.stderr
    assert "Traceback" not in proc.stderr  # a message, not a crash
