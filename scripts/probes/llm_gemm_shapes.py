"""The GEMMs of one training step of the example LLM (examples/llm/model.py: B x S = 8192 tokens, width 1024,
qkv 1536, FFN 2816, bf16), tilejit's tuned ``gemm`` of ``tilejit.ops`` (the config the tuner chose printed)
against torch's matmul of the same operands in the same layouts (cuBLAS), each timed with
``tilejit.testing.do_bench`` (CUDA events, median), TFLOP/s and the ratio. Forms: x @ W^T (forward), dY @ W (dX),
dY^T @ X (dW: few output tiles, long K), and the two-product dGate @ Wg + dUp @ Wu.

    python scripts/probes/llm_gemm_shapes.py [--tokens 8192]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tilejit.ops.linear_kernels as kernels  # noqa: E402
from tilejit.testing import do_bench  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8192)
    tokens = parser.parse_args().tokens
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)

    rows = []
    for name, n, k in [("qkv", 1536, 1024), ("wo", 1024, 1024), ("w_down", 1024, 2816), ("head", 256, 1024)]:
        x, w, dy = rand(tokens, k), rand(n, k) / 32, rand(tokens, n)
        cases = [(f"{name} fwd x @ W^T ({tokens}x{n}x{k})", 2 * tokens * n * k, (False, True, False),
                  lambda x=x, w=w, n=n: kernels.matmul(x, w, x.new_empty(tokens, n), trans_b=True),
                  lambda x=x, w=w: x @ w.T),
                 (f"{name} dX = dY @ W ({tokens}x{k}x{n})", 2 * tokens * n * k, (False, False, False),
                  lambda dy=dy, w=w, k=k: kernels.matmul(dy, w, dy.new_empty(tokens, k)), lambda dy=dy, w=w: dy @ w),
                 (f"{name} dW = dY^T @ X ({n}x{k}x{tokens})", 2 * tokens * n * k, (True, False, False),
                  lambda dy=dy, x=x, n=n, k=k: kernels.matmul(dy, x, dy.new_empty(n, k), trans_a=True),
                  lambda dy=dy, x=x: dy.T @ x)]
        rows += cases
    dg, du, wg, wu = rand(tokens, 2816), rand(tokens, 2816), rand(2816, 1024) / 32, rand(2816, 1024) / 32
    rows.append((f"dX = dGate @ Wg + dUp @ Wu ({tokens}x1024x2x2816)", 2 * 2 * tokens * 2816 * 1024,
                 (False, False, True),
                 lambda: kernels.matmul(dg, wg, dg.new_empty(tokens, 1024), a2=du, b2=wu),
                 lambda: torch.addmm(dg @ wg, du, wu)))
    print(f"{torch.cuda.get_device_name()}")
    print("| GEMM | tilejit us | TFLOP/s | config | torch us | TFLOP/s | tilejit / torch |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, flops, (trans_a, trans_b, two), ours, theirs in rows:
        ours()  # tunes (the choice is the tuner's best_config)
        config = kernels.tuned_gemm(2, trans_a, trans_b, False, two).best_config
        t_ours, t_theirs = do_bench(ours), do_bench(theirs)
        print(f"| {label} | {t_ours * 1e3:.1f} | {flops / t_ours / 1e9:.0f} | {config or ''} | {t_theirs * 1e3:.1f} | "
              f"{flops / t_theirs / 1e9:.0f} | {t_theirs / t_ours:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
