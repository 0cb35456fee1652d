#!/usr/bin/env bash
# One GPU check for a working session (run by the device tool from the repository root):
#   GPU tests given in $TESTS (default: all of tests/gpu), then the matmul benchmark on $SHAPES / $DTYPES, then a
#   short table. Logs and JSON under $OUT.
set -u -o pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TILEJIT_CACHE_DIR="${TILEJIT_CACHE_DIR:-$(mktemp -d)/tilejit-cache}"
OUT="${OUT:-$PWD/benchmarks/out}"
mkdir -p "$OUT"
python3 -m compileall -q tilejit benchmarks >/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${RUN_TESTS:-1}" = 1 ]; then
    timeout -k 5 "${T_TESTS:-300}" python3 -m pytest -q -m gpu -p no:cacheprovider -rf ${TESTS:-tests/gpu} \
        > "$OUT/gpu_tests.log" 2>&1
    echo "gpu tests rc=$?"; tail -25 "$OUT/gpu_tests.log"
fi
if [ -n "${SHAPES:-}" ]; then
    timeout -k 5 "${T_BENCH:-240}" python3 -m benchmarks.matmul --dtypes "${DTYPES:-fp16}" --shapes "$SHAPES" \
        --out "$OUT" --no-append --budget-s "$(( ${T_BENCH:-240} - 40 ))" > "$OUT/matmul.log" 2>&1
    echo "matmul rc=$?"; grep -E "^\|" "$OUT/matmul.log" | tail -30
fi
if [ -n "${EXTRA:-}" ]; then
    timeout -k 5 "${T_EXTRA:-200}" bash -c "$EXTRA" > "$OUT/extra.log" 2>&1
    echo "extra rc=$?"; tail -40 "$OUT/extra.log"
fi
