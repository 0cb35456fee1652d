#!/usr/bin/env bash
# The GPU check of tilejit.ops: their GPU tests, probes and benchmarks, spread over the GPUs of one machine with
# scripts/gpu_parallel.sh (one job per GPU; logs under $OUT, each job's tail last).
#
#   OUT=/tmp/out T=480 bash scripts/gpu_ops_check.sh
#
# Jobs: "kernels" times the memory-bound ops and decode (probes under scripts/probes, benchmarks.decode_attention)
# on a quiet GPU, then runs the ops' GPU tests; "train" and "serve" run benchmarks.llm's training rows (with one
# step's profile) and decode rows; "autotune" runs the training rows of Liger Kernel and torch.compile's
# max-autotune, whose tuning takes minutes. On a 2-GPU machine train+serve share one GPU and autotune is left out.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/tilejit-gpu-ops}"
T="${T:-480}"
export OUT T
gpus=$(nvidia-smi -L | wc -l)
tests="gpu/test_gpu_llm_norm_rope.py gpu/test_gpu_decode_attention.py gpu/test_gpu_llm_linear_ops.py"
tests="$tests $(cd tests && ls gpu/test_gpu_embedding*.py 2>/dev/null) gpu/test_gpu_llm_model.py"
kernels="python3 scripts/probes/norm_rope_speed.py; python3 scripts/probes/ce_embed_speed.py;"
kernels="$kernels python3 scripts/probes/decode_variants.py --batch 32 --context 32768 --pages none,16,64;"
kernels="$kernels python3 -m benchmarks.decode_attention --batches 1,32,128 --contexts 4096,32768 --out \$OUT/decode;"
kernels="$kernels cd tests && python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 --timeout 300 -rfE $tests"
train="python3 -m benchmarks.llm --only 'eager torch,torch.compile,tilejit' --profile --skip-decode --out \$OUT/llm_train"
serve="python3 -m benchmarks.llm --skip-train --profile --out \$OUT/llm_decode"
autotune="python3 -m benchmarks.llm --only 'eager torch,Liger Kernel,torch.compile max-autotune' --skip-decode --out \$OUT/llm_autotune"
if [ "$gpus" -ge 4 ]; then
    bash scripts/gpu_parallel.sh "kernels::$kernels" "train::$train" "serve::$serve" "autotune::$autotune"
else
    bash scripts/gpu_parallel.sh "kernels::$kernels" "llm::$train; $serve"
fi
