#!/usr/bin/env bash
# The GPU check of the low-precision GEMMs and of decode, on a machine of two GPUs (or one: the jobs then share
# it): the GPU tests of MN-major 8-bit operands, the transposing copy, block-scaled and precise fp8, and decode
# on one GPU; the benchmarks whose tables RESULTS.md keeps (fp8 / int8 with MN-major rows, block-scaled fp8,
# decode over a paged cache, decode's page-16 variants, block-scaled configs at M = 128) on the other. Logs under $OUT; each job's tail last.
#
#   OUT=/tmp/out bash scripts/gpu_lowp_check.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/tilejit-lowp-check}"
pytest="cd tests && python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 --timeout 300 -rfE"
tests="gpu/test_gpu_mn_major.py gpu/test_gpu_transpose_copy.py gpu/test_gpu_fp8_blockscaled.py"
tests="$tests gpu/test_gpu_fp8_precision.py gpu/test_gpu_decode_attention.py gpu/test_gpu_dtypes.py"
tests="$tests gpu/test_gpu_wgmma_majors.py gpu/test_gpu_mma_register_a.py"
bench="python3 -m benchmarks.matmul --dtypes fp8,int8 --shapes 4096x4096x4096,8192x8192x8192 --no-append"
bench="$bench --out $OUT/matmul; python3 -m benchmarks.fp8_blockscaled --quick --no-append --out $OUT/blockscaled"
bench="$bench; python3 -m benchmarks.decode_attention --batches 1,32,128 --contexts 4096,32768 --out $OUT/decode"
bench="$bench; python3 scripts/probes/decode_variants.py --batch 32 --context 4096 --pages 16"
bench="$bench; python3 scripts/probes/blockscaled_configs.py --shapes 128x7168x2048,128x4096x7168,128x2112x7168"
OUT="$OUT" T="${T:-560}" TAIL="${TAIL:-30}" bash scripts/gpu_parallel.sh "tests::$pytest $tests" "bench::$bench"
