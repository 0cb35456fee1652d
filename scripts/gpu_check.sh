#!/usr/bin/env bash
# GPU measurements and checks beyond benchmarks/device_run.sh, one named part at a time. Run it from the repository
# root on a machine with an NVIDIA GPU: after a change to generated code (PART=suite, then sanitize on the kernels it
# touches), to refresh a table of benchmarks/RESULTS.md (sweep, attention, launch, ncu), or to compare configs and
# launch options side by side before changing tilejit/configs.py (configs, ncu).
#
#   PART=suite,sweep OUT=/tmp/out bash scripts/gpu_check.sh
#
# Parts (PART is a comma-separated list, run in order; each writes its logs under $OUT and prints a summary):
#   suite     the GPU tests: TESTS (paths under tests/, default gpu) over WORKERS pytest-xdist processes (default 14)
#   sweep     autotuned matmul against cuBLAS and Triton: DTYPES (default fp16), SHAPES (default the full sweep)
#   configs   fixed configs side by side, cuBLAS in the same run (benchmarks.configs --no-tuned): DTYPE, SHAPES,
#             CONFIGS (e.g. 128x256x64w8s4,256x128x64w8s4), MODES (e.g. off,ws,persistent,pingpong,stream-k)
#   ncu       elapsed cycles and tensor-pipe share under ncu's locked clock, tilejit next to cuBLAS on the same
#             problem (scripts/probes/ncu_compare.py): CASES, e.g. fp16:4096x4096x4096:256x128x64w8s4:persistent
#   attention attention against SDPA (flash, cuDNN) and Triton: PASSES (fwd), DIMS (64,128), SEQS (1024,4096), DTYPES
#   sm80      the sm_80 path (cp.async ring, ldmatrix, mma.sync) on this GPU: the register-only mma.sync ceiling,
#             then the path autotuned next to the native kernel and cuBLAS (DTYPES, default bf16)
#   launch    host costs: launch overhead, cold compile, disk-cache hit, import (benchmarks.launch)
#   sanitize  compute-sanitizer memcheck and racecheck over TESTS (paths under tests/), filtered by K (pytest -k);
#             the default: the persistent 256x128 tiles of tests/gpu/test_gpu_kernels.py (TMA store boxes)
#
# Environment: OUT (default /tmp/tilejit-gpu-check), TILEJIT_CACHE_DIR (default /tmp/tilejit-gpu-check-cache: kept
# between calls so a later part reuses the kernels an earlier one compiled; point it at an empty folder for cold
# numbers), T (time limit of each step in seconds, default 540), NCU (the ncu binary), SANITIZER
# (compute-sanitizer).
set -u -o pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TILEJIT_CACHE_DIR="${TILEJIT_CACHE_DIR:-/tmp/tilejit-gpu-check-cache}"
OUT="${OUT:-/tmp/tilejit-gpu-check}"
T="${T:-540}"
NCU="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"
SANITIZER="${SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}"
mkdir -p "$OUT"
# Bytecode first, as `pip install` writes it: fresh processes then time tilejit, not Python compiling it.
python3 -m compileall -q tilejit benchmarks >/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader || echo "no nvidia-smi"

tables() { grep -E "^\||geomean" "$1"; }  # the Markdown rows and geomeans of a benchmark's log

part_suite() {
    (cd tests && timeout "$T" python3 -m pytest -q -m gpu -p no:cacheprovider -n "${WORKERS:-14}" ${TESTS:-gpu}) \
        > "$OUT/gpu_suite.log" 2>&1
    local rc=$?
    echo "suite rc=$rc"; grep -E "^FAILED|^ERROR" "$OUT/gpu_suite.log" | head -20; tail -1 "$OUT/gpu_suite.log"
    return $rc
}

part_sweep() {
    timeout "$T" python3 -m benchmarks.matmul --dtypes "${DTYPES:-fp16}" ${SHAPES:+--shapes "$SHAPES"} \
        --out "$OUT/sweep" --no-append --budget-s $((T - 40)) > "$OUT/sweep.log" 2>&1
    local rc=$?
    echo "sweep rc=$rc"; tables "$OUT/sweep.log"
    return $rc
}

part_configs() {
    timeout "$T" python3 -m benchmarks.configs --no-tuned --dtype "${DTYPE:-fp16}" ${SHAPES:+--shapes "$SHAPES"} \
        ${CONFIGS:+--configs "$CONFIGS"} --modes "${MODES:-off,ws}" --out "$OUT/configs" > "$OUT/configs.log" 2>&1
    local rc=$?
    echo "configs rc=$rc"; tables "$OUT/configs.log"
    return $rc
}

part_ncu() {
    local cases="${CASES:-fp16:4096x4096x4096:256x128x64w8s4:persistent fp16:8192x8192x1024:256x128x64w8s4:persistent}"
    # shellcheck disable=SC2086  # CASES is a list
    timeout "$T" "$NCU" -k regex:"tj_|nvjet|xmma|sm90" --section SpeedOfLight \
        --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__cycles_active.avg \
        python3 scripts/probes/ncu_compare.py $cases > "$OUT/ncu_cycles.log" 2>&1
    local rc=$?
    echo "ncu rc=$rc"
    grep -E "^  [a-zA-Z_0-9]+.*\(|Elapsed Cycles|hmma_cycles|sm__cycles_active" "$OUT/ncu_cycles.log" | sed 's/  */ /g'
    return $rc
}

part_attention() {
    timeout "$T" python3 -m benchmarks.attention --passes "${PASSES:-fwd}" --dims "${DIMS:-64,128}" \
        --seqs "${SEQS:-1024,4096}" --dtypes "${DTYPES:-bf16}" --out "$OUT/attention" > "$OUT/attention.log" 2>&1
    local rc=$?
    echo "attention rc=$rc"; tables "$OUT/attention.log"
    return $rc
}

part_sm80() {
    timeout 120 python3 scripts/probes/mma_ceiling.py 2>&1 | tee "$OUT/mma_ceiling.log"
    timeout "$T" python3 -m benchmarks.matmul --sm80-path --dtypes "${DTYPES:-bf16}" \
        --shapes "${SHAPES:-4096x4096x4096,8192x8192x8192}" --out "$OUT/sm80" --no-append --budget-s $((T - 40)) \
        > "$OUT/sm80.log" 2>&1
    local rc=$?
    echo "sm80 rc=$rc"; tables "$OUT/sm80.log"
    return $rc
}

part_launch() {
    timeout "$T" python3 -m benchmarks.launch --out "$OUT/launch" --no-append > "$OUT/launch.log" 2>&1
    local rc=$?
    echo "launch rc=$rc"; tables "$OUT/launch.log"
    return $rc
}

part_sanitize() {
    local tool rc=0
    for tool in memcheck racecheck; do
        # shellcheck disable=SC2086  # TESTS is a list
        (cd tests && timeout "$T" "$SANITIZER" --tool $tool --report-api-errors no --error-exitcode 3 \
            python3 -m pytest -q -p no:cacheprovider ${TESTS:-gpu/test_gpu_kernels.py} \
            -k "${K:-persistent_big_tiles and 256x128}") > "$OUT/$tool.log" 2>&1 || rc=$?
        echo "$tool done (rc so far $rc)"
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/$tool.log" | tail -3
    done
    return $rc
}

status=0
IFS=, read -r -a parts <<< "${PART:?set PART to one or more of suite,sweep,configs,ncu,attention,sm80,launch,sanitize}"
for part in "${parts[@]}"; do
    echo "=== $part"
    if declare -F "part_$part" >/dev/null; then "part_$part" || status=1
    else echo "unknown part '$part'"; status=2
    fi
done
exit $status
