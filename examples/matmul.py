"""The matmul kernel of the README (one pipelined T.range loop), checked against a float64 torch reference.

With a CUDA GPU it is compiled and run in fp16 on two shapes; without one it runs through the IR
interpreter (TILEJIT_INTERPRET=1) on CPU tensors, on a small ragged shape. One line per shape; the exit
status is 1 if any result is off.

    python examples/matmul.py
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
def matmul(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    M, K = A.shape
    N = B.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, stages=3):          # software-pipelined loop
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


def run_case(M: int, N: int, K: int, tiles: tuple[int, int, int], device: str, how: str) -> bool:
    BM, BN, BK = tiles
    torch.manual_seed(0)
    A = torch.randn(M, K, device=device, dtype=torch.float16)
    B = torch.randn(K, N, device=device, dtype=torch.float16)
    C = torch.full((M, N), float("nan"), device=device, dtype=torch.float16)  # unwritten elements stay NaN
    matmul[(tilejit.cdiv(M, BM), tilejit.cdiv(N, BN))](A, B, C, BM=BM, BN=BN, BK=BK, num_warps=4)
    ref = A.double() @ B.double()
    err = (C.double() - ref).abs()
    # fp16 output: half an ulp relative to the value, plus float32 accumulation noise
    bound = 2e-3 * ref.abs() + 1e-2
    ok = bool((err <= bound).all())  # False if any element is NaN (never written)
    worst = float(err.nan_to_num(float("inf")).max())
    print(f"matmul {M}x{N}x{K} f16 ({how}, {BM}x{BN}x{BK} tiles): max abs err {worst:.3g} "
          f"{'ok' if ok else 'MISMATCH'}")
    return ok


def main() -> int:
    if torch.cuda.is_available():
        cases = [((1000, 3000, 777), (128, 128, 32)), ((4096, 4096, 4096), (128, 128, 32))]
        device, how = "cuda", "compiled for " + torch.cuda.get_device_name()
    else:
        os.environ["TILEJIT_INTERPRET"] = "1"  # read at launch: run on CPU through the IR interpreter
        cases = [((200, 150, 100), (64, 64, 32))]
        device, how = "cpu", "interpreter"
    results = [run_case(M, N, K, tiles, device, how) for (M, N, K), tiles in cases]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
