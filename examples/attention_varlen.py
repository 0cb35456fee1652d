"""Causal attention of packed variable-length sequences with ``tilejit.ops.attention_varlen``, forward and
backward, in ``flash_attn_varlen_func``'s conventions: the sequences' tokens concatenated into q (total, heads, D)
and k, v (total, kv_heads, D) (GQA 4:1), ``cu_seqlens`` (int32, batch + 1) marking where each sequence starts, no
padding. Output and dq, dk, dv are checked against float64 SDPA run sequence by sequence. On a GPU if there is one
(bf16), else through the interpreter at a small size (float32, tf32 products as on the GPU).

    python examples/attention_varlen.py
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))  # run from a checkout
from tilejit.ops import attention_varlen  # noqa: E402


def reference(q, k, v, cu_seqlens):
    """float64 causal SDPA of each sequence on its own (differentiable), the outputs packed again."""
    group = q.shape[1] // k.shape[1]
    outs = []
    for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
        qb, kb, vb = (t[start:end].double().transpose(0, 1) for t in (q, k, v))    # (heads, length, D)
        kb, vb = kb.repeat_interleave(group, 0), vb.repeat_interleave(group, 0)
        outs.append(F.scaled_dot_product_attention(qb, kb, vb, is_causal=True).transpose(0, 1))
    return torch.cat(outs)


def main() -> None:
    gpu = torch.cuda.is_available() and os.environ.get("TILEJIT_INTERPRET") != "1"
    if not gpu:
        os.environ["TILEJIT_INTERPRET"] = "1"
    device, dtype = ("cuda", torch.bfloat16) if gpu else ("cpu", torch.float32)
    lengths, heads, kv_heads, dim = ([1000, 3, 517, 2048, 129], 16, 4, 128) if gpu else ([70, 1, 20], 4, 1, 32)
    where = torch.cuda.get_device_name() if gpu else "CPU (interpreter)"
    torch.manual_seed(0)
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    total = sum(lengths)
    q = torch.randn(total, heads, dim, device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(total, kv_heads, dim, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
    out = attention_varlen(q, k, v, cu_seqlens, cu_seqlens, max(lengths), max(lengths), causal=True)
    do = torch.randn_like(out)
    out.backward(do)

    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = reference(*leaves, cu_seqlens)
    ref.backward(do.double())
    err = (out.double() - ref).abs().max().item()
    # each gradient's error relative to its largest magnitude (16-bit P and dS on the GPU)
    grad_err = max((t.grad.double() - r.grad).abs().max().item() / r.grad.abs().max().item()
                   for t, r in zip((q, k, v), leaves))
    print(f"attention_varlen causal, lengths {lengths}, H={heads} Hkv={kv_heads} D={dim}: max |err| = {err:.2e}, "
          f"dq/dk/dv relative error {grad_err:.2e} on {where}")
    tol = 3e-2 if gpu else 1e-2
    if not (err < tol and grad_err < tol):
        sys.exit(f"attention_varlen: error {err:.2e} / {grad_err:.2e} is above {tol}")


if __name__ == "__main__":
    main()
