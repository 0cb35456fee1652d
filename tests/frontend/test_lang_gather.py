"""Gathers and scatters: tensors indexed by a 1-D integer tile (X[idx, 0:D], X[idx], X[idx, 0:D] = v,
X[idx] = v), through the interpreter against torch references; IR, CUDA text, located errors."""
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


def ref_gather_rows(w: torch.Tensor, ids: torch.Tensor, d: int) -> torch.Tensor:
    out = torch.zeros(ids.numel(), d, dtype=w.dtype)
    ok = (ids >= 0) & (ids < w.shape[0])
    cols = min(d, w.shape[1])
    out[ok, :cols] = w[ids[ok].long(), :cols]
    return out


@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64, torch.int16])
def test_embedding_interpreter(interpret, id_dtype):
    w = torch.randn(50, 24)
    ids = torch.randint(-5, 60, (37,), dtype=id_dtype)  # some out of range, duplicates likely
    out = torch.full((37, 32), float("nan"))
    lk.embedding[(3,)](ids, w, out, BM=16, D=32)  # D > 24 columns: zeros; rows 37..47 of the last block: skipped
    torch.testing.assert_close(out, ref_gather_rows(w, ids, 32))


def test_gather_1d_interpreter(interpret):
    x = torch.randn(100, dtype=torch.float64)
    idx = torch.tensor([0, 99, 100, -1, 5, 5, 42, 7], dtype=torch.int32)
    y = torch.full((8,), float("nan"), dtype=torch.float64)
    lk.gather_1d[(1,)](x, idx, y, B=8)
    expected = torch.where((idx >= 0) & (idx < 100), x[idx.clamp(0, 99).long()], torch.zeros(8, dtype=torch.float64))
    torch.testing.assert_close(y, expected * 2)


def test_gather_cols_interpreter(interpret):
    x = torch.randn(20, 9)
    cols = torch.tensor([8, 0, 3, 3, 9, -2, 1, 4], dtype=torch.int32)
    y = torch.full((20, 8), float("nan"))
    lk.gather_cols[(2,)](x, cols, y, BM=16, BC=8)
    ok = (cols >= 0) & (cols < 9)
    expected = torch.zeros(20, 8)
    expected[:, ok] = x[:, cols[ok].long()]
    torch.testing.assert_close(y, expected)


def test_scatter_rows_interpreter(interpret):
    src = torch.randn(30, 8)
    ids = torch.randperm(40)[:30].int()
    ids[3] = 45   # out of range: not written
    ids[4] = -1
    out = torch.full((40, 8), -7.0)
    lk.scatter_rows[(2,)](src, ids, out, BM=16, D=8)
    expected = torch.full((40, 8), -7.0)
    for m in range(30):
        if 0 <= ids[m] < 40:
            expected[ids[m]] = src[m] + 1
    torch.testing.assert_close(out, expected)


def test_scatter_duplicates_one_write_wins(interpret):
    v = torch.arange(16, dtype=torch.int32) * 10
    idx = torch.tensor([3, 3, 3, 5, 5, 0, 16, -1, 2, 2, 9, 9, 9, 9, 1, 1], dtype=torch.int32)
    x = torch.full((16,), -1, dtype=torch.int32)
    lk.scatter_1d[(1,)](v, idx, x, B=16)
    for j in range(16):
        writers = [int(v[i]) for i in range(16) if idx[i] == j]
        assert (x[j].item() in writers) if writers else x[j].item() == -1


def test_gather_ir():
    ir = lk.embedding.ir(meta(37, dtype=torch.int32), meta(50, 24), meta(37, 32), BM=16, D=32)
    filecheck(ir, r"""
        CHECK: %ids = tj.load %Ids
        CHECK: tj.expand_dims %ids {axis = 1}
        CHECK: tj.broadcast {{%[0-9]+}} {shape = [16, 32]} : tile<16x32xi32>
        CHECK: tj.gather %W, {{%[0-9]+}}, {{%[0-9]+}}, {{%[0-9]+}} {shape = [16, 32], axis = 0} : tile<16x32xf32>
        CHECK: tj.store
    """)
    ir = lk.scatter_1d.ir(meta(16, dtype=torch.int32), meta(16, dtype=torch.int32), meta(16, dtype=torch.int32), B=16)
    filecheck(ir, r"""
        CHECK: tj.scatter %X, {{%[0-9]+}}, %idx, {{%[0-9]+}} {shape = [16], axis = 0}
    """)


def test_gather_cuda_text():
    cuda = lk.embedding.compile(meta(37, dtype=torch.int32), meta(50, 24), meta(37, 32), BM=16, D=32,
                                arch="sm_80", stop_after="cuda").cuda
    filecheck(cuda, r"""
        CHECK: // gather rows of {{v[0-9]+_W}} by an index tile
        CHECK: = ((uint64_t)(int64_t)({{.*}}[i]) < (uint64_t){{v[0-9]+_W}}_size0 && {{.*}}) ? {{v[0-9]+_W}}[{{.*}}] : float{};
    """)
    cuda = lk.scatter_rows.compile(meta(30, 8), meta(30, dtype=torch.int32), meta(40, 8), BM=16, D=8,
                                   arch="sm_90a", stop_after="cuda").cuda
    filecheck(cuda, r"""
        CHECK: // scatter into rows of {{v[0-9]+_Out}} picked by an index tile
        CHECK: if ((uint64_t)(int64_t)({{.*}}[i]) < (uint64_t){{v[0-9]+_Out}}_size0 && {{.*}}) {{v[0-9]+_Out}}[{{.*}}] = {{.*}}[i];
    """)


def test_gather_augmented_assignment(interpret):
    @tilejit.kernel
    def k(X, Idx, B: T.constexpr):
        idx = Idx[0:B]
        X[idx] += 1.0

    x = torch.zeros(8)
    k[(1,)](x, torch.tensor([1, 3, 9, 5], dtype=torch.int32), B=4)
    assert x.tolist() == [0, 1, 0, 1, 0, 1, 0, 0]


# -- misuse ---------------------------------------------------------------------------------------------------

@tilejit.kernel
def k_float_index(X, F, B: T.constexpr):
    X[0:B] = X[F[0:B]]  # ERR


@tilejit.kernel
def k_2d_index(X, B: T.constexpr):
    idx = T.zeros((B, B), T.int32)
    X[0:B] = X[idx]  # ERR


@tilejit.kernel
def k_two_index_tiles(X, I, B: T.constexpr):
    idx = I[0:B]
    X[0:B, 0] = X[idx, idx]  # ERR


@tilejit.kernel
def k_scatter_wrong_shape(X, I, B: T.constexpr):
    idx = I[0:B]
    X[idx, 0:B] = T.zeros((B, 2 * B), T.float32)  # ERR


ERRORS = [
    (k_float_index, lambda: (meta(64), meta(64)), "an index tile must be a 1-D integer tile, got tile of type tile<16xf32>",
     "F[0:B]"),
    (k_2d_index, lambda: (meta(64),), "an index tile must be a 1-D integer tile", "idx"),
    (k_two_index_tiles, lambda: (meta(64, 64), meta(64, dtype=torch.int32)),
     "only one dimension can be indexed by a tile", "idx]"),
    (k_scatter_wrong_shape, lambda: (meta(64, 64), meta(64, dtype=torch.int32)),
     "cannot use a tile of shape (16, 32) with a window of shape (16, 16)", "X[idx, 0:B]"),
]


@pytest.mark.parametrize("kernel, args, phrase, at", ERRORS, ids=[e[0].__name__ for e in ERRORS])
def test_gather_misuse_is_located(kernel, args, phrase, at):
    import inspect

    with pytest.raises(tilejit.CompilationError) as info:
        kernel.ir(*args(), B=16)
    err = info.value
    lines, first = inspect.getsourcelines(kernel.fn)
    (lineno, line), = [(first + i, l.rstrip("\n")) for i, l in enumerate(lines) if "# ERR" in l]
    assert err.lineno == lineno, str(err)
    assert phrase in err.message, str(err)
    shown, caret = str(err).split("\n")[1:3]
    assert shown[caret.index("^"):].startswith(at), str(err)
