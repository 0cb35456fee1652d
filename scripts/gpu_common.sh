# What the per-session GPU scripts share (sourced from the repository root, on the device tool's machine): the
# environment (the tree on PYTHONPATH, a kernel cache in ${TJC:-/tmp/tjc}), the GPU's name, and three helpers
# writing their logs under $OUT.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TILEJIT_CACHE_DIR=${TJC:-/tmp/tjc}
python3 -m compileall -q tilejit benchmarks >/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
NCU=/usr/local/cuda/bin/ncu
configs() {  # name shapes configs modes: one benchmarks.configs run, its table
  timeout ${T_CONFIGS:-240} python3 -m benchmarks.configs --no-tuned --dtype ${DTYPE:-fp16} --shapes $2 --configs $3 \
    --modes $4 --out $OUT/$1 > $OUT/$1.log 2>&1
  echo "== $1 rc=$?"; grep "^| [0-9]" $OUT/$1.log
}
gpu_suite() {  # the whole GPU suite, its failures and count
  (cd tests && timeout ${T_TESTS:-420} python3 -m pytest -q -m gpu -p no:cacheprovider -n 14 gpu > $OUT/gpu_suite.log 2>&1)
  echo "gpu suite rc=$?"; grep -E "^FAILED|^ERROR" $OUT/gpu_suite.log | head -20; tail -1 $OUT/gpu_suite.log
}
ncu_cycles() {  # name cases...: elapsed cycles and tensor-pipe share of each kernel (tilejit's, then cuBLAS's)
  name=$1; shift
  timeout ${T_NCU:-240} $NCU -k regex:"tj_|nvjet|xmma|sm90" --section SpeedOfLight \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__cycles_active.avg \
    python3 scripts/ncu_compare.py "$@" > $OUT/ncu_$name.log 2>&1
  echo "== ncu $name rc=$?"
  grep -E "^  [a-zA-Z_0-9]+.*\(|Elapsed Cycles|hmma_cycles|sm__cycles_active" $OUT/ncu_$name.log | sed 's/  */ /g'
}
