# The eleventh session's GPU checks (device tool, repository root); logs under $OUT.
# PART=first: the whole GPU suite (the epilogue and prefetch changes touch every TMA kernel), then the persistent
# tiles' cycles under ncu (locked clock: comparable across runs) and at the free clock next to cuBLAS and Triton.
# Every other part says what it runs beside its `if`.
TJC=/tmp/tjc11 . scripts/gpu_common.sh  # PYTHONPATH, the cache, configs, gpu_suite, ncu_cycles
if [ "${PART:-first}" = first ]; then
  gpu_suite
  ncu_cycles p4096 fp16:4096x4096x4096:256x128x64w8s4:persistent fp16:4096x4096x4096:256x128x64w8s3:persistent \
    fp16:4096x4096x4096:128x256x64w8s4:persistent fp16:4096x4096x4096:128x256x64w8s3:persistent
  ncu_cycles k1024 fp16:8192x8192x1024:256x128x64w8s4:persistent fp16:8192x8192x1024:256x128x64w8s3:persistent \
    fp16:8192x8192x1024:128x128x64w4s4:pingpong
  configs big 4096x4096x4096,8192x8192x1024,8192x8192x8192 128x256x64w8s4,128x256x64w8s3,256x128x64w8s4,256x128x64w8s3 \
    persistent,ws
fi
if [ "${PART}" = boxes ]; then  # slab boxes through two buffers (256x128 on a full ring): suite, cycles, free clock
  gpu_suite
  ncu_cycles boxes fp16:4096x4096x4096:256x128x64w8s4:persistent fp16:8192x8192x1024:256x128x64w8s4:persistent \
    fp16:8192x8192x1024:128x256x64w8s4:persistent fp16:8192x8192x1024:128x128x64w4s4:pingpong
  configs big2 4096x4096x4096,8192x8192x1024,8192x8192x8192 128x256x64w8s4,256x128x64w8s4 persistent,ws
  configs pp2 8192x8192x1024,4096x11008x4096 128x128x64w4s4,64x256x64w4s4 pingpong
fi
if [ "${PART}" = final11 ]; then  # the new small-square tile's GPU checks and figures, then the fp16 sweep
  (cd tests && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 14 gpu/test_gpu_warp_specialize.py \
    gpu/test_gpu_kernels.py gpu/test_autotune_gpu.py > $OUT/tests11.log 2>&1)
  echo "tests rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests11.log | head; tail -1 $OUT/tests11.log
  configs small11 512x512x512,1024x1024x1024 64x64x128w4s4,64x64x64w4s8 ws
  PART=sweep bash scripts/gpu_session11.sh | grep -v "^NVIDIA"
fi
if [ "${PART}" = sweep ]; then  # the full autotuned sweep (DTYPES, default fp16) against cuBLAS and Triton
  timeout ${T_SWEEP:-560} python3 -m benchmarks.matmul --dtypes ${DTYPES:-fp16} --out $OUT/sweep --no-append \
    --budget-s ${BUDGET:-520} > $OUT/sweep.log 2>&1
  echo "sweep rc=$?"; grep -E "^\||geomean|^# matmul" $OUT/sweep.log
fi
if [ "${PART}" = bf16 ]; then  # the ragged shape's usual config alone (its sweep figure swings), then the bf16 sweep
  configs ragged11 1000x3000x777 64x256x32w8s3,128x128x64w4s4 off,ws
  DTYPES=bf16 PART=sweep bash scripts/gpu_session11.sh | grep -v "^NVIDIA"
fi
# PART=ab needs ab/nopf/tilejit and ab/head/tilejit beside the tree (made for that call, not kept: the tree with the
# emitter's prefetch.tensormap lines removed, and `git archive 9190700 tilejit`); the prefetch has since left the tree.
if [ "${PART}" = ab ]; then  # the ragged shape: this tree, this tree without the tensor-map prefetch, the last commit
  root=$PWD
  for v in tree nopf head tree; do  # each from a directory whose tilejit is that version (python -m puts it first)
    d=/tmp/ab_$v; mkdir -p $d; ln -sfn $root/benchmarks $d/benchmarks
    if [ $v = tree ]; then ln -sfn $root/tilejit $d/tilejit; else ln -sfn $root/ab/$v/tilejit $d/tilejit; fi
    (cd $d && PYTHONPATH=$d TILEJIT_CACHE_DIR=/tmp/tjc_$v timeout 200 python3 -m benchmarks.configs --no-tuned \
      --shapes 1000x3000x777,512x512x512 --configs 64x256x32w8s3,64x64x128w4s4 --modes off,ws --out $OUT/ab_$v \
      > $OUT/ab_$v.log 2>&1; echo "== $v rc=$?"; grep "^| [0-9]" $OUT/ab_$v.log)
  done
fi
if [ "${PART}" = last ]; then  # the final tree: the whole GPU suite, then the cooperative tiles' cycles once more
  gpu_suite
  ncu_cycles last fp16:4096x4096x4096:256x128x64w8s4:persistent fp16:8192x8192x1024:256x128x64w8s4:persistent \
    fp16:8192x8192x1024:128x256x64w8s4:persistent
fi
if [ "${PART}" = sanitize ]; then  # the changed epilogue's synchronization under compute-sanitizer: slab boxes, pingpong
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in racecheck memcheck; do
    (cd tests && timeout 110 $CS --tool $tool --report-api-errors no --error-exitcode 3 python3 -m pytest -q \
      -p no:cacheprovider gpu/test_gpu_kernels.py -k "persistent_big_tiles and 256x128" \
      > $OUT/sanitize_$tool.log 2>&1)
    echo "== $tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" $OUT/sanitize_$tool.log | tail -3
  done
fi
