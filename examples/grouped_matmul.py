"""Grouped GEMM over tensor lists: C[g] = A[g] @ B[g] for G groups of different M, N and K, in one launch.

The kernel takes three tensor lists (Python lists of tensors). A fixed number of programs walks the groups'
output tiles as one flat sequence: group g's tiles come after those of groups 0..g-1, and program p takes tiles
p, p + P, p + 2P, ... (P programs), so work is spread evenly however ragged the groups are, and no program
exists for a tile that does not. Each tile is an ordinary K loop (cp.async-pipelined); the edges of every
group are masked as for any tensor.

With a CUDA GPU it runs in bfloat16 on five ragged groups (one with a single row); without one it runs through
the IR interpreter (TILEJIT_INTERPRET=1) on CPU tensors, on smaller groups. Outputs start as NaN and are
checked against a float64 torch reference; the exit status is 1 if any group is off.

    python examples/grouped_matmul.py
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
def grouped_matmul_kernel(As, Bs, Cs, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """Cs[g] = As[g] @ Bs[g] for every g; program p computes flat tiles p, p + P, ... (P = programs)."""
    pid = T.program_id(0)
    programs = T.num_programs(0)
    first = 0  # flat index of group g's first tile
    for g in range(len(As)):
        A = As[g]
        B = Bs[g]
        C = Cs[g]
        M, K = A.shape
        N = B.shape[1]
        tiles_n = T.cdiv(N, BN)
        tiles = T.cdiv(M, BM) * tiles_n
        # this program's first tile in [first, first + tiles): the first one >= first that is pid modulo P
        for t in range(first + (pid - first) % programs, first + tiles, programs):
            local = t - first
            m0 = (local // tiles_n) * BM
            n0 = (local % tiles_n) * BN
            acc = T.zeros((BM, BN), T.float32)
            for k0 in T.range(0, K, BK):
                acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
            C[m0:m0 + BM, n0:n0 + BN] = acc  # rounded to C's dtype; rows and columns past M, N are not written
        first += tiles


def grouped_matmul(As: list[torch.Tensor], Bs: list[torch.Tensor], Cs: list[torch.Tensor] | None = None,
                   BM: int = 64, BN: int = 64, BK: int = 32, num_warps: int = 4,
                   programs: int | None = None) -> list[torch.Tensor]:
    """``[A @ B for A, B in zip(As, Bs)]`` in one launch (into ``Cs`` when given, else new tensors)."""
    if Cs is None:
        Cs = [torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype) for a, b in zip(As, Bs)]
    tiles = sum(tilejit.cdiv(a.shape[0], BM) * tilejit.cdiv(b.shape[1], BN) for a, b in zip(As, Bs))
    if programs is None:
        slots = torch.cuda.get_device_properties(As[0].device).multi_processor_count * 2 \
            if As[0].device.type == "cuda" else 4
        programs = max(1, min(tiles, slots))
    grouped_matmul_kernel[(programs,)](As, Bs, Cs, BM=BM, BN=BN, BK=BK, num_warps=num_warps)
    return Cs


def check(shapes: list[tuple[int, int, int]], device: str, dtype: torch.dtype, tiles: tuple[int, int, int],
          how: str) -> bool:
    torch.manual_seed(0)
    As = [torch.randn(M, K, device=device, dtype=dtype) for M, N, K in shapes]
    Bs = [torch.randn(K, N, device=device, dtype=dtype) for M, N, K in shapes]
    Cs = [torch.full((M, N), float("nan"), device=device, dtype=dtype) for M, N, K in shapes]
    BM, BN, BK = tiles
    grouped_matmul(As, Bs, Cs, BM, BN, BK)
    ok = True
    for (M, N, K), a, b, c in zip(shapes, As, Bs, Cs):
        ref = a.double() @ b.double()
        err = (c.double() - ref).abs()
        # float32 sums rounded once to the output dtype: half an ulp of |ref| plus the sums' own noise
        ulp = 2.0 ** (-8 if dtype == torch.bfloat16 else -11)
        bound = ulp * ref.abs() + 1e-5 * K ** 0.5 * (ref.abs().max() if ref.numel() else 0) + 1e-6
        good = bool(torch.isfinite(c).all()) and bool((err <= bound).all())
        ok &= good
        print(f"  group {M}x{N}x{K}: max abs err {float(err.max()) if err.numel() else 0.0:.3g} "
              f"{'ok' if good else 'MISMATCH'}")
    print(f"grouped matmul of {len(shapes)} groups, {str(dtype)[6:]} ({how}, {BM}x{BN}x{BK} tiles): "
          f"{'ok' if ok else 'MISMATCH'}")
    return ok


def main() -> int:
    if torch.cuda.is_available():
        shapes = [(1000, 700, 512), (1, 4096, 1024), (4097, 256, 333), (256, 1000, 2048), (77, 129, 64)]
        ok = check(shapes, "cuda", torch.bfloat16, (128, 128, 64), "compiled for " + torch.cuda.get_device_name())
    else:
        os.environ["TILEJIT_INTERPRET"] = "1"  # read at launch: run on CPU through the IR interpreter
        shapes = [(40, 24, 33), (1, 70, 16), (70, 50, 64), (33, 9, 20)]
        ok = check(shapes, "cpu", torch.bfloat16, (32, 32, 16), "interpreter")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
