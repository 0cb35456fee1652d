"""MN-major tf32 operands on sm_90a wgmma with the MN-major operand read into registers (``lower_wgmma_mn``).

The DESIGN matmul in float32 (B given K x N) computes ``C^T = B^T A^T``: the instruction's A is a register
fragment gathered from B's swizzled K x N tile, its B is A's K-major tile, and the result is the accumulator's
layout with its dims swapped. The generated fragment loads are replayed here thread by thread against the shared
tile's layout: every register must hold the element the PTX fragment of A puts there, each instruction must read
the registers and the descriptor of one k step, and the result layout must map every register to the transposed
coordinates of the instruction's accumulator. The commits, waits and fragment loads are replayed over several
iterations: no register is reloaded while an instruction that reads it may be pending. Then: no transposing copy,
no shrunk ring in the default tf32 autotune space, cubins without spills or serialized wgmma, and the other arches
unchanged.
"""
from __future__ import annotations

import re
import warnings

import pytest
import torch

from _lowering import kernel_body, lower
from filecheck import filecheck
from kernels import matmul, matmul_any, matmul_staged

import tilejit.language as T
from tilejit.configs import matmul_configs
from tilejit.ir.layouts import PermutedLayout, WgmmaLayout


def _meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _design(bm, bn, bk, warps, m=1024, n=1024, k=1024, **options):
    """The DESIGN matmul (examples/matmul.py) in float32: A M x K, B K x N."""
    return lower(matmul, _meta(m, k), _meta(k, n), _meta(m, n), BM=bm, BN=bn, BK=bk, num_warps=warps,
                 arch=options.pop("arch", "sm_90a"), **options)


def _any(ta, tb, bm, bn, bk, warps, m=1024, n=1024, k=1024, **options):
    a = _meta(k, m) if ta else _meta(m, k)
    b = _meta(n, k) if tb else _meta(k, n)
    return lower(matmul_any, a, b, _meta(m, n), BM=bm, BN=bn, BK=bk, TA=ta, TB=tb, ACC=T.float32,
                 PRECISION="tf32", num_warps=warps, arch=options.pop("arch", "sm_90a"), **options)


def _gemm(fn):
    return next(op for op in fn.walk() if op.kind.mnemonic == "gemm")


def _py(expr: str) -> str:
    # the emitted index math is non-negative integer arithmetic, fully parenthesised
    return expr.replace("/", "//")


def _replay_fragments(cuda: str, source_layout, threads: int) -> dict[int, list[tuple[int, tuple[int, int]]]]:
    """Per thread, in emission order, (fragment register index, the (k, mn) element of the K x MN tile its load
    reads)."""
    body = kernel_body(cuda)
    hoisted = {name: _py(expr) for name, expr in
               re.findall(r"const unsigned (tj_h\d+) = tj_opaque\(\(unsigned\)\((.*)\)\);", body)}
    loads = re.findall(r"tj_fa\[(\d+)\] = \*reinterpret_cast<const float\*>\(tj_fsrc \+ (tj_h\d+)(?: \+ (\d+))?\);",
                       body)
    assert loads
    where = {source_layout.elem_offset(k, mn): (k, mn)
             for k in range(source_layout.rows) for mn in range(source_layout.cols)}
    regs: dict[int, list[tuple[int, tuple[int, int]]]] = {}
    for tid in range(threads):
        base = {name: eval(expr, {}, {"tid": tid}) for name, expr in hoisted.items()}
        regs[tid] = [(int(index), where[base[name] + int(plus or 0)]) for index, name, plus in loads]
    return regs


def _expected(tid: int, j: int, r: int, slabs: int, groups: int) -> tuple[int, int]:
    """(k, mn) of fragment register ``r`` of instruction ``j`` (k step major, then slab) for thread ``tid``: the PTX
    tf32 A fragment's (row mn, col k) at that k step and slab."""
    wg, warp, lane = tid // 128, (tid // 32) % 4, tid % 32
    g, t = lane // 4, lane % 4
    kk, s = divmod(j, slabs)
    return 8 * kk + t + 4 * (r >> 1), (s * groups + wg) * 64 + warp * 16 + g + 8 * (r & 1)


def _instructions(cuda: str) -> list[tuple[list[int], int]]:
    """Each wgmma's fragment registers and its B descriptor's offset (>> 4), in issue order."""
    found = []
    for ins in re.findall(r"wgmma\.mma_async.*?\n.*?\n\s*: (.*?\"l\"\(.*?\)), \"r\"\(1\)\);", kernel_body(cuda)):
        regs = [int(x) for x in re.findall(r"tj_fa\[(\d+)\]", ins)]
        plus = re.search(r"\"l\"\(\(tj_bdesc \+ (\d+)ull\)\)", ins)
        found.append((regs, int(plus.group(1)) if plus else 0))
    return found


# (BM, BN, BK, warps): one and two warpgroups, one and two 64-row slabs of the instruction's M (= BN) each
TILES = [(128, 256, 32, 8), (256, 128, 32, 8), (128, 128, 32, 4), (64, 256, 32, 4), (128, 128, 16, 8)]


@pytest.mark.parametrize("tile", TILES, ids=lambda t: "{}x{}x{}-w{}".format(*t))
def test_b_given_k_by_n_is_the_register_a_of_the_transposed_product(tile):
    bm, bn, bk, warps = tile
    fn, cuda = _design(bm, bn, bk, warps)
    gemm = _gemm(fn)
    assert gemm.attrs.impl == "wgmma_mn_m64nNk8_tf32"
    assert not any(op.kind.mnemonic == "transpose_copy" for op in fn.walk())
    groups = warps // 4
    inst = WgmmaLayout((bn, bm), groups)
    assert gemm.result.type.layout == PermutedLayout(inst, (1, 0))
    # every register of the result is the instruction's accumulator element with its coordinates swapped
    for tid in range(warps * 32):
        for i in range(inst.regs):
            row, col = inst.coords(tid, i)
            assert gemm.result.type.layout.coords(tid, i) == [col, row]
    # instruction j's fragment (k step kk, slab s), in buffer j % 2, holds B[k, n] at the PTX tf32 A fragment's
    # (row n, col k)
    b_tile = gemm.operands[1].type.layout
    assert (b_tile.rows, b_tile.cols) == (bk, bn)
    regs = _replay_fragments(cuda, b_tile, warps * 32)
    slabs = inst.slabs
    count = bk // 8 * slabs
    for tid, loads in regs.items():
        assert len(loads) == count * 4
        for p, (index, elem) in enumerate(loads):
            j, r = divmod(p, 4)
            assert index == (j % 2) * 4 + r and elem == _expected(tid, j, r, slabs, groups), (tid, p)
    # each instruction reads its buffer and A's K-major tile at its k step (32 bytes a step)
    issued = _instructions(cuda)
    assert len(issued) == count
    for j, (frag, plus) in enumerate(issued):
        assert frag == [(j % 2) * 4 + r for r in range(4)]
        assert plus * 16 == j // slabs * 32


def test_the_transposed_product_is_what_the_store_writes():
    """Numerically, lane by lane: the instruction's D (the gathered fragments times A's K-major rows), read back
    through the result layout, is C = A @ B at every element."""
    bm, bn, bk, warps = 128, 128, 16, 4
    fn, cuda = _design(bm, bn, bk, warps)
    gemm = _gemm(fn)
    inst = gemm.result.type.layout.base
    regs = _replay_fragments(cuda, gemm.operands[1].type.layout, warps * 32)
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-4, 5, (bm, bk), generator=gen).double()
    b = torch.randint(-4, 5, (bk, bn), generator=gen).double()
    # the instruction's A (N x K), assembled from the lanes' registers by the PTX fragment map
    a2 = torch.full((bn, bk), float("nan"), dtype=torch.float64)
    for tid, loads in regs.items():
        wg, warp, lane = tid // 128, (tid // 32) % 4, tid % 32
        g, t = lane // 4, lane % 4
        for p, (_, (k, n)) in enumerate(loads):  # the p-th load: instruction p // 4, register p % 4
            (kk, s), r = divmod(p // 4, inst.slabs), p % 4
            row = (s * inst.groups + wg) * 64 + warp * 16 + g + 8 * (r & 1)
            a2[row, 8 * kk + t + 4 * (r >> 1)] = b[k, n]
    d = a2 @ a.T  # wgmma: D (N x M) = A'' (N x K) times B'' (M rows of K, K-major)
    out = torch.full((bm, bn), float("nan"), dtype=torch.float64)
    for tid in range(warps * 32):
        for i in range(inst.regs):
            row, col = inst.coords(tid, i)
            m, n = gemm.result.type.layout.coords(tid, i)
            out[m, n] = d[row, col]
    assert torch.equal(out, a @ b)


def test_a_given_k_by_m_is_read_into_registers_without_swapping():
    fn, cuda = _any(True, True, 128, 256, 32, 8)
    gemm = _gemm(fn)
    assert gemm.attrs.impl == "wgmma_mn_m64nNk8_tf32"
    assert gemm.result.type.layout == WgmmaLayout((128, 256), 2)
    a_tile = gemm.operands[0].type.layout
    assert (a_tile.rows, a_tile.cols) == (32, 128)
    regs = _replay_fragments(cuda, a_tile, 256)
    for tid, loads in regs.items():
        assert len(loads) == 16
        for p, (index, elem) in enumerate(loads):
            j, r = divmod(p, 4)
            assert index == (j % 2) * 4 + r and elem == _expected(tid, j, r, 1, 2)


def test_both_mn_major_copy_both_operands_for_the_descriptor_lowering():
    """A given K x M and B given K x N: no copy is paired with the gathered form (its registers and a copy's code
    together spill at 128x256); both are copied K-major, as before."""
    fn, _ = _any(True, False, 128, 256, 32, 8)
    gemm = _gemm(fn)
    copies = [op for op in fn.walk() if op.kind.mnemonic == "transpose_copy"]
    assert gemm.attrs.impl == "wgmma_m64nNk8_tf32" and len(copies) == 2
    assert not gemm.attrs.transpose_a and gemm.attrs.transpose_b


def test_k_major_operands_keep_the_descriptor_lowering():
    fn, cuda = _any(False, True, 128, 256, 32, 8)
    assert _gemm(fn).attrs.impl == "wgmma_m64nNk8_tf32" and "tj_fa" not in cuda


def _gemm_block(cuda: str) -> str:
    body = kernel_body(cuda)
    start = body.index("// gemm ")
    return body[start:body.index("}\n", body.index("tj_wgmma_commit();\n", body.rindex("tj_fa[", 0, len(body))))]


def _events(block: str) -> list[tuple]:
    """The gemm's fragment loads, instructions (the fragment registers they read), commits, waits and release,
    in order (a wait split over two asm statements for its operands counts once)."""
    events: list[tuple] = []
    for line in block.splitlines():
        if m := re.search(r"tj_fa\[(\d+)\] = ", line):
            events.append(("load", int(m.group(1))))
        elif "wgmma.mma_async" in line:
            events.append(("mma", set()))
        elif '"r"(__float_as_uint(tj_fa[' in line:
            events[-1][1].update(int(x) for x in re.findall(r"tj_fa\[(\d+)\]", line))
        elif "tj_wgmma_commit();" in line:
            events.append(("commit",))
        elif m := re.search(r"wgmma\.wait_group\.sync\.aligned (\d+);", line):
            if not events or events[-1] != ("wait", int(m.group(1))):
                events.append(("wait", int(m.group(1))))
        elif "tj_mbar_arrive" in line:
            events.append(("release",))
    return events


def _replay_groups(events: list[tuple], iterations: int = 4) -> None:
    """Runs the gemm's events for several iterations of the loop that leaves it in flight: no fragment register is
    loaded while a pending or open instruction reads it, and at the slot's release no group of the previous
    iteration is pending (groups complete in commit order; ``wait N`` leaves the newest N pending)."""
    pending: list[tuple[int, set]] = []  # (iteration, registers read) of each committed, incomplete group
    for it in range(iterations):
        open_group: set = set()
        for event in events:
            if event[0] == "load":
                assert all(event[1] not in regs for _, regs in pending), (it, event)
                assert event[1] not in open_group
            elif event[0] == "mma":
                open_group |= event[1]
            elif event[0] == "commit":
                pending.append((it, open_group))
                open_group = set()
            elif event[0] == "wait":
                pending = pending[len(pending) - event[1]:] if event[1] else []
            elif event[0] == "release":
                assert all(i == it for i, _ in pending), (it, [i for i, _ in pending])
        assert not open_group


@pytest.mark.parametrize("options", [{}, dict(warp_specialize=True), dict(persistent=True)],
                         ids=["plain", "ws", "persistent"])
def test_in_flight_loop_commits_each_instruction_and_waits_before_reloading_its_registers(options):
    fn, cuda = _design(128, 256, 32, 8, num_stages=3, **options)
    loop = next(op for op in fn.walk() if op.kind.mnemonic == "for")
    assert loop.attrs.async_mma == "wgmma"
    if options:
        assert loop.attrs.producer_warpgroup
    block = _gemm_block(cuda)
    filecheck(block, r"""
        CHECK: gemm 128x256x32 on wgmma.m64n128k8 (2 warpgroup(s), 2 slab(s) of 64 rows each), A from registers
        CHECK-SAME: left in flight
        CHECK: wgmma.wait_group.sync.aligned 1;
        CHECK: tj_fa[0] = *reinterpret_cast<const float*>(tj_fsrc + tj_h
        CHECK: tj_wgmma_fence();
        CHECK: wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {{\{%0, .*\}, \{%64, %65, %66, %67\}, %68, p, 1, 1;}}
        CHECK: tj_wgmma_commit();  // one group per instruction
        CHECK-NEXT: wgmma.wait_group.sync.aligned 1;
        CHECK: tj_fa[4] = *reinterpret_cast<const float*>(tj_fsrc + tj_h{{\d+}} + 16384);
        CHECK: tj_wgmma_fence();  // this instruction's A registers were written by ordinary loads
        CHECK: tj_fa[0] = *reinterpret_cast<const float*>(tj_fsrc + tj_h{{\d+}} + 1024);
        CHECK: release its slot
        CHECK-NOT: wgmma.wait_group
        CHECK: tj_mbar_arrive
    """)
    assert "transposing copy" not in cuda
    events = _events(block)
    assert sum(e[0] == "commit" for e in events) == 8 and sum(e[0] == "mma" for e in events) == 8
    _replay_groups(events)


def test_group_replay_catches_a_missing_wait():
    """The replay above fails on the same events with the waits taken out (a register reloaded in flight)."""
    events = [e for e in _events(_gemm_block(_design(128, 256, 32, 8, num_stages=3)[1])) if e[0] != "wait"]
    with pytest.raises(AssertionError):
        _replay_groups(events)


def test_loop_not_left_in_flight_completes_the_gemm_in_its_iteration():
    fn, cuda = lower(matmul_staged, _meta(1024, 1024), _meta(1024, 1024), _meta(1024, 1024), BM=128, BN=256, BK=32,
                     num_warps=8, num_stages=1, arch="sm_90a")
    assert _gemm(fn).attrs.impl == "wgmma_mn_m64nNk8_tf32"
    events = _events(_gemm_block(cuda))
    # no wait before the first two instructions' loads (nothing earlier reads their buffers); all done at the end
    assert events[0][0] == "load" and events[-1] == ("wait", 0)
    _replay_groups(events)
    with pytest.raises(AssertionError):
        _replay_groups([e for e in events if e[0] != "wait"])


def test_pinned_descriptor_lowering_keeps_the_transposing_copy(monkeypatch):
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", "wgmma_m64nNk8_tf32")
    fn, cuda = _design(128, 256, 32, 8)
    assert _gemm(fn).attrs.impl == "wgmma_m64nNk8_tf32" and "// transposing copy" in cuda


def test_other_arches_are_unchanged():
    """sm_80 reads MN-major tf32 fragments with mma.sync; sm_100a's tcgen05 keeps the transposing copy."""
    fn, _ = _design(128, 128, 32, 4, arch="sm_80")
    assert _gemm(fn).attrs.impl == "mma_sync_m16n8k8_tf32"
    fn, _ = _design(128, 256, 32, 8, arch="sm_100a")
    assert _gemm(fn).attrs.impl.startswith("tcgen05")
    assert any(op.kind.mnemonic == "transpose_copy" for op in fn.walk())


def test_default_tf32_space_compiles_without_shrinking():
    """Every config of the float32 autotune space takes the register form where its shapes allow and none is
    compiled with fewer stages than it names (the copy's ring no longer takes shared memory)."""
    impls = set()
    for config in matmul_configs(elem_bytes=4):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fn, _ = lower(matmul, _meta(4096, 4096), _meta(4096, 4096), _meta(4096, 4096), arch="sm_90a",
                          **config.all_kwargs())
        impls.add(_gemm(fn).attrs.impl)
    assert "wgmma_mn_m64nNk8_tf32" in impls


@pytest.mark.parametrize("options", [{}, dict(warp_specialize=True)], ids=["plain", "ws"])
@pytest.mark.parametrize("tile", [(128, 256, 8), (256, 128, 8)], ids=["128x256", "256x128"])
def test_compiles_without_spills_or_serialized_wgmma(tile, options):
    bm, bn, warps = tile
    compiled = matmul.compile(_meta(1024, 1024), _meta(1024, 1024), _meta(1024, 1024), BM=bm, BN=bn, BK=32,
                              num_warps=warps, num_stages=4, arch="sm_90a", **options)
    assert compiled.meta["spills"] == 0 and not compiled.meta["wgmma_serialized"]
    assert "transpose_copy" not in compiled.asm["ir"]
