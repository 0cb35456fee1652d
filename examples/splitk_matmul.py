"""Split-K matmul through atomics: each program computes one BM x BN tile of C over one chunk of K and adds its
partial product into a float32 C with ``T.atomic_add``, so a skinny problem (few output tiles, long K) still
fills the GPU. Checked against a float64 torch reference and the plain matmul.

With a CUDA GPU it runs in bf16 on two shapes; without one it runs through the IR interpreter
(TILEJIT_INTERPRET=1) on CPU tensors, on a small ragged shape. The exit status is 1 if any result is off.

    python examples/splitk_matmul.py
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
def matmul_splitk(A, B, C, K_SPLIT, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """C += A @ B over K range [pid2 * K_SPLIT, (pid2 + 1) * K_SPLIT); K_SPLIT is a multiple of BK, so a
    chunk's last tile never reads into the next chunk (only past K, which reads 0)."""
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    k_begin = T.program_id(2) * K_SPLIT
    k_end = T.minimum(k_begin + K_SPLIT, K)
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(k_begin, k_end, BK, stages=3):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    T.atomic_add(C[m0:m0 + BM, n0:n0 + BN], acc, sem="relaxed")  # out-of-bounds rows/cols are skipped


def splitk_matmul(A: torch.Tensor, B: torch.Tensor, split_k: int, BM: int = 64, BN: int = 64, BK: int = 32,
                  num_warps: int = 4) -> torch.Tensor:
    """float32 A @ B, K cut into ``split_k`` chunks (rounded up to whole BK tiles)."""
    M, K = A.shape
    N = B.shape[1]
    k_split = tilejit.cdiv(tilejit.cdiv(K, split_k), BK) * BK
    C = torch.zeros(M, N, device=A.device, dtype=torch.float32)  # the atomics add into it
    grid = (tilejit.cdiv(M, BM), tilejit.cdiv(N, BN), tilejit.cdiv(K, k_split))
    matmul_splitk[grid](A, B, C, k_split, BM=BM, BN=BN, BK=BK, num_warps=num_warps)
    return C


def run_case(M: int, N: int, K: int, split_k: int, tiles: tuple[int, int, int], device: str, how: str,
             dtype: torch.dtype) -> bool:
    BM, BN, BK = tiles
    torch.manual_seed(0)
    A = torch.randn(M, K, device=device, dtype=dtype)
    B = torch.randn(K, N, device=device, dtype=dtype)
    C = splitk_matmul(A, B, split_k, BM, BN, BK)
    ref = A.double() @ B.double()
    err = (C.double() - ref).abs()
    bound = 1e-5 * K ** 0.5 * ref.abs().max() + 1e-4  # float32 accumulation noise, in any summation order
    ok = bool((err <= bound).all())
    print(f"split-K matmul {M}x{N}x{K} {str(dtype)[6:]}, split {split_k} ({how}, {BM}x{BN}x{BK} tiles): "
          f"max abs err {float(err.max()):.3g} {'ok' if ok else 'MISMATCH'}")
    return ok


def main() -> int:
    if torch.cuda.is_available():
        cases = [((64, 96, 8192, 8), (64, 64, 32)), ((200, 300, 4097, 5), (64, 64, 32))]
        device, how, dtype = "cuda", "compiled for " + torch.cuda.get_device_name(), torch.bfloat16
    else:
        os.environ["TILEJIT_INTERPRET"] = "1"  # read at launch: run on CPU through the IR interpreter
        cases = [((70, 50, 300, 3), (32, 32, 32))]
        device, how, dtype = "cpu", "interpreter", torch.float16
    results = [run_case(M, N, K, s, tiles, device, how, dtype) for (M, N, K, s), tiles in cases]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
