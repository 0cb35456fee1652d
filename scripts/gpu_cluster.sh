# The cluster (TMA multicast) check of the seventh session (device tool, repository root): its GPU tests, the
# warp-specialize / pingpong / attention-ws modules it touches, then fp16 / tf32 configs with and without
# cluster=2 next to cuBLAS. Logs under $OUT.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TILEJIT_CACHE_DIR=/tmp/tjc1
python3 -m compileall -q tilejit benchmarks >/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
cd tests
timeout ${T_TESTS:-240} python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 -x gpu/test_gpu_cluster.py ${EXTRA_TESTS} > $OUT/tests.log 2>&1; echo "tests rc=$?"; tail -15 $OUT/tests.log
cd ..
for spec in ${BENCH:-"fp16:8192x8192x1024,4096x4096x4096,8192x8192x8192:128x256x64w8s4,256x128x64w8s4:persistent,persistent-c2,ws,ws-c2"}; do
  IFS=: read dtype shapes configs modes <<< "$spec"
  timeout ${T_BENCH:-200} python3 -m benchmarks.configs --no-tuned --dtype $dtype --shapes $shapes --configs $configs --modes $modes --out $OUT/$dtype > $OUT/bench_$dtype.log 2>&1; echo "$dtype rc=$?"; grep "^|" $OUT/bench_$dtype.log | head -40
done
# each launch's cluster size as the profiler sees it (Python launcher first, then the compiled one; odd grid last)
if [ -n "$NCU" ]; then
  timeout 120 /usr/local/cuda/bin/ncu --section LaunchStats python3 scripts/cluster_launch_check.py > $OUT/ncu_launch.log 2>&1; echo "ncu rc=$?"
  grep -E "M=|Cluster Size|Grid Size  " $OUT/ncu_launch.log
fi
