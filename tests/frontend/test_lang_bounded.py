"""T.bounded(C, (M, N)): runtime-bounded views honored by loads, stores, atomics and gathers; the interpreter
against torch, the IR, the CUDA text (TMA is not used through a view), located errors."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from filecheck import filecheck
import lang_kernels as lk


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


@pytest.mark.parametrize("rows, cols", [(30, 37), (40, 50), (100, 100), (0, 10), (-3, 5), (1, 1)])
def test_bounded_copy_interpreter(interpret, rows, cols):
    x = torch.randn(40, 50)
    y = torch.full((40, 50), -5.0)
    h = torch.zeros(64, dtype=torch.int32)
    lk.bounded_copy[(3, 2)](x, y, h, rows, cols, BM=16, BN=32)
    r, c = max(0, min(rows, 40)), max(0, min(cols, 50))
    expected = torch.full((40, 50), -5.0)
    expected[:r, :c] = x[:r, :c] + 1
    if 1 <= rows <= 40 and c > 0:
        expected[rows - 1, 0] = 100.0
    assert torch.equal(y, expected)
    hb = max(0, min(cols, 64))  # H is bounded to cols itself
    assert h.tolist() == [3] * hb + [0] * (64 - hb)


def test_grouped_matmul_bounded_interpreter(interpret):
    G, R, K, N = 3, 40, 48, 24
    rows = torch.tensor([40, 17, 0], dtype=torch.int32)
    a = torch.randn(G, R, K, dtype=torch.float16)
    b = torch.randn(K, N, dtype=torch.float16)
    c = torch.full((G, R, N), float("nan"), dtype=torch.float16)
    lk.grouped_matmul_bounded[(2, 1, G)](a, b, c, rows, BM=32, BN=32, BK=16)
    for g in range(G):
        n = int(rows[g])
        torch.testing.assert_close(c[g, :n].double(), (a[g, :n].double() @ b.double()).half().double(),
                                   rtol=2e-3, atol=2e-3)
        assert c[g, n:].isnan().all()  # the padding rows are not written


def test_bounded_gather(interpret):
    @tilejit.kernel
    def k(W, Ids, Out, n_valid, B: T.constexpr, D: T.constexpr):
        Wv = T.bounded(W, (n_valid, D))
        Out[0:B, 0:D] = Wv[Ids[0:B], 0:D]

    w = torch.randn(20, 8)
    ids = torch.tensor([0, 5, 12, 19, 3, 11], dtype=torch.int32)
    out = torch.full((6, 8), float("nan"))
    k[(1,)](w, ids, out, 12, B=6, D=8)
    expected = torch.where((ids < 12)[:, None], w[ids.long()], torch.zeros(6, 8))
    assert torch.equal(out, expected)


def test_bounded_ir_and_cuda():
    args = (meta(40, 50), meta(40, 50), meta(64, dtype=torch.int32), 30, 37)
    ir = lk.bounded_copy.ir(*args, BM=16, BN=32)
    filecheck(ir, r"""
        CHECK: %X_1 = tj.bounded %X, %rows, %cols : tensor<2d x f32>
        CHECK: %Y_1 = tj.bounded %Y, %rows, %cols : tensor<2d x f32>
        CHECK: %tile = tj.load %X_1[%m0, %n0]
        CHECK: tj.store {{%[0-9]+}}, %Y_1[%m0, %n0]
        CHECK: %H_1 = tj.bounded %H, %cols
        CHECK: tj.atomic %H_1
    """)
    cuda = lk.bounded_copy.compile(*args, BM=16, BN=32, arch="sm_80", stop_after="cuda").cuda
    filecheck(cuda, r"""
        CHECK: // bounded view of [[X:v[0-9]+_X]]
        CHECK: float* const [[V:v[0-9]+_X]] = [[X]];
        CHECK: const int64_t [[V]]_size0 = (int64_t)({{.*}}) < 0 ? (int64_t)0 : ((int64_t)({{.*}}) < [[X]]_size0 ? (int64_t)({{.*}}) : [[X]]_size0);
        CHECK: const int64_t [[V]]_stride1 = [[X]]_stride1;
        CHECK: < (uint64_t)[[V]]_size1
    """)


def test_bounded_loads_never_use_tma():
    stages = lk.grouped_matmul_bounded.compile(
        meta(3, 256, 512, dtype=torch.bfloat16), meta(512, 256, dtype=torch.bfloat16),
        meta(3, 256, 256, dtype=torch.bfloat16), meta(3, dtype=torch.int32), BM=128, BN=128, BK=64, num_warps=8,
        arch="sm_90a", stop_after="passes")
    filecheck(stages.final_ir, r"""
        CHECK: tj.load %A_1[{{.*}}copy = cp_async}
        CHECK: tj.load %B[{{.*}}copy = tma_bulk_tensor}
    """)


@tilejit.kernel
def k_bounded_rank(X, n, B: T.constexpr):
    Xv = T.bounded(X, (n,))  # ERR
    X[0:B, 0] = Xv[0:B, 0]


@tilejit.kernel
def k_bounded_tile(X, B: T.constexpr):
    Xv = T.bounded(X[0:B], (4,))  # ERR
    X[0:B] = Xv


@tilejit.kernel
def k_bounded_float(X, B: T.constexpr):
    Xv = T.bounded(X, (2.5,))  # ERR
    X[0:B] = Xv[0:B]


@pytest.mark.parametrize("kernel, args, phrase", [
    (k_bounded_rank, (meta(16, 16), 4), "T.bounded of the rank-2 tensor 'X' needs 2 extents, got 1"),
    (k_bounded_tile, (meta(16),), "T.bounded needs a tensor argument, got tile"),
    (k_bounded_float, (meta(16),), "T.bounded extents must be integers, got float 2.5"),
], ids=["rank", "tile", "float"])
def test_bounded_misuse_is_located(kernel, args, phrase):
    import inspect

    with pytest.raises(tilejit.CompilationError) as info:
        kernel.ir(*args, B=16)
    err = info.value
    lines, first = inspect.getsourcelines(kernel.fn)
    (lineno, _), = [(first + i, l) for i, l in enumerate(lines) if "# ERR" in l]
    assert err.lineno == lineno and phrase in err.message, str(err)


@tilejit.kernel
def k_view_in_loop(A, B, C, Rows, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, stages=3):
        Av = T.bounded(A, (Rows[0], K))
        acc += Av[0:BM, k0:k0 + BK] @ B[k0:k0 + BK, 0:BN]
    C[0:BM, 0:BN] = acc


def test_a_view_made_inside_a_pipelined_loop_is_not_prefetched(interpret):
    args = (meta(64, 256, dtype=torch.float16), meta(256, 64, dtype=torch.float16), meta(64, 64),
            meta(1, dtype=torch.int32))
    for arch in ("sm_80", "sm_90a"):
        final = k_view_in_loop.compile(*args, BM=64, BN=64, BK=32, arch=arch, stop_after="passes").final_ir
        filecheck(final, r"""
            CHECK: tj.load %A_1[{{[^]]*}}] {shape = [64, 32], copy = cp_async}
            CHECK: tj.load %B[{{[^]]*}}] {shape = [32, 64], pipeline = 3
        """)
    a, b = torch.randn(64, 256, dtype=torch.float16), torch.randn(256, 64, dtype=torch.float16)
    c = torch.zeros(64, 64)
    k_view_in_loop[(1,)](a, b, c, torch.tensor([40], dtype=torch.int32), BM=64, BN=64, BK=32)
    ref = a.double().clone()
    ref[40:] = 0
    torch.testing.assert_close(c.double(), ref @ b.double(), rtol=1e-4, atol=1e-3)
