"""What the GPU tests of the 8- and 32-bit wgmma paths share: A (M x K) and Bt (N x K, K-major, as those wgmma
kinds read it) for fp8, int8 or tf32 with a poisoned output, and the check of ``A @ Bt.T`` against float64 (int64
for int8) with the tolerance each kind's rounding allows."""
from __future__ import annotations

import torch

import tilejit.language as T

#: BK per kind: one 128-byte row of K per stage
LOWP_BK = {"fp8": 128, "int8": 128, "tf32": 32}


def lowp_operands(kind: str, m: int, n: int, k: int):
    """(a, bt, c, accumulator dtype) for ``kind``, c poisoned (NaN, or INT32_MIN for int8's int32 sums)."""
    torch.manual_seed(m + k)
    if kind == "fp8":
        a = (torch.randn(m, k, device="cuda") * 2).to(torch.float8_e4m3fn)
        bt = (torch.randn(n, k, device="cuda") * 2).to(torch.float8_e4m3fn)
        acc, out_dtype = T.float32, torch.float32
    elif kind == "int8":
        a = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8)
        bt = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8)
        acc, out_dtype = T.int32, torch.int32
    else:
        a = torch.randn(m, k, device="cuda")
        bt = torch.randn(n, k, device="cuda")
        acc, out_dtype = T.float32, torch.float32
    c = torch.full((m, n), -(2 ** 31) if out_dtype == torch.int32 else float("nan"), device="cuda", dtype=out_dtype)
    return a, bt, c, acc


def check_lowp(kind: str, a, bt, c) -> None:
    if kind == "int8":
        assert torch.equal(c.long().cpu(), a.long().cpu() @ bt.long().cpu().T)
        return
    ref = a.double() @ bt.double().T
    assert not torch.isnan(c).any()
    if kind == "fp8":
        # exact products, but Hopper's fp8 tensor-core sums keep fewer bits than float32 (as in test_gpu_dtypes)
        bound = (a.double().abs() @ bt.double().abs().T) * 2.0 ** -7 + 1e-3
        assert ((c.double() - ref).abs() <= bound).all(), (c.double() - ref).abs().max().item()
        return
    err = (c.double() - ref).abs().max().item()
    k = a.shape[1]
    assert err <= 3e-3 * k ** 0.5 * ref.abs().max().item() + 1e-3, err
