"""Fused attention from ``tilejit.ops``, forward and backward, checked against float64 torch: on a GPU if there is
one (bf16), else through the interpreter on small shapes (float32, tf32 products as on the GPU).

    python examples/attention.py

The kernels and their configs live in ``tilejit/ops/fused_attention.py``; ``tilejit.ops.attention`` is a PyTorch
operator, differentiable and usable under ``torch.compile``.
"""
from __future__ import annotations

import os

import torch

from tilejit.ops import attention
from tilejit.ops.fused_attention import reference


def main() -> None:
    gpu = torch.cuda.is_available() and os.environ.get("TILEJIT_INTERPRET") != "1"
    if not gpu:
        os.environ["TILEJIT_INTERPRET"] = "1"
    device = "cuda" if gpu else "cpu"
    dtype = torch.bfloat16 if gpu else torch.float32
    # bf16 inputs and outputs on the GPU; tf32 products in the interpreter (as on the GPU for float32)
    tol = 3e-2 if gpu else 1e-2
    shapes = [(2, 4, 1000, 64, 2), (1, 2, 257, 128, 1)] if gpu else [(1, 2, 70, 32, 2)]
    where = torch.cuda.get_device_name() if gpu else "CPU (interpreter)"
    for batch, heads, seq, dim, group in shapes:
        for causal in (False, True):
            torch.manual_seed(seq + dim + causal)
            q = torch.randn(batch, heads, seq, dim, device=device, dtype=dtype)
            k = torch.randn(batch, heads // group, seq, dim, device=device, dtype=dtype)
            v = torch.randn(batch, heads // group, seq, dim, device=device, dtype=dtype)
            out = torch.full_like(q, float("nan"))
            cfg = {} if gpu else dict(BM=32, BN=16, num_warps=4)
            attention(q, k, v, causal=causal, out=out, **cfg)
            err = (out.double() - reference(q, k, v, causal)).abs().max().item()
            print(f"attention B={batch} H={heads} S={seq} D={dim} GQA={group} causal={causal}: "
                  f"max |err| = {err:.2e} on {where}")
            assert err < tol, err
            bwd_cfg = None if gpu else {"dkdv": dict(BM=16, BN=32, num_warps=4), "dq": dict(BM=32, BN=16, num_warps=4)}
            leaves = [t.requires_grad_() for t in (q, k, v)]
            do = torch.randn_like(q)
            attention(*leaves, causal=causal, bwd_config=bwd_cfg, **cfg).backward(do)
            ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
            reference(*ref, causal).backward(do.double())
            # relative to each gradient's largest magnitude (16-bit P and dS on the GPU)
            err = max((t.grad.double() - r.grad).abs().max().item() / r.grad.abs().max().item()
                      for t, r in zip(leaves, ref))
            print(f"  backward: max |err| of dq, dk, dv relative to their scale = {err:.2e}")
            assert err < tol, err


if __name__ == "__main__":
    main()
