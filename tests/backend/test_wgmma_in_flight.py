"""The sm_90a GEMM main loop keeps wgmma groups in flight across k-steps (``wgmma.wait_group 1``) and hands
ring slots back through "empty" mbarriers instead of a block-wide barrier; loops it does not fit keep the
synchronous form. ptxas itself checks the result: it reports (C7514/C7515, with ``-v``) when it has to
serialize wgmma because an ordinary instruction touches an in-flight accumulator, and no compile here may
get that report."""
from __future__ import annotations

import re

import pytest
import torch

import tilejit
import tilejit.language as T
from _lowering import braced_block
from kernels import matmul_any
from tilejit.backend_cuda import nvrtc

E4M3 = torch.float8_e4m3fn


def _meta(*shape, dtype):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _loop(cuda: str) -> str:
    """The text of the pipelined k-loop, from its header to its closing brace."""
    return braced_block(cuda, cuda.index("for (", cuda.index("int tj_it = 0;")))


def _ptxas_report(cuda: str) -> str:
    return nvrtc.compile_cuda(cuda, name="k", arch="sm_90a", options=["--ptxas-options=-v"]).log


# (operand dtype, accumulator, BM, BN, BK bytes, warps); matmul_any's loop is 3 stages deep
CASES = [
    (torch.float16, T.float32, 128, 256, 128, 8),
    (torch.bfloat16, T.float32, 128, 128, 128, 4),
    (torch.bfloat16, T.float32, 64, 128, 256, 4),
    (E4M3, T.float32, 128, 256, 128, 8),
    (torch.int8, T.int32, 128, 128, 128, 4),
    (torch.float32, T.float32, 128, 128, 128, 8),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}x{c[3]}-w{c[5]}".replace("torch.", ""))
def test_main_loop_keeps_one_iteration_in_flight(case):
    dtype, acc, bm, bn, bk_bytes, warps = case
    out = torch.int32 if acc == T.int32 else torch.float32
    a, b, c = _meta(1000, 1536, dtype=dtype), _meta(900, 1536, dtype=dtype), _meta(1000, 900, dtype=out)
    # fp8: the fast form keeps its accumulator in flight; the default promotes (tests/backend/test_fp8_precision.py)
    precision = "fast" if dtype == E4M3 else None
    cuda = matmul_any.compile(a, b, c, BM=bm, BN=bn, BK=bk_bytes // dtype.itemsize, TA=False, TB=True, ACC=acc,
                              PRECISION=precision, num_warps=warps, arch="sm_90a", stop_after="cuda").cuda
    loop = _loop(cuda)
    assert "left in flight" in loop
    assert "__syncthreads" not in loop  # the slot hand-back is per warp, through mbarriers
    assert loop.count("wgmma.wait_group.sync.aligned 1;") >= 1 and "wait_group.sync.aligned 0;" not in loop
    assert "tj_mbar_arrive(" in loop
    # after the loop, before the accumulator is read: everything in flight is waited for
    after = cuda[cuda.index(loop) + len(loop):]
    assert after.index("wgmma.wait_group.sync.aligned 0;") < after.index("tj_from_f32") if "tj_from_f32" in after \
        else "wgmma.wait_group.sync.aligned 0;" in after
    report = _ptxas_report(cuda)
    assert not re.search(r"C751[0-9]|serialized", report), report
    assert "0 bytes spill stores" in report


def test_the_report_this_file_relies_on_exists():
    """Touching an in-flight accumulator between the wait and the next wgmma gets ptxas's serialization report
    (so the test above would notice a lowering that does)."""
    a = _meta(1024, 1024, dtype=torch.float16)
    cuda = matmul_any.compile(a, a, _meta(1024, 1024, dtype=torch.float32), BM=128, BN=128, BK=64, TA=False, TB=True,
                              ACC=T.float32, num_warps=4, arch="sm_90a", stop_after="cuda").cuda
    wait = re.search(r'asm volatile\("wgmma\.wait_group\.sync\.aligned 1;" : "\+f"\((\w+)\[0\]\)[^\n]*\n', cuda)
    assert wait is not None
    spoiled = cuda[:wait.end()] + f"{wait.group(1)}[5] = {wait.group(1)}[5] * 2.0f;\n" + cuda[wait.end():]
    assert re.search(r"C751[0-9].*serialized", _ptxas_report(spoiled))


def test_loops_that_do_not_fit_stay_synchronous():
    """Two chained gemms with softmax math between (attention), a cp.async ring (unaligned rows) and a
    gemm whose accumulator is read in the body all wait for their groups in the same iteration."""
    @tilejit.kernel
    def acc_read_in_body(A, B, C, S, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
        acc = T.zeros((BM, BN), T.float32)
        top = T.zeros((BM, BN), T.float32)
        for k0 in T.range(0, A.shape[1], BK, stages=3):
            acc = T.gemm(A[0:BM, k0:k0 + BK], B[0:BN, k0:k0 + BK], acc, transpose_b=True)
            top = T.maximum(top, acc)
        C[0:BM, 0:BN] = acc
        S[0:BM, 0:BN] = top

    a = _meta(512, 1024, dtype=torch.float16)
    c = _meta(512, 512, dtype=torch.float32)
    cuda = acc_read_in_body.compile(a, a, c, c, BM=128, BN=128, BK=64, num_warps=4, arch="sm_90a",
                                    stop_after="cuda").cuda
    loop = _loop(cuda)
    assert "left in flight" not in loop and "wgmma.wait_group.sync.aligned 0;" in loop and "__syncthreads" in loop

    ragged = matmul_any.compile(_meta(1000, 777, dtype=torch.float16), _meta(900, 777, dtype=torch.float16),
                                _meta(1000, 900, dtype=torch.float32), BM=128, BN=128, BK=64, TA=False, TB=True,
                                ACC=T.float32, num_warps=4, arch="sm_90a", stop_after="cuda").cuda
    assert "tj_mbar_expect_tx(tj_smem" not in ragged and "left in flight" not in ragged  # 777-element rows: cp.async
