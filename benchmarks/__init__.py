"""Benchmarks of tilejit against cuBLAS, Triton and torch; each run appends to
benchmarks/history/runs.md; benchmarks/RESULTS.md holds the current table of each workload.

    python -m benchmarks.matmul [--quick]     # TFLOP/s: tilejit vs cuBLAS vs Triton
    python -m benchmarks.launch               # host overhead per launch, compile and cache-hit times
    bash benchmarks/device_run.sh             # everything above plus the GPU tests, on a GPU machine
"""
