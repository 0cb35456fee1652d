"""The attention backward's configs on the sm_80 path, run on a Hopper GPU with
``benchmarks.kernels.SM80_PINS`` (mma.sync and cp.async pinned): each candidate dK/dV config with the first dQ
config, then each dQ config with the fastest dK/dV one, bf16, B=4 H=16 S=4096, each checked against float64
first (``benchmarks.attention._backward``). The candidates are BWD_CONFIGS' and the ones ptxas compiles for
sm_80 without spills (CPU: tests/backend/test_attention_backward.py).

    python scripts/probes/attention_sm80.py
"""
from __future__ import annotations

import os

import torch

from benchmarks.kernels import SM80_PINS

os.environ.update(SM80_PINS)

from benchmarks import attention as bench  # noqa: E402

CANDIDATES = {
    64: {"dkdv": [(64, 128, 8), (64, 64, 8), (32, 128, 4), (64, 64, 4)],
         "dq": [(128, 64, 8), (64, 64, 4), (64, 32, 4), (64, 64, 8)]},
    128: {"dkdv": [(64, 128, 8), (32, 32, 8), (16, 32, 4), (64, 64, 4)],
          "dq": [(128, 64, 8), (128, 128, 8), (64, 32, 4), (64, 64, 8)]},
}


def main() -> None:
    bench.SM80_PATH = True
    print(torch.cuda.get_device_name(), "sm_80 path:", SM80_PINS, flush=True)
    seq, heads = 4096, 16
    batch = 16384 // seq
    for dim, space in CANDIDATES.items():
        bench.attention.BWD_CONFIGS[dim] = space
        torch.manual_seed(dim)
        q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for causal in (False, True):
            def tflops(ms):
                return bench._tflops(batch, heads, seq, dim, causal, ms, True)
            (ms, label), _ = bench._backward(q, k, v, causal, {}, tflops)
            print(f"D={dim} causal={causal}: best {label} {tflops(ms):.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
