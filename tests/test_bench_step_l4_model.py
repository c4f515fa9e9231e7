"""CPU tests of `bench/step/l4_model.py` (issue 41): reading Nsight Compute's raw CSV, the bytes
model's arithmetic, and the modelled entry it publishes, which `check` reads as modelled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from file_modules import load_module

from grader.agent import estimate

ROOT = Path(__file__).resolve().parent.parent
l4_model = load_module(ROOT / "bench" / "step" / "l4_model.py", "bench_l4_model", register=True)

HEADER = ('"ID","Process ID","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum",'
          '"gpu__time_duration.sum"')
UNITS = '"","","","Mbyte","Kbyte","nsecond"'


def _csv(rows: list[tuple[str, float, float]]) -> str:
    """ncu's raw page as `ncu --import --csv` prints it, its own messages included."""
    lines = ["==PROF== Disconnected from process 1", HEADER, UNITS]
    lines += [f'"{i}","1","{name}","{mb}","{kb}","1000"' for i, (name, mb, kb) in enumerate(rows)]
    return "\n".join(lines) + "\n"


def test_reads_every_kernel_in_bytes() -> None:
    kernels = l4_model.read_ncu_csv(_csv([("_conv_norm_fwd_chain_kernel", 16.0, 512.0),
                                          ("nvjet_tst_128x64_64x6_1x1_v_bz_coopA_NNN", 2.5, 0.0),
                                          ("vectorized_elementwise_kernel", 1.0, 1.0)]))
    assert [k.dram_bytes for k in kernels] == [16e6 + 512e3, 2.5e6, 1e6 + 1e3]
    assert [k.gemm for k in kernels] == [False, True, False]
    with pytest.raises(ValueError, match="no ncu raw-page header"):
        l4_model.read_ncu_csv('"ID","Kernel Name"\n"0","k"\n')


def test_model_adds_kernels_and_takes_the_host_where_it_binds() -> None:
    kernels = [l4_model.Kernel("a", 300e6), l4_model.Kernel("sgemm_x", 30e6)]
    # 300 MB at 300 GB/s: 1 ms; the GEMM's 30 MB take 0.1 ms, its 6 GFLOP at 30 TFLOP/s 0.2 ms.
    m = l4_model.model_block(kernels, 6 * 10**9, 300.0, 30.0, host_ms=0.5)
    assert m.kernels_ms == pytest.approx(1.2) and m.step_ms == pytest.approx(1.2)
    assert m.bound == "kernels" and m.kernels == 2 and m.gemm_kernels == 1
    launch_bound = l4_model.model_block(kernels, 6 * 10**9, 300.0, 30.0, host_ms=2.0)
    assert launch_bound.step_ms == 2.0 and launch_bound.bound == "host"


def test_model_publishes_a_modelled_entry_check_reads(tmp_path: Path) -> None:
    shapes = l4_model.profile_shapes("l4")
    host = {"meta": {"gpu": "NVIDIA H200"}, "shapes": {}}
    for shape in shapes:
        host["shapes"][shape.label] = {b: {"host_ms": 0.01} for b in l4_model.BLOCKS}
        # plain moves 3x the reference's bytes, all outside GEMMs, memory-bound everywhere
        for block, mb in (("plain", 3000.0), ("reference", 1000.0)):
            (tmp_path / f"{l4_model.file_stem(block, shape.label)}.csv").write_text(
                _csv([("elementwise", mb, 0.0)]))
    result = l4_model.model(tmp_path, host, 300.0, {"float32": 1e6, "bfloat16": 1e6})
    assert set(result) == {s.label for s in shapes}
    assert all(r["g"] == pytest.approx(3.0, rel=1e-3) for r in result.values())
    published = tmp_path / "published.json"
    published.write_text((ROOT / "grader" / "published_speedups.json").read_text())
    l4_model.write_entry(published, result, "MODELLED: test")
    entry = estimate.load_published("l4", published)
    assert entry is not None and entry.basis == "modelled" and entry.source == "MODELLED: test"
    assert entry.g == {label: 3.0 for label in result}
    # Nothing else of the file changed.
    before = json.loads((ROOT / "grader" / "published_speedups.json").read_text())
    after = json.loads(published.read_text())
    assert after["ceiling"] == before["ceiling"]
    assert after["reference"]["profiles"]["h200"] == before["reference"]["profiles"]["h200"]
    missing = tmp_path / "empty"
    missing.mkdir()
    with pytest.raises(SystemExit, match="missing"):
        l4_model.model(missing, host, 300.0, {"float32": 1.0, "bfloat16": 1.0})
