"""Atomics: T.atomic_add/max/min/xchg/cas on slices, single elements and index tiles, through the interpreter
against torch references, their IR, their CUDA text, and located errors for misuse."""
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


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32, torch.float64, torch.float16,
                                   torch.bfloat16])
@pytest.mark.parametrize("op", ["add", "max", "min"])
def test_atomic_rows_interpreter(interpret, op, dtype):
    P, N = 7, 13
    if dtype.is_floating_point:
        v = torch.randn(P, N, dtype=torch.float64).to(dtype)
        c0 = torch.randn(N, dtype=torch.float64).to(dtype)
    else:
        v = torch.randint(-1000, 1000, (P, N), dtype=dtype)
        c0 = torch.randint(-1000, 1000, (N,), dtype=dtype)
    c = c0.clone()
    count = torch.zeros(1, dtype=torch.int32)
    lk.atomic_rows[(P,)](v, c, count, OP=op, BN=16, SEM="acq_rel")  # BN > N: 3 elements skipped
    fn = {"add": torch.add, "max": torch.maximum, "min": torch.minimum}[op]
    expected = c0.clone()
    for p in range(P):  # program after program, as the interpreter runs them
        expected = fn(expected, v[p])
    torch.testing.assert_close(c, expected)
    assert count.item() == P


def test_atomic_xchg_returns_old_values(interpret):
    P, N = 5, 6
    c = torch.full((N,), -1, dtype=torch.int32)
    old = torch.full((P, 8), 99, dtype=torch.int32)
    lk.atomic_xchg_old[(P,)](c, old, BN=8)
    # sequential programs: program p takes out p - 1 (program 0 the initial -1); columns past N read 0
    assert (c == P - 1).all()
    for p in range(P):
        assert old[p, :N].tolist() == [p - 1] * N and old[p, N:].tolist() == [0, 0]


def test_atomic_2d_old_values(interpret):
    BM, BN = 8, 16
    c0 = torch.randn(13, 21)
    x = torch.randn(13, 21)
    c = c0.clone()
    gm, gn = 3, 3
    old = torch.full((gm, gn, BM, BN), float("nan"))
    lk.atomic_2d_old[(gm, gn)](c, x, old, BM=BM, BN=BN)
    ref = c0.clone().double()
    for pn in range(gn):  # the interpreter's order: program_id(0) fastest
        for pm in range(gm):
            m0, n0 = pm * BM // 2, pn * BN // 2
            window = ref[m0:m0 + BM, n0:n0 + BN]
            expected_old = torch.zeros(BM, BN, dtype=torch.float64)
            expected_old[:window.shape[0], :window.shape[1]] = window
            torch.testing.assert_close(old[pm, pn].double(), expected_old, atol=1e-5, rtol=1e-5)
            window += x[m0:m0 + BM, n0:n0 + BN].double()
    torch.testing.assert_close(c.double(), ref, atol=1e-5, rtol=1e-5)


def test_spin_lock_counter_interpreter(interpret):
    lock = torch.zeros(1, dtype=torch.int32)
    counter = torch.zeros(1, dtype=torch.int32)
    order = torch.full((6,), -1, dtype=torch.int32)
    lk.spin_lock_counter[(6,)](lock, counter, order)
    assert lock.item() == 0 and counter.item() == 6
    assert sorted(order.tolist()) == list(range(6))


def test_histogram_duplicates_and_out_of_range(interpret):
    x = torch.randint(-3, 20, (1000,), dtype=torch.int32)
    hist = torch.zeros(16, dtype=torch.int32)
    lk.histogram[(8,)](x, hist, BLOCK=128)  # 1024 lanes: the last 24 add 0
    inside = x[(x >= 0) & (x < 16)]
    assert hist.tolist() == torch.bincount(inside.long(), minlength=16).int().tolist()


def test_atomic_cas_elementwise(interpret):
    @tilejit.kernel
    def k(C, Cmp, Old, BN: T.constexpr):
        Old[0:BN] = T.atomic_cas(C[0:BN], Cmp[0:BN], 7.5, sem="relaxed", scope="cta")

    c = torch.tensor([1.0, 2.0, 3.0, -0.0, float("nan")])
    cmp = torch.tensor([1.0, 5.0, 3.0, 0.0, float("nan")])
    old = torch.zeros(5)
    k[(1,)](c, cmp, old, BN=5)
    assert old.tolist()[:4] == [1.0, 2.0, 3.0, -0.0] and old[4].isnan()
    # bitwise compare: -0.0 != 0.0; a NaN of the same bits matches
    assert c.tolist() == [7.5, 2.0, 7.5, -0.0, 7.5]


def test_atomic_scalar_returns_old(interpret):
    @tilejit.kernel
    def k(C, Out):
        p = T.program_id(0)
        Out[p] = T.atomic_add(C[1], p + 1)

    c = torch.zeros(3, dtype=torch.int64)
    out = torch.zeros(4, dtype=torch.int64)
    k[(4,)](c, out)
    assert c.tolist() == [0, 10, 0] and out.tolist() == [0, 1, 3, 6]


def test_atomic_ir():
    ir = lk.atomic_rows.ir(meta(4, 10), meta(10), meta(1, dtype=torch.int32), OP="min", BN=16, SEM="release")
    filecheck(ir, r"""
        CHECK: %v = tj.load %V
        CHECK: tj.atomic %C, %v, {{%[0-9]+}} {op = min, sem = release, scope = gpu, shape = [16]} : tile<16xf32>
        CHECK: tj.atomic %Count, {{%[0-9]+}}, {{%[0-9]+}} {op = add, sem = release, scope = gpu, shape = [1], dropped = [0]} : i32
    """)
    ir = lk.histogram.ir(meta(100, dtype=torch.int32), meta(16, dtype=torch.int32), BLOCK=128)
    filecheck(ir, r"""
        CHECK: tj.atomic %Hist, {{%[0-9]+}}, %bins, {{%[0-9]+}} {op = add, sem = relaxed, scope = gpu, shape = [128], axis = 0} : tile<128xi32>
    """)


def test_atomic_cuda_text():
    cuda = lk.atomic_rows.compile(meta(4, 10), meta(10), meta(1, dtype=torch.int32), OP="add", BN=16,
                                  SEM="relaxed", arch="sm_80", stop_after="cuda").cuda
    # results unused, relaxed: red; the single-element counter is thread 0's
    filecheck(cuda, r"""
        CHECK: red.relaxed.gpu.global.add.f32 [%0], %1;
        CHECK: red.relaxed.gpu.global.add.u32 [%0], %1;
        CHECK: tj_atomic_rows(
        CHECK: if ({{.*}}) tj_red_add_float32_relaxed_gpu(
        CHECK: if (tid == 0 && {{.*}}) tj_red_add_int32_relaxed_gpu(
    """)
    cuda = lk.atomic_rows.compile(meta(4, 10), meta(10), meta(1, dtype=torch.int32), OP="max", BN=16,
                                  SEM="acq_rel", arch="sm_90a", stop_after="cuda").cuda
    filecheck(cuda, r"""
        CHECK: atom.acq_rel.gpu.global.cas.b32
        CHECK: tj_atom_max_float32_acq_rel_gpu
        CHECK: atom.acq_rel.gpu.global.add.u32
        CHECK: __syncthreads();
        CHECK: if (tid == 0 && {{.*}}) tj_atom_add_int32_acq_rel_gpu(
        CHECK: __syncthreads();
    """)
    cuda = lk.atomic_xchg_old.compile(meta(8, dtype=torch.int64), meta(4, 8, dtype=torch.int64), BN=8,
                                      arch="sm_80", stop_after="cuda").cuda
    assert "atom.acq_rel.gpu.global.exch.b64 %0, [%1], %2;" in cuda


# -- misuse: located errors ----------------------------------------------------------------------------------

@tilejit.kernel
def k_atomic_bool(X, BN: T.constexpr):
    T.atomic_add(X[0:BN], True)  # ERR


@tilejit.kernel
def k_atomic_fp8(X, BN: T.constexpr):
    T.atomic_max(X[0:BN], 1.0)  # ERR


@tilejit.kernel
def k_atomic_bad_sem(X, BN: T.constexpr):
    T.atomic_add(X[0:BN], 1.0, sem="seq_cst")  # ERR


@tilejit.kernel
def k_atomic_bad_scope(X, BN: T.constexpr):
    T.atomic_add(X[0:BN], 1.0, scope="device")  # ERR


@tilejit.kernel
def k_atomic_not_a_window(X, BN: T.constexpr):
    x = X[0:BN]
    T.atomic_add(x, 1.0)  # ERR


@tilejit.kernel
def k_atomic_tile_into_element(X, BN: T.constexpr):
    T.atomic_add(X[0], X[0:BN])  # ERR


@tilejit.kernel
def k_atomic_missing_value(X, BN: T.constexpr):
    T.atomic_cas(X[0:BN], 1.0)  # ERR


@tilejit.kernel
def k_atomic_float_index(X, I, BN: T.constexpr):
    T.atomic_add(X[I[0:BN]], 1.0)  # ERR


ERROR_CASES = [
    (k_atomic_bool, (meta(64, dtype=torch.bool),), "T.atomic_add on a bool tensor is not supported", "T.atomic_add"),
    (k_atomic_fp8, (meta(64, dtype=torch.float8_e4m3fn),), "T.atomic_max on a float8_e4m3fn tensor is not supported",
     "T.atomic_max"),
    (k_atomic_bad_sem, (meta(64),), "sem must be one of 'relaxed', 'acquire', 'release', 'acq_rel', got 'seq_cst'",
     '"seq_cst"'),
    (k_atomic_bad_scope, (meta(64),), "scope must be one of 'gpu', 'cta', 'sys', got 'device'", '"device"'),
    (k_atomic_not_a_window, (meta(64),), "must be a tensor window", "x, 1.0"),
    (k_atomic_tile_into_element, (meta(64),), "cannot use a tile of shape (16,) with one element", "T.atomic_add"),
    (k_atomic_missing_value, (meta(64),), "missing val: T.atomic_cas(X[...], cmp, val", "T.atomic_cas"),
    (k_atomic_float_index, (meta(64), meta(64)), "an index tile must be a 1-D integer tile", "I[0:BN]"),
]


@pytest.mark.parametrize("kernel, args, phrase, at", ERROR_CASES, ids=[c[0].__name__ for c in ERROR_CASES])
def test_atomic_misuse_is_located(kernel, args, phrase, at):
    import inspect

    with pytest.raises(tilejit.CompilationError) as info:
        kernel.ir(*args, BN=16)
    err = info.value
    lines, first = inspect.getsourcelines(kernel.fn)
    (lineno, line), = [(first + i, l.rstrip("\n")) for i, l in enumerate(lines) if "# ERR" in l]
    assert err.lineno == lineno, str(err)
    assert phrase in err.message, str(err)
    shown, caret = str(err).split("\n")[1:3]
    assert shown[caret.index("^"):].startswith(at), str(err)


# -- the split-K example ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("M, N, K, split_k", [(70, 50, 300, 3), (33, 64, 96, 4), (16, 16, 40, 1)])
def test_splitk_example_interpreter(interpret, M, N, K, split_k):
    ex = lk.load_example("splitk_matmul")
    torch.manual_seed(0)
    A = torch.randn(M, K, dtype=torch.float16)
    B = torch.randn(K, N, dtype=torch.float16)
    C = ex.splitk_matmul(A, B, split_k, BM=32, BN=32, BK=16)
    ref = A.double() @ B.double()
    torch.testing.assert_close(C.double(), ref, atol=1e-3, rtol=1e-4)


def test_splitk_example_main_interpreter(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("main() runs on the GPU here")
    ex = lk.load_example("splitk_matmul")
    # main() sets TILEJIT_INTERPRET=1 itself; setting it through monkeypatch first makes teardown undo it
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    assert ex.main() == 0


# -- replicated values and atomics in loops ---------------------------------------------------------------------

def test_atomic_of_a_reduction_interpreter(interpret):
    x = torch.randn(100, 300)
    row_max = torch.full((100,), float("-inf"))
    row_sum = torch.zeros(100)
    lk.row_max_atomic[(2, 5)](x, row_max, row_sum, BM=64, BN=64)
    assert torch.equal(row_max, x.amax(1))
    torch.testing.assert_close(row_sum, x.sum(1), rtol=1e-5, atol=1e-4)


def test_atomic_of_a_reduction_gets_one_owner_per_element():
    """A reduction's result is held by every thread that reduced it: the atomic must not add it once per holder,
    so the layout pass converts it to a blocked layout first."""
    stages = lk.row_max_atomic.compile(meta(100, 300), meta(100), meta(100), BM=64, BN=64, arch="sm_80",
                                       stop_after="passes")
    filecheck(stages.final_ir, r"""
        CHECK: tj.reduce {{.*}} {axis = 1, kind = max} : tile<64xf32, reg, #slice<
        CHECK: [[V:%[0-9]+]] = tj.convert_layout {{%[0-9]+}} : tile<64xf32, reg, #blocked<threads=128, vec=1>>
        CHECK: tj.atomic %RowMax, [[V]], %m0 {op = max
    """)


def test_atomic_in_a_loop_interpreter(interpret):
    x = torch.randn(100, 300)
    partial = torch.zeros(64)
    lk.atomic_in_loop[(4,)](x, partial, 300, BM=32, BK=64)
    expected = torch.zeros(64, dtype=torch.float64)
    for k0 in range(0, 300, 64):
        block = x[:, k0:k0 + 64].double().sum(0)
        expected[:block.shape[0]] += block
    torch.testing.assert_close(partial.double(), expected, rtol=1e-5, atol=1e-4)
