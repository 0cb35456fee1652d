"""The language constructs of tests/lang_kernels.py on the GPU: scalar indexing, atomics under contention, split-K,
gather and scatter with duplicate and out-of-range indices, the extra math functions, bounded views, matrix
products, tensor lists, alignment promises. Outputs are NaN-poisoned where a
missed element would otherwise go unnoticed; shapes are not multiples of the tiles."""
from __future__ import annotations

import pytest
import torch

import lang_kernels as lk

pytestmark = pytest.mark.gpu


def test_scalar_index_gpu():
    x = torch.randn(37, 29, device="cuda")
    y = torch.full((37, 29), float("nan"), device="cuda")
    lk.scalar_index[(37,)](x, y, BN=32)  # columns 29..31 are out of bounds
    torch.testing.assert_close(y, 2 * x + x[:, :1])


@pytest.mark.parametrize("i, j", [(3, 5), (-1, 2), (3, 40), (9, 0)])
def test_scalar_index_mixed_gpu(i, j):
    x = torch.randn(8, 16, device="cuda")
    y = torch.full((16,), float("nan"), device="cuda")
    out = torch.full((8, 16), 7.0, device="cuda")
    lk.scalar_index_mixed[(1,)](x, y, out, i, j, BN=16)
    inside = 0 <= i < 8 and 0 <= j < 16
    v = x[i, j] if inside else torch.tensor(0.0, device="cuda")
    expected_out = torch.full((8, 16), 7.0, device="cuda")
    if inside:
        expected_out[i, j] = 3 * v
    torch.testing.assert_close(out, expected_out)
    row = x[i] if 0 <= i < 8 else torch.zeros(16, device="cuda")
    torch.testing.assert_close(y, row + v)


# -- atomics ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("op", ["add", "max", "min"])
@pytest.mark.parametrize("sem", ["relaxed", "acq_rel"])
def test_atomic_contention_exact_integers(op, dtype, sem):
    """4096 programs combine their rows into the same 100 cells: exact results; Count[0] counts the programs."""
    P, N = 4096, 100
    hi = 2**40 if dtype == torch.int64 else 1000
    v = torch.randint(-hi, hi, (P, N), device="cuda", dtype=dtype)
    c0 = torch.randint(-hi, hi, (N,), device="cuda", dtype=dtype)
    c = c0.clone()
    count = torch.zeros(1, device="cuda", dtype=torch.int32)
    lk.atomic_rows[(P,)](v, c, count, OP=op, BN=128, SEM=sem)  # BN > N: 28 elements skipped
    if op == "add":
        expected = (c0.long() + v.long().sum(0)).to(dtype)
    elif op == "max":
        expected = torch.maximum(c0, v.amax(0))
    else:
        expected = torch.minimum(c0, v.amin(0))
    assert torch.equal(c, expected)
    assert count.item() == P


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("op", ["add", "max", "min"])
def test_atomic_contention_floats(op, dtype):
    P, N = 2048, 77
    v = torch.randn(P, N, device="cuda", dtype=dtype)
    c0 = torch.randn(N, device="cuda", dtype=dtype)
    c = c0.clone()
    count = torch.zeros(1, device="cuda", dtype=torch.int32)
    lk.atomic_rows[(P,)](v, c, count, OP=op, BN=128, SEM="acq_rel")
    if op == "add":
        torch.testing.assert_close(c.double(), c0.double() + v.double().sum(0), atol=1e-3, rtol=1e-4)
    else:  # max/min are exact whatever the order
        expected = torch.maximum(c0, v.amax(0)) if op == "max" else torch.minimum(c0, v.amin(0))
        assert torch.equal(c, expected)
    assert count.item() == P


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", ["add", "max", "min"])
def test_atomic_contention_16bit_floats(op, dtype):
    """f16/bf16 atomics (add: atom.add.noftz, or a CAS loop where the hardware has none; max/min: a CAS loop).
    Adds of small integers are exact (bf16 holds every integer up to 256)."""
    P, N = 200, 77
    if op == "add":
        v = torch.randint(-1, 2, (P, N), device="cuda").to(dtype)
        c0 = torch.zeros(N, device="cuda", dtype=dtype)
    else:
        v = torch.randn(P, N, device="cuda").to(dtype)
        c0 = torch.randn(N, device="cuda").to(dtype)
    c = c0.clone()
    count = torch.zeros(1, device="cuda", dtype=torch.int32)
    lk.atomic_rows[(P,)](v, c, count, OP=op, BN=128, SEM="acq_rel")
    if op == "add":
        expected = (c0.double() + v.double().sum(0)).to(dtype)
    else:
        expected = torch.maximum(c0, v.amax(0)) if op == "max" else torch.minimum(c0, v.amin(0))
    assert torch.equal(c, expected)
    assert count.item() == P


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32, torch.bfloat16])
def test_atomic_xchg_old_values_gpu(dtype):
    """Per column, the old values the programs took out plus the final value are the initial value and each
    program id exactly once; out-of-bounds columns read 0."""
    P, N, BN = (256 if dtype == torch.bfloat16 else 512), 50, 64  # bf16 holds the integers up to 256 exactly
    c = torch.full((N,), -1, device="cuda", dtype=dtype)
    old = torch.full((P, BN), 99, device="cuda", dtype=dtype)
    lk.atomic_xchg_old[(P,)](c, old, BN=BN)
    taken = torch.cat([old[:, :N], c[None, :]], 0).double().sort(0).values
    expected = torch.arange(-1, P, device="cuda", dtype=torch.float64)[:, None].expand(P + 1, N)
    assert torch.equal(taken, expected)
    assert (old[:, N:] == 0).all()


def test_atomic_2d_overlapping_windows_gpu():
    """Tile atomics on windows that overlap (each cell is hit by up to 4 programs) and run past C's edges:
    exact int32 totals; old values outside C are 0."""
    M, N, BM, BN = 100, 150, 32, 64
    gm, gn = -(-M // (BM // 2)), -(-N // (BN // 2))
    x = torch.randint(-50, 50, (M, N), device="cuda", dtype=torch.int32)
    c0 = torch.randint(-50, 50, (M, N), device="cuda", dtype=torch.int32)
    c = c0.clone()
    old = torch.full((gm, gn, BM, BN), 12345, device="cuda", dtype=torch.int32)
    lk.atomic_2d_old[(gm, gn)](c, x, old, BM=BM, BN=BN)
    expected = c0.clone()
    for pm in range(gm):
        for pn in range(gn):
            m0, n0 = pm * BM // 2, pn * BN // 2
            expected[m0:m0 + BM, n0:n0 + BN] += x[m0:m0 + BM, n0:n0 + BN]
            rows, cols = max(0, min(BM, M - m0)), max(0, min(BN, N - n0))
            assert (old[pm, pn, rows:, :] == 0).all() and (old[pm, pn, :, cols:] == 0).all()
    assert torch.equal(c, expected)


def test_spin_lock_gpu():
    """A lock (atomic_cas acquire / atomic_xchg release, one element, the whole program synchronized around each)
    makes a plain read-modify-write of a counter exact under contention."""
    P = 64
    lock = torch.zeros(1, device="cuda", dtype=torch.int32)
    counter = torch.zeros(1, device="cuda", dtype=torch.int32)
    order = torch.full((P,), -1, device="cuda", dtype=torch.int32)
    lk.spin_lock_counter[(P,)](lock, counter, order)
    torch.cuda.synchronize()
    assert lock.item() == 0 and counter.item() == P
    assert sorted(order.tolist()) == list(range(P))


def test_histogram_gpu():
    """An indexed atomic_add: duplicate bins accumulate exactly, out-of-range bins are skipped."""
    x = torch.randint(-3, 20, (100_003,), device="cuda", dtype=torch.int32)
    hist = torch.zeros(16, device="cuda", dtype=torch.int32)
    lk.histogram[(-(-x.numel() // 256),)](x, hist, BLOCK=256)
    inside = x[(x >= 0) & (x < 16)]
    assert torch.equal(hist, torch.bincount(inside.long(), minlength=16).int())


@pytest.mark.parametrize("scope", ["cta", "gpu", "sys"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32, torch.float64, torch.float16])
def test_atomic_cas_gpu(scope, dtype):
    c0 = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8], device="cuda").to(dtype)
    cmp = torch.tensor([1, 0, 3, 0, 5, 0, 0, 8], device="cuda").to(dtype)
    c = c0.clone()
    old = torch.full((8,), -1, device="cuda", dtype=dtype)
    lk.atomic_cas_scoped[(1,)](c, cmp, old, BN=8, SCOPE=scope)
    assert torch.equal(old, c0)
    assert torch.equal(c, torch.where(c0 == cmp, torch.full_like(c0, 7), c0))


# -- split-K ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("M, N, K, split_k, tiles, warps", [
    (64, 96, 8192, 8, (64, 64, 32), 4),
    (200, 300, 4097, 5, (64, 64, 32), 4),
    (129, 257, 3000, 3, (128, 128, 64), 8),
])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_splitk_matches_plain_matmul(M, N, K, split_k, tiles, warps, dtype):
    from kernels import matmul

    ex = lk.load_example("splitk_matmul")
    BM, BN, BK = tiles
    torch.manual_seed(0)
    A = torch.randn(M, K, device="cuda", dtype=dtype)
    B = torch.randn(K, N, device="cuda", dtype=dtype)
    C = ex.splitk_matmul(A, B, split_k, BM, BN, BK, num_warps=warps)
    plain = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float32)
    matmul[(-(-M // BM), -(-N // BN))](A, B, plain, BM=BM, BN=BN, BK=BK, num_warps=warps)
    ref = A.double() @ B.double()
    tol = 1e-5 * K ** 0.5 * float(ref.abs().max()) + 1e-4
    assert float((C.double() - ref).abs().max()) <= tol
    assert float((plain.double() - ref).abs().max()) <= tol
    assert float((C - plain).abs().max()) <= 2 * tol


# -- gather and scatter ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_embedding_gather_gpu(dtype, id_dtype):
    """Rows gathered by ids with duplicates and out-of-range values (zero rows); W narrower than D (zero
    columns); 1000 ids in blocks of 64 (the last block partly outside Ids)."""
    w = torch.randn(300, 120, device="cuda").to(dtype)
    ids = torch.randint(-20, 320, (1000,), device="cuda", dtype=id_dtype)
    ids[:10] = 7  # duplicates for sure
    out = torch.full((1000, 128), float("nan"), device="cuda", dtype=dtype)
    lk.embedding[(-(-1000 // 64),)](ids, w, out, BM=64, D=128)
    expected = torch.zeros(1000, 128, device="cuda", dtype=dtype)
    ok = (ids >= 0) & (ids < 300)
    expected[ok, :120] = w[ids[ok].long()]
    assert torch.equal(out, expected)


def test_gather_1d_and_cols_gpu():
    x = torch.randn(1000, device="cuda", dtype=torch.float64)
    idx = torch.randint(-5, 1005, (256,), device="cuda", dtype=torch.int32)
    y = torch.full((256,), float("nan"), device="cuda", dtype=torch.float64)
    lk.gather_1d[(2,)](x, idx, y, B=128)
    ok = (idx >= 0) & (idx < 1000)
    expected = torch.where(ok, x[idx.clamp(0, 999).long()], torch.zeros_like(y)) * 2
    assert torch.equal(y, expected)

    x2 = torch.randn(70, 9, device="cuda")
    cols = torch.tensor([8, 0, 3, 3, 9, -2, 1, 4], device="cuda", dtype=torch.int32)
    y2 = torch.full((70, 8), float("nan"), device="cuda")
    lk.gather_cols[(-(-70 // 32),)](x2, cols, y2, BM=32, BC=8)
    okc = (cols >= 0) & (cols < 9)
    expected2 = torch.zeros(70, 8, device="cuda")
    expected2[:, okc] = x2[:, cols[okc].long()]
    assert torch.equal(y2, expected2)


def test_scatter_rows_gpu():
    """Rows scattered by ids with duplicates and out-of-range ids: unwritten rows keep their value; a row hit
    several times holds, element by element, one of the written values."""
    M, R, D = 500, 300, 64
    src = torch.randn(M, D, device="cuda")
    ids = torch.randint(-10, R + 10, (M,), device="cuda", dtype=torch.int32)
    out = torch.full((R, D), -7.0, device="cuda")
    lk.scatter_rows[(-(-M // 64),)](src, ids, out, BM=64, D=D)
    ids_cpu, src_cpu, out_cpu = ids.cpu(), src.cpu() + 1, out.cpu()
    for r in range(R):
        writers = src_cpu[ids_cpu == r]
        if writers.shape[0] == 0:
            assert (out_cpu[r] == -7.0).all(), r
        else:
            assert ((out_cpu[r][None, :] == writers).any(0)).all(), r


def test_scatter_1d_duplicates_gpu():
    n = 4096
    v = torch.arange(n, device="cuda", dtype=torch.int32) * 10
    idx = torch.randint(-50, 1100, (n,), device="cuda", dtype=torch.int32)
    x = torch.full((1000,), -1, device="cuda", dtype=torch.int32)
    lk.scatter_1d[(n // 256,)](v, idx, x, B=256)
    idx_cpu, v_cpu, x_cpu = idx.cpu(), v.cpu(), x.cpu()
    for j in range(1000):
        writers = v_cpu[idx_cpu == j]
        assert (x_cpu[j].item() in writers.tolist()) if writers.numel() else x_cpu[j].item() == -1


# -- math -----------------------------------------------------------------------------------------------------

TORCH_FN = {"log2": torch.log2, "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh, "erf": torch.erf,
            "sigmoid": torch.sigmoid}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("fn", sorted(TORCH_FN) + ["fma"])
def test_math_gpu(fn, dtype):
    """Accurate (not fast-math) versions: float32 within a few ulp of the float64 reference, over a range that
    includes large arguments (sin/cos argument reduction) and saturating ones (tanh, erf, sigmoid)."""
    def inputs():
        x = torch.randn(333, 257, device="cuda", dtype=torch.float64) * 30
        return (x.abs() + 1e-3 if fn == "log2" else x).to(dtype)

    x, y, z = inputs(), inputs(), inputs()
    out = torch.full((333, 257), float("nan"), device="cuda", dtype=dtype)
    lk.math_fns[(-(-333 // 64), -(-257 // 64))](x, y, z, out, FN=fn, BM=64, BN=64)
    ref = (x.double() * y.double() + z.double()) if fn == "fma" else TORCH_FN[fn](x.double())
    if dtype == torch.float32:
        torch.testing.assert_close(out.double(), ref, rtol=2e-6, atol=1e-6 if fn != "fma" else 1e-4)
    elif dtype == torch.float64:
        torch.testing.assert_close(out, ref, rtol=1e-13, atol=1e-13 if fn != "fma" else 1e-10)
    else:  # computed in float32, rounded once to the 16-bit dtype: within one of its ulps
        eps = torch.finfo(dtype).eps
        torch.testing.assert_close(out.double(), ref, rtol=eps, atol=1e-5 if fn != "fma" else 1e-2)


def test_fma_rounds_once_gpu():
    a = torch.full((1,), 1 + 2 ** -12, device="cuda")
    out = torch.zeros(1, 1, device="cuda")
    c = torch.full((1, 1), -1.0, device="cuda")
    lk.math_fns[(1, 1)](a[:, None], a[:, None], c, out, FN="fma", BM=16, BN=16)
    assert out.item() == 2 ** -11 + 2 ** -24


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32, torch.int64])
def test_cumsum_gpu(axis, dtype):
    M, N, BM, BN = 100, 50, 64, 64
    x = (torch.randn(M, N, device="cuda") * 4).to(dtype) if dtype.is_floating_point else \
        torch.randint(-1000, 1000, (M, N), device="cuda", dtype=dtype)
    out_dtype = torch.float32 if dtype == torch.float16 else dtype
    out = torch.full((M, BN), -99, device="cuda", dtype=out_dtype)
    lk.cumsum_2d[(-(-M // BM),)](x, out, AXIS=axis, BM=BM, BN=BN)
    for m0 in range(0, M, BM):
        block = torch.zeros(BM, BN, device="cuda", dtype=torch.float64 if dtype.is_floating_point else torch.int64)
        rows = x[m0:m0 + BM]
        block[:rows.shape[0], :N] = rows.to(block.dtype)
        expected = block.cumsum(axis)[:M - m0]
        if dtype.is_floating_point:
            torch.testing.assert_close(out[m0:m0 + BM].double(), expected, rtol=1e-5, atol=1e-3)
        else:
            assert torch.equal(out[m0:m0 + BM], expected.to(dtype))


def test_cumsum_of_reduction_gpu():
    x = torch.randn(20, 50, device="cuda")
    out = torch.full((20,), float("nan"), device="cuda")
    lk.cumsum_of_reduction[(1,)](x, out, BM=32, BN=64)
    s = x.double().sum(1)
    torch.testing.assert_close(out.double(), s.cumsum(0) - s, rtol=1e-5, atol=1e-4)


# -- torch.compile --------------------------------------------------------------------------------------------

def test_torch_op_in_fullgraph_compile_gpu():
    """A model calling tilejit kernels (plain, autotuned, and one writing an argument in place) compiles with the
    default backend (inductor) and fullgraph=True, and matches eager torch."""
    torch._dynamo.reset()
    scale, scale_tuned, splitk_add_ = lk.define_torch_ops()

    def model(x, s, a, b):
        y = scale(x * 2, s).relu()
        z = scale_tuned(y, s + 1).sum(1)
        c = torch.zeros(a.shape[0], b.shape[1], device=a.device)
        splitk_add_(a, b, c, 3)
        return z, c * 2

    compiled = torch.compile(model, fullgraph=True)
    x, s = torch.randn(300, 200, device="cuda"), torch.randn(300, device="cuda")
    a = torch.randn(100, 700, device="cuda", dtype=torch.float16)
    b = torch.randn(700, 90, device="cuda", dtype=torch.float16)
    z, c = compiled(x, s, a, b)
    torch.testing.assert_close(z, ((x * 2 * s[:, None]).relu() * (s + 1)[:, None]).sum(1), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(c.double(), 2 * (a.double() @ b.double()), rtol=1e-4, atol=1e-2)
    assert torch._dynamo.explain(model)(x, s, a, b).graph_break_count == 0


# -- runtime-bounded views --------------------------------------------------------------------------------------

@pytest.mark.parametrize("rows, cols", [(30, 37), (40, 50), (100, 100), (0, 10), (-3, 5), (1, 1)])
def test_bounded_copy_gpu(rows, cols):
    x = torch.randn(40, 50, device="cuda")
    y = torch.full((40, 50), -5.0, device="cuda")
    h = torch.zeros(64, device="cuda", dtype=torch.int32)
    lk.bounded_copy[(3, 2)](x, y, h, rows, cols, BM=16, BN=32)
    r, c = max(0, min(rows, 40)), max(0, min(cols, 50))
    expected = torch.full((40, 50), -5.0, device="cuda")
    expected[:r, :c] = x[:r, :c] + 1
    if 1 <= rows <= 40 and c > 0:
        expected[rows - 1, 0] = 100.0
    assert torch.equal(y, expected)
    hb = max(0, min(cols, 64))
    assert h.tolist() == [3] * hb + [0] * (64 - hb)


@pytest.mark.parametrize("dtype, tiles, warps", [(torch.bfloat16, (128, 128, 64), 8), (torch.float16, (64, 64, 32), 4)])
def test_grouped_matmul_bounded_gpu(dtype, tiles, warps):
    """Per-group row counts: A's padding rows (filled with garbage) read as 0 through the view, C's padding rows
    stay NaN."""
    G, R, K, N = 4, 300, 520, 200
    rows = torch.tensor([300, 17, 0, 129], device="cuda", dtype=torch.int32)
    a = torch.randn(G, R, K, device="cuda", dtype=dtype)
    b = torch.randn(K, N, device="cuda", dtype=dtype)
    c = torch.full((G, R, N), float("nan"), device="cuda", dtype=dtype)
    BM, BN, BK = tiles
    lk.grouped_matmul_bounded[(-(-R // BM), -(-N // BN), G)](a, b, c, rows, BM=BM, BN=BN, BK=BK, num_warps=warps)
    for g in range(G):
        n = int(rows[g])
        ref = a[g, :n].double() @ b.double()
        torch.testing.assert_close(c[g, :n].double(), ref, rtol=2e-2, atol=2e-1)
        assert c[g, n:].isnan().all()


def test_atomic_of_a_reduction_gpu():
    """Atomics on a reduction's result (replicated over threads): each row combined once per program."""
    x = torch.randn(1000, 700, device="cuda")
    row_max = torch.full((1000,), float("-inf"), device="cuda")
    row_sum = torch.zeros(1000, device="cuda")
    lk.row_max_atomic[(-(-1000 // 64), -(-700 // 64))](x, row_max, row_sum, BM=64, BN=64)
    assert torch.equal(row_max, x.amax(1))
    torch.testing.assert_close(row_sum.double(), x.double().sum(1), rtol=1e-5, atol=1e-4)


def test_atomic_in_a_loop_gpu():
    x = torch.randint(-9, 10, (1000, 300), device="cuda").float()  # integer-valued: exact float sums
    partial = torch.zeros(64, device="cuda")
    lk.atomic_in_loop[(-(-1000 // 32),)](x, partial, 300, BM=32, BK=64)
    expected = torch.zeros(64, device="cuda", dtype=torch.float64)
    for k0 in range(0, 300, 64):
        block = x[:, k0:k0 + 64].double().sum(0)
        expected[:block.shape[0]] += block
    assert torch.equal(partial.double(), expected)


# -- matrix products: out_dtype, batched 3-D products, multiply-broadcast-sum ------------------------------------

import dot_kernels as dk  # noqa: E402
import tilejit.language as T  # noqa: E402

# (BM, BN, BK, num_warps, B given N x K): on an H100 the first two take wgmma with an f16 accumulator (N-major B
# with BN % 64 == 0, and K-major B), the last mma.sync f16.f16.f16.f16 (BK = 32 is half a 128-byte panel).
F16_ACC_CONFIGS = [(128, 128, 64, 8, False), (64, 128, 64, 4, True), (64, 64, 32, 4, False)]


@pytest.mark.parametrize("config", F16_ACC_CONFIGS)
@pytest.mark.parametrize("out", [torch.float16, torch.float32])
def test_f16_accumulation_gpu(config, out):
    """A 300 x 200 x 777 product accumulated in float16, stored to float16 and float32 tensors poisoned with
    NaN; float64 reference. |C| is about sqrt(777) ~ 28, where a float16 ulp is 2^-5: ~49 k steps of rounding
    stay well inside 0.25."""
    BM, BN, BK, warps, trans_b = config
    M, N, K = 300, 200, 777
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    c = torch.full((M, N), float("nan"), device="cuda", dtype=out)
    grid = (-(-M // BM), -(-N // BN))
    dk.matmul_out_dtype[grid](a, b.T.contiguous() if trans_b else b, c, OUT=T.float16, TRANS_B=trans_b, BM=BM,
                              BN=BN, BK=BK, num_warps=warps)
    assert not c.isnan().any()
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-2, atol=0.25)
    kernel = dk.matmul_out_dtype.compile(a, b.T.contiguous() if trans_b else b, c, OUT=T.float16, TRANS_B=trans_b,
                                         BM=BM, BN=BN, BK=BK, num_warps=warps)
    assert "f16acc" in kernel.asm["ir"]


@pytest.mark.parametrize("config", F16_ACC_CONFIGS)
def test_f16_accumulation_really_rounds_to_f16_gpu(config):
    """Every product 1 + 2^-6: past 1024 a float16 accumulator rounds each step's extra .25 away, which float32
    keeps (4160 exactly)."""
    BM, BN, BK, warps, trans_b = config
    K = 4096
    a = torch.ones(BM, K, device="cuda", dtype=torch.float16)
    b = torch.full((K, BN), 1 + 2 ** -6, device="cuda", dtype=torch.float16)
    bb = b.T.contiguous() if trans_b else b
    c16 = torch.full((BM, BN), float("nan"), device="cuda")
    c32 = torch.full((BM, BN), float("nan"), device="cuda")
    kw = dict(TRANS_B=trans_b, BM=BM, BN=BN, BK=BK, num_warps=warps)
    dk.matmul_out_dtype[(1, 1)](a, bb, c16, OUT=T.float16, **kw)
    dk.matmul_out_dtype[(1, 1)](a, bb, c32, OUT=T.float32, **kw)
    assert torch.equal(c32, torch.full_like(c32, 4160.0))
    assert (c16 == c16[0, 0]).all()
    assert c16[0, 0].item() <= 4160.0 - 20


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("computed", [False, True])
@pytest.mark.parametrize("tiles", [(2, 64, 64, 64, 4), (3, 32, 32, 16, 4)])
def test_batched_matmul_gpu(dtype, computed, tiles):
    """C[b] = A[b] @ B[b] with a 3-D accumulator carried through a K loop; 7 batches against BT = 2 or 3, the
    other dims ragged; float64 reference (float32 operands multiply in tf32, as 2-D products do)."""
    BT, BM, BN, BK, warps = tiles
    Bz, M, N, K = 7, 100, 90, 150
    a = torch.randn(Bz, M, K, device="cuda", dtype=dtype)
    b = torch.randn(Bz, K, N, device="cuda", dtype=dtype)
    c = torch.full((Bz, M, N), float("nan"), device="cuda")
    dk.batched_matmul[(-(-M // BM), -(-N // BN), -(-Bz // BT))](a, b, c, COMPUTED=computed, BT=BT, BM=BM, BN=BN,
                                                                BK=BK, num_warps=warps)
    tol = 3e-2 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_batched_dot_gpu(dtype):
    Bz, M, N, K = 5, 100, 80, 64
    a = torch.randn(Bz, M, K, device="cuda", dtype=dtype)
    b = torch.randn(Bz, K, N, device="cuda", dtype=dtype)
    c = torch.full((Bz, M, N), float("nan"), device="cuda")
    dk.batched_dot[(2, 2, 3)](a, b, c, BT=2, BM=64, BN=64, BK=64)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 1e-4), (torch.bfloat16, 1e-4)])
def test_broadcast_sum_dot_gpu(dtype, tol):
    """T.sum(a[:, :, None] * b[None, :, :], 1) as a product: float32 stays exact float32 (tf32 would be off by
    ~1e-3 relative), 16-bit operands multiply exactly and sum in float32."""
    M, N, K = 100, 90, 64
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    b = torch.randn(K, N, device="cuda", dtype=dtype)
    c = torch.full((M, N), float("nan"), device="cuda")
    dk.broadcast_sum_dot[(-(-M // 64), -(-N // 64))](a, b, c, BM=64, BN=64, BK=64)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=tol, atol=tol * 10)


# -- examples/layer_norm.py ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("M, N", [(1000, 3000), (4097, 1000), (3, 77)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_layer_norm_gpu(M, N, dtype):
    """Forward and backward against torch autograd in float64 on the same (rounded) inputs; every output of every
    kernel, the partial-sum buffers included, starts as NaN."""
    ln = lk.load_example("layer_norm")
    x = (torch.randn(M, N, device="cuda") * 2 + 0.5).to(dtype)
    w = torch.randn(N, device="cuda").to(dtype)
    b = torch.randn(N, device="cuda").to(dtype)
    dy = torch.randn(M, N, device="cuda").to(dtype)
    nan = float("nan")
    BM, BN = ln._tiles(N)
    P = -(-M // BM)
    y, dx = torch.full_like(x, nan), torch.full_like(x, nan)
    mean = torch.full((M,), nan, device="cuda")
    rstd = torch.full((M,), nan, device="cuda")
    dwp = torch.full((P, N), nan, device="cuda")
    dbp = torch.full((P, N), nan, device="cuda")
    dw, db = torch.full_like(w, nan), torch.full_like(w, nan)
    ln.layer_norm_fwd[(P,)](x, w, b, y, mean, rstd, 1e-5, BM=BM, BN=BN)
    ln.layer_norm_bwd_dx[(P,)](x, dy, w, mean, rstd, dx, dwp, dbp, BM=BM, BN=BN)
    ln.column_sums[(-(-N // 128),)](dwp, dw, BM=32, BN=128)
    ln.column_sums[(-(-N // 128),)](dbp, db, BM=32, BN=128)
    ry, rdx, rdw, rdb = ln.reference(x, w, b, dy)
    x64 = x.double()
    torch.testing.assert_close(mean.double(), x64.mean(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rstd.double(), 1 / torch.sqrt(x64.var(1, unbiased=False) + 1e-5), rtol=1e-4,
                               atol=1e-5)
    if dtype == torch.float32:
        tols = dict(y=(1e-4, 1e-4), dx=(1e-4, 1e-4), dwdb=(1e-4, 1e-3))
    else:  # the outputs are rounded to bf16 (8 bits): a relative 2^-8 of each value
        tols = dict(y=(1e-2, 2e-2), dx=(1e-2, 2e-2), dwdb=(1e-2, 1e-1))
    torch.testing.assert_close(y.double(), ry, rtol=tols["y"][0], atol=tols["y"][1])
    torch.testing.assert_close(dx.double(), rdx, rtol=tols["dx"][0], atol=tols["dx"][1])
    torch.testing.assert_close(dw.double(), rdw, rtol=tols["dwdb"][0], atol=tols["dwdb"][1])
    torch.testing.assert_close(db.double(), rdb, rtol=tols["dwdb"][0], atol=tols["dwdb"][1])


def test_layer_norm_autograd_function_gpu():
    ln = lk.load_example("layer_norm")
    x = torch.randn(4, 250, 384, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(384, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(384, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(4, 250, 384, device="cuda", dtype=torch.bfloat16)
    y = ln.LayerNorm.apply(x, w, b, 1e-5)
    y.backward(dy)
    ry, rdx, rdw, rdb = ln.reference(x, w, b, dy)
    torch.testing.assert_close(y.double(), ry, rtol=1e-2, atol=2e-2)
    torch.testing.assert_close(x.grad.double(), rdx, rtol=1e-2, atol=2e-2)
    torch.testing.assert_close(w.grad.double(), rdw, rtol=1e-2, atol=1e-1)
    torch.testing.assert_close(b.grad.double(), rdb, rtol=1e-2, atol=1e-1)


# -- tensor lists -------------------------------------------------------------------------------------------------

from tilejit.runtime.tensor_lists import TABLES  # noqa: E402

GROUPED = lk.load_example("grouped_matmul")
# ragged groups (M, N, K): one row, a K that is no multiple of BK, N smaller than a tile, a large one
LIST_GROUPS = [(1000, 700, 512), (1, 4096, 1024), (4097, 256, 333), (256, 1000, 2048), (77, 129, 64)]
LIST_CONFIGS = [(128, 128, 64, 8), (64, 64, 32, 4)]


def _list_groups(shapes, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    As = [torch.randn(m, k, device="cuda", dtype=dtype) for m, n, k in shapes]
    Bs = [torch.randn(k, n, device="cuda", dtype=dtype) for m, n, k in shapes]
    Cs = [torch.full((m, n), float("nan"), device="cuda", dtype=dtype) for m, n, k in shapes]
    return As, Bs, Cs


def _check_list_groups(As, Bs, Cs):
    """Each C against float64: float32 sums (K rounding steps of 2^-24 relative to sum |a||b| at most) rounded
    once to bfloat16 (2^-9 of |ref|; 2^-8 allowed)."""
    for a, b, c in zip(As, Bs, Cs):
        ref = a.double() @ b.double()
        bound = a.shape[1] * 2.0 ** -24 * (a.double().abs() @ b.double().abs()) + 2.0 ** -8 * ref.abs() + 1e-6
        assert torch.isfinite(c).all(), f"group {tuple(a.shape)} x {tuple(b.shape)}: unwritten (NaN) elements"
        worst = float(((c.double() - ref).abs() / bound).max())
        assert worst <= 1.0, f"group {tuple(a.shape)} x {tuple(b.shape)}: error {worst:.3g} x the bound"


def _grid_launch(As, Bs, Cs, BM, BN, BK, warps):
    tiles_m = max(-(-a.shape[0] // BM) for a in As)
    tiles_n = max(-(-b.shape[1] // BN) for b in Bs)
    lk.grouped_matmul_lists[(tiles_m, tiles_n, len(As))](As, Bs, Cs, BM=BM, BN=BN, BK=BK, num_warps=warps)


@pytest.mark.parametrize("config", LIST_CONFIGS)
@pytest.mark.parametrize("groups", [3, 5])
@pytest.mark.parametrize("kernel", ["persistent", "grid"])
def test_grouped_matmul_over_tensor_lists_gpu(kernel, groups, config):
    BM, BN, BK, warps = config
    shapes = LIST_GROUPS[:groups] if groups == 5 else [LIST_GROUPS[1], LIST_GROUPS[4], LIST_GROUPS[2]]
    As, Bs, Cs = _list_groups(shapes)
    if kernel == "persistent":
        GROUPED.grouped_matmul(As, Bs, Cs, BM=BM, BN=BN, BK=BK, num_warps=warps)
    else:
        _grid_launch(As, Bs, Cs, BM, BN, BK, warps)
    _check_list_groups(As, Bs, Cs)


def test_tensor_list_relaunch_reuses_the_table_gpu():
    As, Bs, Cs = _list_groups(LIST_GROUPS[:3], seed=1)
    GROUPED.grouped_matmul(As, Bs, Cs)
    builds = TABLES.builds
    for c in Cs:
        c.fill_(float("nan"))
    GROUPED.grouped_matmul(As, Bs, Cs)  # the same tensors: no table written
    assert TABLES.builds == builds
    _check_list_groups(As, Bs, Cs)
    As[1] = torch.randn_like(As[1])  # another tensor (another address): a new table for As only
    Cs[1].fill_(float("nan"))
    GROUPED.grouped_matmul(As, Bs, Cs)
    assert TABLES.builds == builds + 1
    _check_list_groups(As, Bs, Cs)


def test_tensor_list_launch_in_a_cuda_graph_gpu():
    """Warm up, capture, then change the inputs in place and replay: the graph's kernel reads the cached tables."""
    As, Bs, Cs = _list_groups(LIST_GROUPS[1:4], seed=2)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        GROUPED.grouped_matmul(As, Bs, Cs)  # warm-up: compiles, loads, writes the tables
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    builds = TABLES.builds
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        GROUPED.grouped_matmul(As, Bs, Cs)
    assert TABLES.builds == builds
    TABLES.clear()  # an ordinary eviction must not free what the graph reads
    for a, b, c in zip(As, Bs, Cs):
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
        c.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _check_list_groups(As, Bs, Cs)


def test_tensor_list_table_made_during_capture_gpu():
    """Tensors first seen inside a capture: the table's copy is recorded in the graph; an ordinary launch with
    the same tensors afterwards writes a table of its own."""
    As, Bs, Cs = _list_groups(LIST_GROUPS[:2], seed=3)
    GROUPED.grouped_matmul(*_list_groups(LIST_GROUPS[:2], seed=4))  # compiled and loaded before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        GROUPED.grouped_matmul(As, Bs, Cs)
    graph.replay()
    torch.cuda.synchronize()
    _check_list_groups(As, Bs, Cs)
    for c in Cs:
        c.fill_(float("nan"))
    GROUPED.grouped_matmul(As, Bs, Cs)
    torch.cuda.synchronize()
    _check_list_groups(As, Bs, Cs)


def test_tensor_list_items_len_and_out_of_range_gpu():
    xs = [torch.arange(5, device="cuda", dtype=torch.float32), torch.arange(12, device="cuda", dtype=torch.float32)[::3]]
    out = torch.full((3, 4), float("nan"), device="cuda")
    lk.list_lengths[(3,)](xs, out, BLOCK=8)
    assert out.tolist() == [[2, 5, 1, 10], [2, 4, 3, 18], [2, 0, 0, 0]]
    assert xs[0][0].item() == -1 and xs[1][0].item() == -1


# -- T.multiple_of: promises (and ints divisible by 16) that drop run-time alignment tests ---------------------------
# A hinted kernel is launched only where its promise holds (a broken promise is undefined behaviour); the same
# kernel unhinted, and on shapes, offsets and views that leave the run-time tests in, must agree.

@pytest.mark.parametrize("n, off, hint", [
    (1008, 0, True), (1008, 16, True), (1008, 5, True), (4096, 32, True), (1008, -16, True),  # n % 16 == 0
    (1008, 0, False), (1000, 0, False), (1001, 3, False), (1008, 5, False)])
def test_hinted_copy_gpu(n, off, hint):
    """Y[off + i] = 2 X[off + i] + 1 for the tiles the grid covers; the rest of Y stays NaN (off may be negative:
    the elements before 0 are not read or written)."""
    x = torch.randn(n, device="cuda")
    y = torch.full((n,), float("nan"), device="cuda")
    programs = -(-(n - off) // 256)
    lk.hinted_copy[(programs,)](x, y, off, BLOCK=256, HINT=hint)
    expected = torch.full((n,), float("nan"), device="cuda", dtype=torch.float64)
    lo, hi = max(off, 0), min(off + programs * 256, n)
    expected[lo:hi] = x[lo:hi].double() * 2 + 1
    torch.testing.assert_close(y.double(), expected, rtol=1e-6, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("off", [0, 16, 5])
def test_hinted_copy_on_misaligned_views_gpu(off):
    """Views 4 bytes into their storage are not 16-byte aligned: the specialization knows, so the hinted kernel
    tests the pointers at run time and takes its element-wise path; the promised extents (1008) hold."""
    n = 1008
    xs = torch.randn(n + 1, device="cuda")
    ys = torch.full((n + 1,), float("nan"), device="cuda")
    x, y = xs[1:], ys[1:]
    assert x.data_ptr() % 16 and y.data_ptr() % 16
    lk.hinted_copy[(-(-(n - off) // 256),)](x, y, off, BLOCK=256, HINT=True)
    expected = torch.full((n,), float("nan"), device="cuda", dtype=torch.float64)
    expected[off:] = x[off:].double() * 2 + 1
    torch.testing.assert_close(y.double(), expected, rtol=1e-6, atol=1e-6, equal_nan=True)
    assert ys[0].isnan()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M, K, N, hint", [
    (200, 776, 328, True), (200, 776, 328, False), (64, 1024, 512, True),  # K, N multiples of 8, not of the tiles
    (333, 777, 330, False), (129, 8, 8, True)])
@pytest.mark.parametrize("tiles, warps", [((64, 64, 32), 4), ((128, 128, 32), 8)])
def test_hinted_matmul_gpu(M, K, N, hint, tiles, warps, dtype):
    """The DESIGN matmul, hinted (K and N promised multiples of 8: cp.async with no run-time test and no
    element-wise fallback; on sm_90a the 64-byte-wide A tiles still take cp.async) and not, against float64;
    C starts as NaN. Where the promise holds, the two variants load the same data and run the same products: they
    agree bit for bit."""
    BM, BN, BK = tiles
    torch.manual_seed(0)
    a = torch.randn(M, K, device="cuda").to(dtype)
    b = torch.randn(K, N, device="cuda").to(dtype)
    grid = (-(-M // BM), -(-N // BN))
    c = torch.full((M, N), float("nan"), device="cuda")
    lk.hinted_matmul[grid](a, b, c, BM=BM, BN=BN, BK=BK, HINT=hint, num_warps=warps)
    ref = a.double() @ b.double()
    tol = 1e-5 * K ** 0.5 * float(ref.abs().max()) + 1e-4
    assert float((c.double() - ref).abs().max()) <= tol
    if K % 8 == 0 and N % 8 == 0:  # the promise holds: the other variant may run too
        other = torch.full((M, N), float("nan"), device="cuda")
        lk.hinted_matmul[grid](a, b, other, BM=BM, BN=BN, BK=BK, HINT=not hint, num_warps=warps)
        assert torch.equal(c, other)


@pytest.mark.parametrize("starts, hint", [
    # multiples of 16 (992 runs past the end, 2048 is wholly outside, -48 starts before it); no two segments
    # overlap (programs writing the same element would race)
    ([128, 64, 992, 480, 2048, -48], True),
    ([128, 64, 992, 480, 2048, -48], False),
    ([5, 101, 999, 430, 2001, -60], False),
])
def test_hinted_segments_gpu(starts, hint):
    """Program g copies X[s:s + 64] + g to Y for its start s = Starts[g] read from memory; elements outside
    [0, 1000) are neither read nor written; the rest of Y stays NaN."""
    n, B = 1000, 64
    x = torch.randn(n, device="cuda")
    y = torch.full((n,), float("nan"), device="cuda")
    s = torch.tensor(starts, device="cuda", dtype=torch.int32)
    lk.hinted_segments[(len(starts),)](x, y, s, BLOCK=B, HINT=hint)
    expected = torch.full((n,), float("nan"), dtype=torch.float64)
    xc = x.double().cpu()
    for g, start in enumerate(starts):
        lo, hi = max(start, 0), min(start + B, n)
        if lo < hi:
            expected[lo:hi] = xc[lo:hi] + g
    torch.testing.assert_close(y.double().cpu(), expected, rtol=1e-6, atol=1e-6, equal_nan=True)
