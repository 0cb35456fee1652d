"""The README's first example: a tiled matmul, checked against torch's A @ B.

Compiled for the GPU when there is one, else run by the IR interpreter on CPU tensors.

    python examples/first_kernel.py
"""
import os
import sys

try:
    import tilejit
except ImportError:  # run from a source checkout without installing: use the repository's package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

# -- the README's example, verbatim from here on --
import os, torch, tilejit
import tilejit.language as T

@tilejit.kernel
def matmul(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    M, K = A.shape
    m0, n0 = T.program_id(0) * BM, T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, stages=3):            # software-pipelined
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)       # out-of-bounds rows/cols are masked

if torch.cuda.is_available():
    device, (M, N, K) = "cuda", (1000, 3000, 777)
else:                                                 # no GPU: the IR interpreter runs it on CPU tensors
    os.environ["TILEJIT_INTERPRET"] = "1"
    device, (M, N, K) = "cpu", (200, 300, 77)
A = torch.randn(M, K, device=device, dtype=torch.bfloat16)
B = torch.randn(K, N, device=device, dtype=torch.bfloat16)
C = torch.empty(M, N, device=device, dtype=torch.bfloat16)
matmul[(tilejit.cdiv(M, 128), tilejit.cdiv(N, 128))](A, B, C, BM=128, BN=128, BK=32, num_warps=4)

expected = A.float() @ B.float()                      # A @ B, accumulated in float32 as the kernel does
torch.testing.assert_close(C.float(), expected, rtol=1e-2, atol=1e-2)  # C is bfloat16: 8 bits of mantissa
err = (C.float() - expected).abs().max().item()
print(f"C = A @ B on {device} ({M}x{K} @ {K}x{N}, bfloat16): max abs error {err:.3g}")
