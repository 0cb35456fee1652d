"""A relaxed tile atomic_add of a wgmma accumulator on sm_90a: registers -> the TMA store epilogue's swizzled shared
boxes -> one ``cp.reduce.async.bulk.tensor`` add per box (``UTMAREDG``), with no wait after the issue in a loop, and
every atomic the bulk reduction does not match (another sem or scope, old values used, an index tile, a tile not
in a wgmma layout, a view, f16, a tensor the kernel also reads, staging that does not fit) keeping the per-element
``red``/``atom``."""
from __future__ import annotations

import re

import pytest
import torch

import tilejit
import tilejit.language as T
from filecheck import filecheck
from kernels import accumulate_blocks, splitk_atomic
from tilejit.runtime import libcuda, tma


def _meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _splitk(arch="sm_90a", c_dtype=torch.float32, stop_after="cuda", **kwargs):
    """The split-K kernel, 128 x 128 tiles on 8 warps, C 1000 x 1000 (ragged against the tile)."""
    a, b, c = _meta(1000, 4096), _meta(4096, 1000), _meta(1000, 1000, dtype=c_dtype)
    return splitk_atomic.compile(a, b, c, 1024, BM=128, BN=128, BK=64, num_warps=8, arch=arch,
                                 stop_after=stop_after, **kwargs)


def _blocks(stop_after="cuda", **kwargs):
    """accumulate_blocks: a 64 x 128 product of each K block added into C[0:64, 0:128] inside the pipelined loop."""
    a, b, c = _meta(8, 64, 1024), _meta(8, 1024, 128), _meta(64, 128, dtype=torch.float32)
    return accumulate_blocks.compile(a, b, c, BM=64, BN=128, BK=64, num_warps=4, arch="sm_90a",
                                     stop_after=stop_after, **kwargs)


BULK = "bulk reductions into global"


def test_a_relaxed_float32_accumulator_atomic_is_one_bulk_reduction_per_box():
    st = _splitk()
    # 128 float32 columns are four 128-byte panels: four boxes of all 128 rows through two 64 KB buffers, each
    # written (column pairs), fenced for the async proxy and handed to thread 0, which issues and commits it
    filecheck(st.cuda, r"""
    CHECK: atomic add (relaxed) into v2_C window by TMA: registers -> swizzled shared boxes -> bulk reductions into global
    CHECK-NEXT: {
    CHECK-NEXT: if (tid == 0) tj_bulk_wait_read0();  // an earlier TMA reduction has finished reading shared memory
    CHECK-NEXT: __syncthreads();
    CHECK: float* tj_d = reinterpret_cast<float*>(tj_smem + [[BUF0:\d+]] +
    CHECK-NEXT: tj_d[0] = v19_acc[i]; tj_d[1] = v19_acc[i + 1];
    CHECK: tj_fence_proxy_async();
    CHECK-NEXT: __syncthreads();
    CHECK-NEXT: if (tid == 0) { tj_tma_reduce_add_2d(&tj_tmap2, (int)(v10_n0), (int)(v7_m0), tj_smem_u32 + [[BUF0]]); tj_bulk_commit(); }
    CHECK-NOT: tj_bulk_wait
    CHECK: tj_tma_reduce_add_2d(&tj_tmap2, (int)(v10_n0) + 32, (int)(v7_m0), tj_smem_u32 + [[BUF1:\d+]]);
    CHECK: if (tid == 0) tj_bulk_wait_read1();  // the reduction that last read this buffer is done
    CHECK: tj_tma_reduce_add_2d(&tj_tmap2, (int)(v10_n0) + 64, (int)(v7_m0), tj_smem_u32 + [[BUF0]]);
    CHECK: if (tid == 0) tj_bulk_wait_read1();
    CHECK: tj_tma_reduce_add_2d(&tj_tmap2, (int)(v10_n0) + 96, (int)(v7_m0), tj_smem_u32 + [[BUF1]]);
    CHECK-NOT: tj_bulk_wait
    CHECK: if (tid == 0) tj_bulk_wait0();  // the TMA bulk reductions are complete before the program exits
    CHECK-NEXT: }
    """)
    assert "tj_red_add" not in st.cuda and "tj_atom_add" not in st.cuda
    # the map adds float32 elements: typed for the reduction, a 32-column x 128-row box
    assert {"tensor": "C", "box": [32, 128], "elem_bytes": 4, "data_type": "float32"} in st.tensor_maps


def test_the_reduction_compiles_to_utmaredg():
    ck = _splitk(stop_after="cubin")
    ptx, sass = ck.asm["ptx"], ck.asm["sass"]
    assert ptx.count("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group") == 4
    assert "cp.async.bulk.wait_group 0;" in ptx and "red.relaxed" not in ptx
    assert len(re.findall(r"UTMAREDG\.2D\.ADD", sass)) == 4
    assert not re.search(r"\bREDG\.", sass)  # (the per-element path's REDG.E.ADD.F32...)


def test_int32_accumulators_reduce_through_an_int32_map():
    """int8 products summed in int32: the staging writes keep the bits, and the map's type makes the add an s32
    one (the same as u32 in two's complement)."""
    i8 = torch.int8
    st = accumulate_blocks.compile(_meta(8, 64, 1024, dtype=i8), _meta(8, 128, 1024, dtype=i8),
                                   _meta(64, 128, dtype=torch.int32), BM=64, BN=128, BK=128, TB=True, ACC=T.int32,
                                   num_warps=4, arch="sm_90a", stop_after="cuda")
    assert BULK in st.cuda and "int32_t* tj_d = reinterpret_cast<int32_t*>" in st.cuda
    assert {"tensor": "C", "box": [32, 64], "elem_bytes": 4, "data_type": "int32"} in st.tensor_maps


def _loop_body(cuda: str) -> str:
    """The main loop of accumulate_blocks, from its header to the wait after it."""
    start = cuda.index("for (int64_t v7_k0")
    return cuda[start:cuda.index("tj_bulk_wait0();", start)]


@pytest.mark.parametrize("options", [{}, {"warp_specialize": True}], ids=["pipelined", "warp_specialized"])
def test_in_a_loop_the_issuing_thread_does_not_wait_after_the_reduction(options):
    """After an iteration's reductions, the next iteration's gemm runs at once: the only waits for their reads are
    before the threads rewrite the staging (the next iteration's reduction), and once after the loop, before its
    shared memory is given back. In the warp-specialized loop the staging's barriers are the math warps' named
    barrier (the producer warpgroup has left)."""
    st = _blocks(**options)
    body = _loop_body(st.cuda)
    sync = 'asm volatile("bar.sync 1, 128;" ::: "memory");' if options else "__syncthreads();"
    filecheck(body, rf"""
    CHECK: for (int64_t v7_k0
    CHECK-NOT: tj_bulk_wait
    CHECK: wgmma.mma_async
    CHECK-NOT: tj_bulk_wait
    CHECK: {BULK}
    CHECK-NEXT: {{
    CHECK-NEXT: if (tid == 0) tj_bulk_wait_read0();
    CHECK-NEXT: {sync}
    CHECK-NEXT: #pragma unroll
    CHECK: tj_tma_reduce_add_2d(&tj_tmap2, (int)(v14) + 96, (int)(v13),
    CHECK-NOT: tj_bulk_wait
    CHECK: if (tid == 0) tj_bulk_wait_read0();  // the loop's bulk reductions have read their staging
    CHECK-NEXT: {sync}
    CHECK-NOT: tj_bulk_wait
    """)
    # every wait inside the iteration precedes a rewrite of the staging, after a barrier of the writing threads
    for wait in re.finditer(r"if \(tid == 0\) tj_bulk_wait_read[01]\(\);.*\n", body[:body.index("the loop's bulk")]):
        after = body[wait.end():]
        assert after.lstrip().startswith(sync) and after.index("tj_d[0] =") < after.index("tj_tma_reduce_add_2d")
    if options:
        assert "tj_setmaxnreg_dec" in st.cuda and "__syncthreads();" not in body
    ck = _blocks(stop_after="cubin", **options)
    assert ck.asm["cubin"][:4] == b"\x7fELF" and "UTMAREDG.2D.ADD" in ck.asm["sass"]


def test_persistent_and_pingpong_walks_wait_once_at_the_end():
    for options in ({"persistent": True}, {"pingpong": True}):
        warps = 4 if options.get("pingpong") else 8
        a, b, c = _meta(1000, 4096), _meta(4096, 1000), _meta(1000, 1000, dtype=torch.float32)
        cuda = splitk_atomic.compile(a, b, c, 1024, BM=128, BN=128, BK=64, num_warps=warps, arch="sm_90a",
                                     stop_after="cuda", **options).cuda
        walk = cuda[cuda.index(BULK):]
        # the next program's reduction waits before it writes the staging; the program leaves once all are done
        assert walk.count("tj_bulk_wait_read0();") == 1 and walk.count("tj_bulk_wait0();") == 1, options
        assert walk.rstrip().endswith("if (tid == 0) tj_bulk_wait0();  // the TMA bulk reductions are complete "
                                      "before the program exits\n}")


@tilejit.kernel
def _atomic_variants(A, B, C, D, Old, M, N, WHAT: T.constexpr, BM: T.constexpr, BN: T.constexpr,
                     BK: T.constexpr):
    """One tile atomic_add of a gemm accumulator into C, in the form WHAT names."""
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, A.shape[1], BK, stages=3):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    if WHAT == "old_values_used":
        old = T.atomic_add(C[m0:m0 + BM, n0:n0 + BN], acc, sem="relaxed")
        Old[m0:m0 + BM, n0:n0 + BN] = old
    elif WHAT == "index_tile":
        rows = m0 + T.arange(0, BM)
        T.atomic_add(C[rows, n0:n0 + BN], acc, sem="relaxed")
    elif WHAT == "bounded_view":
        T.atomic_add(T.bounded(C, (M, N))[m0:m0 + BM, n0:n0 + BN], acc, sem="relaxed")
    elif WHAT == "not_an_accumulator":
        T.atomic_add(C[m0:m0 + BM, n0:n0 + BN], D[m0:m0 + BM, n0:n0 + BN], sem="relaxed")
    elif WHAT == "read_back":
        T.atomic_add(C[m0:m0 + BM, n0:n0 + BN], acc, sem="relaxed")
        D[m0:m0 + BM, n0:n0 + BN] = C[m0:m0 + BM, n0:n0 + BN]
    elif WHAT == "with_an_acq_rel_add":
        T.atomic_add(C[m0:m0 + BM, n0:n0 + BN], acc, sem="relaxed")
        T.atomic_add(C[m0:m0 + BM, n0:n0 + BN], acc, sem="acq_rel")
    elif WHAT == "two_adds":
        T.atomic_add(C[m0:m0 + BM, n0:n0 + BN], acc, sem="relaxed")
        T.atomic_add(C[m0:m0 + BM, n0:n0 + BN], acc * 2.0, sem="relaxed")
    else:  # WHAT == "half": the f16 tensor takes red.add.noftz.f16
        T.atomic_add(Old[m0:m0 + BM, n0:n0 + BN], acc.to(Old.dtype), sem="relaxed")


def _variant(what, old_dtype=torch.float32):
    f32 = torch.float32
    args = (_meta(1000, 512), _meta(512, 1000), _meta(1000, 1000, dtype=f32), _meta(1000, 1000, dtype=f32),
            _meta(1000, 1000, dtype=old_dtype), 1000, 1000)
    return _atomic_variants.compile(*args, WHAT=what, BM=128, BN=128, BK=64, num_warps=8, arch="sm_90a",
                                    stop_after="cuda").cuda


@pytest.mark.parametrize("case", ["acq_rel", "sys", "sm_80", "old_values_used", "index_tile", "bounded_view",
                                  "not_an_accumulator", "read_back", "with_an_acq_rel_add", "half", "no_room"])
def test_atomics_the_bulk_reduction_does_not_match_keep_the_per_element_path(case):
    """acq_rel (the default) and sys scope: a bulk reduction is relaxed at gpu scope; sm_80 and a loaded tile: not
    in a wgmma accumulator layout; old values used or an index tile: no window to reduce into; a T.bounded view:
    TMA clips at the tensor's own extents; f16: not verified to round as red.add.noftz.f16 does; a kernel that
    reads the tensor back (the reduction would complete after the read) or also adds into it otherwise (a generic-
    and an async-proxy atomic are not atomic with respect to each other); a ring that leaves no room for a staging
    buffer."""
    if case in ("acq_rel", "sys"):
        cuda = _splitk(**({"SEM": "acq_rel"} if case == "acq_rel" else {"SCOPE": "sys"})).cuda
        per_element = "tj_atom_add_float32_acq_rel_gpu(" if case == "acq_rel" else "tj_red_add_float32_relaxed_sys("
    elif case == "sm_80":
        cuda, per_element = _splitk(arch="sm_80").cuda, "tj_red_add_float32_relaxed_gpu("
    elif case == "no_room":  # 11 stages of 20 KB leave 5 KB: not one 8 KB box of 64 rows
        a, b, c = _meta(8, 64, 1024), _meta(8, 1024, 256), _meta(64, 256, dtype=torch.float32)
        st = accumulate_blocks.compile(a, b, c, BM=64, BN=256, BK=32, STAGES=11, num_warps=4, arch="sm_90a",
                                       stop_after="cuda")
        assert st.shared_bytes > 220 * 1024
        cuda, per_element = st.cuda, "tj_red_add_float32_relaxed_gpu("
    elif case == "half":
        cuda, per_element = _variant(case, torch.float16), "tj_red_add_float16_relaxed_gpu("
    else:
        returns = case == "old_values_used"
        cuda = _variant(case)
        per_element = "tj_atom_add_float32_relaxed_gpu(" if returns else "tj_red_add_float32_relaxed_gpu("
    assert BULK not in cuda and "tj_tma_reduce_add" not in cuda and "tj_bulk_wait0" not in cuda
    assert per_element in cuda


def test_two_reductions_into_one_tensor_both_take_the_bulk_path():
    """Relaxed adds commute: a tensor only reduced into, by two atomics, needs no ordering between them."""
    cuda = _variant("two_adds")
    assert cuda.count(BULK) == 2 and "tj_red_add" not in cuda
    # the second waits for the first's reads before it writes its own staging
    second = cuda[cuda.rindex(BULK):]
    assert second.index("tj_bulk_wait_read0();") < second.index("tj_d[0] =")


def test_the_runtime_encodes_a_typed_map_for_a_reduction(monkeypatch):
    """cuTensorMapEncodeTiled gets CU_TENSOR_MAP_DATA_TYPE_FLOAT32 (7) / _INT32 (3) for a reduction's map, and an
    unsigned type of the element's size (UINT32: 2) for a copy's (cuda.h's CUtensorMapDataType)."""
    calls = []

    def fake(name):
        assert name == "cuTensorMapEncodeTiled"
        return lambda *args: calls.append(args) or 0

    monkeypatch.setattr(libcuda, "function", fake)
    packer = tma.TensorMapPacker([{"tensor": "C", "box": [32, 64], "elem_bytes": 4, "data_type": "float32"},
                                  {"tensor": "C", "box": [32, 64], "elem_bytes": 4, "data_type": "int32"},
                                  {"tensor": "C", "box": [32, 64], "elem_bytes": 4}], {"C": (0, 2)})
    packer.maps([0x7100_0000, 1000, 904, 904, 1])
    assert [call[1] for call in calls] == [7, 3, 2]


def test_the_interpreter_sums_split_k_partials(monkeypatch):
    """The interpreter runs the atomic as before (one program after another): C0 + A @ B, C0 random, A and B
    exact in bf16 (a float32 gemm would round its operands to tf32)."""
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    torch.manual_seed(0)
    m, n, k, k_split = 70, 90, 160, 64
    a, b = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(k, n, dtype=torch.bfloat16)
    c0 = torch.randn(m, n)
    c = c0.clone()
    splitk_atomic[(tilejit.cdiv(m, 32), tilejit.cdiv(n, 32), tilejit.cdiv(k, k_split))](a, b, c, k_split, BM=32, BN=32,
                                                                                        BK=32)
    torch.testing.assert_close(c.double(), c0.double() + a.double() @ b.double(), rtol=1e-5, atol=1e-4)
