"""MN-major float8 and int8 operands on sm_90a wgmma, gathered into registers as the instruction's A
(``backend_cuda/lower_wgmma_mn8.py``).

The generated gemm is interpreted thread by thread: every ``ldmatrix.x4.trans`` reads the 16-byte rows its lanes
address through the real swizzled ``SharedLayout`` of the MN-major tile (each byte stands for its (k, mn)
element) and hands each lane its b16 elements as the PTX ISA defines it, every ``__byte_perm`` picks bytes by its
selector, every ``__shfl_sync`` takes the source lane's word, every select its operand; at each wgmma, every
byte of every fragment register must be the element the PTX table of the 8-bit A fragment puts there (lane
4g + t: a0 (row g, k 4t..4t+3), a1 (row g + 8), a2 (k + 16), a3 (both); rows 16 * warp of the slab). The commits
and waits are replayed with it, over several iterations: no fragment register is written while an instruction
that reads it may be pending. Then: the bank conflicts of each ldmatrix phase (none), dispatch, the pinned
copy, the autotune space, and cubins without spills.
"""
from __future__ import annotations

import re
import warnings

import pytest
import torch

from _lowering import braced_block, kernel_body, lower
from filecheck import filecheck
from kernels import matmul, matmul_any

from tilejit.backend_cuda.lower_wgmma import PROMOTION_K, promotion_chunks
from tilejit.backend_cuda.lower_wgmma_mn import GATHER_REGISTERS
from tilejit.backend_cuda.lower_wgmma_mn8 import SELECT_MN_ODD, SELECT_T_HIGH, SELECT_WORD, ldmatrix_coords
from tilejit.configs import matmul_configs, promotion_fits
from tilejit.ir.layouts import PermutedLayout, WgmmaLayout

F8, I8 = torch.float8_e4m3fn, torch.int8


def _meta(*shape, dtype=F8):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _acc(dtype):
    return torch.int32 if dtype == I8 else torch.float32


def _design(bm, bn, bk, warps, dtype=F8, m=1024, n=1024, k=1024, **options):
    """The DESIGN matmul (examples/matmul.py): A M x K, B K x N (precision "precise" for float8)."""
    return lower(matmul, _meta(m, k, dtype=dtype), _meta(k, n, dtype=dtype), _meta(m, n, dtype=_acc(dtype)),
                 BM=bm, BN=bn, BK=bk, num_warps=warps, arch=options.pop("arch", "sm_90a"), **options)


def _any(ta, tb, bm, bn, bk, warps, dtype=F8, precision=None, m=1024, n=1024, k=1024, **options):
    import tilejit.language as T
    a = _meta(k, m, dtype=dtype) if ta else _meta(m, k, dtype=dtype)
    b = _meta(n, k, dtype=dtype) if tb else _meta(k, n, dtype=dtype)
    acc = T.int32 if dtype == I8 else T.float32
    return lower(matmul_any, a, b, _meta(m, n, dtype=_acc(dtype)), BM=bm, BN=bn, BK=bk, TA=ta, TB=tb, ACC=acc,
                 PRECISION=precision, num_warps=warps, arch=options.pop("arch", "sm_90a"), **options)


def _gemm(fn):
    return next(op for op in fn.walk() if op.kind.mnemonic == "gemm")


def _copies(fn) -> int:
    return sum(op.kind.mnemonic == "transpose_copy" for op in fn.walk())


def _py(expr: str) -> str:
    """A hoisted C expression (non-negative integer arithmetic, fully parenthesised, or a selector's ternary) as
    Python."""
    expr = re.sub(r"(0x[0-9a-f]+)u", r"\1", expr.replace("/", "//"))
    if m := re.fullmatch(r"(.*) \? (\w+) : (\w+)", expr):
        return f"({m.group(2)} if ({m.group(1)}) else {m.group(3)})"
    return expr


def _byte_perm(x: tuple, y: tuple, selector: int) -> tuple:
    """PTX prmt (default mode): result byte i is byte (selector >> 4 i) & 7 of {y, x}."""
    data = x + y
    return tuple(data[(selector >> (4 * i)) & 7] for i in range(4))


LDMATRIX = re.compile(r"tj_ldmatrix_x4_trans_at<(\d+)>\(tj_w\[0\], tj_w\[1\], tj_w\[2\], tj_w\[3\], "
                      r"tj_fsa \+ (tj_h\d+)\);")
SHUFFLE = re.compile(r"tj_x\[(\d)\] = __shfl_sync\(0xffffffffu, __byte_perm\(tj_w\[(\d)\], tj_w\[(\d)\], (tj_h\d+)\), "
                     r"(tj_h\d+)(?: \^ (\d+)u)?\);")
ASSIGN = re.compile(r"tj_fa\[(\d+)\] = (tj_h\d+) \? tj_x\[(\d)\] : tj_x\[(\d)\];")
WAIT = re.compile(r"wgmma\.wait_group\.sync\.aligned (\d+);")


def ldmatrix_x4_trans(rows: list[list[tuple]]) -> list[list[tuple]]:
    """PTX ldmatrix .m8n8.x4.trans.b16 for one warp: ``rows[lane]`` is the 16 bytes at the row address lane
    gives (lanes 8 i .. 8 i + 7: rows 0..7 of matrix i); lane l receives in register i the b16 elements (row
    2 (l % 4), column l / 4) and (row 2 (l % 4) + 1, column l / 4) of matrix i, low half first."""
    out = []
    for lane in range(32):
        col, row = lane // 4, 2 * (lane % 4)
        out.append([rows[8 * i + row][2 * col:2 * col + 2] + rows[8 * i + row + 1][2 * col:2 * col + 2]
                    for i in range(4)])
    return out


class Replay:
    """Runs a gemm's generated block for every thread of the block: the fragment words each wgmma reads (per
    thread, 4 words of 4 (k, mn) elements), and the bank conflicts of each ldmatrix phase."""

    def __init__(self, cuda: str, tile_layout, threads: int):
        body = kernel_body(cuda)
        self.hoisted = {}
        for name, expr in re.findall(r"const unsigned (tj_h\d+) = tj_opaque\(\(unsigned\)\((.*)\)\);", body):
            code = compile(_py(expr), name, "eval")
            self.hoisted[name] = [eval(code, {}, {"tid": tid}) for tid in range(threads)]
        self.where = {tile_layout.elem_offset(k, mn): (k, mn)
                      for k in range(tile_layout.rows) for mn in range(tile_layout.cols)}
        self.threads = threads
        self.blocks = [[None] * 4 for _ in range(threads)]  # tj_w: what ldmatrix left
        self.words = [[None] * 4 for _ in range(threads)]  # tj_x: what the shuffles left
        self.fragments = [{} for _ in range(threads)]
        self.issued: list[list[tuple]] = []  # per wgmma: per thread, its 4 fragment words
        self.conflicts = 0  # the worst bank conflict of any ldmatrix phase (ways)
        self.phases = 0  # ldmatrix phases replayed
        self.pending: list[set] = []  # registers read by each committed, incomplete group
        self.open: set = set()

    def run(self, block: str) -> None:
        lines = block.splitlines()
        for at, line in enumerate(lines):
            if m := LDMATRIX.search(line):
                self._ldmatrix(int(m.group(1)), m.group(2))
            elif m := SHUFFLE.search(line):
                r, lo, hi = int(m.group(1)), int(m.group(2)), int(m.group(3))
                sel, source, flip = self.hoisted[m.group(4)], self.hoisted[m.group(5)], int(m.group(6) or 0)
                sent = [_byte_perm(self.blocks[t][lo], self.blocks[t][hi], sel[t]) for t in range(self.threads)]
                for t in range(self.threads):
                    self.words[t][r] = sent[t - t % 32 + (source[t] ^ flip) % 32]
            elif m := ASSIGN.search(line):
                index = int(m.group(1))
                assert all(index not in regs for regs in self.pending) and index not in self.open, \
                    f"fragment register {index} written while an instruction reading it may be pending"
                cond = self.hoisted[m.group(2)]
                for t in range(self.threads):
                    self.fragments[t][index] = self.words[t][int(m.group(3) if cond[t] else m.group(4))]
            elif "wgmma.mma_async" in line:
                operands = next(x for x in lines[at + 1:at + 4] if '"l"(' in x)
                regs = [int(x) for x in re.findall(r'"r"\(tj_fa\[(\d+)\]\)', operands)]
                assert len(regs) == 4
                self.open |= set(regs)
                self.issued.append([[self.fragments[t][i] for i in regs] for t in range(self.threads)])
            elif "tj_wgmma_commit();" in line:
                self.pending.append(self.open)
                self.open = set()
            elif m := WAIT.search(line):
                keep = int(m.group(1))
                self.pending = self.pending[len(self.pending) - keep:] if keep else []

    def _ldmatrix(self, plus: int, base: str) -> None:
        """Every warp's ``ldmatrix.x4.trans`` at ``tj_fsa + base + plus``: 16-byte-aligned rows of 16 bytes; per
        phase (one matrix: 8 rows), the most distinct words any bank serves."""
        for warp in range(self.threads // 32):
            rows = []
            for lane in range(32):
                off = self.hoisted[base][warp * 32 + lane] + plus
                assert off % 16 == 0
                rows.append(tuple(self.where[off + b] for b in range(16)))
            for i in range(4):
                banks: dict[int, set] = {}
                for lane in range(8 * i, 8 * i + 8):
                    off = self.hoisted[base][warp * 32 + lane] + plus
                    for word in range(off // 4, off // 4 + 4):
                        banks.setdefault(word % 32, set()).add(word)
                self.conflicts = max(self.conflicts, max(len(words) for words in banks.values()))
                self.phases += 1
            for lane, regs in enumerate(ldmatrix_x4_trans(rows)):
                self.blocks[warp * 32 + lane] = regs


def _expected(tid: int, kk: int, s: int, groups: int) -> list[tuple]:
    """The PTX 8-bit A fragment of k32 step ``kk`` and slab ``s`` for thread ``tid``: register r, byte b is
    (k, mn) = (32 kk + 16 (r >> 1) + 4 t + b, 64 (s * groups + wg) + 16 warp + g + 8 (r & 1))."""
    wg, warp, lane = tid // 128, (tid // 32) % 4, tid % 32
    g, t = lane // 4, lane % 4
    return [tuple((32 * kk + 16 * (r >> 1) + 4 * t + b, 64 * (s * groups + wg) + 16 * warp + g + 8 * (r & 1))
                  for b in range(4)) for r in range(4)]


def _order(gemm, inst: WgmmaLayout, precise: bool) -> list[tuple[int, int]]:
    """(k step, slab) of each instruction in issue order: k step major, then slab; a promoted gemm's by chunk
    (k group, slab, column band), then k step."""
    steps = gemm.operands[0].type.shape[0 if gemm.attrs.transpose_a else 1] // 32
    if not precise:
        return [(kk, s) for kk in range(steps) for s in range(inst.slabs)]
    width, _ = promotion_chunks(inst.regs, inst.shape[1], GATHER_REGISTERS)
    per = PROMOTION_K // 32
    return [(kk, s) for g in range(0, steps, per) for s in range(inst.slabs) for _ in range(inst.shape[1] // width)
            for kk in range(g, min(g + per, steps))]


def _gemm_block(cuda: str) -> str:
    """The gemm's own block of generated code (its comment and braces)."""
    body = kernel_body(cuda)
    start = body.index("// gemm ")
    block = braced_block(body, re.compile(r"\n\s*\{\n").search(body, start).start())  # (after the accumulator's copy)
    return body[start:body.index(block, start) + len(block)]


def _check(fn, cuda, warps, precise, iterations=1):
    gemm = _gemm(fn)
    swapped = not gemm.attrs.transpose_a
    mn_tile = gemm.operands[1 if swapped else 0].type.layout
    inst = gemm.result.type.layout.base if swapped else gemm.result.type.layout
    assert isinstance(inst, WgmmaLayout) and inst.groups == warps // 4
    replay = Replay(cuda, mn_tile, warps * 32)
    block = _gemm_block(cuda)
    order = _order(gemm, inst, precise)
    for _ in range(iterations):
        replay.issued = []
        replay.run(block)
        assert len(replay.issued) == len(order)
        for (kk, s), fragments in zip(order, replay.issued):
            for tid in range(warps * 32):
                assert fragments[tid] == _expected(tid, kk, s, inst.groups), (tid, kk, s)
    return replay


# (BM, BN, BK, warps): the swapped product's instruction M is BN: 4 slabs of one warpgroup (half-panel steps),
# 2 slabs of two, one 64-byte row, one slab of two
SWAPPED = [(128, 256, 128, 8), (64, 256, 64, 4), (128, 64, 64, 4), (256, 128, 128, 8), (128, 128, 128, 8)]


@pytest.mark.parametrize("dtype,precision", [(F8, None), (F8, "fast"), (I8, None)], ids=["precise", "fast", "int8"])
@pytest.mark.parametrize("tile", SWAPPED, ids=lambda t: "{}x{}x{}-w{}".format(*t))
def test_b_given_k_by_n_every_fragment_byte_is_the_ptx_element(tile, dtype, precision):
    bm, bn, bk, warps = tile
    fn, cuda = _any(False, False, bm, bn, bk, warps, dtype=dtype, precision=precision)
    gemm = _gemm(fn)
    assert gemm.attrs.impl == ("wgmma_mn_m64nNk32_int8" if dtype == I8 else "wgmma_mn_m64nNk32_fp8")
    assert not any(op.kind.mnemonic == "transpose_copy" for op in fn.walk())
    assert gemm.result.type.layout == PermutedLayout(WgmmaLayout((bn, bm), warps // 4), (1, 0))
    replay = _check(fn, cuda, warps, precise=dtype == F8 and precision is None, iterations=2)
    assert replay.conflicts == 1 and replay.phases


# A given K x M (not swapped): the instruction's M is BM; 128x256 precise runs in two column bands
@pytest.mark.parametrize("dtype,precision", [(F8, None), (F8, "fast"), (I8, None)], ids=["precise", "fast", "int8"])
@pytest.mark.parametrize("tile", [(128, 256, 128, 8), (64, 128, 64, 4), (256, 64, 64, 4)],
                         ids=lambda t: "{}x{}x{}-w{}".format(*t))
def test_a_given_k_by_m_every_fragment_byte_is_the_ptx_element(tile, dtype, precision):
    bm, bn, bk, warps = tile
    fn, cuda = _any(True, True, bm, bn, bk, warps, dtype=dtype, precision=precision)
    gemm = _gemm(fn)
    assert gemm.attrs.impl.startswith("wgmma_mn_m64nNk32")
    assert gemm.result.type.layout == WgmmaLayout((bm, bn), warps // 4)
    replay = _check(fn, cuda, warps, precise=dtype == F8 and precision is None, iterations=2)
    assert replay.conflicts == 1 and replay.phases


@pytest.mark.parametrize("wrong", ["selector", "source", "odd"])
def test_replay_catches_a_wrong_exchange(wrong):
    """The replay fails when the permute keeps the wrong k pairs for t >= 2, the second shuffle reads the wrong
    half of the warp, or the fragment registers are not swapped for odd g."""
    fn, cuda = _any(False, False, 128, 128, 64, 8, precision="fast")
    broken = {"selector": lambda c: c.replace(f"((tid >> 1) & 1) * {SELECT_T_HIGH:#x}u", "0"),
              "source": lambda c: c.replace("^ 16u)", "^ 8u)"),
              "odd": lambda c: c.replace("(tid >> 2) & 1", "(tid >> 3) & 1")}[wrong](cuda)
    assert broken != cuda
    with pytest.raises(AssertionError):
        _check(fn, broken, 8, precise=False)


def test_replay_catches_a_missing_wait():
    fn, cuda = _any(False, False, 128, 256, 128, 8, precision="fast")
    with pytest.raises(AssertionError, match="written while"):
        _check(fn, re.sub(r'asm volatile\("wgmma\.wait_group\.sync\.aligned 1;".*\n', "", cuda), 8, precise=False)


def test_ldmatrix_rows_give_each_lane_four_k_of_two_columns():
    """On symbolic rows: the row each lane addresses and the selectors leave lane (g, t) of one warp, for each k
    half h, the words (k 16 h + 4 t .. + 3) of mn columns 2 g and 2 g + 1 (in that order for g < 4, swapped for
    g >= 4), before the shuffles; a wrong half-swap of the k pairs (t >= 2) breaks it."""
    rows = []
    for lane in range(32):
        k, mn = ldmatrix_coords(lane)
        assert mn == 0
        rows.append(tuple((k, c) for c in range(16)))
    assert sorted(r[0][0] for r in rows) == list(range(32))
    for lane, blocks in enumerate(ldmatrix_x4_trans(rows)):
        g, t = lane // 4, lane % 4
        sel = SELECT_WORD ^ ((t >> 1) * SELECT_T_HIGH) ^ ((g >> 2) * SELECT_MN_ODD)
        for h in range(2):
            first = _byte_perm(blocks[2 * h], blocks[2 * h + 1], sel)
            second = _byte_perm(blocks[2 * h], blocks[2 * h + 1], sel ^ SELECT_MN_ODD)
            columns = (2 * g, 2 * g + 1) if g < 4 else (2 * g + 1, 2 * g)
            assert [first, second] == [tuple((16 * h + 4 * t + b, c) for b in range(4)) for c in columns]
            if t >= 2:
                assert _byte_perm(blocks[2 * h], blocks[2 * h + 1], sel ^ SELECT_T_HIGH) != first


@pytest.mark.parametrize("dtype,precision", [(F8, "fast"), (I8, None)], ids=["fast", "int8"])
@pytest.mark.parametrize("options", [dict(warp_specialize=True), dict(persistent=True)], ids=["ws", "persistent"])
def test_in_flight_loop_waits_before_rewriting_a_fragment_register(options, dtype, precision):
    """A loop that leaves its gemm in flight: the first fragment of an iteration is written after a wait that
    leaves only the previous iteration's last instruction pending; replayed over three iterations."""
    fn, cuda = _any(False, False, 128, 256, 128, 8, dtype=dtype, precision=precision, num_stages=3, **options)
    loop = next(op for op in fn.walk() if op.kind.mnemonic == "for")
    assert loop.attrs.async_mma == "wgmma" and loop.attrs.producer_warpgroup
    block = _gemm_block(cuda)
    kind = "s32.s8.s8" if dtype == I8 else "f32.e4m3.e4m3"
    filecheck(block, rf"""
        CHECK: gemm 128x256x128 on wgmma.m64n128k32 (2 warpgroup(s), 2 slab(s) of 64 rows each), A from registers
        CHECK-SAME: left in flight
        CHECK: tj_ldmatrix_x4_trans_at<0>(tj_w[0], tj_w[1], tj_w[2], tj_w[3], tj_fsa + tj_h
        CHECK: tj_x[0] = __shfl_sync(0xffffffffu, __byte_perm(
        CHECK: tj_x[1] = __shfl_sync(0xffffffffu, __byte_perm(
        CHECK: tj_x[2] = __shfl_sync(0xffffffffu, __byte_perm(
        CHECK: tj_x[3] = __shfl_sync(0xffffffffu, __byte_perm(
        CHECK-NEXT: wgmma.wait_group.sync.aligned 1;
        CHECK: tj_fa[0] = tj_h{{{{\d+}}}} ? tj_x[1] : tj_x[0];
        CHECK: wgmma.mma_async.sync.aligned.m64n128k32.{kind} {{{{\{{%0, .*\}}, \{{%64, %65, %66, %67\}}, %68, p}}}}
        CHECK: tj_wgmma_commit();  // one group per instruction
        CHECK: tj_fa[4] = tj_h{{{{\d+}}}} ? tj_x[1] : tj_x[0];
        CHECK: tj_wgmma_fence();  // this instruction's A registers were written by ordinary loads
        CHECK: release its slot
        CHECK-NOT: wgmma.wait_group
        CHECK: tj_mbar_arrive
    """)
    assert "transposing copy" not in cuda
    _check(fn, cuda, 8, precise=False, iterations=3)


def test_precise_gemm_in_a_loop_completes_in_its_iteration():
    """A precise float8 gemm is never left in flight: its chunks' fragments are double-buffered, every chunk is
    waited for and added, and the replay over iterations finds no register rewritten in flight."""
    fn, cuda = _any(False, False, 128, 256, 128, 8, num_stages=3, warp_specialize=True)
    block = _gemm_block(cuda)
    filecheck(block, r"""
        CHECK: promoted every 128 products of K: 4 chunk(s) of 64x64 into 1 temporary
        CHECK: wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3
        CHECK: tj_wgmma_commit();  // one group per instruction
        CHECK: wgmma.wait_group.sync.aligned 0;
        CHECK: += tj_p0[i];
    """)
    assert "left in flight" not in block
    _check(fn, cuda, 8, precise=True, iterations=3)


@pytest.mark.parametrize("dtype,impl", [(F8, "wgmma_mn_m64nNk32_fp8"), (torch.float8_e5m2, "wgmma_mn_m64nNk32_fp8"),
                                        (I8, "wgmma_mn_m64nNk32_int8")], ids=["e4m3", "e5m2", "int8"])
def test_dispatch_takes_the_register_form_for_one_mn_major_operand(dtype, impl):
    """B given K x N (the DESIGN matmul) and A given K x M: the gathered form, no copy; K-major operands keep the
    descriptor lowering; both MN-major: both copied K-major for the descriptor lowering (no copy beside a
    gathered fragment)."""
    precision = None if dtype == I8 else "fast"
    for ta, tb in ((False, False), (True, True)):
        fn, cuda = _any(ta, tb, 128, 256, 128, 8, dtype=dtype, precision=precision)
        assert _gemm(fn).attrs.impl == impl and not _copies(fn), (ta, tb)
        assert re.search(r'"r"\(tj_fa\[0\]\), "r"\(tj_fa\[1\]\), "r"\(tj_fa\[2\]\), "r"\(tj_fa\[3\]\), "l"\(', cuda)
    fn, cuda = _any(False, True, 128, 256, 128, 8, dtype=dtype, precision=precision)
    assert _gemm(fn).attrs.impl == impl.replace("_mn", "") and "tj_fa" not in cuda
    fn, _ = _any(True, False, 128, 256, 128, 8, dtype=dtype, precision=precision)
    assert _gemm(fn).attrs.impl == impl.replace("_mn", "") and _copies(fn) == 2


def test_pinned_descriptor_lowering_keeps_the_transposing_copy(monkeypatch):
    for dtype, pin in ((F8, "wgmma_m64nNk32_fp8"), (I8, "wgmma_m64nNk32_int8")):
        monkeypatch.setenv("TILEJIT_GEMM_LOWERING", pin)
        fn, cuda = _design(128, 256, 128, 8, dtype=dtype)
        assert _gemm(fn).attrs.impl == pin and "// transposing copy" in cuda and "tj_fa" not in cuda


def test_other_arches_and_shapes_are_unchanged():
    """sm_100a's tcgen05 keeps the transposing copy; sm_89 reads 8-bit fragments with mma.sync; a 192-byte MN row
    (not swizzled) and a pingpong group owning two slabs of M keep the copy."""
    fn, _ = _design(128, 256, 128, 8, arch="sm_100a")
    assert _gemm(fn).attrs.impl.startswith("tcgen05") and _copies(fn) == 1
    fn, _ = _design(128, 128, 64, 4, arch="sm_89")
    assert _gemm(fn).attrs.impl.startswith("mma_sync")
    fn, _ = _design(64, 192, 128, 4, dtype=I8)
    assert _gemm(fn).attrs.impl == "wgmma_m64nNk32_int8" and _copies(fn) == 1
    fn, _ = _design(128, 128, 128, 4, dtype=I8, pingpong=True)
    assert _gemm(fn).attrs.impl == "wgmma_m64nNk32_int8"
    fn, _ = _design(64, 256, 128, 4, dtype=I8, pingpong=True)
    assert _gemm(fn).attrs.impl == "wgmma_mn_m64nNk32_int8"


@pytest.mark.parametrize("dtype", [F8, I8], ids=["fp8", "int8"])
def test_default_8bit_space_takes_the_register_form_without_shrinking(dtype):
    """Every config of the 8-bit autotune space that ``matmul_prune`` keeps for B stored K x N (``promotion_fits``)
    compiles with no warning (no ring shrunk below what it names); all but the 192-wide tile (a row the
    swizzle cannot take) gather B into registers."""
    impls = {}
    for config in matmul_configs(elem_bytes=1):
        if not promotion_fits(config):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fn, _ = lower(matmul, _meta(4096, 4096, dtype=dtype), _meta(4096, 4096, dtype=dtype),
                          _meta(4096, 4096, dtype=_acc(dtype)), arch="sm_90a", **config.all_kwargs())
        impls[str(config)] = _gemm(fn).attrs.impl
    copied = sorted(c for c, impl in impls.items() if "_mn_" not in impl)
    assert copied and all("BN=192" in c for c in copied), copied


def test_prune_drops_pingpong_groups_of_two_slabs_for_b_stored_k_by_n(monkeypatch):
    import tilejit.configs as configs
    monkeypatch.setattr(configs, "is_sm90", lambda tensor: True)
    space = matmul_configs(elem_bytes=1)
    a = torch.empty(4096, 4096, dtype=I8)
    b_kn = torch.empty(4096, 4096, dtype=I8)
    b_nk_view = torch.empty(4096, 4096, dtype=I8).T  # stored N x K: K-major
    kept_kn = configs.matmul_prune(space, {"A": a, "B": b_kn})
    kept_nk = configs.matmul_prune(space, {"A": a, "B": b_nk_view})
    assert any(c.pingpong and not promotion_fits(c) for c in kept_nk)
    assert not any(c.pingpong and not promotion_fits(c) for c in kept_kn)
    assert any(c.pingpong for c in kept_kn)


CUBINS = [("precise", F8, None, (128, 256, 128, 8), {}), ("fast", F8, "fast", (128, 256, 128, 8), {}),
          ("int8", I8, None, (128, 256, 128, 8), {}),
          ("precise-ws", F8, None, (128, 128, 128, 8), dict(warp_specialize=True)),
          ("fast-ws", F8, "fast", (128, 128, 128, 8), dict(warp_specialize=True)),
          ("int8-ws", I8, None, (128, 128, 128, 8), dict(warp_specialize=True)),
          ("precise-ws-256", F8, None, (128, 256, 128, 8), dict(warp_specialize=True)),
          ("int8-persistent", I8, None, (128, 256, 128, 8), dict(persistent=True)),
          ("precise-64x256", F8, None, (64, 256, 128, 4), {}), ("fast-128x64", F8, "fast", (128, 64, 128, 4), {}),
          ("int8-64x64", I8, None, (64, 64, 128, 4), {}),
          ("precise-256x128", F8, None, (256, 128, 128, 8), {}),
          ("precise-persistent", F8, None, (128, 128, 128, 8), dict(persistent=True)),
          ("precise-persistent-256", F8, None, (128, 256, 128, 8), dict(persistent=True)),
          ("precise-ws-256x128", F8, None, (256, 128, 128, 8), dict(warp_specialize=True))]


@pytest.mark.parametrize("ta", [False, True], ids=["b-kn", "a-km"])
@pytest.mark.parametrize("name,dtype,precision,tile,options", CUBINS, ids=[c[0] for c in CUBINS])
def test_compiles_without_spills_or_serialized_wgmma(name, dtype, precision, tile, options, ta):
    import tilejit.language as T
    bm, bn, bk, warps = tile
    a = _meta(1024, 1024, dtype=dtype)
    compiled = matmul_any.compile(a, _meta(1024, 1024, dtype=dtype), _meta(1024, 1024, dtype=_acc(dtype)), BM=bm,
                                  BN=bn, BK=bk, TA=ta, TB=ta, ACC=T.int32 if dtype == I8 else T.float32,
                                  PRECISION=precision, num_warps=warps, arch="sm_90a", **options)
    assert compiled.meta["spills"] == 0 and not compiled.meta["wgmma_serialized"]
    assert "transpose_copy" not in compiled.asm["ir"] and "wgmma_mn_m64nNk32" in compiled.asm["ir"]


@pytest.mark.parametrize("dtype", [F8, I8], ids=["fp8", "int8"])
@pytest.mark.parametrize("tile", [(128, 256, 128, 8), (128, 128, 128, 8)], ids=["128x256", "128x128"])
def test_launch_model_defaults_compile_without_spills(dtype, tile):
    """Only tiles and warps given (int8 with its int32 accumulator, as ``benchmarks/matmul.py`` runs it): what the
    launch model picks (warp specialization, ring depth) fits the gathered form's registers."""
    import tilejit.language as T
    bm, bn, bk, warps = tile
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = matmul_any.compile(_meta(1024, 1024, dtype=dtype), _meta(1024, 1024, dtype=dtype),
                                      _meta(1024, 1024, dtype=_acc(dtype)), BM=bm, BN=bn, BK=bk, TA=False, TB=False,
                                      ACC=T.int32 if dtype == I8 else T.float32, num_warps=warps, arch="sm_90a")
    assert compiled.meta["spills"] == 0 and "wgmma_mn_m64nNk32" in compiled.asm["ir"]


FAST_16_BIT_OUT = [((64, 128, 128, 4), dict(warp_specialize=True)), ((128, 128, 128, 8), dict(warp_specialize=True)),
                   ((128, 256, 128, 8), dict(persistent=True)), ((256, 128, 128, 8), dict(persistent=True))]


@pytest.mark.parametrize("out", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("tile,options", FAST_16_BIT_OUT, ids=["64x128-ws", "128x128-ws", "128x256-p", "256x128-p"])
def test_fast_gather_with_16_bit_output_keeps_its_wgmma_in_flight(tile, options, out):
    """The fast fp8 loop with B given K x N and a 16-bit C: its accumulators (transposed: the gather computes C^T)
    are stored element by element under bounds checks, and ptxas serialized every wgmma of the main loop (C7514)
    while their float32 -> 16-bit casts were single conversions; converted in pairs (``tj_from_f32x2``) it keeps
    them in flight."""
    import tilejit.language as T
    bm, bn, bk, warps = tile
    compiled = matmul_any.compile(_meta(1024, 1024, dtype=F8), _meta(1024, 1024, dtype=F8),
                                  _meta(1024, 1024, dtype=out), BM=bm, BN=bn, BK=bk, TA=False, TB=False,
                                  ACC=T.float32, PRECISION="fast", num_warps=warps, arch="sm_90a", **options)
    assert "tj_from_f32x2<" in compiled.asm["cuda"]
    assert compiled.meta["spills"] == 0 and not compiled.meta["wgmma_serialized"]


def test_single_casts_serialize_the_fast_gather(monkeypatch):
    """The check above can fail: with the casts one register at a time (TILEJIT_PAIRED_CASTS=0, part of the cache
    key) ptxas serializes the same kernel."""
    import tilejit.language as T
    monkeypatch.setenv("TILEJIT_PAIRED_CASTS", "0")
    compiled = matmul_any.compile(_meta(1024, 1024, dtype=F8), _meta(1024, 1024, dtype=F8),
                                  _meta(1024, 1024, dtype=torch.bfloat16), BM=64, BN=128, BK=128, TA=False, TB=False,
                                  ACC=T.float32, PRECISION="fast", num_warps=4, arch="sm_90a", warp_specialize=True)
    assert "tj_from_f32x2<" not in compiled.asm["cuda"]
    assert compiled.meta["wgmma_serialized"]
