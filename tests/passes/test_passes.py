"""The pass pipeline, checked with FileCheck on the IR it leaves (``Stages.final_ir``, printed as
``compiled.asm["ir"]``), and a few structural invariants of the layout pass on the IR objects of every case.

The kernels and their specializations are shared with tests/backend/test_pass_codegen.py, which checks the
CUDA and PTX generated from the same IR (``kernels.PASS_CASES``). Only the frontend and the passes run here
(``stop_after="passes"``, or ``"cuda"`` through ``_lowering.lower``): no NVRTC.
"""
from __future__ import annotations

import functools

import pytest

from tilejit.ir import OpKind, Scope
from tilejit.ir.layouts import ExpandLayout, RegisterLayout, SharedLayout, SliceLayout, broadcast_view

from _lowering import lower
from filecheck import filecheck
from kernels import PASS_CASES, example_matmul, matmul_nt_view, meta


@functools.cache
def final_ir(name: str) -> str:
    """The printed IR after the passes of a case of PASS_CASES (computed once per process)."""
    kernel, args, kwargs = PASS_CASES[name]()
    return kernel.compile(*args, stop_after="passes", **kwargs).final_ir


def lowered(name: str):
    """(final IR function, CUDA source) of a case of PASS_CASES, without NVRTC."""
    kernel, args, kwargs = PASS_CASES[name]()
    return lower(kernel, *args, **kwargs)


# -- the matmul of examples/matmul.py on sm_80 ------------------------------------------------------------------

def test_example_matmul_sm80_ir():
    filecheck(final_ir("mm80"), r"""
        CHECK-LABEL: tj.func @matmul
        CHECK-SAME: attributes {arch = sm_80, num_warps = 4}
        CHECK: %acc = tj.splat {{.*}} : tile<128x128xf32, reg, #mma<warps=2x2>>
        CHECK: tj.for %k0 = {{.*}} -> (tile<128x128xf32, reg, #mma<warps=2x2>>) {kind = pipelined, stages = 3}
        CHECK-NEXT: tj.load %A[%m0, %k0] {{.*}}pipeline = 3{{.*}} : tile<128x32xf16, shared, #shared<128x32, swizzle=64B, stages=3>>
        CHECK-NEXT: tj.load %B[%k0, %n0] {{.*}}pipeline = 3{{.*}} : tile<32x128xf16, shared, #shared<32x128, swizzle=128B, panels=2, stages=3>>
        // the frontend's `acc + gemm(a, b, 0)` is one gemm accumulating into the loop-carried accumulator
        CHECK-NOT: tj.binary
        CHECK-NOT: tj.splat
        CHECK-NEXT: [[ACC:%acc_[0-9]+]] = tj.gemm %{{[0-9]+}}, %{{[0-9]+}}, %acc_2 {transpose_a = false, transpose_b = false, impl = mma_sync_m16n8k16} : tile<128x128xf32, reg, #mma<warps=2x2>>
        CHECK-NEXT: tj.yield [[ACC]]
        CHECK: tj.cast %acc_1 {dtype = f16} : tile<128x128xf16, reg, #mma<warps=2x2>>
        CHECK: tj.store
    """)
    frontend = example_matmul.ir(meta(256, 256), meta(256, 256), meta(256, 256), BM=128, BN=128, BK=32)
    assert "tj.binary %acc_2, %" in frontend and "{op = add}" in frontend, "the frontend emits the add"


def test_sm90a_with_bk32_takes_wgmma_with_the_64_byte_swizzle():
    ir = final_ir("mm90_bk32")
    filecheck(ir, r"""
        CHECK: tj.load %A{{.*}} : tile<128x32xf16, shared, #shared<128x32, swizzle=64B, stages=3>>
        CHECK: tj.gemm {{.*}}impl = wgmma_m64nNk16} : tile<128x128xf32, reg, #wgmma<warpgroups=1>>
        CHECK-NOT: #mma<
    """)


def test_nt_frontend_ir_has_the_transpose_the_pass_removes():
    frontend = matmul_nt_view.ir(meta(256, 256), meta(256, 256), meta(256, 256), BM=128, BN=128, BK=32)
    assert "tj.trans" in frontend and "transpose_b = false" in frontend
    fn, _ = lowered("nt")
    assert not any(op.kind is OpKind.TRANSPOSE for op in fn.walk())


def test_vector_width_follows_dtype_and_strides():
    assert "tile<4x128xf32, reg, #blocked<threads=128, vec=4>>" in final_ir("softmax_2d_f32")
    strided = final_ir("softmax_strided")  # X[:, ::2]: the last dim is not unit-stride
    assert "tile<1024xf16, reg, #blocked<threads=128, vec=1>>" in strided
    assert "vec=8" not in strided


def test_accumulator_initialised_from_a_load_converts_once_outside_the_loop():
    ir = final_ir("acc_from_load")
    loop = ir[ir.index("tj.for"):ir.index("tj.yield")]
    assert "convert_layout" not in loop
    assert "-> (tile<64x64xf32, reg, #mma<warps=2x2>>)" in ir


def test_accumulator_initialised_from_a_load_converts_before_the_loop():
    """The init is converted to the gemm's layout once; nothing crosses layouts inside the loop."""
    ir = final_ir("acc_from_load")
    filecheck(ir, r"""
        CHECK: tj.load %C{{.*}} : tile<64x64xf16, reg, #blocked<threads=128, vec=8>>
        CHECK: tj.convert_layout {{.*}} #mma<warps=2x2>>
        CHECK: tj.for
        CHECK: tj.gemm {{.*}}#mma<warps=2x2>>
        CHECK-NEXT: tj.yield
    """)


# -- layout invariants on the IR objects, for every case ----------------------------------------------------------

_ELEMENTWISE = {OpKind.BINARY, OpKind.UNARY, OpKind.COMPARE, OpKind.SELECT, OpKind.CAST}


def _layout(v):
    return getattr(v.type, "layout", None)


def _check_invariants(fn) -> int:
    checked = 0
    loops = [op for op in fn.walk() if op.kind is OpKind.FOR]
    stages_of = {}
    for loop in loops:
        for inner in loop.regions[0].ops:
            stages_of[id(inner)] = loop.attrs.stages
    for op in fn.walk():
        for r in op.results:
            if not r.is_tile:
                continue
            lay = _layout(r)
            if r.type.scope is Scope.REGISTER:
                assert isinstance(lay, RegisterLayout) and tuple(lay.shape) == tuple(r.type.shape), (op, lay)
            else:
                assert r.type.scope is Scope.SHARED and isinstance(lay, SharedLayout)
                assert (lay.rows, lay.cols, lay.elem_bytes) == (*r.type.shape, r.dtype.itemsize)
        if op.kind in _ELEMENTWISE and op.result.is_tile:
            for v in op.operands:
                if v.is_tile:
                    assert _layout(v) == _layout(op.result), f"{op.kind}: {_layout(v)} vs {_layout(op.result)}"
                    checked += 1
        elif op.kind is OpKind.GEMM:
            assert op.operands[0].type.scope is Scope.SHARED and op.operands[1].type.scope is Scope.SHARED
            assert _layout(op.operands[2]) == _layout(op.result)
            checked += 1
        elif op.kind is OpKind.REDUCE and op.result.is_tile:
            assert _layout(op.result) == SliceLayout(_layout(op.operands[0]), op.attrs.axis)
            checked += 1
        elif op.kind is OpKind.EXPAND_DIMS:
            assert _layout(op.result) == ExpandLayout(_layout(op.operands[0]), op.attrs.axis)
            checked += 1
        elif op.kind is OpKind.FOR:
            body = op.regions[0]
            for init, arg, res, y in zip(op.operands[3:], body.args[1:], op.results, body.terminator.operands):
                if init.is_tile:
                    assert _layout(init) == _layout(arg) == _layout(res) == _layout(y)
                    checked += 1
        elif op.kind is OpKind.LOAD and op.attrs.pipeline:
            assert op.result.type.scope is Scope.SHARED
            assert _layout(op.result).stages == op.attrs.pipeline == stages_of[id(op)]
            checked += 1
        elif op.kind is OpKind.BROADCAST and broadcast_view(_layout(op.operands[0]), _layout(op.result)):
            checked += 1
        elif op.kind is OpKind.CONVERT_LAYOUT:
            src, out = op.operands[0], op.result
            assert src.type.scope != out.type.scope or _layout(src) != _layout(out)
            checked += 1
    return checked


@pytest.mark.parametrize("case", sorted(PASS_CASES))
def test_layout_invariants_hold(case):
    fn, source = lowered(case)
    assert _check_invariants(fn) > 0
    assert 'extern "C" __global__' in source
