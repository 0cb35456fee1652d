"""Tensor lists as kernel arguments: the interpreter against torch (grouped GEMMs of
ragged groups), the IR and CUDA text, cubins, the specialization key, the device-table cache, the launch path's
signature, and located errors / launch errors for misuse."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tilejit
import tilejit.language as T
from filecheck import filecheck
import lang_kernels as lk
from tilejit.runtime import jit
from tilejit.runtime.tensor_lists import TensorListTables, table_words

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = lk.load_example("grouped_matmul")

# ragged groups (M, N, K): a single row, K not a multiple of BK, N smaller than a tile, a group of whole tiles
SHAPES = [(40, 24, 33), (1, 70, 16), (70, 50, 64), (33, 9, 20), (64, 32, 32)]


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def meta_lists(shapes=((40, 24, 64), (1, 17, 64)), dtype=torch.bfloat16):
    return ([meta(m, k, dtype=dtype) for m, n, k in shapes], [meta(k, n, dtype=dtype) for m, n, k in shapes],
            [meta(m, n, dtype=dtype) for m, n, k in shapes])


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


def groups(shapes, dtype, seed=0):
    torch.manual_seed(seed)
    As = [torch.randn(m, k, dtype=dtype) for m, n, k in shapes]
    Bs = [torch.randn(k, n, dtype=dtype) for m, n, k in shapes]
    Cs = [torch.full((m, n), float("nan"), dtype=dtype) for m, n, k in shapes]
    return As, Bs, Cs


def check_groups(As, Bs, Cs, dtype):
    """Each C against float64: float32 sums of products (exact for 16-bit operands, of tf32-truncated operands
    for float32: 2 x 2^-10 relative each), rounded once to the output dtype (half an ulp)."""
    product = 2 * 2.0 ** -10 if dtype == torch.float32 else 1e-6
    ulp = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 0.0}[dtype]
    for a, b, c in zip(As, Bs, Cs):
        ref = a.double() @ b.double()
        bound = product * (a.double().abs() @ b.double().abs()) + ulp * ref.abs() + 1e-6
        assert torch.isfinite(c).all()
        assert ((c.double() - ref).abs() <= bound).all(), float(((c.double() - ref).abs() / bound).max())


# -- the interpreter ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_grouped_matmul_over_lists_interpreter(interpret, dtype):
    As, Bs, Cs = groups(SHAPES, dtype)
    tiles_m = max(tilejit.cdiv(m, 32) for m, n, k in SHAPES)
    tiles_n = max(tilejit.cdiv(n, 32) for m, n, k in SHAPES)
    lk.grouped_matmul_lists[(tiles_m, tiles_n, len(SHAPES) + 1)](As, Bs, Cs, BM=32, BN=32, BK=16)  # z past the list
    check_groups(As, Bs, Cs, dtype)


@pytest.mark.parametrize("programs", [1, 3, 7, 64])
def test_persistent_grouped_matmul_example_interpreter(interpret, programs):
    """The example's kernel: P programs walk the groups' tiles as one flat sequence, whatever P is."""
    As, Bs, Cs = groups(SHAPES, torch.bfloat16, seed=programs)
    EXAMPLE.grouped_matmul(As, Bs, Cs, BM=32, BN=32, BK=16, programs=programs)
    check_groups(As, Bs, Cs, torch.bfloat16)


def test_tuples_strided_items_and_one_group(interpret):
    """A tuple works as a list; items with other strides (a transposed view) and a one-item list."""
    torch.manual_seed(1)
    a = torch.randn(50, 30)
    b = torch.randn(40, 30).T  # (30, 40), strides (1, 30): no unit last dim
    c = torch.full((50, 40), float("nan"))
    lk.grouped_matmul_lists[(2, 2, 1)]((a,), (b,), (c,), BM=32, BN=32, BK=16)
    check_groups([a], [b], [c], torch.float32)


def test_len_shape_stride_and_out_of_range_items(interpret):
    xs = [torch.arange(5, dtype=torch.float32), torch.arange(12, dtype=torch.float32)[::3]]  # the second strided
    out = torch.full((3, 4), float("nan"))
    lk.list_lengths[(3,)](xs, out, BLOCK=8)
    assert out.tolist() == [[2, 5, 1, 10], [2, 4, 3, 18], [2, 0, 0, 0]]  # item 2 is past the list: empty
    assert xs[0][0] == -1 and xs[1][0] == -1  # stores through an item reach the caller's tensor


def test_example_runs_on_the_cpu_and_checks_itself(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO), "TILEJIT_CACHE_DIR": str(tmp_path)}
    env.pop("TILEJIT_INTERPRET", None)
    done = subprocess.run([sys.executable, str(REPO / "examples" / "grouped_matmul.py")], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "grouped matmul of 4 groups, bfloat16 (interpreter" in done.stdout and "MISMATCH" not in done.stdout


# -- IR, CUDA, cubins --------------------------------------------------------------------------------------------

def test_tensor_list_ir():
    ir = lk.list_lengths.ir([meta(5, dtype=torch.float32)], meta(3, 4, dtype=torch.float32), BLOCK=8)
    filecheck(ir, r"""
        CHECK: tj.func @list_lengths(%Xs: tensor_list<1d x f32>, %Out: tensor<2d x f32>)
        CHECK: %[[X:Xs_[0-9]+]] = tj.list_item %Xs, {{%[0-9]+}} : tensor<1d x f32>
        CHECK: tj.tensor_dim %[[X]] {axis = 0}
        CHECK: tj.tensor_stride %[[X]] {axis = 0}
        CHECK: tj.list_len %Xs : i64
        CHECK: tj.load %[[X]][
        CHECK: tj.store {{%[0-9]+}}, %[[X]][
    """)


def test_tensor_list_cuda_reads_the_table_and_never_uses_tma():
    stages = EXAMPLE.grouped_matmul_kernel.compile(*meta_lists(), BM=128, BN=128, BK=64, num_warps=8,
                                                   arch="sm_90a", stop_after="cuda")
    filecheck(stages.cuda, r"""
        CHECK: const int64_t* __restrict__ [[AS:v[0-9]+_As]]_table,
        CHECK-NEXT: int64_t [[AS]]_len,
        CHECK: const int64_t [[LEN:v[0-9]+]] = [[AS]]_len;
        CHECK: for (int64_t [[G:v[0-9]+_g]] = {{.*}}; ([[G]] < [[LEN]]);
        CHECK: const bool [[OK:tj_in_list[0-9]+]] = (uint64_t)(int64_t)({{.*}}) < (uint64_t)[[AS]]_len;
        CHECK: const int64_t* const [[ROW:tj_row[0-9]+]] = [[AS]]_table + ([[OK]] ? {{.*}} : (int64_t)0) * 5;
        CHECK: tj_bf16* const [[A:v[0-9]+_As]] = [[OK]] ? reinterpret_cast<tj_bf16*>([[ROW]][0]) : (tj_bf16*)nullptr;
        CHECK: const int64_t [[A]]_size1 = [[OK]] ? [[ROW]][2] : (int64_t)0;
        CHECK: const int64_t [[A]]_stride0 = [[OK]] ? [[ROW]][3] : (int64_t)0;
        CHECK: wgmma
    """)
    assert "tj_tmap" not in stages.cuda and "cp.async.bulk.tensor" not in stages.cuda
    assert "copy = cp_async" in stages.final_ir and "tma_bulk_tensor" not in stages.final_ir


@pytest.mark.parametrize("arch, kw", [("sm_80", dict(BM=64, BN=64, BK=32)),
                                      ("sm_90a", dict(BM=128, BN=128, BK=64, num_warps=8)),
                                      ("sm_100a", dict(BM=128, BN=128, BK=64, num_warps=8))])
@pytest.mark.parametrize("kernel", ["example", "grid"])
def test_grouped_matmul_cubins(tmp_path, monkeypatch, arch, kw, kernel):
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))
    k = EXAMPLE.grouped_matmul_kernel if kernel == "example" else lk.grouped_matmul_lists
    compiled = k.compile(*meta_lists(), arch=arch, **kw)
    assert compiled.asm["cubin"][:4] == b"\x7fELF"
    assert compiled.param_kinds == ["ptr", "i64"] * 3
    assert compiled.meta["spills"] in (0, None)
    assert "list of bfloat16[2d]" in compiled.meta["signature"]
    impl = {"sm_80": "mma_sync", "sm_90a": "wgmma", "sm_100a": "tcgen05"}[arch]
    assert impl in compiled.asm["ir"]


def test_value_layout_counts_two_slots_per_list():
    call = lk.list_lengths.bind([[meta(5, dtype=torch.float32)], meta(3, 4, dtype=torch.float32)], {"BLOCK": 8})
    assert call.spec.value_layout() == {"Out": [2, 2]}  # after the list's table address and length


# -- the specialization key ---------------------------------------------------------------------------------------

def key(*lists):
    call = EXAMPLE.grouped_matmul_kernel.bind(lists, {"BM": 64, "BN": 64, "BK": 32})
    return call.spec.key("cuda:sm_90a")


def test_the_key_holds_dtype_rank_unit_strides_not_length_extents_strides_alignment():
    base = key(*meta_lists())
    assert key(*meta_lists(((40, 24, 64), (1, 17, 64), (7, 7, 7)))) == base  # length, extents, strides
    assert key(*meta_lists(((999, 24, 64),))) == base
    assert key(*meta_lists(dtype=torch.float16)) != base
    As, Bs, Cs = meta_lists()
    assert key([a[None] for a in As], Bs, Cs) != base  # rank 3
    assert key([As[0].T.contiguous().T, As[1]], Bs, Cs) != base  # one item column-major: no common unit last dim
    cpu = [torch.zeros(64, 64, dtype=torch.bfloat16)]
    assert key(cpu, cpu, cpu) == key([torch.zeros(4097, dtype=torch.bfloat16)[1:].view(64, 64)], cpu, cpu)  # alignment: checked at run time
    material = EXAMPLE.grouped_matmul_kernel.bind(meta_lists(), {"BM": 64, "BN": 64, "BK": 32}).spec.key_material("x")
    assert material["args"][0] == ["As", ["tensor_list", "bfloat16", 2, [1]]]


def test_fast_path_signature_follows_the_key_not_the_extents():
    sig = jit._list_signature
    a = [torch.zeros(40, 64), torch.zeros(1, 64)]
    assert sig(a, torch.Tensor) == sig([torch.zeros(7, 64), torch.zeros(3, 64), torch.zeros(2, 64)], torch.Tensor)
    assert sig(a, torch.Tensor) != sig([torch.zeros(40, 64), torch.zeros(64, 2).T], torch.Tensor)  # unit dims
    assert sig(a, torch.Tensor) == sig([torch.zeros(40, 64), torch.zeros(70)[1:65].view(1, 64)], torch.Tensor)
    assert sig(a, torch.Tensor) != sig([torch.zeros(40, 64, dtype=torch.float16)], torch.Tensor)
    for bad in ([torch.zeros(4), 3], [torch.zeros(4), torch.zeros(4, dtype=torch.float16)],
                [torch.zeros(4), torch.zeros(4, 1)], [torch.zeros(())]):
        assert sig(bad, torch.Tensor) is None  # the slow path says what is wrong


def test_fast_args_hand_lists_to_the_table_on_a_hit():
    k = EXAMPLE.grouped_matmul_kernel
    As, Bs, Cs = groups(SHAPES[:2], torch.bfloat16)
    signature, values, device = k._fast_args((As, Bs, Cs), {"BM": 64, "BN": 64, "BK": 32})
    assert values == [As, 2, Bs, 2, Cs, 2] and device == -1  # CPU tensors: the interpreter, never a fast hit
    assert jit._LIST in signature


# -- the table cache ----------------------------------------------------------------------------------------------

class FakeTensor:
    def __init__(self, shape, ptr, strides=None):
        self.shape = torch.Size(shape)
        self._strides = strides or torch.empty(shape, device="meta").stride()
        self._ptr = ptr

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return self._strides


class FakeUpload:
    """Stands in for the device copy: records each table written, hands out distinct addresses."""

    def __init__(self):
        self.tables: list[tuple[list[int], int, bool]] = []

    def __call__(self, words, device, capturing):
        self.tables.append((words, device, capturing))
        upload = self

        class Buffer:
            address = 0x9000_0000 + 0x1000 * len(upload.tables)

            def data_ptr(self):
                return self.address
        return Buffer()


def test_table_words_hold_pointer_sizes_strides_per_tensor():
    items = [FakeTensor((3, 4), 0x1000), FakeTensor((5, 6), 0x2000, strides=(1, 5))]
    assert table_words(items) == [0x1000, 3, 4, 4, 1, 0x2000, 5, 6, 1, 5]


def test_same_layout_reuses_the_table_a_changed_pointer_builds_another():
    upload = FakeUpload()
    tables = TensorListTables(upload)
    items = [FakeTensor((3, 4), 0x1000), FakeTensor((5, 6), 0x2000)]
    first = tables.address(items, 0)
    assert tables.address(items, 0) == first
    assert tables.address(list(items), 0) == first  # another list object, the same tensors
    assert tables.address([FakeTensor((3, 4), 0x1000), FakeTensor((5, 6), 0x2000)], 0) == first  # same layout
    assert len(upload.tables) == 1 and tables.builds == 1
    moved = tables.address([FakeTensor((3, 4), 0x1000), FakeTensor((5, 6), 0x3000)], 0)  # a pointer changed
    assert moved != first and len(upload.tables) == 2
    assert tables.address([FakeTensor((3, 5), 0x1000), FakeTensor((5, 6), 0x2000)], 0) not in (first, moved)
    assert tables.address(items, 1) not in (first, moved)  # another device
    assert upload.tables[0] == ([0x1000, 3, 4, 4, 1, 0x2000, 5, 6, 6, 1], 0, False)
    assert tables.address(items, 0) == first and tables.builds == 4


def test_eviction_spares_tables_a_capture_used():
    upload = FakeUpload()
    tables = TensorListTables(upload, capacity=2)
    kept = [FakeTensor((8,), 0x1000)]
    graph_address = tables.address(kept, 0)
    assert tables.address(kept, 0, capturing=True) == graph_address  # a warm table, now baked into a graph
    for i in range(5):
        tables.address([FakeTensor((8,), 0x10000 * (i + 2))], 0)
    assert tables.address(kept, 0) == graph_address and tables.builds == 6  # still there: never evicted
    evicted = [FakeTensor((8,), 0x20000)]
    assert tables.address(evicted, 0) and tables.builds == 7  # an ordinary one was evicted and is written again


def test_a_table_first_made_in_a_capture_is_written_again_for_ordinary_launches():
    upload = FakeUpload()
    tables = TensorListTables(upload)
    items = [FakeTensor((8,), 0x1000)]
    in_graph = tables.address(items, 0, capturing=True)
    assert upload.tables[-1][2] is True  # the copy is recorded in the graph
    ordinary = tables.address(items, 0)
    assert ordinary != in_graph and upload.tables[-1][2] is False
    assert tables.address(items, 0) == ordinary and tables.address(items, 0, capturing=True) == ordinary
    assert tables.builds == 2


def test_a_second_capture_of_a_replay_only_table_records_its_own_copy():
    upload = FakeUpload()
    tables = TensorListTables(upload)
    items = [FakeTensor((8,), 0x1000)]
    first = tables.address(items, 0, capturing=True)
    second = tables.address(items, 0, capturing=True)
    assert second != first and [t[2] for t in upload.tables] == [True, True]


# -- errors ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("As, error, phrase", [
    ([], ValueError, "argument 'As' is an empty list; a tensor list needs at least one tensor"),
    ((torch.zeros(4, 4), 3), TypeError, "argument 'As' has type tuple, whose item 1 is a int"),
    ([torch.zeros(4, 4), torch.zeros(4, 4, dtype=torch.float16)], TypeError,
     "share one dtype; item 0 is torch.float32, item 1 is torch.float16"),
    ([torch.zeros(4, 4), torch.zeros(4)], ValueError, "share one rank; item 0 is 2-d, item 1 is 1-d"),
    ([torch.zeros(4, 4), torch.zeros(4, 4, device="meta")], ValueError,
     "are on one device; item 0 is on cpu, item 1 on meta"),
    ([torch.zeros(())], ValueError, "a list of 0-d tensors"),
])
def test_bad_lists_are_usage_errors_at_launch(interpret, As, error, phrase):
    b = [torch.zeros(4, 4)]
    with pytest.raises(tilejit.UsageError) as info:
        lk.grouped_matmul_lists[(1, 1, 1)](As, b, b, BM=16, BN=16, BK=16)
    assert isinstance(info.value, error) and phrase in str(info.value), str(info.value)


def test_list_on_another_device_than_the_tensors(interpret):
    with pytest.raises(ValueError, match=r"different devices \(.*Out on meta, Xs\[0\] on cpu"):
        lk.list_lengths[(1,)]([torch.zeros(8)], torch.zeros(1, 4, device="meta"), BLOCK=8)


@tilejit.kernel
def copy_block(X, Y, B: T.constexpr):
    Y[0:B] = X[0:B]


@tilejit.kernel
def copy_item(Xs, Y, B: T.constexpr):
    Y[0:B] = Xs[0][0:B]


def test_list_where_a_tensor_is_expected_and_back(interpret):
    x = torch.zeros(8)
    with pytest.raises(tilejit.CompilationError, match="'X' is a list of tensors: pick one with a single integer"):
        copy_block[(1,)]([x], x, B=8)
    with pytest.raises(tilejit.CompilationError, match="tensor 'Xs' is indexed twice") as info:
        copy_item[(1,)](torch.zeros(2, 8), x, B=8)
    assert "pass a list or tuple of tensors for it at launch" in info.value.hint
    copy_item[(1,)]([torch.ones(8)], x, B=8)
    assert x.tolist() == [1.0] * 8


@tilejit.kernel
def k_len_of_tensor(X, Out):
    Out[0] = len(X)  # ERR


@tilejit.kernel
def k_full_slice_of_item(Xs, Out, B: T.constexpr):
    X = Xs[0]
    Out[0:B] = X[:]  # ERR


@tilejit.kernel
def k_float_index(Xs, Out, B: T.constexpr):
    Out[0:B] = Xs[0.5][0:B]  # ERR


@tilejit.kernel
def k_list_shape(Xs, Out, B: T.constexpr):
    n = Xs.shape[0]  # ERR
    Out[0:B] = n


@pytest.mark.parametrize("kernel, args, phrase, hint", [
    (k_len_of_tensor, (meta(8), meta(8)), "len() of tensor 'X': use X.shape[0]", "tensor list"),
    (k_full_slice_of_item, ([meta(8)], meta(8)), "the tensors of list 'Xs' have run-time extents",
     "start:start + BLOCK"),
    (k_float_index, ([meta(8)], meta(8)), "a tensor list is indexed by an integer scalar, got float 0.5", "Xs[g]"),
    (k_list_shape, ([meta(8)], meta(8)), "tensor list 'Xs' has no attribute 'shape'", "Xs[g].shape"),
], ids=["len_tensor", "full_slice", "float_index", "list_shape"])
def test_list_misuse_is_located(kernel, args, phrase, hint):
    kw = {"B": 8} if "B" in kernel.arg_names else {}
    with pytest.raises(tilejit.CompilationError) as info:
        kernel.ir(*args, **kw)
    err = info.value
    lines, first = inspect.getsourcelines(kernel.fn)
    (lineno,) = [first + i for i, line in enumerate(lines) if "# ERR" in line]
    assert err.lineno == lineno and phrase in err.message and hint in (err.hint or ""), str(err)
