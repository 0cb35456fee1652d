"""The TMA store epilogue on sm_90a: a wgmma accumulator tile (after its cast) stored
into a tensor TMA can describe goes registers -> 128-byte-swizzled shared tile -> one bulk tensor store per
128-byte panel; every other store keeps the masked element-wise path."""
from __future__ import annotations

import re

import torch

import tilejit
import tilejit.language as T
from kernels import matmul_any
from tilejit.ir.layouts import SharedLayout


def _meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _design(c_dtype=torch.float16, c_shape=(1000, 904), arch="sm_90a", warps=8, bm=128, bn=256):
    a, b = _meta(1000, 512), _meta(c_shape[1], 512)
    # (num_stages given: the plain kernel, not the launch model's warp-specialized one; passes/launch_model.py)
    return matmul_any.compile(a, b, _meta(*c_shape, dtype=c_dtype), BM=bm, BN=bn, BK=64, TA=False, TB=True,
                              ACC=T.float32, num_warps=warps, num_stages=3, arch=arch, stop_after="cuda")


def test_accumulator_store_goes_through_swizzled_panels_and_tma():
    st = _design()
    cuda = st.cuda
    assert "by TMA: registers -> swizzled shared boxes -> global" in cuda
    # one bulk store per 128-byte panel of the 256 half columns, from two alternating 16 KB panel buffers
    stores = re.findall(r"tj_tma_store_2d\(&tj_tmap\d+, \(int\)\((\w+)\)(?: \+ (\d+))?, \(int\)\((\w+)\), "
                        r"tj_smem_u32 \+ (\d+)\);", cuda)
    assert [int(s[1] or 0) for s in stores] == [0, 64, 128, 192]
    base = int(stores[0][3])
    assert base % 1024 == 0 and [int(s[3]) - base for s in stores] == [0, 16384, 0, 16384]
    body = cuda[cuda.index("window by TMA"):]
    panel = ["__syncthreads();", "*reinterpret_cast<unsigned*>(tj_smem", "tj_fence_proxy_async();", "__syncthreads();",
             "tj_tma_store_2d(", "tj_bulk_commit();"]
    # the first wait frees both buffers for panels 0 and 1; before panel p > 1: the store that read its buffer two
    # panels ago is done (one group may stay in flight)
    order = ["tj_bulk_wait_read0();", *panel, *panel[1:]] + (["tj_bulk_wait_read1();", *panel] * 2) \
        + ["tj_bulk_wait_read0();"]
    at = 0
    for needle in order:
        at = body.index(needle, at) + len(needle)
    # each panel's threads write only that panel's column pairs: 256 columns / 4 panels over 2 warpgroups
    writes = re.findall(r"for \(int tj_q = (\d+); tj_q < (\d+); \+\+tj_q\)", body)
    assert [(int(a), int(b)) for a, b in writes] == [(0, 16), (16, 32), (32, 48), (48, 64)]
    # the C tensor's map: a 64 x 128 box (innermost first) of 2-byte elements
    assert {"tensor": "C", "box": [64, 128], "elem_bytes": 2} in st.tensor_maps
    assert "st.global" not in cuda  # no element-wise fallback remains for this store


def test_a_full_ring_stores_slab_boxes_through_two_buffers():
    """A persistent 256x128 tile on a 4-deep ring leaves 33 KB of shared memory: not two buffers of a 256-row
    panel (32 KB each), so the tile goes out in boxes of one register slab's 128 rows (a thread's registers fall
    in one box whatever the thread) through two 16 KB buffers, alternating, each box's store waited for only when
    its buffer comes round again; the walk's last store is waited for once, after the walk."""
    from kernels import matmul_staged

    c = _meta(1000, 904)
    st = matmul_staged.compile(_meta(1000, 520), _meta(520, 904), c, BM=256, BN=128, BK=64, num_warps=8,
                               num_stages=4, persistent=True, arch="sm_90a", stop_after="cuda")
    cuda = st.cuda
    stores = re.findall(r"tj_tma_store_2d\(&tj_tmap\d+, \(int\)\(\w+\)(?: \+ (\d+))?, \(int\)\(\w+\)(?: \+ (\d+))?, "
                        r"tj_smem_u32 \+ (\d+)\);", cuda)
    assert [(int(col or 0), int(row or 0)) for col, row, _ in stores] == [(0, 0), (64, 0), (0, 128), (64, 128)]
    base = int(stores[0][2])
    assert base % 1024 == 0 and [int(s[2]) - base for s in stores] == [0, 16384, 0, 16384]
    assert {"tensor": "C", "box": [64, 128], "elem_bytes": 2} in st.tensor_maps
    body = cuda[cuda.index("window by TMA"):]
    assert body.count("tj_bulk_wait_read1();") == 2 and body.count("tj_bulk_wait_read0();") == 2
    # the last one, after the walk's loop: once the walk ends, before the program leaves
    assert body.rstrip().endswith("if (tid == 0) tj_bulk_wait_read0();  // the shared memory stays valid until the "
                                  "last TMA store has read it\n}")
    # slab s of both warpgroups (registers 64 s .. 64 s + 63) is box row s: column pairs of panel p in turn
    writes = re.findall(r"for \(int tj_q = (\d+); tj_q < (\d+); \+\+tj_q\)", body)
    assert [(int(a), int(b)) for a, b in writes] == [(0, 16), (16, 32), (32, 48), (48, 64)]
    assert st.shared_bytes <= 232448


def test_float32_accumulator_store_and_a_128_byte_row():
    st = _design(c_dtype=torch.float32, bn=32, bm=64, warps=4)
    assert "window by TMA" in st.cuda and "tj_d[0] =" in st.cuda
    assert {"tensor": "C", "box": [32, 64], "elem_bytes": 4} in st.tensor_maps


def test_stores_tma_cannot_take_keep_the_element_wise_path():
    # sm_80 has no TMA; rows of 777 halves are not 16-byte multiples; 48 columns are not a 128-byte panel
    for kwargs in (dict(arch="sm_80"), dict(c_shape=(1000, 777))):
        assert "window by TMA" not in _design(**kwargs).cuda, kwargs
    assert "window by TMA" not in _design(bn=48, bm=64, warps=4).cuda

    @tilejit.kernel
    def bounded_store(A, B, C, M, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
        acc = T.zeros((BM, BN), T.float32)
        for k0 in T.range(0, A.shape[1], BK):
            acc += A[0:BM, k0:k0 + BK] @ B[k0:k0 + BK, 0:BN]
        view = T.bounded(C, (M, BN))
        view[0:BM, 0:BN] = acc.to(C.dtype)

    a = _meta(256, 256)
    cuda = bounded_store.compile(a, a, a, 100, BM=128, BN=128, BK=64, num_warps=4, arch="sm_90a",
                                 stop_after="cuda").cuda
    assert "window by TMA" not in cuda  # a runtime-bounded view: TMA would clip at C's own extents


def test_the_staging_tile_matches_the_tma_128_byte_swizzle():
    """Element (r, c) of the staging tile sits where a TMA box with 128-byte swizzle expects it: panel c // 64,
    row r at 128 r, 16-byte chunk (c % 64) // 8 XOR r % 8 (for 2-byte elements)."""
    lay = SharedLayout(128, 256, 2)
    for r in range(128):
        for c in range(0, 256, 2):
            expected = (c // 64) * 128 * 128 + r * 128 + ((((c % 64) * 2) // 16) ^ (r % 8)) * 16 + (c * 2) % 16
            assert lay.elem_offset(r, c) == expected


def test_cubin_builds_with_no_spills():
    st = matmul_any.compile(_meta(1000, 512), _meta(904, 512), _meta(1000, 904), BM=128, BN=256, BK=64, TA=False,
                            TB=True, ACC=T.float32, num_warps=8, arch="sm_90a")
    assert st.asm["cubin"][:4] == b"\x7fELF"
    assert "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group" in st.asm["ptx"]
    assert "cp.async.bulk.wait_group.read 0" in st.asm["ptx"]


def test_int32_accumulator_keeps_its_bits():
    """int8 products store int32 sums: the staging writes are int32 (a float store would convert the value)."""
    a, b = _meta(1000, 512, dtype=torch.int8), _meta(904, 512, dtype=torch.int8)
    st = matmul_any.compile(a, b, _meta(1000, 904, dtype=torch.int32), BM=128, BN=128, BK=128, TA=False, TB=True,
                            ACC=T.int32, num_warps=8, arch="sm_90a", stop_after="cuda")
    assert "window by TMA" in st.cuda and "int32_t* tj_d = reinterpret_cast<int32_t*>" in st.cuda
    assert "float* tj_d" not in st.cuda
