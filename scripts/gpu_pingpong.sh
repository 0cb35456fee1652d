# The pingpong check of the sixth session (device tool, repository root): its GPU tests, then the fp16 / tf32
# configs compared with the persistent form of the same tiles. Logs under $OUT.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TILEJIT_CACHE_DIR=/tmp/tjc1
python3 -m compileall -q tilejit benchmarks >/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 280 python3 -m benchmarks.configs --no-tuned --dtype fp16 --shapes 8192x8192x1024,4096x4096x1024,4096x4096x4096 --configs 128x128x64w4s4,64x256x64w4s4,256x128x64w8s4 --modes persistent,pingpong --out $OUT/fp16 > $OUT/fp16.log 2>&1; echo "fp16 rc=$?"; grep "^|" $OUT/fp16.log; cat $OUT/fp16.log | head -20
