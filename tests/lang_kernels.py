"""Kernels of the language constructs Triton users reach for: scalar indexing, atomics, gather and
scatter, the extra math functions. Shared by the interpreter tests (tests/frontend), the compile tests
(tests/backend) and the GPU tests (tests/gpu)."""
from __future__ import annotations

import torch

import tilejit
import tilejit.language as T


@tilejit.kernel
def scalar_index(X, Y, BN: T.constexpr):
    """Y[r, c] = 2 * X[r, c] + X[r, 0] for one row per program, element by element along the row's first BN
    columns (scalar loads and stores, out-of-bounds columns read 0 and are not written)."""
    r = T.program_id(0)
    first = X[r, 0]
    for c in T.static_range(BN):
        Y[r, c] = 2.0 * X[r, c] + first


@tilejit.kernel
def scalar_index_mixed(X, Y, Out, i, j, BN: T.constexpr):
    """A scalar read from a runtime position used with tiles, a scalar written at a runtime position (which may
    be out of bounds), and a row tile plus the scalar."""
    v = X[i, j]
    Out[i, j] = v * 3.0
    Y[0:BN] = X[i, 0:BN] + v


@tilejit.kernel
def atomic_rows(V, C, Count, OP: T.constexpr, BN: T.constexpr, SEM: T.constexpr):
    """Every program combines its row of V into the same cells C[0:BN] (contention), and counts itself in
    Count[0]. C may be shorter than BN: the extra elements are skipped."""
    p = T.program_id(0)
    v = V[p, 0:BN]
    if OP == "add":
        T.atomic_add(C[0:BN], v, sem=SEM)
    elif OP == "max":
        T.atomic_max(C[0:BN], v, sem=SEM)
    elif OP == "min":
        T.atomic_min(C[0:BN], v, sem=SEM)
    T.atomic_add(Count[0], 1, sem=SEM)


@tilejit.kernel
def atomic_xchg_old(C, Old, BN: T.constexpr):
    """Program p swaps p into C[0:BN] and records what it took out: per column, the old values of all programs
    plus C's final value are C's initial value and 0..P-1, each once."""
    p = T.program_id(0)
    old = T.atomic_xchg(C[0:BN], p)
    Old[p, 0:BN] = old


@tilejit.kernel
def atomic_2d_old(C, X, Old, BM: T.constexpr, BN: T.constexpr):
    """A 2-D tile atomic_add returning the old values, on windows that overlap between programs (contention) and
    run past C's edges."""
    m0 = T.program_id(0) * (BM // 2)
    n0 = T.program_id(1) * (BN // 2)
    x = X[m0:m0 + BM, n0:n0 + BN]
    old = T.atomic_add(C[m0:m0 + BM, n0:n0 + BN], x, sem="relaxed")
    Old[T.program_id(0), T.program_id(1), 0:BM, 0:BN] = old


@tilejit.kernel
def spin_lock_counter(Lock, Counter, Order):
    """A lock taken with atomic_cas (acquire) and released with atomic_xchg (release) guards a plain
    read-modify-write of Counter[0]; Order[p] records the value program p saw."""
    while T.atomic_cas(Lock[0], 0, 1, sem="acquire") != 0:
        pass
    seen = Counter[0]
    Counter[0] = seen + 1
    Order[T.program_id(0)] = seen
    T.atomic_xchg(Lock[0], 0, sem="release")


@tilejit.kernel
def histogram(X, Hist, BLOCK: T.constexpr):
    """Hist[X[i]] += 1 for every element: an indexed atomic_add with duplicate and out-of-range bins."""
    i0 = T.program_id(0) * BLOCK
    bins = X[i0:i0 + BLOCK]
    valid = i0 + T.arange(0, BLOCK) < X.shape[0]
    T.atomic_add(Hist[bins], T.where(valid, 1, 0), sem="relaxed")


@tilejit.kernel
def atomic_cas_scoped(C, Cmp, Old, BN: T.constexpr, SCOPE: T.constexpr):
    """An element-wise compare-and-swap of 7 where C equals Cmp, at the given scope; Old gets the old values."""
    Old[0:BN] = T.atomic_cas(C[0:BN], Cmp[0:BN], 7, sem="relaxed", scope=SCOPE)


def load_example(name: str):
    """A module of examples/ by file name (examples/ is not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"tilejit_examples_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@tilejit.kernel
def embedding(Ids, W, Out, BM: T.constexpr, D: T.constexpr):
    """Out[m] = W[Ids[m]] for rows of a block (a row gather); ids outside W's rows give zero rows. W may have
    fewer than D columns (the rest read 0)."""
    m0 = T.program_id(0) * BM
    ids = Ids[m0:m0 + BM]
    Out[m0:m0 + BM, 0:D] = W[ids, 0:D]


@tilejit.kernel
def gather_1d(X, Idx, Y, B: T.constexpr):
    """Y[i] = X[Idx[i]] * 2 (a 1-D gather feeding arithmetic)."""
    i0 = T.program_id(0) * B
    Y[i0:i0 + B] = X[Idx[i0:i0 + B]] * 2.0


@tilejit.kernel
def gather_cols(X, Cols, Y, BM: T.constexpr, BC: T.constexpr):
    """Y[r, j] = X[r, Cols[j]] (the indexed dim is the second one)."""
    m0 = T.program_id(0) * BM
    Y[m0:m0 + BM, 0:BC] = X[m0:m0 + BM, Cols[0:BC]]


@tilejit.kernel
def scatter_rows(Src, Ids, Out, BM: T.constexpr, D: T.constexpr):
    """Out[Ids[m]] = Src[m] + 1 (a row scatter): out-of-range ids are not written; of duplicates one row wins.
    The block's lanes past Ids' end load id 0, a valid row: they are sent out of range (-1) explicitly."""
    m0 = T.program_id(0) * BM
    ids = T.where(m0 + T.arange(0, BM) < Ids.shape[0], Ids[m0:m0 + BM], -1)
    Out[ids, 0:D] = Src[m0:m0 + BM, 0:D] + 1.0


@tilejit.kernel
def scatter_1d(V, Idx, X, B: T.constexpr):
    """X[Idx[i]] = V[i] (a 1-D scatter); lanes past Idx's end are sent out of range."""
    i0 = T.program_id(0) * B
    idx = T.where(i0 + T.arange(0, B) < Idx.shape[0], Idx[i0:i0 + B], -1)
    X[idx] = V[i0:i0 + B]


@tilejit.kernel
def math_fns(X, Y, Z, Out, FN: T.constexpr, BM: T.constexpr, BN: T.constexpr):
    """Out = FN(X) for the unary math functions, T.fma(X, Y, Z) for "fma"; on BM x BN blocks."""
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    x = X[m0:m0 + BM, n0:n0 + BN]
    if FN == "log2":
        r = T.log2(x)
    elif FN == "sin":
        r = T.sin(x)
    elif FN == "cos":
        r = T.cos(x)
    elif FN == "tanh":
        r = T.tanh(x)
    elif FN == "erf":
        r = T.erf(x)
    elif FN == "sigmoid":
        r = T.sigmoid(x)
    else:
        r = T.fma(x, Y[m0:m0 + BM, n0:n0 + BN], Z[m0:m0 + BM, n0:n0 + BN])
    Out[m0:m0 + BM, n0:n0 + BN] = r


@tilejit.kernel
def cumsum_2d(X, Out, AXIS: T.constexpr, BM: T.constexpr, BN: T.constexpr):
    """Out = cumsum of a BM x BN block of X along AXIS (elements outside X read 0)."""
    m0 = T.program_id(0) * BM
    Out[m0:m0 + BM, 0:BN] = T.cumsum(X[m0:m0 + BM, 0:BN], AXIS)


@tilejit.kernel
def cumsum_of_reduction(X, Out, BM: T.constexpr, BN: T.constexpr):
    """An exclusive scan of row sums (a SliceLayout operand): Out[m] = sum of rows before m."""
    s = T.sum(X[0:BM, 0:BN], 1)
    Out[0:BM] = T.cumsum(s, 0) - s


@tilejit.kernel
def scale_rows(X, S, Out, BM: T.constexpr, BN: T.constexpr):
    """Out = X * S[:, None] (an elementwise kernel for the torch.compile tests)."""
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    x = X[m0:m0 + BM, n0:n0 + BN].to(T.float32)
    s = S[m0:m0 + BM].to(T.float32)
    Out[m0:m0 + BM, n0:n0 + BN] = x * s[:, None]


@tilejit.autotune(configs=[tilejit.Config({"BM": 32, "BN": 32}, num_warps=4),
                           tilejit.Config({"BM": 64, "BN": 32}, num_warps=4)], key=["X"])
@tilejit.kernel
def scale_rows_tuned(X, S, Out, BM: T.constexpr, BN: T.constexpr):
    """scale_rows under the autotuner."""
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    x = X[m0:m0 + BM, n0:n0 + BN].to(T.float32)
    s = S[m0:m0 + BM].to(T.float32)
    Out[m0:m0 + BM, n0:n0 + BN] = x * s[:, None]


def define_torch_ops():
    """The torch operators of the torch.compile tests (defined once per process: torch.library names are
    global)."""
    if hasattr(define_torch_ops, "ops"):
        return define_torch_ops.ops

    def fake_scale(x, s):
        return torch.empty_like(x, dtype=torch.float32)

    @tilejit.torch_op("tilejit_test::scale_rows", fake=fake_scale)
    def scale(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape, device=x.device, dtype=torch.float32)
        scale_rows[(tilejit.cdiv(x.shape[0], 32), tilejit.cdiv(x.shape[1], 32))](x, s, out, BM=32, BN=32)
        return out

    @tilejit.torch_op("tilejit_test::scale_rows_tuned", fake=fake_scale)
    def scale_tuned(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape, device=x.device, dtype=torch.float32)
        grid = lambda meta: (tilejit.cdiv(x.shape[0], meta["BM"]), tilejit.cdiv(x.shape[1], meta["BN"]))  # noqa: E731
        scale_rows_tuned[grid](x, s, out)
        return out

    @tilejit.torch_op("tilejit_test::splitk_add_", mutates_args=("c",))
    def splitk_add_(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, split_k: int) -> None:
        ex = load_example("splitk_matmul")
        k_split = tilejit.cdiv(tilejit.cdiv(a.shape[1], split_k), 16) * 16
        grid = (tilejit.cdiv(a.shape[0], 32), tilejit.cdiv(b.shape[1], 32), tilejit.cdiv(a.shape[1], k_split))
        ex.matmul_splitk[grid](a, b, c, k_split, BM=32, BN=32, BK=16)

    define_torch_ops.ops = (scale, scale_tuned, splitk_add_)
    return define_torch_ops.ops


@tilejit.kernel
def bounded_copy(X, Y, H, rows, cols, BM: T.constexpr, BN: T.constexpr):
    """Y = X within the runtime bounds (rows, cols) of both (the rest of Y untouched, reads past the bounds are
    0); H[0:BN] += 1 through an atomic on a view bounded to cols; Y[rows, 0] = 1 through a view (skipped when
    rows is outside the bound)."""
    Xv = T.bounded(X, (rows, cols))
    Yv = T.bounded(Y, (rows, cols))
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    tile = Xv[m0:m0 + BM, n0:n0 + BN]
    Yv[m0:m0 + BM, n0:n0 + BN] = tile + 1.0
    T.atomic_add(T.bounded(H, (cols,))[n0:n0 + BN], 1, sem="relaxed")
    Yv[rows - 1 + T.program_id(0) * 0, 0] = Xv.shape[0] * 0.0 + tile.shape[0] * 0.0 + 100.0


@tilejit.kernel
def grouped_matmul_bounded(A, B, C, Rows, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """Per group g (program axis 2) C[g] = A[g] @ B over the first Rows[g] rows only: A's padding rows read as 0
    and C's padding rows are never written."""
    g = T.program_id(2)
    rows = Rows[g]
    K = A.shape[2]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    Av = T.bounded(A, (A.shape[0], rows, K))
    Cv = T.bounded(C, (C.shape[0], rows, C.shape[2]))
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, stages=3):
        acc += Av[g, m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    Cv[g, m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def row_max_atomic(X, RowMax, RowSum, BM: T.constexpr, BN: T.constexpr):
    """Program (i, j) reduces its BM x BN block of X along the columns and combines the partial row results into
    RowMax / RowSum with atomics: the value is a reduction's result (replicated over the threads that reduced it),
    which the compiler moves to one owner per element first. Padding columns read as -inf / 0."""
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    x = X[m0:m0 + BM, n0:n0 + BN]
    cols = n0 + T.arange(0, BN)
    x_max = T.where(cols[None, :] < X.shape[1], x, float("-inf"))
    T.atomic_max(RowMax[m0:m0 + BM], T.max(x_max, 1), sem="relaxed")
    T.atomic_add(RowSum[m0:m0 + BM], T.sum(x, 1), sem="relaxed")


@tilejit.kernel
def atomic_in_loop(X, Partial, K, BM: T.constexpr, BK: T.constexpr):
    """A layer-norm-backward-like partial reduction: a loop over K blocks, each adding its column sums into
    Partial[0:BK] with an atomic inside the loop body."""
    m0 = T.program_id(0) * BM
    for k0 in range(0, K, BK):
        T.atomic_add(Partial[0:BK], T.sum(X[m0:m0 + BM, k0:k0 + BK], 0), sem="relaxed")


@tilejit.kernel
def grouped_matmul_lists(As, Bs, Cs, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """Cs[g] = As[g] @ Bs[g] over tensor lists, group g on grid axis 2; tiles past a group's extents skip the K
    loop (their stores would be masked anyway). Grid z may exceed the list: those programs see empty tensors."""
    g = T.program_id(2)
    A, B, C = As[g], Bs[g], Cs[g]
    M, K = A.shape
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    if (m0 < M) & (n0 < B.shape[1]):
        acc = T.zeros((BM, BN), T.float32)
        for k0 in T.range(0, K, BK):
            acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
        C[m0:m0 + BM, n0:n0 + BN] = acc


@tilejit.kernel
def list_lengths(Xs, Out, BLOCK: T.constexpr):
    """Out[g] = (len(Xs), Xs[g].shape[0], Xs[g].stride(0), sum of Xs[g][0:BLOCK]) for g < Out.shape[0] (an index
    past the list reads an empty tensor); Xs[g][0] = -1 (a scalar store through an item)."""
    g = T.program_id(0)
    X = Xs[g]
    Out[g, 0] = len(Xs)
    Out[g, 1] = X.shape[0]
    Out[g, 2] = X.stride(0)
    Out[g, 3] = T.sum(X[0:BLOCK], 0)
    X[0] = -1.0


# -- T.multiple_of: promises that drop run-time alignment tests ------------------------------------------------

@tilejit.kernel
def hinted_copy(X, Y, off, BLOCK: T.constexpr, HINT: T.constexpr):
    """Y[off + i] = 2 * X[off + i] + 1 in BLOCK-element tiles. With HINT, both extents are promised to be
    multiples of 16: with an ``off`` divisible by 16 (or 0) every alignment test is then known at compile time and
    only the vector path is generated."""
    if HINT:
        T.multiple_of(X.shape[0], 16)
        T.multiple_of(Y.shape[0], 16)
    i0 = off + T.program_id(0) * BLOCK
    Y[i0:i0 + BLOCK] = X[i0:i0 + BLOCK] * 2.0 + 1.0


@tilejit.kernel
def hinted_matmul(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr, HINT: T.constexpr):
    """The DESIGN matmul; with HINT, K (A's columns) and N (B's and C's columns) are promised to be multiples of 8,
    so the cp.async copies of 16-bit operands need no run-time test and no element-wise fallback, and C's store no
    alignment test."""
    M, K = A.shape
    N = B.shape[1]
    if HINT:
        T.multiple_of(K, 8)
        T.multiple_of(N, 8)
        T.multiple_of(C.shape[1], 8)
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, stages=3):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def hinted_segments(X, Y, Starts, BLOCK: T.constexpr, HINT: T.constexpr):
    """Program g copies Y[s:s + BLOCK] = X[s:s + BLOCK] + g for s = Starts[g], a start read from memory; with HINT
    it is promised to be a multiple of 16."""
    g = T.program_id(0)
    s = Starts[g]
    if HINT:
        s = T.multiple_of(s, 16)
    Y[s:s + BLOCK] = X[s:s + BLOCK] + g


def load_ops_copy(name: str):
    """A copy of ``tilejit/ops/<name>.py`` loaded from its file as a module of its own: its kernels' in-process
    launch caches are its own (for tests that pin lowerings), and its PyTorch operators get a namespace of their
    own (``tilejit.ops.custom_ops.namespace``)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tilejit" / "ops" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"tilejit_ops_copy_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
