"""What the GPU tests of the wgmma paths share: for 8- and 32-bit operands, A (M x K) and Bt (N x K, K-major, as
those wgmma kinds read it) for fp8, int8 or tf32 with a poisoned output, and the check of ``A @ Bt.T`` against
float64 (int64 for int8) with the tolerance each kind's rounding allows; and the launches each launch option's
tests repeat (a low-precision product, a fused epilogue launched many times) with a check of the compiled kernel
passed in."""
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


def check_close(c, ref, rel: float = 1e-2) -> None:
    """No output left unwritten (NaN) and the largest error within ``rel`` of the reference's largest entry."""
    assert not torch.isnan(c).any()
    err = (c.double() - ref).abs().max().item()
    assert err <= rel * ref.abs().max().item() + 1e-2, err


def check_lowp_launch(kind: str, shape: tuple[int, int, int], kw: dict, check_compiled) -> None:
    """``matmul_any`` on ``kind`` operands (B given N x K) with 128x128 tiles and the launch options of ``kw``:
    ``check_compiled`` looks at the compiled kernel (did the option take), then the result is checked."""
    import tilejit
    from kernels import matmul_any

    m, n, k = shape
    a, b, c, acc = lowp_operands(kind, m, n, k)
    kw = dict(BM=128, BN=128, BK=LOWP_BK[kind], TA=False, TB=True, ACC=acc, **kw)
    check_compiled(matmul_any.compile(a, b, c, **kw))
    matmul_any[(tilejit.cdiv(m, 128), tilejit.cdiv(n, 128))](a, b, c, **kw)
    torch.cuda.synchronize()
    check_lowp(kind, a, b, c)


def check_benchmark_matmul(dtype, shape: tuple[int, int, int], kw: dict, check_compiled) -> None:
    """The benchmarks' grouped-order matmul (``benchmarks.kernels.matmul.kernel``) on fresh ``dtype`` operands at
    the launch options of ``kw`` (a config's ``all_kwargs()``): ``check_compiled`` looks at the compiled kernel,
    then the NaN-poisoned output is checked against float64."""
    import tilejit
    from benchmarks.kernels import matmul

    m, n, k = shape
    torch.manual_seed(m + 5 * n + k)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    check_compiled(matmul.kernel.compile(a, b, c, **kw))
    matmul.kernel[(tilejit.cdiv(m, kw["BM"]) * tilejit.cdiv(n, kw["BN"]),)](a, b, c, **kw)
    torch.cuda.synchronize()
    check_close(c, a.double() @ b.double())


def check_linear_relu_launches(shape: tuple[int, int, int], kw: dict, check_compiled, launches: int = 20,
                               check_each: bool = False) -> None:
    """relu(x @ w + bias) in bfloat16 with 128x128 tiles and the launch options of ``kw``, launched ``launches``
    times back to back, each time into a fresh NaN-poisoned output (state a launch leaves behind, like ring
    barriers or counters, must not spoil the next); checked after the last launch, or after each."""
    import tilejit
    from kernels import linear_relu

    m, n, k = shape
    torch.manual_seed(7)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    ref = torch.relu(x.double() @ w.double() + bias.double())
    kw = dict(BM=128, BN=128, BK=64, **kw)
    check_compiled(linear_relu.compile(x, w, bias, torch.empty(m, n, device="cuda", dtype=torch.bfloat16), **kw))
    for _ in range(launches):
        y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        linear_relu[(tilejit.cdiv(m, 128), tilejit.cdiv(n, 128))](x, w, bias, y, **kw)
        if check_each:
            torch.cuda.synchronize()
            check_close(y, ref)
    torch.cuda.synchronize()
    check_close(y, ref)
