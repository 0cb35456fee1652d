"""m16n8k16's operand A fragment (``MmaOperandALayout``) and the accumulator it is read from (``lower_mma_rs``),
for every lane and register, against the PTX ISA's fragment formulas written out here independently.

PTX ISA 9.7.14.5.8, mma.m16n8k16 with .f16/.bf16 (g = groupID = lane >> 2, t = threadID_in_group = lane % 4):

* A, elements a0..a7 (two per 32-bit register): row g for a0, a1, a4, a5 and g + 8 for a2, a3, a6, a7; col
  2t + (i & 1) for i < 4 and 2t + (i & 1) + 8 for i >= 4.
* B, elements b0..b3: row (k) 2t + (i & 1) for i < 2 and 2t + (i & 1) + 8 for i >= 2; col (n) g.
* C/D, elements c0..c3: row g for i < 2 and g + 8 for i >= 2; col 2t + (i & 1).

The last test runs the lowering's whole data path in Python: a product's accumulator (``MmaLayout`` with the
warps along M) in each thread's registers, packed into A fragment registers as the emitted code packs them,
multiplied by instructions that place their operands by the formulas above, the result read back through the
second accumulator's layout: it must be the matrix product.
"""
from __future__ import annotations

import itertools
import random

import pytest

from tilejit.backend_cuda.lower_mma_rs import a_fragment_registers, fragment_word
from tilejit.ir.layouts import (BlockedLayout, CExpr, MmaLayout, MmaOperandALayout, RegisterLayout, WgmmaLayout,
                                c_text)

SHAPES = [(16, 16, 1), (32, 16, 2), (64, 64, 4), (128, 64, 8), (128, 32, 4), (64, 128, 2), (256, 64, 8),
          (48, 48, 3)]


def ptx_a(lane: int, i: int) -> tuple[int, int]:
    """(row, col) inside the 16 x 16 A tile of element a_i held by ``lane``."""
    g, t = lane >> 2, lane & 3
    row = g if i < 2 or 4 <= i < 6 else g + 8
    col = 2 * t + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def ptx_b(lane: int, i: int) -> tuple[int, int]:
    """(k, n) inside the 16 x 8 B tile of element b_i held by ``lane``."""
    g, t = lane >> 2, lane & 3
    return 2 * t + (i & 1) + (8 if i >= 2 else 0), g


def ptx_c(lane: int, i: int) -> tuple[int, int]:
    """(row, col) inside the 16 x 8 C/D tile of element c_i held by ``lane``."""
    g, t = lane >> 2, lane & 3
    return g + (8 if i >= 2 else 0), 2 * t + (i & 1)


@pytest.mark.parametrize("m, k, warps", [(m, k, w) for m, k, w in SHAPES if k % 16 == 0 and m % (16 * w) == 0])
def test_fragment_layout_is_the_ptx_table(m, k, warps):
    """Register 8 (am K/16 + kk) + i of a thread is a_i of m16 atom am at k step kk, in its warp's rows; the C
    text the emitter would print for the map agrees; every element of the tile is held exactly once."""
    layout = MmaOperandALayout((m, k), warps)
    rows_per_warp, steps = m // warps, k // 16
    assert layout.regs == (rows_per_warp // 16) * steps * 8
    texts = [compile(c_text(c).replace("/", "//"), "<c>", "eval") for c in layout.coords(CExpr("tid"), CExpr("i"))]
    seen = set()
    for tid in range(32 * warps):
        warp, lane = divmod(tid, 32)
        for reg in range(layout.regs):
            step, i = divmod(reg, 8)
            am, kk = divmod(step, steps)
            r, c = ptx_a(lane, i)
            want = [warp * rows_per_warp + am * 16 + r, kk * 16 + c]
            assert layout.coords(tid, reg) == want, (tid, reg)
            assert [eval(x, {}, {"tid": tid, "i": reg}) for x in texts] == want  # noqa: S307 (CExpr text)
            seen.add(tuple(want))
    assert seen == set(itertools.product(range(m), range(k)))


@pytest.mark.parametrize("m, k, warps", [(16, 8, 1), (32, 16, 4), (48, 32, 2)])
def test_fragment_layout_refuses_shapes_that_do_not_split(m, k, warps):
    with pytest.raises(ValueError, match="m16k16 A fragments"):
        MmaOperandALayout((m, k), warps)


@pytest.mark.parametrize("m, k, warps", [(m, k, w) for m, k, w in SHAPES if k % 16 == 0 and m % (16 * w) == 0])
def test_accumulator_with_warps_along_m_is_the_fragment_in_order(m, k, warps):
    """c0 c1 | c2 c3 of n8 atom 2 kk are a0 a1 | a2 a3 of k step kk, those of atom 2 kk + 1 a4..a7: the f32
    accumulator's registers are the fragment's, in the same order (the emitted code packs 2 i, 2 i + 1)."""
    acc = MmaLayout((m, k), warps, 1)
    perm = a_fragment_registers(acc, m, k, warps, 32 * warps)
    assert perm == tuple(range(acc.regs))
    # the same, from the PTX formulas alone: accumulator atom (am, an) element c vs fragment element i
    steps, atoms_n = k // 16, k // 8
    for lane in range(32):
        for kk, i in itertools.product(range(steps), range(8)):
            an, c = 2 * kk + (i >> 2), i & 3
            ar, ac = ptx_a(lane, i)
            cr, cc = ptx_c(lane, c)
            assert (ar, ac) == (cr, cc + 8 * (an - 2 * kk))
            assert 4 * an + c == 8 * kk + i  # register of atom an (row 0 of atoms) == fragment register
    assert atoms_n == 2 * steps


def test_one_warpgroup_slab_of_wgmma_is_the_fragment_too():
    """A 64-row wgmma accumulator (one slab per warpgroup) holds warp w's rows 16 w .. 16 w + 15 in the m16n8
    order: a mixed sm_90a kernel (wgmma, then mma.sync) reads it from registers. Two slabs per warpgroup do not
    (warp w holds rows 16 w and 64 + 16 w, not 32 w .. 32 w + 31)."""
    assert a_fragment_registers(WgmmaLayout((64, 32), 1), 64, 32, 4, 128) == tuple(range(16))
    assert a_fragment_registers(WgmmaLayout((128, 64), 2), 128, 64, 8, 256) == tuple(range(32))
    assert a_fragment_registers(WgmmaLayout((128, 64), 1), 128, 64, 4, 128) is None


@pytest.mark.parametrize("layout, m, k, warps", [
    (MmaLayout((64, 64), 2, 2), 64, 64, 4),       # warps split along N: a warp holds half of K
    (MmaLayout((64, 64), 1, 4), 64, 64, 4),
    (BlockedLayout((64, 64), 128, 8), 64, 64, 4),  # a coalesced load's layout
    (MmaLayout((32, 64), 2, 2), 32, 64, 4),       # M = 32 is no multiple of 16 x 4 warps
    (MmaLayout((64, 8), 4, 1), 64, 8, 4),         # K = 8: no k16 step
], ids=["warps-2x2", "warps-1x4", "blocked", "m32-w4", "k8"])
def test_other_layouts_are_refused(layout, m, k, warps):
    assert a_fragment_registers(layout, m, k, warps, 32 * warps) is None


class _Reversed(RegisterLayout):
    """A layout holding ``base``'s elements in the opposite register order (to reach the lowering's per-register
    packing, which no layout the passes make needs today)."""

    def __init__(self, base: RegisterLayout) -> None:
        self.base, self.shape, self.regs, self.vec = base, base.shape, base.regs, 1

    def coords(self, tid, i):
        return self.base.coords(tid, self.regs - 1 - i)

    def __hash__(self):
        return hash(("reversed", self.base))

    def __eq__(self, other):
        return isinstance(other, _Reversed) and other.base == self.base


def test_a_renaming_gives_the_registers_to_pack():
    acc = MmaLayout((64, 32), 4, 1)
    perm = a_fragment_registers(_Reversed(acc), 64, 32, 4, 128)
    assert perm == tuple(reversed(range(acc.regs)))


def _run_register_a_product(m: int, k: int, n: int, warps: int, a_layout: RegisterLayout, seed: int) -> None:
    rng = random.Random(seed)
    A = [[rng.randint(-4, 4) for _ in range(k)] for _ in range(m)]
    B = [[rng.randint(-4, 4) for _ in range(n)] for _ in range(k)]
    threads = 32 * warps
    # each thread's registers of the A tile (the first product's accumulator, cast)
    regs = [[A[r][c] for r, c in (a_layout.coords(tid, i) for i in range(a_layout.regs))] for tid in range(threads)]
    perm = a_fragment_registers(a_layout, m, k, warps, threads)
    assert perm is not None
    words = [[(regs[tid][perm[2 * w]], regs[tid][perm[2 * w + 1]]) for w in range(len(perm) // 2)]
             for tid in range(threads)]
    out = MmaLayout((m, n), warps, 1)
    atoms_m, atoms_n = out.atoms
    acc = [[0] * out.regs for _ in range(threads)]
    for warp, kk, am, an in itertools.product(range(warps), range(k // 16), range(atoms_m), range(atoms_n)):
        # one mma.sync: the warp's lanes hand in their registers, the instruction places them by the PTX table
        a_tile = [[None] * 16 for _ in range(16)]
        b_tile = [[None] * 8 for _ in range(16)]
        for lane in range(32):
            tid = 32 * warp + lane
            for r in range(4):
                lo, hi = words[tid][fragment_word(am, kk, r, k // 16)]
                for h, value in enumerate((lo, hi)):
                    row, col = ptx_a(lane, 2 * r + h)
                    assert a_tile[row][col] is None
                    a_tile[row][col] = value
            for i in range(4):  # B as ldmatrix hands it over (tested with the shared-memory path)
                kb, nb = ptx_b(lane, i)
                b_tile[kb][nb] = B[kk * 16 + kb][an * 8 + nb]
        for lane in range(32):
            for c in range(4):
                row, col = ptx_c(lane, c)
                acc[32 * warp + lane][4 * (am * atoms_n + an) + c] += sum(a_tile[row][x] * b_tile[x][col]
                                                                           for x in range(16))
    got = [[None] * n for _ in range(m)]
    for tid in range(threads):
        for i in range(out.regs):
            r, c = out.coords(tid, i)
            got[r][c] = acc[tid][i]
    want = [[sum(A[r][x] * B[x][c] for x in range(k)) for c in range(n)] for r in range(m)]
    assert got == want


@pytest.mark.parametrize("m, k, n, warps", [(16, 16, 8, 1), (64, 32, 16, 4), (128, 64, 24, 8), (64, 48, 8, 2)])
def test_register_a_product_is_the_matrix_product(m, k, n, warps):
    _run_register_a_product(m, k, n, warps, MmaLayout((m, k), warps, 1), seed=m + k + n)


def test_register_a_product_through_a_renaming():
    _run_register_a_product(64, 32, 16, 4, _Reversed(MmaLayout((64, 32), 4, 1)), seed=7)
