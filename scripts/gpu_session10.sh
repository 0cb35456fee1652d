# The tenth session's GPU checks (device tool, repository root); logs under $OUT.
# PART=explore: candidate configs and launch modes on the sweep's weakest shapes (benchmarks.configs, cuBLAS in
# the same run). Every other part says what it runs beside its `if`.
TJC=/tmp/tjc10 . scripts/gpu_common.sh  # PYTHONPATH, the cache, configs, gpu_suite, ncu_cycles
if [ "${PART:-explore}" = explore ]; then
  configs decode 1x4096x4096,16x11008x4096,1x4096x11008 \
    64x32x64w4s12,64x32x128w4s8,64x16x128w4s8,64x64x64w4s8,64x64x128w4s6,64x128x64w4s4 off,ws,split-k2,split-k4
  configs m128 128x11008x4096,128x4096x4096 \
    64x64x64w4s12,64x64x64w4s4,64x32x64w4s12,128x64x64w4s4,64x128x64w4s4,128x128x64w4s4 ws,split-k2,stream-k
  configs small 1024x1024x1024,512x512x512 \
    64x128x64w4s4,128x64x64w4s4,128x128x64w4s4,128x128x64w8s4,64x64x64w4s8,64x256x64w4s4,128x256x64w8s3 \
    off,ws,persistent,split-k2,stream-k
  configs k1024 8192x8192x1024 128x128x64w4s4,64x256x64w4s4,256x128x64w8s4,128x256x64w8s4,128x192x64w8s4 \
    persistent,pingpong
fi
if [ "${PART}" = clusters ]; then  # clusters of 2 (TMA multicast) where the L2 feeds small tiles; the K=1024 tiles
  configs clusters 1024x1024x1024,2048x2048x2048 \
    64x128x64w4s4,128x64x64w4s4,128x128x64w4s4,128x128x64w8s4,64x64x64w4s8 ws,ws-c2,persistent,persistent-c2
  configs k1024b 8192x8192x1024 128x256x64w8s4,128x192x64w8s4 persistent,ws
fi
if [ "${PART}" = ncu ]; then  # where the time goes: tilejit next to cuBLAS under ncu on the weak shapes (CASES)
  for case in ${CASES:-fp16:1024x1024x1024:64x128x64w4s4:ws fp16:128x11008x4096:128x128x64w4s4:ws fp16:1x4096x4096:64x64x128w4s6:sk2}; do
    name=$(echo $case | cut -d: -f2)
    timeout 150 $NCU -k regex:"tj_|nvjet|xmma|sm90|gemv|gemm" --section SpeedOfLight --section LaunchStats \
      --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
      --metrics dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,sm__cycles_active.avg,gpc__cycles_elapsed.max \
      python3 scripts/ncu_compare.py $case > $OUT/ncu_$name.log 2>&1
    echo "== ncu $case rc=$?"
    grep -E "^  [a-zA-Z_0-9]+.*\(|Duration|Elapsed Cycles|SM Frequency|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Grid Size|Block Size|Cluster Size|Registers Per|Dynamic Shared|Warp Cycles Per Issued|dram__bytes|lts__t_sectors|sm__cycles_active|Achieved Occupancy|Mem Busy|Max Bandwidth|L2 Hit" $OUT/ncu_$name.log | sed 's/  */ /g'
  done
fi
if [ "${PART}" = events ]; then  # event time against kernel duration, tilejit and cuBLAS (scripts/kernel_vs_event.py)
  timeout 200 python3 scripts/kernel_vs_event.py ${CASES} 2>&1 | tee $OUT/kernel_vs_event.log | grep -v Warning
fi
if [ "${PART}" = deep ]; then  # deeper rings where K is short or the operand stream is the limit
  configs deep_small 1024x1024x1024,512x512x512 64x128x64w4s8,128x64x64w4s8,64x128x64w4s4,64x64x64w4s12 ws,persistent
  configs deep_m128 128x11008x4096,128x4096x4096,128x4096x11008 \
    128x128x64w4s6,128x128x64w4s4,128x64x64w4s8,64x128x64w4s8,128x96x64w4s6 ws,persistent
  configs deep_decode 1x4096x4096,16x11008x4096 64x64x128w4s6,64x128x128w4s4,64x64x256w4s3,64x128x64w4s8 ws,split-k2,split-k4
fi
if [ "${PART}" = c2skinny ]; then  # clusters of 2 sharing B (multicast) for the M = 128 shapes' deep 64-row rings
  configs c2skinny 128x4096x4096,128x4096x11008,16x4096x4096 64x64x64w4s12,64x128x64w4s8,128x64x64w4s8 ws,ws-c2,persistent-c2
fi
if [ "${PART}" = sweep ]; then  # the full autotuned sweep (DTYPES, default fp16) against cuBLAS and Triton
  timeout ${T_SWEEP:-560} python3 -m benchmarks.matmul --dtypes ${DTYPES:-fp16} --out $OUT/sweep --no-append \
    --budget-s ${BUDGET:-520} > $OUT/sweep.log 2>&1
  echo "sweep rc=$?"; grep -E "^\||geomean|^# matmul" $OUT/sweep.log
fi
if [ "${PART}" = suite ]; then gpu_suite; fi
if [ "${PART}" = thin ]; then  # 16-row tiles (mma.sync on TMA rings, room for deep rings) on decode shapes; K=1024 pingpong rings
  configs thin 1x4096x4096,16x11008x4096,16x4096x11008,1x8192x28672 \
    16x128x64w4s11,16x64x64w4s12,16x256x64w4s6,16x128x128w4s6,16x64x128w4s8,64x64x64w4s8 off,split-k2,split-k4
  configs k1024pp 8192x8192x1024 128x128x64w4s6,64x256x64w4s5,128x128x64w4s4,64x256x64w4s4 pingpong
fi
if [ "${PART}" = final10 ]; then  # the new tiles' GPU tests, then the fp16 sweep
  (cd tests && timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 14 gpu/test_gpu_thin_tiles.py \
    gpu/test_gpu_warp_specialize.py gpu/test_gpu_split_k.py > $OUT/tests10.log 2>&1)
  echo "tests rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests10.log | head; tail -1 $OUT/tests10.log
  PART=sweep bash scripts/gpu_session10.sh | grep -v "^NVIDIA"
fi
if [ "${PART}" = last ]; then  # 192-column tiles for 128 x 11008 (116 programs, as cuBLAS's 96-column tile); 512^3 candidates
  configs n192 128x11008x4096,128x28672x8192 64x192x64w4s6,128x128x64w4s6,64x192x64w4s4 ws,persistent
  configs s512 512x512x512 64x64x64w4s8,64x32x64w4s8,64x64x128w4s4,64x64x64w4s4 ws,persistent
fi
if [ "${PART}" = n192 ]; then  # the 64x192 persistent tile: the deep-ring GPU tests, then the M = 128 shapes tuned
  (cd tests && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 14 gpu/test_gpu_warp_specialize.py \
    gpu/test_gpu_thin_tiles.py > $OUT/tests_n192.log 2>&1)
  echo "tests rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests_n192.log | head; tail -1 $OUT/tests_n192.log
  timeout 200 python3 -m benchmarks.matmul --dtypes fp16 --out $OUT/m128 --no-append --budget-s 180 \
    --shapes 128x4096x4096,128x11008x4096,128x4096x11008,128x8192x8192,128x28672x8192,128x8192x28672 > $OUT/m128.log 2>&1
  echo "sweep rc=$?"; grep -E "^\|" $OUT/m128.log
fi
if [ "${PART}" = prune ]; then  # the prune's shared-memory query on the GPU: autotune and runtime tests, two tuned shapes
  python3 -c "import torch; from tilejit.configs import shared_memory_per_block as s; print('smem per block', s(torch.empty(1, device='cuda')))"
  (cd tests && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 14 gpu/test_autotune_gpu.py \
    gpu/test_runtime_gpu.py gpu/test_gpu_split_k.py > $OUT/tests_prune.log 2>&1)
  echo "tests rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests_prune.log | head; tail -1 $OUT/tests_prune.log
  timeout 120 python3 -m benchmarks.matmul --dtypes fp16 --out $OUT/prune --no-append --budget-s 100 \
    --shapes 1x4096x4096,1024x1024x1024 > $OUT/prune.log 2>&1
  echo "bench rc=$?"; grep -E "^\| [0-9]" $OUT/prune.log
fi
