# The stream-K check (device tool, repository root): its GPU tests (plus EXTRA_TESTS), then configs with and
# without stream_k next to cuBLAS (and Triton in the sweep). Logs under $OUT.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TILEJIT_CACHE_DIR=/tmp/tjc1
python3 -m compileall -q tilejit benchmarks >/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
cd tests
timeout ${T_TESTS:-300} python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 -x gpu/test_gpu_stream_k.py ${EXTRA_TESTS} > $OUT/tests.log 2>&1; echo "tests rc=$?"; tail -15 $OUT/tests.log
cd ..
DEFAULT_BENCH="fp16:4096x4096x4096,8192x8192x8192,4096x11008x4096,128x4096x4096:128x256x64w8s4,256x128x64w8s4:persistent,stream-k tf32nt:4096x4096x4096:128x256x32w8s4:persistent,stream-k"
for spec in ${BENCH:-$DEFAULT_BENCH}; do
  IFS=: read dtype shapes configs modes <<< "$spec"
  timeout ${T_BENCH:-200} python3 -m benchmarks.configs --no-tuned --dtype $dtype --shapes $shapes --configs $configs --modes $modes --out $OUT/$dtype > $OUT/bench_$dtype.log 2>&1; echo "$dtype rc=$?"; grep "^|" $OUT/bench_$dtype.log | head -40
done
