"""fp8, int8 and float32 (tf32 / tf32x3 / ieee) matrix products on the GPU's tensor cores, against float64 (int64
for int8) references on fresh random inputs, NaN-poisoned outputs, ragged and aligned shapes, every operand
major-ness (the K-major forms take wgmma on sm_90a, the others mma.sync with gathered fragments).

Run on a machine with a GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_dtypes.py``.
"""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from kernels import matmul_any

pytestmark = pytest.mark.gpu

SHAPES = [(256, 256, 256), (200, 136, 384), (1000, 300, 777), (64, 8, 4096)]
LAYOUTS = {"nn": (False, False), "nt": (False, True), "tn": (True, False)}
# (BM, BN, BK in bytes of K, num_warps): 8 warps and 128 bytes of K take wgmma for K-major operands on sm_90a.
TILES = [(128, 128, 128, 8), (64, 64, 64, 4)]


def _operands(m, n, k, ta, tb, make_a, make_b):
    """A and B in the layouts the kernel reads (A stored K x M when ta, B stored N x K when tb), and the M x K and
    K x N matrices they hold."""
    a = make_a(k, m) if ta else make_a(m, k)
    b = make_b(n, k) if tb else make_b(k, n)
    return a, b, (a.T if ta else a), (b.T if tb else b)


def _run(a, b, c, m, n, tile, ta, tb, acc, precision=None):
    bm, bn, bk_bytes, warps = tile
    bk = bk_bytes // a.element_size()
    matmul_any[(tilejit.cdiv(m, bm), tilejit.cdiv(n, bn))](a, b, c, BM=bm, BN=bn, BK=bk, TA=ta, TB=tb, ACC=acc,
                                                           PRECISION=precision, num_warps=warps)
    torch.cuda.synchronize()


def _fp8(dtype, scale=1.0):
    def make(*shape):
        return (torch.randn(*shape, device="cuda") * scale).to(dtype)
    return make


FP8_PAIRS = {"e4m3": (torch.float8_e4m3fn, torch.float8_e4m3fn), "e5m2": (torch.float8_e5m2, torch.float8_e5m2),
             "e4m3xe5m2": (torch.float8_e4m3fn, torch.float8_e5m2)}


@tilejit.kernel
def to_fp8(X, Y, Z, BN: T.constexpr):
    x = X[0:BN]
    Y[0:BN] = x.to(Z.dtype).to(T.float32)  # a cast
    Z[0:BN] = x  # a store's cast


@pytest.mark.parametrize("dtype,limit", [(torch.float8_e4m3fn, 448.0), (torch.float8_e5m2, 57344.0)])
def test_fp8_casts_saturate_as_the_interpreter_does(dtype, limit):
    # the GPU's cvt.rn.satfinite: out-of-range values and infinities to +-max, NaN stays NaN; the interpreter
    # (tests/frontend/test_interpreter.py) is held to the same values
    x = torch.tensor([1e6, -1e6, float("inf"), float("-inf"), 3 * limit, 1.5, float("nan"), -0.25], device="cuda")
    y, z = torch.full((8,), float("nan"), device="cuda"), torch.zeros(8, dtype=dtype, device="cuda")
    to_fp8[(1,)](x, y, z, BN=8)
    want = torch.tensor([limit, -limit, limit, -limit, limit, 1.5, float("nan"), -0.25], device="cuda")
    for got in (y, z.float()):
        assert torch.equal(got[:6], want[:6]) and got[6].isnan() and got[7] == -0.25, got


@pytest.mark.parametrize("tile", TILES, ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("pair", FP8_PAIRS)
def test_fp8(pair, shape, layout, tile):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 tensor cores need sm_89+")
    m, n, k = shape
    ta, tb = LAYOUTS[layout]
    torch.manual_seed(m * 7 + n + k)
    da, db = FP8_PAIRS[pair]
    a, b, am, bm_ = _operands(m, n, k, ta, tb, _fp8(da), _fp8(db))
    c = torch.full((m, n), float("nan"), device="cuda")
    _run(a, b, c, m, n, tile, ta, tb, T.float32)
    ref = am.double() @ bm_.double()
    # Products of fp8 values are exact; the tensor cores' sums are not float32-exact on Hopper (fewer bits kept),
    # so the bound is relative to sum |a||b|, far below what a misplaced fragment produces (~sqrt(K) x larger).
    bound = (am.double().abs() @ bm_.double().abs()) * 2.0 ** -7 + 1e-3
    assert not c.isnan().any(), "some outputs were never written"
    assert ((c.double() - ref).abs() <= bound).all(), f"max error {(c.double() - ref).abs().max().item():.3g}"


@pytest.mark.parametrize("dtype,limit", [(torch.float8_e4m3fn, 448.0), (torch.float8_e5m2, 57344.0)])
def test_fp8_values_near_the_format_limits(dtype, limit):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 tensor cores need sm_89+")
    torch.manual_seed(3)
    m, n, k = 130, 136, 256
    signs = lambda *s: torch.randint(0, 2, s, device="cuda").float() * 2 - 1  # noqa: E731
    a = (signs(m, k) * limit * torch.where(torch.rand(m, k, device="cuda") < 0.5, 1.0, 2.0 ** -6)).to(dtype)
    bt = (signs(n, k) * torch.where(torch.rand(n, k, device="cuda") < 0.1, limit, 1.0)).to(dtype)
    assert a.float().abs().max().item() == limit
    c = torch.full((m, n), float("nan"), device="cuda")
    _run(a, bt, c, m, n, TILES[0], False, True, T.float32)
    ref = a.double() @ bt.double().T
    bound = (a.double().abs() @ bt.double().abs().T) * 2.0 ** -7
    assert torch.isfinite(c).all()
    assert ((c.double() - ref).abs() <= bound).all()


@pytest.mark.parametrize("tile", TILES, ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_int8_exact(shape, layout, tile):
    m, n, k = shape
    ta, tb = LAYOUTS[layout]
    torch.manual_seed(m + n * 3 + k)

    def make(*s):
        return torch.randint(-128, 128, s, device="cuda", dtype=torch.int8)
    a, b, am, bm_ = _operands(m, n, k, ta, tb, make, make)
    c = torch.full((m, n), -(2 ** 31), device="cuda", dtype=torch.int32)
    _run(a, b, c, m, n, tile, ta, tb, T.int32)
    assert torch.equal(c.cpu().long(), am.cpu().long() @ bm_.cpu().long())


def _tf32(x: torch.Tensor) -> torch.Tensor:
    return (x.contiguous().view(torch.int32) & -8192).view(torch.float32)


# (BM, BN, BK bytes, warps) for float32: 128 bytes of K = BK 32.
@pytest.mark.parametrize("tile", TILES, ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES[:3], ids=lambda s: "x".join(map(str, s)))
def test_float32_precisions(shape, layout, tile):
    """tf32 equals the product of tf32-truncated inputs (to float32 summation error); tf32x3 and ieee match the
    exact product to near float32 accuracy, tf32x3 at least 16x closer than tf32."""
    m, n, k = shape
    ta, tb = LAYOUTS[layout]
    torch.manual_seed(m + n + k * 5)

    def make(*s):
        return torch.randn(*s, device="cuda")
    a, b, am, bm_ = _operands(m, n, k, ta, tb, make, make)
    exact = am.double() @ bm_.double()
    scale = am.double().abs() @ bm_.double().abs()
    errors = {}
    for precision in ("tf32", "tf32x3", "ieee"):
        c = torch.full((m, n), float("nan"), device="cuda")
        _run(a, b, c, m, n, tile, ta, tb, T.float32, precision)
        assert not c.isnan().any(), f"{precision}: some outputs were never written"
        if precision == "tf32":
            truncated = _tf32(am).double() @ _tf32(bm_).double()
            assert ((c.double() - truncated).abs() <= scale * 2.0 ** -15 + 1e-6).all(), precision
        else:
            assert ((c.double() - exact).abs() <= scale * 2.0 ** -15 + 1e-6).all(), precision
        errors[precision] = (c.double() - exact).abs().max().item()
    assert errors["tf32x3"] * 16 < errors["tf32"], errors


def test_a_matmul_of_float32_tiles_defaults_to_tf32():
    @tilejit.kernel
    def plain(A, B, C, BM: T.constexpr):
        C[0:BM, 0:BM] = A[0:BM, 0:BM] @ B[0:BM, 0:BM]

    torch.manual_seed(5)
    a, b = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    c = torch.full((64, 64), float("nan"), device="cuda")
    plain[(1,)](a, b, c, BM=64)
    truncated = _tf32(a).double() @ _tf32(b).double()
    scale = a.double().abs() @ b.double().abs()
    assert ((c.double() - truncated).abs() <= scale * 2.0 ** -15).all()
    assert (c.double() - a.double() @ b.double()).abs().max().item() > 1e-4  # it did round: not exact float32


def test_scaled_mm_example_matches_torch():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 tensor cores need sm_89+")
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "scaled_mm.py"
    spec = importlib.util.spec_from_file_location("scaled_mm_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.manual_seed(11)
    m, n, k = 1000, 520, 777
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    bt = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    sa, sb = torch.rand(m, device="cuda") + 0.5, torch.rand(n, device="cuda") + 0.5
    out = example.scaled_mm(a, bt, sa, sb, out_dtype=torch.bfloat16)
    ref = (a.double() @ bt.double().T) * sa.double()[:, None] * sb.double()[None, :]
    bound = (a.double().abs() @ bt.double().abs().T) * sa.double()[:, None] * sb.double()[None, :] * 2.0 ** -7
    assert ((out.double() - ref).abs() <= bound + ref.abs() * 2.0 ** -7).all()


def test_narrowing_float_to_int_saturates():
    """Float to int8 / uint8 / int16 saturates toward zero (NaN to 0): the values tests/backend/
    test_narrowing_casts.py checks in the interpreter, on the GPU."""
    @tilejit.kernel
    def narrowing(X, I8, U8, I16, BLOCK: T.constexpr):
        x = X[0:BLOCK]
        I8[0:BLOCK] = x
        U8[0:BLOCK] = x.to(T.uint8)
        I16[0:BLOCK] = x.to(T.float16).to(T.int16)

    values = [300.0, -300.0, 2.7, -2.7, 127.9, -128.9, 0.5, -0.5, 255.5, 1e10, -1e10, float("nan"), 65.0, 7e4,
              -7e4, 3.0]
    x = torch.tensor(values, device="cuda")
    outs = [torch.full((16,), 99, dtype=dt, device="cuda") for dt in (torch.int8, torch.uint8, torch.int16)]
    narrowing[(1,)](x, *outs, BLOCK=16)

    def sat(v, lo, hi):
        return torch.nan_to_num(v.double(), nan=0.0).trunc().clamp(lo, hi)

    want = [sat(x.cpu(), -128, 127), sat(x.cpu(), 0, 255), sat(x.cpu().half(), -2**15, 2**15 - 1)]
    for got, expected in zip(outs, want):
        assert torch.equal(got.cpu().long().double(), expected), (got, expected)
