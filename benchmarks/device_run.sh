#!/usr/bin/env bash
# The first thing to run on a GPU machine: the GPU tests, memcheck on a
# subset, launch/compile costs and matmul TFLOP/s against cuBLAS and Triton, then a short summary. For one part
# alone (the full sweep, configs side by side, ncu cycles, attention, sanitizers) see scripts/gpu_check.sh.
#
#   OUT=/some/dir bash benchmarks/device_run.sh          # ~5-9 minutes: tests, launch costs, matmul --quick
#   OUT=/some/dir FULL=1 bash benchmarks/device_run.sh   # the full matmul sweep only (tests and launch off)
#
# Files written to $OUT (8, flat): gpu_tests.log, memcheck.log, launch.log, matmul.log, launch.json, matmul.json,
# matmul.png (with matplotlib), runs.md (benchmarks/history/runs.md with the new tables appended; copy the figures
# that supersede a table of benchmarks/RESULTS.md there by hand).
# Limits per step (seconds) can be changed: T_TESTS, T_LAUNCH, T_MATMUL; RUN_TESTS=0 / RUN_LAUNCH=0 / RUN_MATMUL=0
# skip a step.
# Nothing here needs a package index; Triton is optional (its columns read n/a without it).
set -u -o pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/benchmarks/out}"
mkdir -p "$OUT"
# A fresh kernel cache outside $OUT: cold-compile numbers are cold, and nothing stale is reused.
export TILEJIT_CACHE_DIR="${TILEJIT_CACHE_DIR:-$(mktemp -d)/tilejit-cache}"

FULL="${FULL:-0}"
if [ "$FULL" = 1 ]; then default_on=0; else default_on=1; fi
RUN_TESTS="${RUN_TESTS:-$default_on}"
RUN_LAUNCH="${RUN_LAUNCH:-$default_on}"
T_TESTS="${T_TESTS:-330}"
T_LAUNCH="${T_LAUNCH:-110}"
if [ "$FULL" = 1 ]; then T_MATMUL="${T_MATMUL:-560}"; else T_MATMUL="${T_MATMUL:-240}"; fi
# Stop starting new shapes well before the hard limit, so the report is written.
BUDGET=$((T_MATMUL - 60))

steps=()
failed=0
step() {  # step NAME LIMIT COMMAND...: run with a time limit, output tee'd to $OUT/NAME.log
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    echo "=== $name (limit ${limit}s): $*"
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    rc=$?
    [ "$rc" = 124 ] && echo "=== $name: TIMED OUT after ${limit}s"
    steps+=("$name: rc=$rc in $((SECONDS - start))s")
    [ "$rc" = 0 ] || failed=1
}

# Bytecode for the package, as `pip install` writes it: first launches in fresh processes then time tilejit, not
# Python compiling tilejit's lazily imported modules (images often set PYTHONDONTWRITEBYTECODE).
python3 -m compileall -q tilejit benchmarks >/dev/null || echo "compileall failed (timings include bytecode compiles)"

echo "=== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available())"
python3 -c "import triton; print('triton', triton.__version__)" 2>/dev/null || echo "triton: not importable"

if [ "$RUN_TESTS" = 1 ]; then
    step gpu_tests "$T_TESTS" python3 -m pytest -q -m gpu tests/ -p no:cacheprovider
fi
RUN_SANITIZER="${RUN_SANITIZER:-$RUN_TESTS}"
if [ "$RUN_SANITIZER" = 1 ] && command -v compute-sanitizer >/dev/null; then
    # memcheck on a representative subset: both gemm lowerings, ragged and strided windows, reductions.
    step memcheck "${T_SANITIZER:-150}" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
        python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_attention.py \
        -k "nt_tn or softmax or atom or batched or non_contiguous or (wgmma_tiles and 128-128-64-4 and bfloat16) or (wgmma_stages and 3) or variable or finite"
fi
if [ "$RUN_LAUNCH" = 1 ]; then
    step launch "$T_LAUNCH" python3 -m benchmarks.launch --out "$OUT"
fi
if [ "${RUN_MATMUL:-1}" != 1 ]; then
    :
elif [ "$FULL" = 1 ]; then
    step matmul "$T_MATMUL" python3 -m benchmarks.matmul --budget-s "$BUDGET" --out "$OUT"
else
    step matmul "$T_MATMUL" python3 -m benchmarks.matmul --quick --budget-s "$BUDGET" --out "$OUT"
fi
cp benchmarks/history/runs.md "$OUT/runs.md" 2>/dev/null || echo "no benchmarks/history/runs.md was written"

echo
echo "=== summary"
printf '%s\n' "${steps[@]}"
[ -f "$OUT/gpu_tests.log" ] && echo "gpu tests: $(grep -E '[0-9]+ (passed|failed|skipped|error|deselected)' "$OUT/gpu_tests.log" | tail -n 1)"
python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])

def cell(r):
    return f"{r['tflops']:.0f}" if r.get("status") == "ok" else r.get("status", "?")

if (out / "launch.json").exists():
    data = json.loads((out / "launch.json").read_text())
    print("launch us:", ", ".join(f"{k} {v['us_per_launch']:.1f}" for k, v in data["launch"].items() if v))
    first, imports = data.get("first_launch"), data.get("imports")
    if first:
        print(f"cold compile+launch {first['cold_ms']:.0f} ms, disk hit {first['disk_hit_ms']:.1f} ms", end="")
    if imports:
        print(f", import tilejit {imports['tilejit_ms']:.0f} ms", end="")
    print()
if (out / "matmul.json").exists():
    data = json.loads((out / "matmul.json").read_text())
    print(f"matmul TFLOP/s on {data['meta']['gpu']} (complete={data.get('complete')}): shape dtype tilejit cuBLAS Triton config")
    for r in data["rows"]:
        t = r["tilejit"]
        print(f"  {r['m']}x{r['n']}x{r['k']} {r['dtype']} {cell(t)} {cell(r['cublas'])} {cell(r['triton'])} "
              f"{t.get('config', '')}")
EOF
exit $failed
