"""An fp8 scaled matmul, as ``torch._scaled_mm`` computes it: ``out = (a @ b.T) * a_scale[:, None] * b_scale[None, :]``
for float8 ``a`` (M x K) and ``b`` given N x K, with float32 row and column scales applied in the epilogue.

fp8 tensor cores want both operands K-major (on sm_90a, wgmma m64nNk32 reads them that way), which is why ``b``
comes as N x K, as ``torch._scaled_mm`` takes it. Per-tensor scales are the same call with scale vectors of one
repeated value. With a GPU (sm_89+) the kernel runs on tensor cores; without one it runs through the interpreter
on a small shape. Prints one line per shape; exit status 1 if a result is off.

    python examples/scaled_mm.py
"""
from __future__ import annotations

import os
import sys

import torch

try:
    import tilejit
except ImportError:  # run from a source checkout without installing: use the repository's package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    import tilejit
import tilejit.language as T


@tilejit.kernel
def scaled_mm_kernel(A, Bt, a_scale, b_scale, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, stages=3):
        acc = T.gemm(A[m0:m0 + BM, k0:k0 + BK], Bt[n0:n0 + BN, k0:k0 + BK], acc, transpose_b=True)
    out = acc * a_scale[m0:m0 + BM][:, None] * b_scale[n0:n0 + BN][None, :]
    C[m0:m0 + BM, n0:n0 + BN] = out.to(C.dtype)


def scaled_mm(a: torch.Tensor, bt: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
              out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``(a @ bt.T) * a_scale[:, None] * b_scale[None, :]`` in ``out_dtype``; ``a`` M x K and ``bt`` N x K float8
    (e4m3fn or e5m2, mixed allowed), ``a_scale`` (M,) and ``b_scale`` (N,) float32."""
    m, n = a.shape[0], bt.shape[0]
    out = torch.empty(m, n, device=a.device, dtype=out_dtype)
    # 128 bytes of K per stage (one wgmma panel), two warpgroups.
    scaled_mm_kernel[(tilejit.cdiv(m, 128), tilejit.cdiv(n, 128))](a, bt, a_scale, b_scale, out, BM=128, BN=128,
                                                                    BK=128, num_warps=8)
    return out


def main() -> int:
    on_gpu = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
    if not on_gpu:
        os.environ["TILEJIT_INTERPRET"] = "1"
    device = "cuda" if on_gpu else "cpu"
    shapes = [(1000, 520, 777), (4096, 4096, 4096)] if on_gpu else [(100, 70, 200)]
    ok = True
    for m, n, k in shapes:
        torch.manual_seed(0)
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        bt = torch.randn(n, k, device=device).to(torch.float8_e4m3fn)
        sa, sb = torch.rand(m, device=device) + 0.5, torch.rand(n, device=device) + 0.5
        out = scaled_mm(a, bt, sa, sb)
        ref = (a.double() @ bt.double().T) * sa.double()[:, None] * sb.double()[None, :]
        # bf16 output rounding plus the tensor cores' reduced-precision fp8 sums, relative to sum |a||b|
        scale = (a.double().abs() @ bt.double().abs().T) * sa.double()[:, None] * sb.double()[None, :]
        good = bool(((out.double() - ref).abs() <= ref.abs() * 2.0 ** -7 + scale * 2.0 ** -7).all())
        ok &= good
        print(f"scaled_mm {m}x{n}x{k} e4m3 -> bf16 ({'GPU' if on_gpu else 'interpreter'}): max abs err "
              f"{(out.double() - ref).abs().max().item():.3g} {'ok' if good else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
