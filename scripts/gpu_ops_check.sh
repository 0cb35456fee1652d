#!/usr/bin/env bash
# The GPU check of tilejit.ops: their GPU tests, probes and benchmarks, spread over the GPUs of one machine with
# scripts/gpu_parallel.sh (one job per GPU; logs under $OUT, each job's tail last).
#
#   OUT=/tmp/out T=480 bash scripts/gpu_ops_check.sh
#
# Jobs: "kernels" times the model's GEMMs against cuBLAS, the ops' host time a call and the memory-bound ops
# (probes under scripts/probes; DECODE=1 adds decode's variants and benchmarks.decode_attention), then runs the
# attention, decode and fp8 ops' GPU tests; "tests" runs the model ops' and the model's GPU tests; "train" runs
# benchmarks.llm's training rows of eager torch, torch.compile and tilejit, eager and under a CUDA graph (with one
# step's profile each), then its decode rows (profiled); "autotune" the training rows of Liger Kernel and
# torch.compile's max-autotune (with eager and tilejit's CUDA graph again, the references of their memory and speed
# in the same run), whose tuning takes minutes. On a 2-GPU machine: kernels then every test on one GPU, the
# training and decode rows on the other, no autotune rows.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/tilejit-gpu-ops}"
T="${T:-480}"
export OUT T
gpus=$(nvidia-smi -L | wc -l)
# The ops' GPU tests in two halves: the model's ops and the model; attention, decode and the fp8 matmuls.
model_tests="gpu/test_gpu_llm_norm_rope.py gpu/test_gpu_llm_linear_ops.py gpu/test_gpu_embedding.py"
model_tests="$model_tests gpu/test_gpu_llm_model.py gpu/test_runtime_gpu.py"
attention_tests="gpu/test_gpu_decode_attention.py gpu/test_gpu_attention.py gpu/test_gpu_attention_window.py"
attention_tests="$attention_tests gpu/test_gpu_attention_varlen.py gpu/test_gpu_attention_fp8.py"
attention_tests="$attention_tests gpu/test_gpu_fp8_blockscaled.py gpu/test_gpu_mxfp8.py"
pytest="cd tests && python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 --timeout 300 -rfE"
kernels="python3 scripts/probes/llm_gemm_shapes.py; python3 scripts/probes/op_host_layers.py;"
kernels="$kernels python3 scripts/probes/norm_rope_speed.py; python3 scripts/probes/ce_embed_speed.py"
decode="python3 scripts/probes/decode_variants.py --batch 32 --context 32768 --pages none,16,64;"
decode="$decode python3 -m benchmarks.decode_attention --batches 1,32,128 --contexts 4096,32768 --out \$OUT/decode"
train="python3 -m benchmarks.llm --only 'eager torch,torch.compile,tilejit,tilejit + CUDA graph,eager torch + CUDA graph'"
train="$train --profile --skip-decode --out \$OUT/llm_train"
serve="python3 -m benchmarks.llm --skip-train --profile --out \$OUT/llm_decode"
autotune="python3 -m benchmarks.llm --only 'eager torch,tilejit + CUDA graph,Liger Kernel,torch.compile max-autotune'"
autotune="$autotune --skip-decode --out \$OUT/llm_autotune"
if [ "${DECODE:-0}" = 1 ]; then
    kernels="$kernels; $decode"
fi
if [ "$gpus" -ge 4 ]; then
    bash scripts/gpu_parallel.sh "kernels::$kernels; $pytest $attention_tests" "tests::$pytest $model_tests" \
        "llm::$train; $serve" "autotune::$autotune"
else
    bash scripts/gpu_parallel.sh "kernels::$kernels; $pytest $attention_tests $model_tests" "llm::$train; $serve"
fi
