#!/usr/bin/env bash
# Run several GPU jobs at once, one per GPU of this machine, each under its own time limit, and print a summary:
# for a multi-GPU machine used as several single-GPU ones (tests and benchmarks that need one GPU each).
#
#   OUT=/tmp/out T=420 bash scripts/gpu_parallel.sh "name1::command 1" "name2::command 2" ...
#
# Job i runs with CUDA_VISIBLE_DEVICES set to GPU i mod (the GPUs nvidia-smi lists), its output in $OUT/<name>.log,
# killed after T seconds (default 420). Wheels under .carry/wheels (e.g. pytest-timeout, liger-kernel) are
# installed into a private target first, where pip works offline. Each job's last lines and exit status come last.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/tilejit-gpu-parallel}"
T="${T:-420}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if compgen -G ".carry/wheels/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tilejit-site \
        .carry/wheels/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/tilejit-site"
fi
gpus=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
i=0
pids=()
names=()
for job in "$@"; do
    name="${job%%::*}"
    cmd="${job#*::}"
    (CUDA_VISIBLE_DEVICES=$((i % gpus)) TILEJIT_CACHE_DIR="/tmp/tilejit-cache-$name" timeout "$T" bash -c "$cmd" \
        > "$OUT/$name.log" 2>&1; echo $? > "$OUT/$name.rc") &
    pids+=($!)
    names+=("$name")
    i=$((i + 1))
done
wait "${pids[@]}"
for name in "${names[@]}"; do
    echo "=== $name rc=$(cat "$OUT/$name.rc")"
    grep -E "FAILED|ERROR|Timeout|crashed" "$OUT/$name.log" | grep -v "^E " | head -"${FAILS:-25}"
    tail -n "${TAIL:-6}" "$OUT/$name.log"
done
