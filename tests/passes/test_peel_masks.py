"""The peeling of masked loop iterations (``passes/peel_masks.py``): the split loops in the printed IR and the
generated CUDA, the masks it leaves alone, and the interpreter's results of peeled and unpeeled IR, bit for bit."""
from __future__ import annotations

import pytest
import torch

from tilejit.interpreter import interpret
from tilejit.ir import OpKind
from tilejit.passes.peel_masks import peel_masks, peel_plan
from tilejit.target import Target

from filecheck import filecheck
from benchmarks.kernels import attention_one_loop
from kernels import masked_from_start, meta, ragged_exp_row_sum, unpeelable_masks


def _attention_args(seq=200, dim=64, dtype=torch.float16):
    return [meta(2, 2, seq, dim, dtype=dtype) for _ in range(4)] + [0.125]


def _loops(fn):
    return [op for op in fn.walk() if op.kind is OpKind.FOR]


def test_causal_attention_splits_into_an_unmasked_and_a_masked_loop():
    st = attention_one_loop.compile(*_attention_args(), BM=64, BN=64, D=64, CAUSAL=True, arch="sm_80",
                                    stop_after="cuda")
    filecheck(st.final_ir, r"""
        CHECK: %hi = tj.binary %Q_size2
        // the run's end: min(first past S - BN, first past the diagonal), clamped to the loop's range
        CHECK: tj.binary {{.*}} {op = floordiv}
        CHECK: tj.binary {{.*}} {op = floordiv}
        CHECK: tj.binary {{.*}} {op = max} : i64
        CHECK-NEXT: tj.binary {{.*}}, %hi {op = min} : i64
        CHECK-NEXT: [[END:%[0-9]+]] = tj.binary {{.*}} {op = max} : i64
        CHECK-NEXT: tj.for %n0 = %{{[0-9]+}} to [[END]] step {{.*}} {kind = pipelined, stages = 3, peeled = unmasked} {
        CHECK-NOT: tj.select
        CHECK-NOT: tj.cmp
        CHECK: tj.yield
        CHECK: tj.for %n0_1 = [[END]] to %hi step {{.*}}peeled = masked} {
        CHECK: tj.cmp {{.*}} {op = lt}
        CHECK: tj.cmp {{.*}} {op = le}
        CHECK: tj.select
        CHECK: tj.yield
        CHECK-NOT: tj.for
        CHECK: tj.store
    """)
    filecheck(st.cuda, r"""
        CHECK: // peeled loop (unmasked): the iterations whose masks are all true, unmasked (kernels.py:{{[0-9]+}})
        CHECK: for (
        CHECK: // peeled loop (masked): the iterations whose masks are not all true (kernels.py:{{[0-9]+}})
        CHECK: for (
    """)


def test_peel_masks_false_keeps_the_loop_whole():
    st = attention_one_loop.compile(*_attention_args(), BM=64, BN=64, D=64, CAUSAL=True, arch="sm_80",
                                    peel_masks=False, stop_after="cuda")
    assert len(_loops(st.fn)) == 1 and "peeled" not in st.final_ir and "peeled" not in st.cuda
    assert "tj.select" in st.final_ir


def test_ragged_tail_splits_and_the_hand_split_attention_is_left_alone():
    st = ragged_exp_row_sum.compile(meta(64, 1000), meta(64, dtype=torch.float32), BM=16, BN=128, arch="sm_80",
                                    stop_after="passes")
    assert [op.attrs.peeled for op in _loops(st.fn)] == ["unmasked", "masked"]
    unmasked, masked = (op.regions[0] for op in _loops(st.fn))
    assert not any(o.kind is OpKind.SELECT for o in unmasked.walk())
    assert any(o.kind is OpKind.SELECT for o in masked.walk())


def test_a_lower_bound_peels_the_masked_iterations_first():
    st = masked_from_start.compile(meta(1000, dtype=torch.float32), meta(1, dtype=torch.float32), 5, BN=64,
                                   arch="sm_80", stop_after="passes")
    assert [op.attrs.peeled for op in _loops(st.fn)] == ["masked", "unmasked"]


def test_masks_not_affine_in_the_loop_index_are_left_unsplit():
    st = unpeelable_masks.compile(meta(1000, dtype=torch.float32), meta(1, dtype=torch.float32), BN=64,
                                  arch="sm_80", stop_after="ir")
    loop, = _loops(st.fn)
    assert peel_plan(loop) is None
    peel_masks(st.fn, Target.of("sm_80"))
    assert len(_loops(st.fn)) == 1 and loop.attrs.peeled is None


def test_warp_specialized_attention_specializes_the_unmasked_loop():
    st = attention_one_loop.compile(*_attention_args(dim=128), BM=128, BN=128, D=128, CAUSAL=True,
                                    arch="sm_90a", num_warps=8, warp_specialize=True, stop_after="cuda")
    unmasked, masked = _loops(st.fn)
    assert (unmasked.attrs.peeled, masked.attrs.peeled) == ("unmasked", "masked")
    assert unmasked.attrs.producer_warpgroup and not masked.attrs.producer_warpgroup
    assert unmasked.attrs.stages == masked.attrs.stages == 3
    assert unmasked.attrs.defer_mma, "the unmasked loop stays eligible for the deferred p @ v"


# -- the interpreter: peeled and unpeeled IR give the same bits ---------------------------------------------------------


def _run_both(kernel, args, grid, names, outputs, **constexprs):
    """The outputs of ``kernel`` interpreted from its frontend IR as is and after peel_masks (which must split it)."""
    results = []
    for peel in (False, True):
        fn = kernel.compile(*[a if not isinstance(a, torch.Tensor) else a.to("meta") for a in args],
                            arch="sm_80", stop_after="ir", **constexprs).fn
        if peel:
            peel_masks(fn, Target.of("sm_80"))
            assert any(op.attrs.peeled for op in _loops(fn))
        values = {n: (a.clone() if isinstance(a, torch.Tensor) else a) for n, a in zip(names, args)}
        interpret(fn, grid, values)
        results.append([values[n] for n in outputs])
    for plain, peeled in zip(*results):
        assert torch.equal(plain, peeled)
    return results[1]


@pytest.mark.parametrize("seq,causal", [(200, True), (130, True), (64, True), (200, False), (37, True)])
def test_interpreted_causal_attention_is_bit_identical_peeled(seq, causal):
    torch.manual_seed(seq)
    q, k, v = (torch.randn(1, 2, seq, 32, dtype=torch.float16) for _ in range(3))
    out = torch.full((1, 2, seq, 32), float("nan"), dtype=torch.float16)
    grid = (-(-seq // 32), 2, 1)
    got, = _run_both(attention_one_loop, [q, k, v, out, 0.125], grid, ["Q", "K", "V", "O", "sm_scale"], ["O"],
                     BM=32, BN=16, D=32, CAUSAL=causal)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal,
                                                           scale=0.125)
    assert (got.double() - ref).abs().max().item() < 2e-2


@pytest.mark.parametrize("cols", [1, 63, 64, 65, 300])
def test_interpreted_ragged_tail_is_bit_identical_peeled(cols):
    torch.manual_seed(cols)
    x = torch.randn(20, cols)
    out = torch.full((20,), float("nan"))
    got, = _run_both(ragged_exp_row_sum, [x, out], (3, 1, 1), ["X", "Out"], ["Out"], BM=8, BN=64)
    assert torch.allclose(got.double(), x.double().exp().sum(1), rtol=1e-5)


@pytest.mark.parametrize("n,start", [(300, 5), (300, 0), (300, -40), (300, 299), (300, 700), (64, 64)])
def test_interpreted_lower_bound_mask_is_bit_identical_peeled(n, start):
    x = torch.randn(n)
    out = torch.full((1,), float("nan"))
    got, = _run_both(masked_from_start, [x, out, start], (1, 1, 1), ["X", "Out", "start"], ["Out"], BN=64)
    assert torch.allclose(got.double(), x[max(start, 0):].double().sum(), atol=1e-4)


# -- the unmasked run is every iteration whose masks are all true, and no other ------------------------------------


def _evaluate(v, leaves):
    """The int a split point's scalar ``v`` holds, given the ints of the leaves it reads (by kind or name)."""
    op = v.owner
    if not hasattr(op, "kind"):
        return leaves[v.name]
    if op.kind is OpKind.CONSTANT:
        return op.attrs.value
    if op.kind in (OpKind.PROGRAM_ID, OpKind.TENSOR_DIM):
        return leaves[op.kind.mnemonic]
    args = [_evaluate(x, leaves) for x in op.operands]
    if op.kind is OpKind.CAST:
        return args[0]
    return {"add": int.__add__, "sub": int.__sub__, "mul": int.__mul__, "floordiv": int.__floordiv__,
            "min": min, "max": max}[op.attrs.op.value](*args)


def _unmasked_run(fn, leaves):
    loop, = [op for op in _loops(fn) if op.attrs.peeled == "unmasked"]
    lo, hi, step = (_evaluate(v, leaves) for v in loop.operands[:3])
    return list(range(lo, hi, step))


@pytest.mark.parametrize("n", [1, 63, 64, 300])
@pytest.mark.parametrize("start", [-70, 0, 5, 64, 200, 299, 400])
def test_the_lower_bound_run_is_exactly_the_all_true_iterations(n, start):
    fn = masked_from_start.compile(meta(n, dtype=torch.float32), meta(1, dtype=torch.float32), start, BN=64,
                                   arch="sm_80", stop_after="passes").fn
    want = [n0 for n0 in range(0, n, 64) if all(n0 + j >= start for j in range(64))]
    assert _unmasked_run(fn, {"tensor_dim": n, "start": start}) == want


@pytest.mark.parametrize("seq", [1, 63, 64, 65, 200, 256])
def test_the_causal_run_is_exactly_the_all_true_iterations(seq):
    # longest_first=False: the program ids in their grid order (passes/program_order.py would mirror them)
    fn = attention_one_loop.compile(*_attention_args(seq), BM=64, BN=32, D=64, CAUSAL=True, arch="sm_80",
                                    stop_after="passes", longest_first=False).fn
    for pid in range(-(-seq // 64)):
        m0 = pid * 64
        want = [n0 for n0 in range(0, min(seq, m0 + 64), 32)
                if all(n0 + j < seq and n0 + j <= m0 + i for i in range(64) for j in range(32))]
        assert _unmasked_run(fn, {"tensor_dim": seq, "program_id": pid}) == want, (seq, pid)
