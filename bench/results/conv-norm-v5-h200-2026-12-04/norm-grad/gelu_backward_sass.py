"""Machine code of reference/norm_grad.py's GELU backward kernel for sm_90, on any machine (the
ptxas and cuobjdump Triton's wheel ships): registers, instructions an element, and the issue
bound at the h200 shapes. From the repository root: python <this folder>/gelu_backward_sass.py
"""

import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import reference.norm_grad as ng  # noqa: E402

CUOBJDUMP = str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
# The h200 shapes' hidden activation: bf16 256x8192, fp32 64x8192, 256 wide.
ELEMENTS = {"bf16": 256 * 8192 * 256, "fp32": 64 * 8192 * 256}
ISSUE_RATE = 132 * 4 * 1.98e9  # warp instructions a second: 132 SMs × 4 schedulers × 1.98 GHz

fn = ng._gelu_bwd_sums_kernel
index = {name: i for i, name in enumerate(fn.arg_names)}
for dtype in ("bf16", "fp32"):
    for rows, warps in ((8, 4), (32, 4), (16, 8)):
        sig = {"DACT": f"*{dtype}", "H": f"*{dtype}", "R": "*fp32", "DH": f"*{dtype}",
               "PART": "*fp32", "L": "i32", "HID": "i32", "n_lb": "i32",
               "BLOCK_L": "constexpr", "BLOCK_H": "constexpr"}
        attrs = {(index[n],): [["tt.divisibility", 16]]
                 for n in ("DACT", "H", "R", "DH", "PART", "L", "HID")}
        src = ASTSource(fn=fn, signature=sig, attrs=attrs,
                        constexprs={(index["BLOCK_L"],): rows, (index["BLOCK_H"],): 256})
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": warps, "num_stages": 1})
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "k.cubin")
            Path(path).write_bytes(kernel.asm["cubin"])
            sass = subprocess.run([CUOBJDUMP, "-sass", path], capture_output=True,
                                  text=True, check=True).stdout
            usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", path],
                                   capture_output=True, text=True, check=True).stdout
        body = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass)
        ops = Counter((i.split()[1] if i.startswith("@") else i.split()[0]).split(".")[0]
                      for i in body)
        per_element = len(body) / (rows * 256 / (32 * warps))
        bound_ms = ELEMENTS[dtype] * per_element / 32 / ISSUE_RATE * 1e3
        registers = re.search(r"REG:\d+", usage).group(0)
        print(f"{dtype} rows {rows} warps {warps}: {registers}, "
              f"{per_element:.1f} instructions an element (MUFU {ops['MUFU']}, SHFL "
              f"{ops['SHFL']}, BAR {ops['BAR']} a program); issue bound at the h200 "
              f"shapes: {bound_ms:.2f} ms")
