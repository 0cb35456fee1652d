# The eighth session's GPU check (device tool, repository root). PART=tests: the GPU tests of what changed
# (stream-K, and the modules its code paths touch); PART=sweep: the autotuned fp16 sweep, then tf32/fp8/int8 at
# 4096^3 and 8192^3, each implementation timed in rotating rounds. Logs under $OUT.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TILEJIT_CACHE_DIR=/tmp/tjc8
python3 -m compileall -q tilejit benchmarks >/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
if [ "${PART:-tests}" = tests ]; then
  cd tests
  timeout ${T_TESTS:-540} python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 gpu/test_gpu_stream_k.py \
    gpu/test_gpu_split_k.py gpu/test_gpu_warp_specialize.py gpu/test_gpu_pingpong.py gpu/test_autotune_gpu.py \
    gpu/test_runtime_gpu.py gpu/test_driver_gpu.py gpu/test_gpu_kernels.py ${EXTRA_TESTS} > $OUT/tests.log 2>&1
  echo "tests rc=$?"; tail -8 $OUT/tests.log
  cd ..
  python3 - <<'PY'
import glob, json
from tilejit import private_io
root = private_io.cache_root()
metas = glob.glob(f"{root}/**/meta.json", recursive=True)
print("cache", root, len(metas), "entries")
for p in metas:
    m = json.load(open(p))
    if m.get("spills") is None:
        print("no spill count:", m.get("signature"), m.get("registers"), m.get("groups"), m.get("compile_seconds"))
PY
else
  timeout 420 python3 -m benchmarks.matmul --dtypes fp16 --out $OUT/sweep --no-append --budget-s 300 > $OUT/sweep.log 2>&1
  echo "sweep rc=$?"; grep "^|" $OUT/sweep.log
  timeout 170 python3 -m benchmarks.matmul --dtypes tf32,fp8,int8 --shapes 4096x4096x4096,8192x8192x8192 \
    --out $OUT/lowp --no-append --budget-s 150 > $OUT/lowp.log 2>&1
  echo "lowp rc=$?"; grep "^|" $OUT/lowp.log
fi
