T=570 TAIL=10 FAILS=40 bash scripts/gpu_parallel.sh \
 'suite::cd tests && python3 -m pytest -q -m gpu -p no:cacheprovider -n 16 --timeout 240 -rfE gpu --ignore=gpu/test_gpu_llm_linear_ops.py --ignore=gpu/test_gpu_attention_fp8.py --ignore=gpu/test_gpu_fp8_blockscaled.py --ignore=gpu/test_gpu_mxfp8.py --ignore=gpu/test_gpu_llm_model.py' \
 'newops::cd tests && python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 --timeout 300 -rfE gpu/test_gpu_attention_fp8.py gpu/test_gpu_fp8_blockscaled.py gpu/test_gpu_mxfp8.py gpu/test_gpu_llm_linear_ops.py gpu/test_gpu_llm_model.py' \
 'bench::for m in decode varlen fp8; do case $m in decode) a="--batches 1,32,128 --contexts 4096,32768";; varlen) a="--seqs 1024,4096 --dims 128";; fp8) a="--seqs 4096 --dims 128";; esac; python3 -m benchmarks.attention --mode $m $a --out $OUT/attn_$m; done; python3 -m benchmarks.matmul --quick --no-append --budget-s 150 --out $OUT/matmul' \
 'llm::python3 -m benchmarks.llm --steps 10 --warmup 3 --out $OUT/llm'
