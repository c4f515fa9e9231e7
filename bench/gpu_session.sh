#!/usr/bin/env bash
# Everything that needs a GPU, grouped into device calls of under ten minutes each (every step has
# its own timeout; the sums stay under the device's 600 s per call), so a session with 30 minutes
# of device time can prove the GPU side of issues 3-6 in four calls:
#
#   bash bench/gpu_session.sh correctness   # <=7 min: reference and grader GPU tests, the budget
#                                           #   calibration (the offset family changed since)
#   bash bench/gpu_session.sh agent         # <=7 min: timing-corpus GPU tests, the agent's end to
#                                           #   end on the GPU
#   bash bench/gpu_session.sh timing        # ~8 min: five grades' spread and wall time (h200),
#                                           #   one l4-profile grade's wall time on this GPU
#   bash bench/gpu_session.sh tune          # ~4 min: bench/device_h200.sh (tuner + benchmark)
#
# Each phase writes its logs and results under $OUT, then packs them into $OUT/<phase>.tgz (at
# most 8 files come back from the device), keeping summary.txt beside it, and prints the summary. What to commit afterwards: the
# calibration and reproducibility results under bench/results/ (their .md names GPU, versions,
# date and command), a tuned reference/plans/h200.json only if tune.log says every entry passed.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
phase=${1:?usage: bash bench/gpu_session.sh correctness|agent|timing|tune}
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }

versions() {
    nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader
    python3 -c "import sys,torch,triton,numpy;print('python',sys.version.split()[0],'torch',torch.__version__,'triton',triton.__version__,'numpy',numpy.__version__)"
    date -u +%FT%TZ
}

# One pytest run, its log under $OUT, its closing line echoed with the wall time.
suite() {
    local name=$1 limit=$2
    shift 2
    local t0
    t0=$(date +%s)
    timeout "$limit" python3 -m pytest -q -p no:cacheprovider -rfE "$@" > "$OUT/$name.log" 2>&1
    echo "$name: rc=$? wall=$(( $(date +%s) - t0 ))s $(tail -n 1 "$OUT/$name.log")"
}

case "$phase" in
correctness)
    versions > "$OUT/summary.txt" 2>&1
    {
        suite reference-gpu 200 tests/test_reference_gpu.py
        suite grader-gpu 120 tests/test_grader_gpu.py
    } | tee -a "$OUT/summary.txt"
    # The offset family changed after the last calibration: measure the plain block again.
    timeout 120 python3 bench/calibrate_budgets.py --draws 3 --md "$OUT/calibration-h200.md" \
        --json "$OUT/calibration-h200.json" > "$OUT/calibration.log" 2>&1
    echo "calibration: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    ;;
agent)
    versions > "$OUT/summary.txt" 2>&1
    {
        suite timing-gpu 160 tests/test_timing_gpu.py
        suite workspace-gpu 270 -m gpu tests/test_workspace_e2e.py
    } | tee -a "$OUT/summary.txt"
    ;;
timing)
    versions > "$OUT/summary.txt" 2>&1
    timeout 330 python3 bench/reproducibility.py --profile h200 --runs 5 --grade --out "$OUT" \
        > "$OUT/repro-h200.log" 2>&1
    echo "reproducibility h200: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    timeout 150 python3 bench/reproducibility.py --profile l4 --runs 1 --grade --out "$OUT" \
        > "$OUT/repro-l4.log" 2>&1
    echo "reproducibility l4 on this GPU: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    tail -n 25 "$OUT/repro-h200.log"
    ;;
tune)
    TOTAL=230 bash bench/device_h200.sh
    ;;
*)
    echo "unknown phase $phase: correctness, agent, timing or tune" >&2
    exit 2
    ;;
esac
echo "phase $phase done in $(elapsed)s" | tee -a "$OUT/summary.txt"
( cd "$OUT" && find . -type f ! -name summary.txt ! -name '*.tgz' -print0 \
    | tar czf "$phase.tgz" --null -T - --remove-files )
cat "$OUT/summary.txt"
