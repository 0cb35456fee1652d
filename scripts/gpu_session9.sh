# The ninth session's GPU checks (device tool, repository root); logs under $OUT.
# PART=probe80: the sm_80 path (issue 15) pinned on this GPU: TFLOP/s per config in plain and warp-specialized
# mode next to cuBLAS, then ncu of two configs (CONFIGS80 / NCU80 override the lists). Every other part says what
# it runs beside its `if`.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TILEJIT_CACHE_DIR=/tmp/tjc9
python3 -m compileall -q tilejit benchmarks >/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
NCU=/usr/local/cuda/bin/ncu
gpu_suite() {  # the whole GPU suite, its failures and count
  (cd tests && timeout ${T_TESTS:-420} python3 -m pytest -q -m gpu -p no:cacheprovider -n 14 gpu > $OUT/gpu_suite.log 2>&1)
  echo "gpu suite rc=$?"; grep -E "^FAILED|^ERROR" $OUT/gpu_suite.log | head -20; tail -1 $OUT/gpu_suite.log
}
sm80_matmul() {  # the sm_80 path tuned next to the native kernel and cuBLAS (dtypes: $1)
  timeout 300 python3 -m benchmarks.matmul --sm80-path --dtypes $1 --shapes 4096x4096x4096,8192x8192x8192 \
    --out $OUT/sm80_matmul --no-append --budget-s 240 > $OUT/sm80_matmul.log 2>&1
  echo "sm80 matmul rc=$?"; grep "^|" $OUT/sm80_matmul.log
}
if [ "${PART:-probe80}" = probe80 ]; then
  export TILEJIT_GEMM_LOWERING=mma_sync_m16n8k16
  timeout ${T_CONFIGS:-300} python3 -m benchmarks.configs --no-tuned --dtype bf16 \
    --shapes ${SHAPES80:-4096x4096x4096,8192x8192x8192} \
    --configs ${CONFIGS80:-128x128x64w4s3,128x128x64w4s4,128x256x64w8s3,256x128x64w8s3,128x256x32w8s4,256x128x32w8s4,128x128x32w4s4} \
    --modes ${MODES80:-off,ws} --out $OUT/configs80 > $OUT/configs80.log 2>&1
  echo "configs rc=$?"; grep "^|" $OUT/configs80.log
  for spec in ${NCU80:-gemm:128x128x64w4s3:bf16 gemm:128x256x64w8s3:bf16}; do
    name=$(echo $spec | tr ':' '_')
    timeout 150 $NCU --launch-skip 2 --launch-count 1 -k regex:tj_ --section SpeedOfLight \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
      --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
      --section InstructionStats --section SourceCounters \
      python3 scripts/profile_kernels.py $spec > $OUT/ncu_$name.log 2>&1
    echo "ncu $spec rc=$?"
    grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Bank|Warp Cycles Per Issued|Executed Ipc A" $OUT/ncu_$name.log | head -20
  done
fi
if [ "${PART}" = clock80 ]; then
  TILEJIT_GEMM_LOWERING=mma_sync_m16n8k16 timeout 200 python3 scripts/clock_probe.py mma80 ${CONFIGS80} 2>&1 | tee $OUT/clock80.log
  spec=${NCU80:-gemm:128x256x64w8s3:bf16}
  TILEJIT_GEMM_LOWERING=mma_sync_m16n8k16 timeout 150 $NCU --clock-control none --launch-skip 2 --launch-count 1 -k regex:tj_ \
    --section SpeedOfLight --section WarpStateStats python3 scripts/profile_kernels.py $spec > $OUT/ncu_free_clock.log 2>&1
  grep -E "Duration|SM Frequency|Compute \(SM\)|Warp Cycles Per Issued" $OUT/ncu_free_clock.log
fi
if [ "${PART}" = stalls80 ]; then  # warp stall reasons and shared-memory traffic of the pinned sm_80 kernels
  for spec in ${NCU80:-gemm:128x128x64w4s3:bf16 gemm:128x256x64w8s3:bf16}; do
    name=$(echo $spec | tr ':' '_')
    TILEJIT_GEMM_LOWERING=${LOWERING:-mma_sync_m16n8k16} timeout 150 $NCU --launch-skip 2 --launch-count 1 -k regex:tj_ \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:l1tex__data_bank_conflicts_pipe_lsu_mem_shared.*\.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,smsp__inst_executed_pipe_tensor.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg,smsp__inst_executed_op_ldsm.sum,l1tex__throughput.avg.pct_of_peak_sustained_active" \
      python3 scripts/profile_kernels.py $spec > $OUT/stalls_$name.log 2>&1
    echo "ncu $spec rc=$?"
    grep -E "^\s+(smsp|l1tex|sm__)" $OUT/stalls_$name.log | awk '$NF+0 > 0.05 || $1 !~ /stalled/' | sed 's/smsp__average_warps_issue_stalled_//'
  done
fi
if [ "${PART}" = sm80 ]; then  # the whole sm_80 path's GPU tests, then its speed with and without fragment carry
  if [ -z "${SKIP_TESTS}" ]; then
    (cd tests && timeout ${T_TESTS:-300} python3 -m pytest -q -m gpu -p no:cacheprovider -n 14 gpu/test_gpu_sm80_path.py \
      gpu/test_gpu_mma_register_a.py gpu/test_gpu_wgmma_swizzle.py gpu/test_gpu_kernels.py ${EXTRA_TESTS} > $OUT/tests80.log 2>&1)
    echo "tests rc=$?"; tail -5 $OUT/tests80.log
  fi
  for copy in cp_async tma; do
    for overlap in 1 0; do
      TILEJIT_GEMM_LOWERING=mma_sync_m16n8k16 TILEJIT_COPY_LOWERING=$([ $copy = cp_async ] && echo cp_async) \
      TILEJIT_MMA_OVERLAP=$overlap timeout 200 python3 -m benchmarks.configs --no-tuned --dtype bf16 \
        --shapes ${SHAPES80:-4096x4096x4096,8192x8192x8192} \
        --configs ${CONFIGS80:-128x128x64w4s3,128x256x64w8s3,128x128x32w4s4,128x256x32w8s3} --modes off \
        --out $OUT/sm80_${copy}_overlap$overlap > $OUT/sm80_${copy}_overlap$overlap.log 2>&1
      echo "== copy=$copy carry=$overlap rc=$?"; grep "^| [0-9]" $OUT/sm80_${copy}_overlap$overlap.log
    done
  done
fi
if [ "${PART}" = ceiling80 ]; then  # the sm_80 path's best configs, cuBLAS and the register-only mma.sync ceiling, back to back
  python3 scripts/mma_ceiling.py
  TILEJIT_GEMM_LOWERING=mma_sync_m16n8k16 TILEJIT_COPY_LOWERING=${COPY80} timeout 200 python3 scripts/clock_probe.py mma80 \
    ${CONFIGS80:-128x128x64w4s3 128x256x64w8s3 128x256x32w8s3} 2>&1 | tee $OUT/ceiling80.log
fi
if [ "${PART}" = verify9 ]; then  # the whole GPU suite, then the sm_80 path tuned next to the native kernel and cuBLAS
  [ -z "${SKIP_TESTS}" ] && gpu_suite
  python3 scripts/mma_ceiling.py | tee $OUT/ceiling.log
  sm80_matmul bf16
fi
if [ "${PART}" = attn80 ]; then  # attention on the sm_80 path: backward config candidates, then the forward
  timeout 330 python3 scripts/attention_sm80.py > $OUT/attn80_bwd.log 2>&1
  echo "bwd rc=$?"; grep -E "TFLOP/s|Error|error" $OUT/attn80_bwd.log | tail -40
  timeout 200 python3 -m benchmarks.attention --passes fwd --dims 64,128 --seqs 4096 --sm80-path --out $OUT/attn80_fwd \
    > $OUT/attn80_fwd.log 2>&1
  echo "fwd rc=$?"; grep "^|" $OUT/attn80_fwd.log
fi
if [ "${PART}" = final9 ]; then  # the whole GPU suite; the sm_80 path next to the native kernel; the fp16 sweep
  gpu_suite
  sm80_matmul bf16,fp16
  timeout 450 python3 -m benchmarks.matmul --dtypes fp16 --out $OUT/sweep --no-append --budget-s 330 > $OUT/sweep.log 2>&1
  echo "sweep rc=$?"; grep "^|" $OUT/sweep.log
fi
if [ "${PART}" = h100_80 ]; then  # issue 15's measurement on the GPU it names: ceiling, clocks, the tuned sm_80 path
  python3 scripts/mma_ceiling.py
  TILEJIT_GEMM_LOWERING=mma_sync_m16n8k16 timeout 150 python3 scripts/clock_probe.py mma80 128x128x64w4s3 \
    256x128x64w8s3 2>&1 | tee $OUT/clock80_tma.log
  TILEJIT_GEMM_LOWERING=mma_sync_m16n8k16 TILEJIT_COPY_LOWERING=cp_async timeout 150 python3 scripts/clock_probe.py \
    mma80 128x128x64w4s3 256x128x64w8s3 2>&1 | tail -4 | tee $OUT/clock80_cp_async.log
  sm80_matmul bf16
fi
if [ "${PART}" = suite ]; then gpu_suite; fi
if [ "${PART}" = ragged ]; then  # the carry on sm_90a's own mma.sync loops (ragged shapes: TMA and cp.async mixed)
  for round in 1 2; do
    for overlap in 1 0; do
      TILEJIT_MMA_OVERLAP=$overlap timeout 120 python3 -m benchmarks.configs --no-tuned --dtype fp16 \
        --shapes 1000x3000x777,1000x3000x776 --configs 64x256x32w8s3,64x128x32w4s4,128x128x32w4s4,128x256x32w8s3 \
        --modes off --out $OUT/ragged_${overlap}_$round > $OUT/ragged_${overlap}_$round.log 2>&1
      echo "== carry=$overlap round $round"; grep "^| [0-9]" $OUT/ragged_${overlap}_$round.log | cut -d'|' -f2-6
    done
  done
fi
if [ "${PART}" = ragged2 ]; then  # after the mixed-loop wait fix: the ragged A/B, then the GPU tests of mma.sync loops
  PART=ragged bash scripts/gpu_session9.sh 2>&1 | grep -v "^NVIDIA"
  (cd tests && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 14 gpu/test_gpu_sm80_path.py \
    gpu/test_gpu_mma_register_a.py gpu/test_gpu_wgmma_swizzle.py gpu/test_gpu_kernels.py gpu/test_gpu_corners.py \
    gpu/test_gpu_dtypes.py 2>&1 | tail -2)
fi
if [ "${PART}" = stress_sk ]; then  # the stream-K fix-up alone: repeated launches, the workspace poisoned or fresh
  for flags in "" --poison-workspace --fresh-workspace; do
    timeout 60 python3 scripts/stream_k_stress.py --launches 200 $flags 2>&1 | tail -3
    timeout 60 python3 scripts/stream_k_stress.py 1100 520 320 128 256 64 8 4 --launches 200 $flags 2>&1 | tail -3
  done
fi
if [ "${PART}" = stress_shared ]; then  # first launches from a warm shared cache while the stream-K tests run beside
  # them: the scene that found the workspace's zero fill on another stream (STRESS_FLAGS: --preallocate, ...)
  export TILEJIT_CACHE_DIR=/tmp/tjc_shared
  timeout 60 python3 scripts/stream_k_stress.py --launches 3 2>&1 | tail -1
  timeout 60 python3 scripts/stream_k_stress.py 1100 520 320 128 256 64 8 4 --launches 3 2>&1 | tail -1
  (cd tests && timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -n 10 gpu/test_gpu_stream_k.py \
     gpu/test_gpu_split_k.py > $OUT/beside.log 2>&1) &
  sleep 8
  for i in 1 2 3 4; do
    timeout 80 python3 scripts/stream_k_stress.py --launches 10 $STRESS_FLAGS 2>&1 | grep -E "bad|counters" &
    timeout 80 python3 scripts/stream_k_stress.py 1100 520 320 128 256 64 8 4 --launches 10 $STRESS_FLAGS 2>&1 \
      | grep -E "bad|counters" &
    sleep 1
  done
  wait
  grep -E "^FAILED" $OUT/beside.log; tail -1 $OUT/beside.log
fi
