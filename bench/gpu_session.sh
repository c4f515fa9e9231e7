#!/usr/bin/env bash
# Everything that needs a GPU, grouped into device calls of under ten minutes each (every step has
# its own timeout; the sums stay under the device's 600 s per call). Measured wall times on an
# H200 (2026-11-30, cold caches on a fresh machine, ~30-60 s more per call for the machine start):
#
#   bash bench/gpu_session.sh reference     # ~6 min: the reference's 152 GPU tests (200 s ran 128)
#   bash bench/gpu_session.sh correctness   # ~5 min: grader GPU tests (120 s ran 5 of 6), the budget
#                                           #   calibration (~30 s)
#   bash bench/gpu_session.sh agent         # ~6-8 min: timing-corpus GPU tests (97 s), the agent's
#                                           #   end to end on the GPU (230 s)
#   bash bench/gpu_session.sh timing        # ~7 min: a whole grade (125 s) plus five timing phases
#                                           #   (35-50 s each) of the h200 profile
#   bash bench/gpu_session.sh timing-l4     # ~2.5 min: one l4-profile grade's wall time on this GPU
#   bash bench/gpu_session.sh tune          # ~6 min: bench/device/device_h200.sh (tuner + benchmark,
#                                           #   torch.compile on the h200 and l4 shapes)
#   bash bench/gpu_session.sh variance      # ~3 min: why the kernels' speed changes between grades
#                                           #   (bench/results/kernel-drift-h200-2026-11-30/)
#   bash bench/gpu_session.sh hosts         # ~9 min: the same verdicts on any host (issue 12): every
#                                           #   gate-corpus entry with pools as large as a 64-core
#                                           #   host's (4 grades at once), the timing corpus, a whole
#                                           #   naive grade with 64-thread pools and the budget
#                                           #   calibration of the structured families, all at once
#                                           #   on one GPU: each is the others' neighbour
#   bash bench/gpu_session.sh structured    # ~4 min: calibration of the structured families, the
#                                           #   reference on them, a naive grade with 64-thread pools
#   bash bench/gpu_session.sh coverage      # ~9 min: 10 timing phases of the reference-as-submission
#                                           #   and the coverage of their 95% intervals
#   bash bench/gpu_session.sh grade-fast    # ~9.5 min: a whole grade's time (reference, naive) with
#                                           #   the gate over two children and the timing's start
#                                           #   beside it, then the gate and timing corpora
#   GRADES=3 bash bench/gpu_session.sh grades  # ~7 min: whole grades of the reference, their spread
#   PAIRS=2 bash bench/gpu_session.sh ab    # ~9 min: sequential and --overlap grades alternated
#   bash bench/gpu_session.sh held-close    # ~9.5 min: a whole grade and five timing phases
#                                           #   (issue 13, held steps)
#   bash bench/gpu_session.sh held-corpus   # ~9.5 min: the timing corpus, then the gate corpus
#   bash bench/gpu_session.sh timing-corpus # ~6 min: the whole timing corpus and the host-wait test
#   bash bench/gpu_session.sh mlp-resident  # ~9.5 min: issue 17's resident MLP kernels: GPU
#                                           #   tests, a sweep, whole bf16 steps
#   bash bench/gpu_session.sh mlp-anatomy   # ~1 min: the MLP forward with parts removed, ncu
#   bash bench/gpu_session.sh gemm-precision # ~1.5 min: fp32 products on tensor cores vs cuBLAS
#   bash bench/gpu_session.sh mlp-bf16x3    # ~8 min: the fused MLP with bf16x3 fp32 products
#   bash bench/gpu_session.sh split-mlp     # ~6 min: the block's split_mlp proven and timed
#   bash bench/gpu_session.sh reference-v2  # ~9.5 min: the reference's GPU tests with its default
#                                           #   MLP path, then bench/step/reference_step.py on the h200 shapes
#   bash bench/gpu_session.sh reference-fp32  # ~7 min: the same, its tests in three processes at
#                                           #   once, the benchmark on the fp32 shapes only
#   bash bench/gpu_session.sh reference-record  # ~7 min: bench/step/reference_step.py on every h200 shape
#                                           #   in one run, torch.compile warmed first
#   bash bench/gpu_session.sh tune-mlp      # ~5 min: the tuner's MLP-path stage: its GPU tests,
#                                           #   --mlp-only on the h200 table, then --reverify
#   bash bench/gpu_session.sh conv-norm-ncu # ~2 min: one conv+norm launch each way under ncu
#   bash bench/gpu_session.sh conv-norm-maxnreg # ~2 min: conv+norm under register caps
#   bash bench/gpu_session.sh conv-norm-taps # ~4 min: Plan.taps_once A/B on every h200 shape,
#                                           #   then the tuner on every h200 class (not the MLP)
#   bash bench/gpu_session.sh reference-all # ~9 min: the reference's GPU tests but the plans' in
#                                           #   three processes, then bench/step/reference_step.py on every
#                                           #   h200 shape
#   bash bench/gpu_session.sh reference-plans # ~5.5 min: test_kernel_plans alone (39 tests)
#   bash bench/gpu_session.sh scoring-reference-grades # ~6.5 min: issue 41's grades alone
#   bash bench/gpu_session.sh conv-norm-chain # ~9 min: the chain kernels' tiles and groups
#                                           #   (bench/kernels/conv_norm_chain.py), then the tuner
#   bash bench/gpu_session.sh norm-grad     # ~3 min: norm_grad's GELU backward tiles against
#                                           #   PyTorch's, its GPU tests, then whole steps with
#                                           #   and without it (norm_grad_from_mlp)
#   bash bench/gpu_session.sh published     # ~3 min: g of the reference as submission, 3 timing
#                                           #   phases (grader/published_speedups.json)
#   bash bench/gpu_session.sh scoring-reference  # ~9.3 min (not yet run): issue 41: the scoring
#                                           #   reference's GPU tests and census, conv+norm against
#                                           #   copy (both dtypes, both directions), the reference
#                                           #   graded as a submission and a timing phase (its
#                                           #   published g: bench/timing/publish_g.py), then a
#                                           #   whole grade of the naive control
#   bash bench/gpu_session.sh scoring-reference-ncu  # ~6 min (not yet run): issue 41: DRAM bytes
#                                           #   of one step of plain and the scoring reference per
#                                           #   l4 shape under Nsight Compute, host times, and the
#                                           #   modelled L4 g (bench/step/l4_model.py)
#   bash bench/gpu_session.sh held-ab       # ~6 min: the hold-page corpus entries, a sequential
#                                           #   and an --overlap grade of the reference
#   bash bench/gpu_session.sh trust-confined  # ~9 min: issue 37 on a GPU: the confinement's GPU
#                                           #   probe and census test, the timing corpus, the gate
#                                           #   corpus 4 at a time
#   bash bench/gpu_session.sh trust-confined-grades  # ~5 min: whole grades of the reference-as-
#                                           #   submission and the naive control, confined
#   bash bench/gpu_session.sh inspect-run   # ~6 min (not yet run): issue 39: the Inspect task once
#                                           #   through `inspect eval` (inspect_ai from the carried
#                                           #   .wheelhouse/), the mock model and the scripted honest
#                                           #   submission graded and finally regraded on this GPU
#   bash bench/gpu_session.sh tail          # ~8 min: a step's tail under the default and a
#                                           #   spinning host wait, in one process and in timing
#   bash bench/gpu_session.sh crowded       # ~9 min (not yet run): issue 38 on a crowded GPU
#                                           #   (bench/grade/crowded.py): a hog holds all but 4 GiB,
#                                           #   then one fills the GPU mid-grade; the naive
#                                           #   control and wrong_conv_grad graded under each
#                                           #   (never out_of_memory), a GPU hoarder (its own
#                                           #   out_of_memory), then a whole naive grade's peak
#                                           #   memory (h200 profile) in the time left
#   bash bench/gpu_session.sh crowded-tests # ~4 min (not yet run): the same as GPU tests on the
#                                           #   CI cases (tests/test_grader_gpu.py -k crowded)
#
# The first six take ~33 device-minutes with starts; a 30-minute session runs the ones its change needs.
#
# Each phase writes its logs and results under $OUT, then packs them into $OUT/<phase>.tgz (at
# most 8 files come back from the device), keeping summary.txt beside it, and prints the summary. What to commit afterwards: the
# calibration and reproducibility results under bench/results/ (their .md names GPU, versions,
# date and command), a tuned reference/plans/h200.json only if tune.log says every entry passed.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
phase=${1:?usage: bash bench/gpu_session.sh scoring-reference|scoring-reference-grades|scoring-reference-ncu|inspect-run|crowded|crowded-tests|trust-confined|trust-confined-grades|norm-grad|grade-fast|grades|ab|reference-record|tune-mlp|conv-norm-ncu|conv-norm-maxnreg|conv-norm-taps|reference-all|reference-plans|conv-norm-chain|held-close|held-corpus|timing-corpus|mlp-resident|mlp-anatomy|gemm-precision|mlp-bf16x3|split-mlp|reference-v2|reference-fp32|published|held-ab|tail|reference|correctness|agent|timing|trust|trust-corpus|trust-final|trust-check|trust-close|timing-l4|tune|variance|hosts|structured|coverage}
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }

versions() {
    nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader
    python3 -c "import sys,torch,triton,numpy;print('python',sys.version.split()[0],'torch',torch.__version__,'triton',triton.__version__,'numpy',numpy.__version__)"
    date -u +%FT%TZ
}

# One pytest run, its log under $OUT, its closing line echoed with the wall time.
# A pytest run under a time limit; -q is set, so ask for per-test lines with -rA, not -v.
suite() {
    local name=$1 limit=$2
    shift 2
    local t0
    t0=$(date +%s)
    # SIGINT, not SIGTERM: pytest ends a run it is told to stop as if interrupted from the
    # keyboard and still prints which tests failed so far (a suite cut by its limit said nothing).
    timeout --signal=INT --kill-after=20 "$limit" python3 -m pytest -q -p no:cacheprovider -rfE \
        "$@" > "$OUT/$name.log" 2>&1
    echo "$name: rc=$? wall=$(( $(date +%s) - t0 ))s $(tail -n 1 "$OUT/$name.log")"
}

# bench/step/reference_step.py on the h200 profile in the time left of $LIMIT, with torch.compile's cold
# times from an earlier --warm-compile-only: the benchmark of record. $1 is the tag; the rest
# go to bench/step/reference_step.py.
bench_record() {
    local tag=$1 left
    shift
    left=$(( ${LIMIT:-580} - $(elapsed) ))
    timeout "$left" python3 bench/step/reference_step.py --profiles h200 --rounds 16 \
        --deadline-s $(( left - 15 )) --compile-deadline-s $(( left - 40 )) \
        --compile-profiles h200 --compile-times "$OUT/compile-warm.json" --out-dir "$OUT" \
        --tag "$tag" "$@" > "$OUT/bench.log" 2>&1
    echo "bench: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    cat "$OUT/reference-$tag.md" >> "$OUT/summary.txt" 2>/dev/null
}

# The tuner on every h200 class's conv+norm plan (the MLP paths left as they are) in the time
# left of $LIMIT: $1 candidates a class, $2 seconds kept back; its decisions in the summary.
tune_h200_plans() {
    timeout $(( ${LIMIT:-560} - $(elapsed) )) python3 -m reference.tune --profile h200 \
        --skip-mlp --max-candidates "$1" --gate-cases 2 --rounds 30 \
        --time-budget-s $(( ${LIMIT:-560} - $(elapsed) - $2 )) \
        --table reference/plans/h200.json --out "$OUT/h200.json" --report "$OUT/tune.json" \
        > "$OUT/tune.log" 2>&1
    echo "tune: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    grep -h "decide\|keep\|PROMOTE\|promot\|entries passed" "$OUT/tune.log" \
        >> "$OUT/summary.txt"
}

# Every GPU test of the reference, the split and the fused MLP but test_kernel_plans, in three
# pytest processes on the one GPU at once (correctness only, nothing timed), each closing line
# in the summary; ~200 s on an H200. test_kernel_plans (39 tests, 299 s alone) has a call of its
# own (the reference-plans phase): beside the others it ran past 300 s twice on 2026-12-04.
reference_tests() {
    suite ref-fp32 300 tests/test_reference_gpu.py -k "test_case_every_dtype and float32" \
        >> "$OUT/summary.txt" &
    local a=$!
    suite ref-half 300 tests/test_reference_gpu.py -k "test_case_every_dtype and not float32" \
        >> "$OUT/summary.txt" &
    local b=$!
    ( suite mlp-gpu 200 -m gpu tests/test_reference_mlp.py tests/test_reference_mlp_path.py
      suite ref-rest 200 -m gpu tests/test_reference_gpu.py tests/test_reference_split_linear.py \
          -k "not test_case_every_dtype and not test_kernel_plans" ) >> "$OUT/summary.txt" &
    wait "$a" "$b" $!
}

# $OUT/scoring-64.yaml (every child's pools as an unpinned child's on a 64-core host) and $naive,
# a committed workspace of the naive control, for a whole grade as a 64-core host would run it.
naive_pools64() {
    python3 - "$OUT/scoring-64.yaml" <<'PY'
import sys, yaml
data = yaml.safe_load(open("scoring.yaml"))
for phase in ("load", "gate", "timing"):
    data["limits"][phase]["pool_threads"] = 64
yaml.safe_dump(data, open(sys.argv[1], "w"), sort_keys=False)
PY
    naive=$(mktemp -d)/naive
    mkdir -p "$naive" && cp tests/corpus/naive_triton/solution.py "$naive/"
    git -C "$naive" init -q && git -C "$naive" add -A \
        && git -C "$naive" -c user.name=g -c user.email=g@g commit -qm naive
}

# $ref: a committed workspace of the reference as the submission (tests/timing_workspace.py).
reference_ws() {
    ref=$(mktemp -d)/ref
    python3 - "$ref" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "tests")
from timing_workspace import REFERENCE_SOLUTION, make_workspace
make_workspace(Path(sys.argv[1]), REFERENCE_SOLUTION, git=True)
PY
}

# One whole grade of the reference-as-submission and $2 timing phases (bench/timing/reproducibility.py,
# h200 profile) within $1 seconds: the rc, the grade's line and each phase's in the summary.
grade_and_phases() {
    local limit=$1 runs=$2
    timeout "$limit" python3 bench/timing/reproducibility.py --profile h200 --runs "$runs" --grade \
        --out "$OUT" > "$OUT/repro-h200.log" 2>&1
    echo "one grade + $runs timing phases, h200: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    grep -E "^(run |whole grade)" "$OUT/repro-h200.log" | cut -c1-300 | tee -a "$OUT/summary.txt"
}

# Issue 41's grades: the reference-as-submission graded with one timing phase after it within $1
# seconds (its g published by bench/timing/publish_g.py, the record named after this GPU), then a
# whole grade of the naive control until $2 seconds into the call.
scoring_grades() {
    local limit=$1 end=$2 gpu
    grade_and_phases "$limit" 1
    cat "$OUT"/reproducibility-*.md >> "$OUT/summary.txt" 2>/dev/null
    gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name(0).split()[1].lower())" \
        2>/dev/null || echo gpu)
    python3 bench/timing/publish_g.py "$OUT"/reproducibility-*.json \
        --record "bench/results/scoring-reference-$gpu-$(date -u +%F)/" \
        > "$OUT/published-entry.json" 2>&1
    echo "publish_g: rc=$? (the entry: published-entry.json)" | tee -a "$OUT/summary.txt"
    naive_pools64
    LIMIT=$(( end - $(elapsed) )) phased grade-naive "$naive" --overlap | tee -a "$OUT/summary.txt"
}

# One whole grade with per-phase timers (bench/grade/grade_phases.py), its score and wall in one line.
phased() {
    local name=$1 ws=$2
    shift 2
    timeout "${LIMIT:-280}" python3 bench/grade/grade_phases.py "$ws" --gpu 0 --out "$OUT/$name.json" \
        --report "$OUT/$name-report.json" "$@" \
        > "$OUT/$name.log" 2>&1
    echo "$name: rc=$? at $(elapsed)s $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(d['status'], d['score'], 'wall', d['wall_s'], {k: v for k, v in d['phases_s'].items()})" \
        "$OUT/$name.json" 2>&1 | cut -c1-400)"
}

# The host's confinement as the grader sees it (kernel, Landlock ABI, seccomp), for the summary.
confinement_host() {
    uname -r
    python3 -c "from grader.confinement import host_confinement; print(host_confinement())"
}

case "$phase" in
crowded)
    # Issue 38: honest verdicts on a crowded GPU. bench/grade/crowded.py grades the naive control and
    # a wrong-gradient entry while a neighbour (bench/grade/gpu_hog.py, its pid in each line) holds all
    # but 4 GiB (fill) or fills the GPU once the grade started (grow): naive scored or
    # grader_error naming the hog, wrong gradient gate_failed or grader_error, never
    # out_of_memory; a submission hoarding GPU memory is out_of_memory (its own share); then a
    # whole naive grade's peak device memory with the GPU's profile (scoring.yaml's
    # peak_device_memory_gib) in the time left.
    versions > "$OUT/summary.txt" 2>&1
    timeout 330 python3 bench/grade/crowded.py --out "$OUT/crowded" --parts fill,grow,own \
        --deadline-s 320 > "$OUT/crowded-verdicts.log" 2>&1
    echo "crowded, fill, grow and own: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    cut -c1-600 "$OUT/crowded-verdicts.log" | tee -a "$OUT/summary.txt"
    left=$(( 560 - $(elapsed) ))
    timeout "$left" python3 bench/grade/crowded.py --out "$OUT/peak" --parts peak \
        --deadline-s $(( left - 10 )) > "$OUT/crowded-peak.log" 2>&1
    echo "whole-grade peak: rc=$? at $(elapsed)s $(grep -E "^peak:" "$OUT/crowded-peak.log")" \
        | tee -a "$OUT/summary.txt"
    ;;
crowded-tests)
    # Issue 38's GPU tests, alone on the GPU (they fill it): fill and grow beside a hog for the
    # naive control and wrong_conv_grad on the CI cases, and the GPU hoarder's own out_of_memory.
    versions > "$OUT/summary.txt" 2>&1
    GRADER_TEST_CROWDED=1 suite crowded-gpu 400 -rA -m gpu tests/test_grader_gpu.py -k crowded \
        | tee -a "$OUT/summary.txt"
    grep -hE "(PASSED|FAILED|ERROR)" "$OUT"/crowded-gpu.log | cut -c1-300 \
        | tee -a "$OUT/summary.txt"
    ;;
trust-confined)
    # Issue 37 on a GPU, the submission's process confined by Landlock and seccomp: the GPU probe
    # (CUDA, Triton's compile and launch, cuBLAS, CUPTI under the GPU policy) and the census's GPU
    # test, every timing-corpus entry alone on the GPU, then every gate-corpus entry (4 at a time).
    { versions; confinement_host; } > "$OUT/summary.txt" 2>&1
    # TIMING_S and END_S shorten it for a call with less device time left.
    suite confine-gpu 120 -rA -m gpu tests/test_child_confine.py tests/test_grader_census.py \
        | tee -a "$OUT/summary.txt"
    suite timing-corpus "${TIMING_S:-280}" -rA tests/test_timing_gpu.py | tee -a "$OUT/summary.txt"
    suite gate-corpus $(( ${END_S:-560} - $(elapsed) )) -rA -n 4 tests/test_grader_gpu.py \
        | tee -a "$OUT/summary.txt"
    grep -hE "(PASSED|FAILED|ERROR)" "$OUT"/confine-gpu.log "$OUT"/*-corpus.log \
        | cut -c1-300 | tee -a "$OUT/summary.txt"
    ;;
inspect-run)
    # Issue 39: the Inspect task (grader/adapters/inspect_task.py) end to end through Inspect's
    # own command line: the mock model, the scripted honest solver (tests/inspect_honest.py: the
    # naive control committed, then the grade tool), the local grader (the embedded store and
    # worker) on this GPU with its own profile, then the final regrade of the best. There is no
    # network here: inspect_ai comes from .wheelhouse/ (carried with the tree), into a venv that
    # sees this machine's torch, triton and numpy.
    versions > "$OUT/summary.txt" 2>&1
    out=$(realpath -m "$OUT")
    site=$(mktemp -d)
    py=python3
    if python3 -m venv --system-site-packages "$site/venv" > "$OUT/install.log" 2>&1; then
        py=$site/venv/bin/python
        timeout 150 "$py" -m pip install -q --no-index --find-links .wheelhouse inspect_ai \
            >> "$OUT/install.log" 2>&1
    else  # no ensurepip here: every wheel into a folder on the path, as the device's notes say
        timeout 150 python3 -m pip install -q --no-index --no-deps --no-compile \
            --target "$site/site" .wheelhouse/*.whl >> "$OUT/install.log" 2>&1
        export PYTHONPATH=$site/site
    fi
    echo "inspect_ai from .wheelhouse: rc=$? at $(elapsed)s, version $(PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} \
        "$py" -c 'import inspect_ai; print(inspect_ai.__version__)' 2>&1 | tail -n 1)" \
        | tee -a "$OUT/summary.txt"
    PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout $(( 525 - $(elapsed) )) "$py" -m inspect_ai \
        eval grader/adapters/inspect_task.py --solver tests/inspect_honest.py@honest_naive \
        --model mockllm/model --sandbox local -T store="$out/store" --log-dir "$out/logs" \
        --log-format json --display plain > "$OUT/inspect.log" 2>&1
    echo "inspect eval: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    timeout 20 "$py" bench/adapters/inspect_log.py "$out"/logs/*.json 2>&1 \
        | tee -a "$OUT/summary.txt"
    tail -n 5 "$OUT/inspect.log"
    ;;
trust-confined-grades)
    # Issue 37's whole grades, confined: the reference-as-submission and the naive control, each
    # with per-phase timers (wall, score against the records).
    { versions; confinement_host; } > "$OUT/summary.txt" 2>&1
    reference_ws
    naive_pools64
    LIMIT=300 phased grade-reference "$ref" --overlap | tee -a "$OUT/summary.txt"
    LIMIT=$(( 585 - $(elapsed) )) phased grade-naive "$naive" --overlap | tee -a "$OUT/summary.txt"
    ;;
norm-grad)
    # Issue 17: the normalization's c1 and c2 from the GELU's backward (reference/norm_grad.py):
    # its kernel's tiles against PyTorch's gelu_backward, its GPU tests, then whole steps of
    # every h200 shape with and without it, interleaved.
    versions > "$OUT/summary.txt" 2>&1
    timeout 150 python3 bench/kernels/gelu_backward.py --out "$OUT/gelu_backward.json" \
        > "$OUT/gelu_backward.log" 2>&1
    echo "gelu backward tiles: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    cat "$OUT/gelu_backward.log" >> "$OUT/summary.txt"
    suite norm-grad-gpu 150 -rA -m gpu tests/test_reference_gpu.py \
        -k "norm_grad or norm_backward or fuses_the_residual" | tee -a "$OUT/summary.txt"
    timeout $(( ${LIMIT:-560} - $(elapsed) )) python3 bench/step/step_limit.py --profile h200 \
        --time --variants ceiling,ceiling_two_pass_norm --rounds "${ROUNDS:-12}" \
        --out-dir "$OUT" --tag norm-grad > "$OUT/step-norm-grad.log" 2>&1
    echo "step limit: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    cat "$OUT"/step-limit-*.md 2>/dev/null | tee -a "$OUT/summary.txt"
    ;;
reference)
    versions > "$OUT/summary.txt" 2>&1
    suite reference-gpu 540 tests/test_reference_gpu.py | tee -a "$OUT/summary.txt"
    ;;
reference-v2)
    # Issue 17: the reference with the MLP path of its plan data (split products in fp32 on an
    # H200) through every GPU test of the reference and the split, while torch.compile's graphs
    # of the h200 shapes warm its caches in the background; then the benchmark of record.
    versions > "$OUT/summary.txt" 2>&1
    nice -n 10 timeout 200 python3 bench/step/reference_step.py --warm-compile-only --profiles h200 \
        --compile-profiles h200 --warm-timeout-s 190 --out-dir "$OUT" > "$OUT/warm.log" 2>&1 &
    warm=$!
    suite reference-gpu 330 tests/test_reference_gpu.py tests/test_reference_split_linear.py \
        | tee -a "$OUT/summary.txt"
    wait "$warm"
    echo "compile warm: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    bench_record h200-v2
    ;;
reference-fp32)
    # Issue 17: reference-v2 within one device call: the GPU tests but the plans' (reference_tests)
    # on the one GPU (correctness only, nothing timed) beside torch.compile's warm-up of the fp32
    # shapes, then the benchmark of record on those shapes.
    versions > "$OUT/summary.txt" 2>&1
    fp32=float32:64x8192:d1,float32:128x4096:d16,float32:64x8192:d128,float32:64x8192:d512
    nice -n 10 timeout 200 python3 bench/step/reference_step.py --warm-compile-only --profiles h200 \
        --shapes "$fp32" --warm-timeout-s 190 --out-dir "$OUT" > "$OUT/warm.log" 2>&1 &
    warm=$!
    reference_tests
    wait "$warm"
    echo "compile warm: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    bench_record h200-fp32 --shapes "$fp32"
    ;;
reference-record)
    # Issue 17's benchmark of record: every h200 shape in one run, torch.compile's graphs warmed
    # first (their compile times are recorded, not paid inside the run's deadline).
    versions > "$OUT/summary.txt" 2>&1
    timeout 240 python3 bench/step/reference_step.py --warm-compile-only --profiles h200 \
        --compile-profiles h200 --warm-timeout-s 230 --out-dir "$OUT" > "$OUT/warm.log" 2>&1
    echo "compile warm: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    bench_record h200-record
    ;;
tune-mlp)
    # Issue 17: the tuner's MLP-path stage for real. Its GPU tests, then the h200 table's MLP
    # paths decided afresh (--mlp-only: conv+norm plans stay) and the result re-verified.
    versions > "$OUT/summary.txt" 2>&1
    suite tune-mlp-gpu 150 -m gpu tests/test_reference_mlp_path.py tests/test_reference_tuning.py \
        | tee -a "$OUT/summary.txt"
    timeout 200 python3 -m reference.tune --profile h200 --mlp-only --rounds 20 \
        --table reference/plans/h200.json --out "$OUT/h200.json" --report "$OUT/tune-mlp.json" \
        > "$OUT/tune-mlp.log" 2>&1
    echo "tune --mlp-only: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    timeout 150 python3 -m reference.tune --profile h200 --mlp-only --reverify --rounds 20 \
        --table "$OUT/h200.json" --out "$OUT/h200-reverified.json" \
        --report "$OUT/reverify-mlp.json" > "$OUT/reverify-mlp.log" 2>&1
    echo "tune --mlp-only --reverify: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    grep -h "MLP path\|gate \|time \|decide\|keep\|PROMOTE\|entries passed" \
        "$OUT/tune-mlp.log" "$OUT/reverify-mlp.log" >> "$OUT/summary.txt"
    ;;
conv-norm-ncu)
    # Issue 17: what bounds conv+norm. One forward and one backward launch per shape with the
    # table's plans, plain (times), then under Nsight Compute.
    versions > "$OUT/summary.txt" 2>&1
    shapes=${SHAPES:-float32:64x8192:d1,bfloat16:256x8192:d64}
    timeout 90 python3 bench/kernels/conv_norm_ncu.py --shapes "$shapes" > "$OUT/conv-norm-times.log" 2>&1
    echo "plain: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    cat "$OUT/conv-norm-times.log" >> "$OUT/summary.txt"
    ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu \
        2>/dev/null | head -n 1)
    if [ -n "$ncu" ]; then
        timeout $(( ${LIMIT:-560} - $(elapsed) )) "$ncu" --profile-from-start off \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
            --section SchedulerStats --section Occupancy --section LaunchStats \
            python3 bench/kernels/conv_norm_ncu.py --shapes "$shapes" > "$OUT/conv-norm-ncu.txt" 2>&1
        echo "ncu ($ncu): rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    else
        echo "ncu: not found" | tee -a "$OUT/summary.txt"
    fi
    ;;
conv-norm-taps)
    # Issue 17: the conv taps loaded once per program (Plan.taps_once) against once per tile on
    # every h200 shape under the plans the reference picks, outputs compared bit for bit; then
    # the tuner decides every h200 class's plan afresh (the taps toggle is each plan's first
    # neighbour), the MLP paths left as they are.
    versions > "$OUT/summary.txt" 2>&1
    timeout 150 python3 bench/kernels/conv_norm_plans.py --vary "taps_once=0;taps_once=1" \
        --out "$OUT/taps.json" > "$OUT/taps.log" 2>&1
    echo "taps A/B: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    cat "$OUT/taps.log" >> "$OUT/summary.txt"
    tune_h200_plans 6 90
    ;;
reference-all)
    # Issue 17: the reference's GPU tests but test_kernel_plans (reference-plans) in three
    # pytest processes on the one GPU (correctness only, nothing timed) beside torch.compile's
    # warm-up of every h200 shape, then the benchmark of record on every h200 shape.
    versions > "$OUT/summary.txt" 2>&1
    nice -n 10 timeout 250 python3 bench/step/reference_step.py --warm-compile-only --profiles h200 \
        --compile-profiles h200 --warm-timeout-s 240 --out-dir "$OUT" > "$OUT/warm.log" 2>&1 &
    warm=$!
    reference_tests
    wait "$warm"
    echo "compile warm: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    bench_record h200-all
    ;;
reference-plans)
    # Issue 17: the reference's kernels under explicit plans (groups, split channels, tiles, the
    # chain kernels), every dtype, alone on the GPU: 39 tests, 299 s on an H200 (2026-12-04).
    versions > "$OUT/summary.txt" 2>&1
    suite ref-plans 420 -m gpu tests/test_reference_gpu.py -k test_kernel_plans \
        | tee -a "$OUT/summary.txt"
    ;;
conv-norm-chain)
    # Issue 17: the chain kernels (reference/conv_norm_chain.py, ±d shifts in registers, one
    # warp a program) across tile heights and groups on every h200 shape against the plan the
    # reference picks, outputs compared; then the tuner decides every h200 class's plan afresh
    # (the other kernel family is each plan's first neighbour), the MLP paths left as they are.
    versions > "$OUT/summary.txt" 2>&1
    timeout 150 python3 bench/kernels/conv_norm_chain.py --rows "${ROWS:-8,16}" \
        --groups "${CHAIN_GROUPS:-33,66,132}" --out "$OUT/chain.json" > "$OUT/chain.log" 2>&1
    echo "chain: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    cat "$OUT/chain.log" >> "$OUT/summary.txt"
    tune_h200_plans "${CANDIDATES:-8}" 60
    ;;
conv-norm-maxnreg)
    # Issue 17: does a register cap (Triton's maxnreg) lift conv+norm's register-limited
    # occupancy into bandwidth? Timed against the uncapped launch, outputs compared bitwise.
    versions > "$OUT/summary.txt" 2>&1
    timeout $(( ${LIMIT:-300} - $(elapsed) )) python3 bench/experiments/conv_norm_maxnreg.py \
        --caps "${CAPS:-128,96,80,64}" --out "$OUT/maxnreg.json" > "$OUT/maxnreg.log" 2>&1
    echo "maxnreg: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    cat "$OUT/maxnreg.log" >> "$OUT/summary.txt"
    ;;
scoring-reference)
    # Issue 41 in one call (every step under its own timeout, 560 s in all): the scoring
    # reference's GPU tests (two processes) beside its census (nothing is timed meanwhile);
    # conv+norm against copy, one shape per dtype, forward and both backwards; the reference
    # graded as a submission and one timing phase after it (the published g, and whether it
    # scores ln g / ln(1.1 g) inside its interval); then a whole grade of the naive control.
    versions > "$OUT/summary.txt" 2>&1
    # Three pytest processes, as reference_tests (every case in fp32 took 82-100 s, in the half
    # dtypes 133-152 s beside each other on 2026-12-04).
    suite scoring-fp32 170 -m gpu tests/test_reference_gpu.py \
        -k "test_case_every_dtype and scoring and float32" >> "$OUT/summary.txt" &
    fp32=$!
    suite scoring-half 170 -m gpu tests/test_reference_gpu.py \
        -k "test_case_every_dtype and scoring and not float32" >> "$OUT/summary.txt" &
    half=$!
    suite scoring-rest 170 -m gpu tests/test_reference_gpu.py \
        -k "scoring and not test_case_every_dtype" >> "$OUT/summary.txt" &
    rest=$!
    timeout 110 python3 bench/step/reference_census.py --out "$OUT/census.json" \
        > "$OUT/census.log" 2>&1
    echo "census: rc=$? at $(elapsed)s $(tail -n 1 "$OUT/census.log" | cut -c1-300)" \
        | tee -a "$OUT/summary.txt"
    wait "$fp32" "$half" "$rest"
    timeout 70 python3 bench/step/reference_step.py --profiles h200 --no-compile --rounds 12 \
        --shapes float32:64x8192:d1,bfloat16:256x8192:d64 --out-dir "$OUT" --tag scoring \
        > "$OUT/bench.log" 2>&1
    echo "conv+norm vs copy: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    sed -n '/## conv+norm kernels alone/,/## Targets/p' "$OUT/reference-scoring.md" \
        >> "$OUT/summary.txt" 2>/dev/null
    scoring_grades 200 558
    ;;
scoring-reference-grades)
    # Issue 41's grades alone (~6.5 min, for a call with less device time left): the scoring
    # block's op census test, the reference graded as a submission with one timing phase after
    # it (the published g), then a whole grade of the naive control; confined, as grades are.
    { versions; confinement_host; } > "$OUT/summary.txt" 2>&1
    suite step-ops 60 -rA -m gpu tests/test_reference_gpu.py -k test_scoring_block_step_ops \
        >> "$OUT/summary.txt"
    scoring_grades 190 "${END_S:-390}"
    ;;
scoring-reference-ncu)
    # Issue 41's modelled L4 g: the host's time to issue each step of plain and the scoring
    # reference on every l4 shape (no profiler), then one step of each under Nsight Compute
    # (DRAM bytes per kernel), then bench/step/l4_model.py. The L4's figures are its datasheet's
    # (DRAM 300 GB/s; dense fp32 30.3 TFLOP/s, bf16 121): check them before publishing.
    versions > "$OUT/summary.txt" 2>&1
    timeout 120 python3 bench/step/step_ncu.py --profile l4 --host-times "$OUT/host-times.json" \
        > "$OUT/host-times.log" 2>&1
    echo "host times: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu \
        2>/dev/null | head -n 1)
    if [ -z "$ncu" ]; then
        echo "ncu: not found" | tee -a "$OUT/summary.txt"
    else
        mkdir -p "$OUT/ncu"
        labels=$(python3 -c "from grader.config import load_config
print(' '.join(s.label for s in load_config().timing.profiles['l4'].shapes))")
        for label in $labels; do
            for block in plain reference; do
                stem=${block}__${label//:/_}
                left=$(( ${LIMIT:-540} - $(elapsed) ))
                [ "$left" -gt 20 ] || { echo "no time for $stem" | tee -a "$OUT/summary.txt"; continue; }
                timeout $(( left < 60 ? left : 60 )) "$ncu" --profile-from-start off \
                    --cache-control none --metrics \
                    dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \
                    -o "$OUT/ncu/$stem" python3 bench/step/step_ncu.py --profile l4 \
                    --block "$block" --shape "$label" > "$OUT/ncu/$stem.log" 2>&1
                "$ncu" --import "$OUT/ncu/$stem.ncu-rep" --csv --page raw \
                    > "$OUT/ncu/$stem.csv" 2>>"$OUT/ncu/$stem.log"
                echo "$stem: rc=$? at $(elapsed)s" >> "$OUT/summary.txt"
            done
        done
        rm -f "$OUT"/ncu/*.ncu-rep
        timeout 30 python3 bench/step/l4_model.py --ncu-dir "$OUT/ncu" \
            --host-times "$OUT/host-times.json" --bw-gbs 300 --tflops float32=30.3,bfloat16=121 \
            --out "$OUT/l4-model.json" > "$OUT/l4-model.md" 2>&1
        echo "l4 model: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
        cat "$OUT/l4-model.md" >> "$OUT/summary.txt"
    fi
    ;;
published)
    # grader/published_speedups.json's h200 g: the reference as the submission, timing phases
    # as a grade runs them.
    versions > "$OUT/summary.txt" 2>&1
    timeout 280 python3 bench/timing/reproducibility.py --profile h200 --runs "${RUNS:-3}" --out "$OUT" \
        > "$OUT/reproducibility.log" 2>&1
    echo "reproducibility: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    cat "$OUT"/reproducibility-*.md >> "$OUT/summary.txt" 2>/dev/null
    ;;
mlp-resident)
    # Issue 17: the resident MLP kernels proven at production width, swept alone against eager
    # and the chunked kernels, then whole bf16 steps with them against the reference and eager.
    versions > "$OUT/summary.txt" 2>&1
    suite mlp-gpu 170 -rA -m gpu tests/test_reference_mlp.py | tee -a "$OUT/summary.txt"
    timeout 240 python3 bench/kernels/mlp_sweep.py --resident --modes bf16 --budget-s 200 \
        --out-dir "$OUT" > "$OUT/mlp-resident.log" 2>&1
    echo "mlp resident sweep: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    timeout $(( 575 - $(elapsed) )) python3 bench/step/step_limit.py --profile h200 --time \
        --variants eager,reference,reference_resident_mlp --rounds 8 \
        --shapes bfloat16:256x8192:d1,bfloat16:256x8192:d512 --out-dir "$OUT" \
        --tag h200-resident > "$OUT/step-resident.log" 2>&1
    echo "step limit: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    ;;
mlp-anatomy)
    # Issue 17: where the fused MLP forward's time goes (bench/experiments/mlp_anatomy.py's variants at
    # 32- and 64-row tiles), then Nsight Compute on one launch of each variant where it exists.
    versions > "$OUT/summary.txt" 2>&1
    timeout 150 python3 bench/experiments/mlp_anatomy.py --out "$OUT" > "$OUT/mlp-anatomy.log" 2>&1
    echo "anatomy 32-row tiles: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    timeout 100 python3 bench/experiments/mlp_anatomy.py --block-m 64 --programs-per-sm 1 \
        --out "$OUT/bm64" >> "$OUT/mlp-anatomy.log" 2>&1
    echo "anatomy 64-row tiles: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu \
        2>/dev/null | head -n 1)
    if [ -n "$ncu" ]; then
        timeout $(( 560 - $(elapsed) )) "$ncu" --section SpeedOfLight \
            --section ComputeWorkloadAnalysis --section WarpStateStats --section LaunchStats \
            --section Occupancy -k regex:_anatomy python3 bench/experiments/mlp_anatomy.py --ncu \
            > "$OUT/mlp-anatomy-ncu.txt" 2>&1
        echo "ncu ($ncu): rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    else
        echo "ncu: not found" | tee -a "$OUT/summary.txt"
    fi
    cat "$OUT"/mlp-anatomy-*.md "$OUT"/bm64/*.md 2>/dev/null | tee -a "$OUT/summary.txt"
    ;;
mlp-bf16x3)
    # Issue 17: the fused MLP with fp32 products as three bf16 ones: GPU tests, the kernels'
    # sweep against eager, and a whole fp32 step with them.
    versions > "$OUT/summary.txt" 2>&1
    suite mlp-gpu 200 -rA -m gpu tests/test_reference_mlp.py | tee -a "$OUT/summary.txt"
    timeout 230 python3 bench/kernels/mlp_sweep.py --modes fp32-bf16x3 --budget-s 190 \
        --out-dir "$OUT" > "$OUT/mlp-sweep.log" 2>&1
    echo "mlp sweep: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    timeout $(( 560 - $(elapsed) )) python3 bench/step/step_limit.py --profile h200 --time \
        --variants eager,reference,reference_bf16x3_mlp --rounds 8 \
        --shapes float32:64x8192:d1 --out-dir "$OUT" --tag h200-bf16x3 \
        > "$OUT/step-bf16x3.log" 2>&1
    echo "step limit: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    cat "$OUT"/mlp-sweep-*.md "$OUT"/step-limit-*.md 2>/dev/null | tee -a "$OUT/summary.txt"
    ;;
split-mlp)
    # Issue 17, next: the reference block with split_mlp (both linears as three bf16 products in
    # fp32) proven on the GPU, then whole steps against the reference and eager in both dtypes
    # (and the fused MLP under bf16x3, which ran out of time on 2026-12-03).
    versions > "$OUT/summary.txt" 2>&1
    suite split-gpu 150 -rA -m gpu tests/test_reference_split_linear.py \
        | tee -a "$OUT/summary.txt"
    timeout $(( ${LIMIT:-560} - $(elapsed) )) python3 bench/step/step_limit.py --profile h200 \
        --time --variants eager,ceiling,ceiling_split_mlp,reference_bf16x3_mlp --rounds 8 \
        --shapes float32:64x8192:d1,float32:64x8192:d512,bfloat16:256x8192:d1 \
        --out-dir "$OUT" --tag h200-split > "$OUT/step-split.log" 2>&1
    echo "step limit: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    cat "$OUT"/step-limit-*.md 2>/dev/null | tee -a "$OUT/summary.txt"
    ;;
gemm-precision)
    # Issue 17: fp32 row products on tensor cores (tf32x3, a bf16x3 split) against cuBLAS fp32,
    # their speed and their error against fp64.
    versions > "$OUT/summary.txt" 2>&1
    timeout 400 python3 bench/kernels/gemm_precision.py --out "$OUT" > "$OUT/gemm-precision.log" 2>&1
    echo "gemm precision: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    cat "$OUT"/gemm-precision-*.md 2>/dev/null | tee -a "$OUT/summary.txt"
    ;;
correctness)
    versions > "$OUT/summary.txt" 2>&1
    suite grader-gpu 360 tests/test_grader_gpu.py | tee -a "$OUT/summary.txt"
    # The plain block against the fp64 oracle under the budgets of scoring.yaml.
    timeout 150 python3 bench/budgets/calibrate_budgets.py --draws 3 --md "$OUT/calibration-h200.md" \
        --json "$OUT/calibration-h200.json" > "$OUT/calibration.log" 2>&1
    echo "calibration: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    ;;
agent)
    versions > "$OUT/summary.txt" 2>&1
    {
        suite timing-gpu 160 tests/test_timing_gpu.py
        # 230 s on the old h200 profile; its shapes now carry ~2x the GPU work.
        suite workspace-gpu 360 -m gpu tests/test_workspace_e2e.py
    } | tee -a "$OUT/summary.txt"
    ;;
timing)
    versions > "$OUT/summary.txt" 2>&1
    # 316 s on 2026-11-30 (bench/results/reproducibility-H200-h200-2026-11-30-run3.md).
    timeout 500 python3 bench/timing/reproducibility.py --profile h200 --runs 5 --grade --out "$OUT" \
        > "$OUT/repro-h200.log" 2>&1
    echo "reproducibility h200: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    tail -n 25 "$OUT/repro-h200.log"
    ;;
trust)
    # Issue 13's first look: the timing corpus and the gate on the GPU through the two-process
    # timing (baselines process + submission process), then one whole grade of the reference.
    versions > "$OUT/summary.txt" 2>&1
    suite timing-corpus 300 tests/test_timing_gpu.py | tee -a "$OUT/summary.txt"
    grep -E "^(FAILED|ERROR)" "$OUT/timing-corpus.log" | cut -c1-400 | tee -a "$OUT/summary.txt"
    timeout 400 python3 bench/timing/reproducibility.py --profile h200 --runs "${RUNS:-2}" --grade \
        --out "$OUT" > "$OUT/repro-h200.log" 2>&1
    echo "one grade + ${RUNS:-2} timing phases, h200: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    tail -n 30 "$OUT/repro-h200.log" | tee -a "$OUT/summary.txt"
    tar -czf "$OUT/trust.tgz" -C "$OUT" --exclude trust.tgz --exclude summary.txt . 2>/dev/null
    ;;
trust-corpus)
    # Issue 13's adversaries on the GPU: the whole timing corpus (one after another: each times
    # the baselines against themselves), then the gate entries of the trust redesign and their
    # controls (4 at once), then the census's own GPU test.
    versions > "$OUT/summary.txt" 2>&1
    suite timing-corpus 300 tests/test_timing_gpu.py | tee -a "$OUT/summary.txt"
    grep -E "^(FAILED|ERROR)" "$OUT/timing-corpus.log" | cut -c1-400 | tee -a "$OUT/summary.txt"
    suite gate-corpus 200 -n 4 tests/test_grader_gpu.py -k "rewrites_gate_outputs or \
installs_global_hooks or hides_in_custom_op or hides_below_python_dispatch or reduces_by_matmul \
or disables_guard_via_frames or drops_census_messages or naive or reference_copy or plain_pytorch \
or frame_walk or patches_torch" | tee -a "$OUT/summary.txt"
    grep -E "^(FAILED|ERROR)" "$OUT/gate-corpus.log" | cut -c1-400 | tee -a "$OUT/summary.txt"
    suite census-gpu 90 -m gpu tests/test_grader_census.py | tee -a "$OUT/summary.txt"
    tar -czf "$OUT/trust.tgz" -C "$OUT" --exclude trust.tgz --exclude summary.txt . 2>/dev/null
    ;;
trust-final)
    # Issue 13's closing measurements in one call: five grades' timing (one whole grade, then
    # five timing phases of the reference-as-submission), the timing corpus, the gate entries of
    # the trust redesign with their controls, the census's GPU test.
    versions > "$OUT/summary.txt" 2>&1
    grade_and_phases 330 5
    suite timing-corpus 170 tests/test_timing_gpu.py | tee -a "$OUT/summary.txt"
    grep -E "^(FAILED|ERROR)" "$OUT/timing-corpus.log" | cut -c1-300 | tee -a "$OUT/summary.txt"
    suite gate-corpus 70 -n 4 tests/test_grader_gpu.py -k "rewrites_gate_outputs or \
installs_global_hooks or hides_in_custom_op or hides_below_python_dispatch or reduces_by_matmul \
or disables_guard_via_frames or drops_census_messages or naive_passes or reference_copy" \
        | tee -a "$OUT/summary.txt"
    grep -E "^(FAILED|ERROR)" "$OUT/gate-corpus.log" | cut -c1-300 | tee -a "$OUT/summary.txt"
    suite census-gpu 30 -m gpu tests/test_grader_census.py | tee -a "$OUT/summary.txt"
    echo "phase done at $(elapsed)s" | tee -a "$OUT/summary.txt"
    tar -czf "$OUT/trust.tgz" -C "$OUT" --exclude trust.tgz --exclude summary.txt . 2>/dev/null
    ;;
trust-check)
    # Issue 13 after call 5: a whole grade and one timing phase of the reference-as-submission
    # (census rule, clock and drift fixes, command telemetry), the timing corpus, the census's
    # GPU test.
    versions > "$OUT/summary.txt" 2>&1
    grade_and_phases 300 1
    suite timing-corpus 200 tests/test_timing_gpu.py | tee -a "$OUT/summary.txt"
    grep -E "^(FAILED|ERROR)" "$OUT/timing-corpus.log" | cut -c1-300 | tee -a "$OUT/summary.txt"
    suite census-gpu 30 -m gpu tests/test_grader_census.py | tee -a "$OUT/summary.txt"
    echo "phase done at $(elapsed)s" | tee -a "$OUT/summary.txt"
    tar -czf "$OUT/trust.tgz" -C "$OUT" --exclude trust.tgz --exclude summary.txt . 2>/dev/null
    ;;
grade-fast)
    # Issue 13's "a whole grade within 150 s": the gate's items over two children
    # (limits.gate_processes) and the timing's start beside the gate (--overlap), on the reference
    # and on the naive control; then the gate corpus (4 grades at a time) and the timing corpus
    # side by side, each the other's neighbour on the GPU.
    versions > "$OUT/summary.txt" 2>&1
    reference_ws
    naive_pools64
    phased grade-reference-overlap "$ref" --overlap | tee -a "$OUT/summary.txt"
    LIMIT=200 phased grade-naive-overlap "$naive" --overlap | tee -a "$OUT/summary.txt"
    left=$(( 560 - $(elapsed) ))
    suite grader-gpu "$left" -n 4 tests/test_grader_gpu.py > "$OUT/s1.txt" &
    suite timing-gpu "$left" tests/test_timing_gpu.py > "$OUT/s2.txt" &
    wait
    cat "$OUT"/s[12].txt | tee -a "$OUT/summary.txt"
    grep -E "^(FAILED|ERROR)" "$OUT"/grader-gpu.log "$OUT"/timing-gpu.log | cut -c1-400 \
        | tee -a "$OUT/summary.txt"
    rm -f "$OUT"/s[12].txt
    ;;
grades)
    # Whole grades of the reference as the submission, one after another (GRADES of them, default
    # 3; ~120 s each): their spread is issue 13's "five grades within 0.005". EXTRA: options for
    # bench/grade/grade_phases.py (e.g. --overlap). TIMING_CORPUS=1 runs the timing corpus first,
    # alone on the GPU.
    if [ -n "${TIMING_CORPUS:-}" ]; then
        suite timing-gpu 230 tests/test_timing_gpu.py | tee -a "$OUT/summary.txt"
        grep -E "^(FAILED|ERROR)" "$OUT"/timing-gpu.log | cut -c1-400 | tee -a "$OUT/summary.txt"
    fi
    versions > "$OUT/summary.txt" 2>&1
    reference_ws
    for i in $(seq 1 "${GRADES:-3}"); do
        phased "grade-reference-$i" "$ref" ${EXTRA:-} | tee -a "$OUT/summary.txt"
    done
    ;;
ab)
    # Does starting the timing beside the gate move the score? Whole grades of the reference,
    # sequential and --overlap alternated on one machine (PAIRS of them, default 2; ~260 s a pair),
    # each with its report (per-shape medians, r, g, clock disagreements). FIRST=overlap puts
    # the overlap first (a fresh machine's first grade is the slowest); a grade that would not
    # end by TOTAL seconds (default 580) is not started; each is cut at LIMIT (default 150).
    versions > "$OUT/summary.txt" 2>&1
    reference_ws
    kinds="sequential overlap"
    [ "${FIRST:-sequential}" = overlap ] && kinds="overlap sequential"
    for i in $(seq 1 "${PAIRS:-2}"); do
        for kind in $kinds; do
            if [ $(( $(elapsed) + ${LIMIT:-150} )) -gt "${TOTAL:-580}" ]; then
                echo "ab-$kind-$i: not started at $(elapsed)s" | tee -a "$OUT/summary.txt"
                continue
            fi
            flag=""
            [ "$kind" = overlap ] && flag=--overlap
            LIMIT=${LIMIT:-150} phased "ab-$kind-$i" "$ref" $flag | tee -a "$OUT/summary.txt"
        done
    done
    ;;
trust-close)
    # Issue 13 after calls 5-6: a whole grade and two timing phases of the reference-as-submission
    # (calibrated clock, bracketed drift, per-item gate census), then the timing corpus.
    versions > "$OUT/summary.txt" 2>&1
    grade_and_phases 330 2
    suite timing-corpus 190 -rA tests/test_timing_gpu.py | tee -a "$OUT/summary.txt"
    grep -E "(PASSED|FAILED|ERROR)" "$OUT/timing-corpus.log" | cut -c1-300 | tee -a "$OUT/summary.txt"
    echo "phase done at $(elapsed)s" | tee -a "$OUT/summary.txt"
    tar -czf "$OUT/trust.tgz" -C "$OUT" --exclude trust.tgz --exclude summary.txt . 2>/dev/null
    ;;
held-close)
    # Issue 13 on the held tree (first steps unheld, pages unlinked): one whole grade of the
    # reference-as-submission and five timing phases (the five grades' spread, the reference
    # inside its interval, a grade's wall time). 440 s cut the fifth phase on 2026-12-03.
    versions > "$OUT/summary.txt" 2>&1
    grade_and_phases 570 5
    ;;
held-corpus)
    # Issue 13 on the held tree: the timing corpus alone on the GPU (240 s ran 19 of 24 on
    # 2026-12-03), then the whole gate corpus 4 at a time (210 s ran 42 of 45).
    versions > "$OUT/summary.txt" 2>&1
    suite timing-corpus 300 -rA tests/test_timing_gpu.py | tee -a "$OUT/summary.txt"
    suite gate-corpus $(( 580 - $(elapsed) )) -rA -n 4 tests/test_grader_gpu.py \
        | tee -a "$OUT/summary.txt"
    grep -hE "(PASSED|FAILED|ERROR)" "$OUT"/*-corpus.log | cut -c1-300 | tee -a "$OUT/summary.txt"
    ;;
timing-corpus)
    # Issue 13 under the grade's defaults (spinning children, the process term): the whole
    # timing corpus and the host-wait test, nothing else (~13 s an entry on an H200).
    versions > "$OUT/summary.txt" 2>&1
    suite timing-corpus 560 -rA tests/test_timing_gpu.py | tee -a "$OUT/summary.txt"
    grep -hE "(PASSED|FAILED|ERROR)" "$OUT/timing-corpus.log" | cut -c1-300 \
        | tee -a "$OUT/summary.txt"
    ;;
held-ab)
    # Issue 13: the hold-page entries of the timing corpus, then one whole grade of the
    # reference sequential and one with the timing started beside the gate (--overlap): their
    # scores side by side and whether a grade fits in 150 s.
    versions > "$OUT/summary.txt" 2>&1
    reference_ws
    suite timing-corpus-hold 150 -rA tests/test_timing_gpu.py -k "hold_page or before_release" \
        | tee -a "$OUT/summary.txt"
    grep -hE "(PASSED|FAILED|ERROR|^E )" "$OUT/timing-corpus-hold.log" | cut -c1-400 \
        | tee -a "$OUT/summary.txt"
    LIMIT=200 phased ab-sequential "$ref" | tee -a "$OUT/summary.txt"
    LIMIT=$(( 575 - $(elapsed) )) phased ab-overlap "$ref" --overlap | tee -a "$OUT/summary.txt"
    ;;
tail)
    # Issue 13: does a spinning host take the tail (the host noticing the device idle, inside
    # every window) out of a step? One process, held and unheld steps, the default scheduling
    # against a spinning one (bench/timing/step_anatomy.py, ~60 s each).
    versions > "$OUT/summary.txt" 2>&1
    for sched in auto spin; do
        timeout 170 python3 bench/timing/step_anatomy.py --rounds 20 --sched "$sched" --out "$OUT" \
            > "$OUT/anatomy-$sched.log" 2>&1
        echo "step anatomy, sched $sched: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
        grep -E "^census\+guard" "$OUT/anatomy-$sched.log" | cut -c1-400 | tee -a "$OUT/summary.txt"
    done
    # Then one timing phase with both children spinning and one as the driver decides, in the
    # time left (~90 s each), their tails counted three ways.
    for wait in spin auto; do
        timeout $(( 560 - $(elapsed) )) python3 bench/timing/reproducibility.py --profile h200 \
            --runs 1 --host-wait "$wait" --out "$OUT" > "$OUT/repro-$wait.log" 2>&1
        echo "one timing phase, host wait $wait: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
        grep -E "^run " "$OUT/repro-$wait.log" | cut -c1-300 | tee -a "$OUT/summary.txt"
    done
    python3 bench/timing/tail_estimators.py "$OUT"/reproducibility-*.json | grep -E "^(## |\| (window|returned))" \
        | tee -a "$OUT/summary.txt"
    suite spin-test $(( 575 - $(elapsed) )) -rA tests/test_timing_gpu.py -k spin_when_asked \
        | tee -a "$OUT/summary.txt"
    ;;
timing-l4)
    versions > "$OUT/summary.txt" 2>&1
    timeout 200 python3 bench/timing/reproducibility.py --profile l4 --runs 1 --grade --out "$OUT" \
        > "$OUT/repro-l4.log" 2>&1
    echo "reproducibility l4 on this GPU: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    tail -n 25 "$OUT/repro-l4.log"
    ;;
tune)
    TOTAL=360 bash bench/device/device_h200.sh
    ;;
variance)
    versions > "$OUT/summary.txt" 2>&1
    # Fresh processes: is a plan without the per-example barrier (one program per example) steady
    # where the runtime plan is not? (2026-11-30: no, both move alike.)
    timeout 330 python3 bench/timing/process_variance.py --shapes float32:64x8192:d1,bfloat16:256x8192:d1 \
        --processes 6 --plan 'group1={"fwd_group": 1, "bwd_group": 1}' --out "$OUT" \
        > "$OUT/process-variance.log" 2>&1
    echo "process variance: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    # One process each: does moving the workspace across 2 MiB segments change the speed?
    for i in 1 2 3; do
        timeout 60 python3 bench/experiments/workspace_placement.py --shape float32:64x8192:d1 --variants 12 \
            --pad-bytes 1048064 --tag "h200-seg$i" --out "$OUT" | tail -n 1 | tee -a "$OUT/summary.txt"
    done
    # One process, several input sets timed interleaved in passes: do all sets move together
    # (a state of the device in time) or each on its own (placement)? NVML sampled alongside.
    for spec in "bfloat16:256x8192:d1 6 3" "float32:64x8192:d1 1 40"; do
        set -- $spec
        timeout 120 python3 bench/experiments/input_sets.py --shape "$1" --sets "$2" --passes "$3" \
            --rounds 12 --trace-ms 50 --tag "h200-$2x$3" --out "$OUT" | grep -v '^pass ' \
            | tee -a "$OUT/summary.txt"
    done
    grep -A 30 "^## " "$OUT/process-variance-h200.md"
    ;;
hosts)
    versions > "$OUT/summary.txt" 2>&1
    nproc >> "$OUT/summary.txt"
    naive_pools64
    # All four at once on one GPU: every grade has neighbours there.
    GRADER_TEST_POOL_THREADS=64 suite grader-gpu 490 -n 4 tests/test_grader_gpu.py \
        > "$OUT/s1.txt" &
    suite timing-gpu 490 tests/test_timing_gpu.py > "$OUT/s2.txt" &
    ( t0=$(date +%s)
      timeout 490 python3 -m grader grade "$naive" --profile h200 --config "$OUT/scoring-64.yaml" \
          --json "$OUT/naive-h200-pools64.json" > "$OUT/naive-h200-pools64.log" 2>&1
      echo "naive grade, h200 profile, 64-thread pools, with neighbours: rc=$? wall=$(( $(date +%s) - t0 ))s"
      head -n 3 "$OUT/naive-h200-pools64.log" ) > "$OUT/s3.txt" &
    ( timeout 330 python3 bench/budgets/calibrate_budgets.py --draws 5 --cases 'ramp-*' 'burst-*' \
          'outlier-*' '*-ramp' '*-burst' '*-outlier' --md "$OUT/calibration-h200-structured.md" \
          --json "$OUT/calibration-h200-structured.json" > "$OUT/calibration.log" 2>&1
      echo "calibration of the structured families: rc=$? at $(elapsed)s"
      suite reference-gpu-structured 150 -m gpu tests/test_reference_gpu.py \
          -k "ramp or burst or outlier" ) > "$OUT/s4.txt" &
    wait
    cat "$OUT"/s[1-4].txt | tee -a "$OUT/summary.txt"
    grep -E "^(FAILED|ERROR)" "$OUT"/grader-gpu.log "$OUT"/timing-gpu.log | tee -a "$OUT/summary.txt"
    rm -f "$OUT"/s[1-4].txt
    ;;
structured)
    versions > "$OUT/summary.txt" 2>&1
    # The structured families once more: calibration, the reference on them in every dtype, and
    # a whole naive grade with 64-thread pools beside both (its neighbours on the GPU).
    naive_pools64
    ( t0=$(date +%s)
      timeout 300 python3 -m grader grade "$naive" --profile h200 --config "$OUT/scoring-64.yaml" \
          --json "$OUT/naive-h200-pools64.json" > "$OUT/naive-h200-pools64.log" 2>&1
      echo "naive grade, h200 profile, 64-thread pools, with neighbours: rc=$? wall=$(( $(date +%s) - t0 ))s"
      grep -v "^gate \[" "$OUT/naive-h200-pools64.log" | head -n 4 ) > "$OUT/s1.txt" &
    ( timeout 200 python3 bench/budgets/calibrate_budgets.py --draws 5 --cases 'ramp-*' 'burst-*' \
          'outlier-*' '*-ramp' '*-burst' '*-outlier' --md "$OUT/calibration-h200-structured.md" \
          --json "$OUT/calibration-h200-structured.json" > "$OUT/calibration.log" 2>&1
      echo "calibration of the structured families: rc=$? at $(elapsed)s" ) > "$OUT/s2.txt" &
    suite reference-gpu-structured 200 -m gpu tests/test_reference_gpu.py \
        -k "ramp or burst or outlier" > "$OUT/s3.txt" &
    wait
    cat "$OUT"/s[1-3].txt | tee -a "$OUT/summary.txt"
    rm -f "$OUT"/s[1-3].txt
    grep -E "^\| (ramp|burst|outlier|c[0-9]+-l[0-9]+-[a-z0-9-]*(ramp|burst|outlier))" \
        "$OUT/calibration-h200-structured.md"
    ;;
coverage)
    versions > "$OUT/summary.txt" 2>&1
    timeout 570 python3 bench/timing/interval_coverage.py --profile h200 --runs 10 --tag h --out "$OUT" \
        > "$OUT/coverage.log" 2>&1
    echo "interval coverage, 10 timing phases: rc=$? at $(elapsed)s" | tee -a "$OUT/summary.txt"
    tail -n 45 "$OUT/coverage.log"
    ;;
*)
    echo "unknown phase $phase: reference, correctness, agent, timing, timing-l4, tune, variance, hosts, structured or coverage" >&2
    exit 2
    ;;
esac
echo "phase $phase done in $(elapsed)s" | tee -a "$OUT/summary.txt"
( cd "$OUT" && find . -type f ! -name summary.txt ! -name '*.tgz' -print0 \
    | tar czf "$phase.tgz" --null -T - --remove-files )
cat "$OUT/summary.txt"
