"""CPU test of `bench/step/reference_census.py` (issue 41): under the grader's census, through the
Triton interpreter, the scoring reference's step passes its checks and the ceiling's (its Triton
GELU carrying the normalization's sums, on an example of 4096 values) fails them."""

from __future__ import annotations

import json
from pathlib import Path

from interpreted import run_interpreted

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "step" / "reference_census.py"


def _census(block: str) -> dict:
    text = run_interpreted(["-c", (
        "import json, sys, io, contextlib\n"
        f"sys.argv = ['x', '--device', 'cpu', '--shapes', '2x512x8:d3:float32', '--block', "
        f"'{block}']\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "buf = io.StringIO()\n"
        "import runpy\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    try:\n"
        f"        runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
        "    except SystemExit:\n"
        "        pass\n"
        "out = buf.getvalue()\n"
        "print(json.dumps(json.loads(out[:out.rindex('census: ')])))\n")], timeout=300)
    return text


def test_the_scoring_reference_passes_and_the_ceiling_is_caught() -> None:
    scoring = _census("reference")
    assert scoring["ok"], json.dumps(scoring)[:3000]
    step = scoring["shapes"]["2x512x8:d3:float32"]
    assert step["forward"]["functions"] == ["ConvNormSkipFunction"]
    assert "aten::gelu" in step["forward"]["ops"] and "aten::gelu_backward" in step["backward"]["ops"]
    ceiling = _census("ceiling")
    assert not ceiling["ok"]
    wrong = [w for s in ceiling["shapes"].values() for w in s["forward"]["wrong"]]
    assert any("GeluNormGradFunction" in w for w in wrong), wrong
