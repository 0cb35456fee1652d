"""Float to 8- and 16-bit integer conversions saturate (toward zero, NaN to 0): the interpreter computes the
language's values, and the CUDA it compiles to clamps through int32 (C++ leaves an out-of-range conversion
undefined; NVRTC's code wrapped 300.0 to 44 in an int8). Integer division by zero is the interpreter's -1 and
dividend (the GPU's is not defined: docs/language.md). tests/gpu/test_gpu_dtypes.py runs the casts on a GPU."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit.backend_cuda.nvrtc import nvrtc_supports

X = [300.0, -300.0, 2.7, -2.7, 127.9, -128.9, 0.5, -0.5, 255.5, 1e10, -1e10, float("nan"), 65.0, 7e4, -7e4, 3.0]
A = [7, -7, 5, 0, -3, 9, 1, -1, 7, -7, 5, 0, -3, 9, 1, -1]
B = [0, 0, 0, 0, 2, -2, 3, -3, 0, 0, 0, 0, 2, -2, 3, -3]


@tilejit.kernel
def narrowing(X, I8, U8, I16, A, B, Q, R, BLOCK: T.constexpr):
    x = X[0:BLOCK]
    I8[0:BLOCK] = x                     # a store converts
    U8[0:BLOCK] = x.to(T.uint8)         # so does .to()
    I16[0:BLOCK] = x.to(T.float16).to(T.int16)
    a = A[0:BLOCK]
    b = B[0:BLOCK]
    Q[0:BLOCK] = a // b
    R[0:BLOCK] = a % b


def expected():
    x = torch.tensor(X, dtype=torch.float64)
    half = torch.tensor(X, dtype=torch.float16).double()

    def sat(v, lo, hi):
        return torch.nan_to_num(v, nan=0.0).trunc().clamp(lo, hi)

    a, b = torch.tensor(A, dtype=torch.int64), torch.tensor(B, dtype=torch.int64)
    q = torch.where(b == 0, -1, torch.div(a, torch.where(b == 0, 1, b), rounding_mode="floor"))
    r = torch.where(b == 0, a, torch.remainder(a, torch.where(b == 0, 1, b)))
    return sat(x, -128, 127), sat(x, 0, 255), sat(half, -2**15, 2**15 - 1), q, r


def launch(device):
    x = torch.tensor(X, device=device)
    outs = [torch.full((16,), 99, dtype=dt, device=device) for dt in (torch.int8, torch.uint8, torch.int16)]
    a, b = (torch.tensor(v, dtype=torch.int32, device=device) for v in (A, B))
    q, r = (torch.full((16,), 99, dtype=torch.int32, device=device) for _ in range(2))
    narrowing[(1,)](x, *outs, a, b, q, r, BLOCK=16)
    return (*outs, q, r)


def test_the_interpreter_saturates_and_divides_by_zero_as_documented(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))
    for got, want in zip(launch("cpu"), expected()):
        assert torch.equal(got.to(torch.int64).double(), want.double()), (got, want)


@pytest.mark.parametrize("arch", [a for a in ("sm_80", "sm_90a") if nvrtc_supports(a)])
def test_the_cuda_clamps_through_int32(fresh_compile_cache, arch):
    m = {dt: torch.empty(16, dtype=dt, device="meta") for dt in (torch.float32, torch.int8, torch.uint8,
                                                                  torch.int16, torch.int32)}
    cuda = narrowing.compile(m[torch.float32], m[torch.int8], m[torch.uint8], m[torch.int16], m[torch.int32],
                             m[torch.int32], m[torch.int32], m[torch.int32], BLOCK=16, arch=arch).asm["cuda"]
    assert "(int8_t)tj_imin<int32_t>(tj_imax<int32_t>((int32_t)(" in cuda and ", -128), 127)" in cuda
    assert "(uint8_t)tj_imin<int32_t>(tj_imax<int32_t>(" in cuda and ", 0), 255)" in cuda
    assert ", -32768), 32767)" in cuda
    assert "tj_floordiv<int32_t>(" in cuda and "tj_pymod<int32_t>(" in cuda
