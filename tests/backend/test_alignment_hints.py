"""What is known at compile time about a window's alignment leaves its run-time test out of the CUDA
(``passes/divisibility.py`` read by ``backend_cuda/lower_memory.py``): T.multiple_of promises, int arguments that
are multiples of 16 at the call, the tensors' specialization (16-byte pointers and strides, compile-time extents).
When every term is known only the vector (cp.async) variant is generated; the unhinted kernels keep the test and
the element-wise variant. Kernels: tests/lang_kernels.py (run on the GPU by tests/gpu/test_gpu_lang_constructs.py)."""
from __future__ import annotations

import pytest
import torch

import lang_kernels as lk
from _lowering import kernel_body, lower
from filecheck import filecheck
from test_compile_all import check_cubin

f16 = torch.float16


def m(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


pytestmark = pytest.mark.usefixtures("fresh_compile_cache")  # tests/conftest.py


def copy_body(off: int, hint: bool, *, x=None, y=None) -> str:
    _, cuda = lower(lk.hinted_copy, m(1000) if x is None else x, m(1000) if y is None else y, off,
                    BLOCK=1024, HINT=hint)
    return kernel_body(cuda)


# -- global <-> registers -------------------------------------------------------------------------------------

def test_unhinted_copy_tests_the_extents_at_run_time():
    """The start (off = 0, a multiple of 16, plus program_id * 256) and the pointers (16-byte aligned meta tensors)
    are known; the run-time extents are not, so each access tests them and keeps its element-wise variant."""
    filecheck(copy_body(0, False), r"""
        CHECK: load [[X:v[0-9]+_X]] window into registers
        CHECK-NEXT: {
        CHECK-NEXT: const float* tj_p =
        CHECK-NEXT: const bool tj_dropped_ok = true;
        CHECK-NEXT: if ([[X]]_size0 % 4 == 0) {
        CHECK: *reinterpret_cast<const tj_v16*>(tj_p
        CHECK: } else {
        CHECK: tj_p[
        CHECK: store into [[Y:v[0-9]+_Y]] window
        CHECK: if ([[Y]]_size0 % 4 == 0) {
        CHECK: } else {
    """)


def test_promised_extents_leave_only_the_vector_path():
    body = copy_body(0, True)
    filecheck(body, r"""
        CHECK: load [[X:v[0-9]+_X]] window into registers
        CHECK-NEXT: {
        CHECK-NEXT: const float* tj_p =
        CHECK-NEXT: const bool tj_dropped_ok = true;
        CHECK-NEXT: // [[X]]: aligned, whole 4-element groups (known at compile time): no element-wise variant
        CHECK-NEXT: #pragma unroll
        CHECK-NEXT: for (int tj_g = 0; tj_g < 2; ++tj_g) {
        CHECK-NEXT: const int i = tj_g * 4;
        CHECK-NEXT: *reinterpret_cast<tj_v16*>({{.*}}) = ({{.*}}) ? *reinterpret_cast<const tj_v16*>(tj_p
        CHECK: store into [[Y:v[0-9]+_Y]] window
        CHECK-NEXT: {
        CHECK-NEXT: float* tj_p =
        CHECK-NEXT: const bool tj_dropped_ok = true;
        CHECK-NEXT: // [[Y]]: aligned, whole 4-element groups (known at compile time): no element-wise variant
    """)
    assert "} else {" not in body and "% 4 == 0" not in body and "% 16 == 0" not in body
    assert "tj_p[" not in body  # no element-wise access


@pytest.mark.parametrize("off, known", [(32, True), (48, True), (0, True), (8, False), (5, False), (-16, True)])
def test_int_argument_divisible_by_16_is_known(off, known):
    """off is specialized on divisibility by 16: a multiple of 16 makes the start (and the pointer) known;
    otherwise the start's and the pointer's alignment are tested at run time (8 is a multiple of the 4-element
    vector, but only divisibility by 16 is part of the specialization)."""
    body = copy_body(off, True)
    if known:
        assert "} else {" not in body and "% 4 == 0" not in body and "% 16 == 0" not in body
    else:
        filecheck(body, r"""
            CHECK: load {{v[0-9]+}}_X window into registers
            CHECK: if (((uint64_t)(tj_p) % 16 == 0) && (int64_t)([[START:v[0-9]+_i0]]) % 4 == 0) {
            CHECK: } else {
            CHECK: store into {{v[0-9]+}}_Y window
            CHECK: if (((uint64_t)(tj_p) % 16 == 0) && (int64_t)([[START]]) % 4 == 0) {
            CHECK: } else {
        """)


def test_int_argument_divisibility_is_in_the_ir():
    text = lk.hinted_copy.ir(m(1000), m(1000), 32, BLOCK=1024, HINT=True)
    filecheck(text, r"""
        CHECK: tj.func @hinted_copy(%X: tensor<1d x f32>, %Y: tensor<1d x f32>, %off: i64 {multiple_of = 16})
        CHECK: %X_size0 {multiple_of = 16} = tj.tensor_dim %X {axis = 0} : i64
        CHECK: %Y_size0 {multiple_of = 16} = tj.tensor_dim %Y {axis = 0} : i64
    """)
    assert "multiple_of" not in lk.hinted_copy.ir(m(1000), m(1000), 5, BLOCK=1024, HINT=False)


def test_a_misaligned_tensor_keeps_the_pointer_test_despite_the_promises():
    """The pointer's alignment comes from the specialization only: a view one element into its storage is not
    16-byte aligned, so its accesses test the pointer (the promised extent is still left out)."""
    x = torch.empty(1001)[1:]
    assert x.data_ptr() % 16
    filecheck(copy_body(0, True, x=x, y=torch.empty(1000)), r"""
        CHECK: load {{v[0-9]+}}_X window into registers
        CHECK: if (((uint64_t)(tj_p) % 16 == 0)) {
        CHECK: } else {
        CHECK: store into {{v[0-9]+}}_Y window
        CHECK-NOT: } else {
    """)


def test_a_start_read_from_memory_is_known_only_when_promised():
    _, plain = lower(lk.hinted_segments, m(1000), m(1000), m(8, dtype=torch.int32), BLOCK=128, HINT=False)
    _, hinted = lower(lk.hinted_segments, m(1000), m(1000), m(8, dtype=torch.int32), BLOCK=128, HINT=True)
    filecheck(kernel_body(plain), r"""
        CHECK: load {{v[0-9]+}}_X window into registers
        CHECK: if (((uint64_t)(tj_p) % 16 == 0) && {{v[0-9]+}}_X_size0 % 4 == 0 && (int64_t)([[S:v[0-9]+_s]]) % 4 == 0) {
    """)
    filecheck(kernel_body(hinted), r"""
        CHECK: load {{v[0-9]+}}_X window into registers
        CHECK: if ({{v[0-9]+}}_X_size0 % 4 == 0) {
    """)


# -- global -> shared (cp.async) ------------------------------------------------------------------------------

def matmul_body(hint: bool, arch: str = "sm_80") -> str:
    a, b, c = m(200, 776, dtype=f16), m(776, 328, dtype=f16), m(200, 328, dtype=f16)
    _, cuda = lower(lk.hinted_matmul, a, b, c, arch=arch, BM=64, BN=64, BK=32, HINT=hint)
    return kernel_body(cuda)


def test_unhinted_matmul_tests_the_chunks_and_keeps_the_element_wise_copies():
    body = matmul_body(False)
    filecheck(body, r"""
        # the prologue's copies of A and B
        CHECK: const bool [[FA:tj_c[0-9]+_]]fast = {{.*}} && {{v[0-9]+}}_A_size1 % 8 == 0;  // whole 16-byte chunks only
        CHECK: if ({{.*}} && ![[FA]]fast) {
        CHECK: const bool [[FB:tj_c[0-9]+_]]fast = {{.*}} && {{v[0-9]+}}_B_size1 % 8 == 0;  // whole 16-byte chunks only
        CHECK: if ({{.*}} && ![[FB]]fast) {
        CHECK: store into {{v[0-9]+}}_C window
        CHECK: if ({{v[0-9]+}}_C_size1 % 2 == 0) {
        CHECK: } else {
    """)


def test_promised_extents_leave_only_the_cp_async_copies():
    """K and N promised multiples of 8: the prologue's, the steady state's and the edge tiles' copies are
    branch-free cp.async under their guard alone, with no element-wise copy; the loop's interior condition keeps
    only the bounds of the invariant dims; C's store has no test."""
    body = matmul_body(True)
    filecheck(body, r"""
        CHECK: const bool [[FA:tj_c[0-9]+_]]fast = ({{[^&]*}});  // aligned, whole 16-byte chunks: known at compile time
        CHECK: tj_cp_async_16_zfill_if({{.*}}, [[FA]]fast);
        CHECK: const bool [[FB:tj_c[0-9]+_]]fast = ({{[^&]*}});  // aligned, whole 16-byte chunks: known at compile time
        CHECK: const bool tj_inner_ok = ((int64_t)({{v[0-9]+}}_m0) + 64 <= {{v[0-9]+}}_A_size0) && ((int64_t)({{v[0-9]+}}_n0) + 64 <= {{v[0-9]+}}_B_size1);
        CHECK: store into {{v[0-9]+}}_C window
        CHECK-NEXT: {
        CHECK-NEXT: tj_half* tj_p =
        CHECK-NEXT: const bool tj_dropped_ok = true;
        CHECK-NEXT: // {{v[0-9]+}}_C: aligned, whole 2-element groups (known at compile time): no element-wise variant
    """)
    assert "fast) {" not in body and "% 8 == 0" not in body and "% 16 == 0" not in body and "} else {" not in body
    assert "whole 16-byte chunks only" not in body


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("hint", [False, True])
def test_hinted_kernels_compile_to_cubins(arch, hint):
    a, b, c = m(200, 776, dtype=f16), m(776, 328, dtype=f16), m(200, 328, dtype=f16)
    compiled = lk.hinted_matmul.compile(a, b, c, arch=arch, BM=64, BN=64, BK=32, HINT=hint)
    check_cubin(compiled, arch, 4)
    compiled = lk.hinted_copy.compile(m(1000), m(1000), 16, arch=arch, BLOCK=256, HINT=hint)
    check_cubin(compiled, arch, 4)
