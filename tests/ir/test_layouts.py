"""Layout objects against the fragment formulas of HARDWARE.md / the PTX ISA, for every lane and register.

Register layouts: the (thread, register) -> coordinate map of each layout is recomputed here from the
documented formulas (independently of the layout's own arithmetic) and checked to be a bijection onto the
tile; the C text the emitter prints for the same map (``coords(CExpr("tid"), CExpr("i"))``) is evaluated for
every thread and register and must give the same ints. Shared layouts: byte offsets of every element, bank
groups of ldmatrix reads and cp.async writes, and the 128-byte-swizzle atom of panelled tiles. The last part
checks the ldmatrix and cp.async addresses the code generator actually emits for several tile configurations.
"""
from __future__ import annotations

import re

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit.backend_cuda.emitter import SharedTile
from tilejit.ir.layouts import (BlockedLayout, CExpr, ExpandLayout, MmaLayout, PermutedLayout, SharedLayout,
                                SliceLayout, WgmmaLayout, broadcast_view, c_text, coords_table, pick_warp_grid)

from _lowering import kernel_body, lower


# -- helpers --------------------------------------------------------------------------------------------------

def c_to_python(text: str) -> str:
    """A C integer expression over non-negative ints as Python: only '/' differs ('//' in Python).

    CExpr parenthesises every binary operation, so C and Python operator precedence never matter."""
    assert "//" not in text
    return text.replace("/", "//")


def c_eval(text: str, **env: int) -> int:
    return eval(compile(c_to_python(text), "<c>", "eval"), {}, env)  # noqa: S307 (text made by CExpr)


class CMap:
    """The C text of a layout's coords (and validity), compiled once, evaluated per (tid, i)."""

    def __init__(self, layout) -> None:
        self.coords = [compile(c_to_python(c_text(c)), "<c>", "eval")
                       for c in layout.coords(CExpr("tid"), CExpr("i"))]
        valid = layout.valid(CExpr("tid"), CExpr("i"))
        self.valid = None if valid is True else compile(c_to_python(c_text(valid)), "<c>", "eval")

    def __call__(self, tid: int, i: int) -> tuple[list[int], bool]:
        env = {"tid": tid, "i": i}
        coords = [eval(c, {}, env) for c in self.coords]  # noqa: S307
        return coords, True if self.valid is None else bool(eval(self.valid, {}, env))  # noqa: S307


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def all_coords(shape):
    import itertools

    return set(itertools.product(*(range(d) for d in shape)))


def holders(layout, threads: int) -> dict[tuple[int, ...], list[tuple[int, int]]]:
    """coords -> [(tid, reg)] over the valid registers, with the layout's Python evaluation."""
    out: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for tid in range(threads):
        for i in range(layout.regs):
            if layout.valid(tid, i):
                out.setdefault(tuple(layout.coords(tid, i)), []).append((tid, i))
    return out


def assert_bijection(layout, threads: int) -> None:
    table = holders(layout, threads)
    assert set(table) == all_coords(layout.shape), "valid registers do not cover exactly the tile"
    dup = {c: h for c, h in table.items() if len(h) != 1}
    assert not dup, f"elements held more than once: {list(dup.items())[:3]}"
    assert coords_table(layout, threads) == table


def assert_c_text_matches(layout, threads: int) -> None:
    cmap = CMap(layout)
    for tid in range(threads):
        for i in range(layout.regs):
            coords, valid = cmap(tid, i)
            assert valid == bool(layout.valid(tid, i)), (tid, i)
            if valid:
                assert coords == [int(c) for c in layout.coords(tid, i)], (str(layout), tid, i)


def assert_vec_runs(layout, threads: int) -> None:
    """Registers i..i+vec-1 (i % vec == 0) are consecutive along the last dim, all valid or all invalid."""
    v = layout.vec
    assert layout.regs % v == 0
    for tid in range(threads):
        for i in range(0, layout.regs, v):
            base = layout.coords(tid, i)
            ok = bool(layout.valid(tid, i))
            for d in range(1, v):
                assert bool(layout.valid(tid, i + d)) == ok
                if ok:
                    assert layout.coords(tid, i + d) == base[:-1] + [base[-1] + d], (str(layout), tid, i, d)


# -- MmaLayout: mma.sync m16n8k16 C/D fragments (PTX 9.7.14.5.8) -------------------------------------------

def mma_expected(shape, wm, wn, tid, reg):
    """HARDWARE.md: c_i at row g + 8*(i>=2), col 2t + (i&1); atoms row-major in a warp; warps row-major."""
    m, n = shape
    warp, lane = divmod(tid, 32)
    g, t = divmod(lane, 4)
    warp_row, warp_col = divmod(warp, wn)
    wtm, wtn = m // wm, n // wn
    atoms_n = wtn // 8
    atom, c = divmod(reg, 4)
    am, an = divmod(atom, atoms_n)
    row = warp_row * wtm + am * 16 + g + (8 if c >= 2 else 0)
    col = warp_col * wtn + an * 8 + 2 * t + (c % 2)
    return [row, col]


MMA_CASES = [((16, 8), 1, 1), ((16, 16), 1, 1), ((32, 8), 1, 1), ((64, 64), 2, 2), ((128, 128), 2, 2),
             ((128, 256), 2, 4), ((64, 128), 1, 4), ((128, 64), 4, 1), ((256, 128), 4, 2), ((64, 24), 2, 1),
             ((48, 40), 1, 1), ((128, 128), 2, 1)]


@pytest.mark.parametrize("shape,wm,wn", MMA_CASES, ids=[f"{s[0]}x{s[1]}-{a}x{b}" for s, a, b in MMA_CASES])
def test_mma_layout_matches_ptx_fragment(shape, wm, wn):
    layout = MmaLayout(shape, wm, wn)
    threads = 32 * wm * wn
    assert layout.regs * threads == numel(shape)
    assert layout.regs == (shape[0] // wm // 16) * (shape[1] // wn // 8) * 4
    for tid in range(threads):
        for i in range(layout.regs):
            assert layout.valid(tid, i) is True
            assert layout.coords(tid, i) == mma_expected(shape, wm, wn, tid, i), (tid, i)
    assert_bijection(layout, threads)
    assert_vec_runs(layout, threads)
    assert_c_text_matches(layout, threads)


def test_mma_layout_one_atom_lane_table():
    """The 16x8 atom written out: lane 0 holds (0,0) (0,1) (8,0) (8,1); lane 5 (g=1, t=1): cols 2, 3."""
    layout = MmaLayout((16, 8), 1, 1)
    assert [layout.coords(0, i) for i in range(4)] == [[0, 0], [0, 1], [8, 0], [8, 1]]
    assert [layout.coords(5, i) for i in range(4)] == [[1, 2], [1, 3], [9, 2], [9, 3]]
    assert [layout.coords(31, i) for i in range(4)] == [[7, 6], [7, 7], [15, 6], [15, 7]]


def test_mma_layout_warps_own_contiguous_warp_tiles():
    layout = MmaLayout((128, 256), 2, 4)  # warp tile 64 x 64
    for warp in range(8):
        rows = {layout.coords(warp * 32 + lane, i)[0] for lane in range(32) for i in range(layout.regs)}
        cols = {layout.coords(warp * 32 + lane, i)[1] for lane in range(32) for i in range(layout.regs)}
        assert rows == set(range((warp // 4) * 64, (warp // 4) * 64 + 64))
        assert cols == set(range((warp % 4) * 64, (warp % 4) * 64 + 64))


@pytest.mark.parametrize("shape,wm,wn", [((24, 8), 1, 1), ((32, 12), 1, 1), ((32, 16), 4, 1), ((16, 16), 1, 4)])
def test_mma_layout_rejects_shapes_that_do_not_split(shape, wm, wn):
    with pytest.raises(ValueError):
        MmaLayout(shape, wm, wn)


# -- WgmmaLayout: wgmma m64nNk16 f32 accumulator (PTX 9.7.15.5.1) -------------------------------------------

def wgmma_expected(shape, groups, tid, reg):
    """d_j at row 16w + g + 8*((j>>1)&1), col 8*(j>>2) + 2t + (j&1); slab s of warpgroup wg is s*groups + wg."""
    n = shape[1]
    wg, rest = divmod(tid, 128)
    w, lane = divmod(rest, 32)
    g, t = divmod(lane, 4)
    s, j = divmod(reg, n // 2)
    row = (s * groups + wg) * 64 + 16 * w + g + 8 * ((j >> 1) & 1)
    col = 8 * (j >> 2) + 2 * t + (j & 1)
    return [row, col]


WGMMA_CASES = [(m, n, groups) for groups in (1, 2) for n in (8, 64, 128, 256) for m in (64 * groups, 128 * groups)
               if (m // (64 * groups)) * n // 2 <= 256]


@pytest.mark.parametrize("m,n,groups", WGMMA_CASES, ids=[f"{m}x{n}-wg{g}" for m, n, g in WGMMA_CASES])
def test_wgmma_layout_matches_ptx_fragment(m, n, groups):
    layout = WgmmaLayout((m, n), groups)
    threads = 128 * groups
    assert layout.regs == (m // (64 * groups)) * n // 2
    for tid in range(threads):
        for i in range(layout.regs):
            assert layout.coords(tid, i) == wgmma_expected((m, n), groups, tid, i), (tid, i)
    assert_bijection(layout, threads)
    assert_vec_runs(layout, threads)
    assert_c_text_matches(layout, threads)


def test_wgmma_warpgroups_take_alternate_64_row_slabs():
    layout = WgmmaLayout((256, 64), 2)  # 2 slabs per warpgroup
    rows_of = lambda wg: {layout.coords(wg * 128 + x, i)[0] // 64 for x in range(128) for i in range(layout.regs)}
    assert rows_of(0) == {0, 2} and rows_of(1) == {1, 3}
    # warp w of a warpgroup owns rows 16w .. 16w+15 of each slab
    for w in range(4):
        rows = {layout.coords(32 * w + lane, i)[0] % 64 for lane in range(32) for i in range(layout.regs)}
        assert rows == set(range(16 * w, 16 * w + 16))


def test_wgmma_n8_atom_equals_mma_accumulator_rows():
    """For N = 8, warp w's four registers are exactly the m16n8 C fragment shifted by 16w rows."""
    wg = WgmmaLayout((64, 8), 1)
    mma = MmaLayout((16, 8), 1, 1)
    for tid in range(128):
        w, lane = divmod(tid, 32)
        for i in range(4):
            r, c = mma.coords(lane, i)
            assert wg.coords(tid, i) == [16 * w + r, c]


@pytest.mark.parametrize("shape,groups", [((96, 64), 1), ((64, 64), 2), ((64, 12), 1), ((64, 264), 1)])
def test_wgmma_layout_rejects_bad_shapes(shape, groups):
    with pytest.raises(ValueError):
        WgmmaLayout(shape, groups)


# -- BlockedLayout ----------------------------------------------------------------------------------------------

BLOCKED_CASES = [((7,), 32, 1), ((100,), 128, 4), ((1024,), 128, 8), ((5, 12), 32, 4), ((3, 5, 8), 64, 8),
                 ((4, 128), 128, 8), ((1, 64), 128, 4), ((64, 32), 128, 8), ((33, 3), 32, 1), ((13, 6), 64, 2),
                 ((2, 3, 5), 32, 1), ((64, 64), 256, 2), ((10, 16), 256, 16)]


@pytest.mark.parametrize("shape,threads,vec", BLOCKED_CASES,
                         ids=["x".join(map(str, s)) + f"-t{t}-v{v}" for s, t, v in BLOCKED_CASES])
def test_blocked_layout_covers_every_element_once(shape, threads, vec):
    layout = BlockedLayout(shape, threads, vec)
    total = numel(shape)
    assert layout.regs == -(-(total // vec) // threads) * vec
    assert_bijection(layout, threads)
    assert_vec_runs(layout, threads)
    assert_c_text_matches(layout, threads)
    # exactly the registers past the last chunk are invalid
    invalid = sum(1 for tid in range(threads) for i in range(layout.regs) if not layout.valid(tid, i))
    assert invalid == layout.regs * threads - total
    # coalescing: register group g of consecutive threads holds consecutive row-major chunks
    strides = [numel(shape[d + 1:]) for d in range(len(shape))]
    for tid in range(threads):
        for i in range(0, layout.regs, vec):
            if layout.valid(tid, i):
                linear = sum(c * s for c, s in zip(layout.coords(tid, i), strides))
                assert linear == (tid + (i // vec) * threads) * vec


def test_blocked_layout_rejects_vec_not_dividing_last_dim():
    with pytest.raises(ValueError):
        BlockedLayout((5, 6), 32, 4)


# -- views: slice / expand / permute ----------------------------------------------------------------------------

PARENTS = [(MmaLayout((64, 64), 2, 2), 128), (BlockedLayout((4, 128), 128, 8), 128),
           (BlockedLayout((5, 12), 32, 4), 32), (WgmmaLayout((128, 64), 1), 128), (MmaLayout((32, 16), 2, 1), 64)]


@pytest.mark.parametrize("parent,threads", PARENTS, ids=[str(p) for p, _ in PARENTS])
@pytest.mark.parametrize("axis", [0, 1])
def test_slice_layout_drops_the_axis_of_its_parent(parent, threads, axis):
    s = SliceLayout(parent, axis)
    assert s.regs == parent.regs and s.root is parent.root
    assert s.shape == tuple(d for k, d in enumerate(parent.shape) if k != axis)
    table = holders(s, threads)
    assert set(table) == all_coords(s.shape)
    for tid in range(threads):
        for i in range(s.regs):
            assert bool(s.valid(tid, i)) == bool(parent.valid(tid, i))
            pc = parent.coords(tid, i)
            assert s.coords(tid, i) == pc[:axis] + pc[axis + 1:]
    # every copy of a reduced element comes from the parent elements of that row/column only
    assert sum(len(h) for h in table.values()) == sum(
        1 for tid in range(threads) for i in range(parent.regs) if parent.valid(tid, i))
    assert_vec_runs(s, threads)
    assert_c_text_matches(s, threads)


@pytest.mark.parametrize("parent,threads", PARENTS, ids=[str(p) for p, _ in PARENTS])
@pytest.mark.parametrize("axis", [0, 1])
def test_expand_of_slice_is_a_free_broadcast_view(parent, threads, axis):
    e = ExpandLayout(SliceLayout(parent, axis), axis)
    assert e.shape[axis] == 1 and len(e.shape) == 2
    assert broadcast_view(e, parent)
    assert not broadcast_view(ExpandLayout(SliceLayout(parent, axis), 1 - axis), parent)
    for tid in range(threads):
        for i in range(e.regs):
            pc = parent.coords(tid, i)
            expected = list(pc)
            expected[axis] = 0
            assert e.coords(tid, i) == expected
    assert_vec_runs(e, threads)
    assert_c_text_matches(e, threads)


def test_expand_of_1d_blocked():
    base = BlockedLayout((64,), 128, 4)
    row, col = ExpandLayout(base, 0), ExpandLayout(base, 1)
    assert row.shape == (1, 64) and col.shape == (64, 1)
    assert row.vec == 4 and col.vec == 1
    for tid in range(128):
        for i in range(base.regs):
            (c,) = base.coords(tid, i)
            assert row.coords(tid, i) == [0, c] and col.coords(tid, i) == [c, 0]
            assert row.valid(tid, i) == base.valid(tid, i)
    assert_vec_runs(row, 128)
    assert not broadcast_view(row, MmaLayout((64, 64), 2, 2))  # not a slice of the target


@pytest.mark.parametrize("base,threads", [(MmaLayout((64, 32), 2, 2), 128), (BlockedLayout((5, 12), 32, 4), 32),
                                          (WgmmaLayout((64, 128), 1), 128)])
def test_permuted_layout_is_a_transposed_bijection(base, threads):
    p = PermutedLayout(base, (1, 0))
    assert p.shape == base.shape[::-1] and p.vec == 1 and p.root is base.root
    for tid in range(threads):
        for i in range(base.regs):
            assert p.coords(tid, i) == base.coords(tid, i)[::-1]
    assert_bijection(p, threads)
    assert_c_text_matches(p, threads)
    identity = PermutedLayout(base, (0, 1))
    assert identity.vec == base.vec


def test_permuted_3d():
    base = BlockedLayout((2, 3, 8), 32, 4)
    p = PermutedLayout(base, (2, 0, 1))
    assert p.shape == (8, 2, 3) and p.vec == 1
    for tid in range(32):
        for i in range(base.regs):
            a, b, c = base.coords(tid, i)
            assert p.coords(tid, i) == [c, a, b]
    assert_bijection(p, 32)
    assert_c_text_matches(p, 32)


# -- pick_warp_grid -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("m", [16, 32, 48, 64, 128, 256])
@pytest.mark.parametrize("n", [8, 16, 24, 64, 128, 256])
@pytest.mark.parametrize("warps", [1, 2, 4, 8, 16])
def test_pick_warp_grid_is_a_valid_squarest_split(m, n, warps):
    splits = [(wm, warps // wm) for wm in range(1, warps + 1) if warps % wm == 0
              and m % (16 * wm) == 0 and n % (8 * (warps // wm)) == 0]
    got = pick_warp_grid(m, n, warps)
    if not splits:
        assert got is None
        return
    assert got in splits
    wm, wn = got
    assert wm * wn == warps
    MmaLayout((m, n), wm, wn)  # constructible
    best = min(abs(m // a - n // b) for a, b in splits)
    assert abs(m // wm - n // wn) == best


def test_pick_warp_grid_known_answers():
    assert pick_warp_grid(128, 128, 4) == (2, 2)
    assert pick_warp_grid(128, 256, 8) == (2, 4)
    assert pick_warp_grid(16, 8, 1) == (1, 1)
    assert pick_warp_grid(16, 8, 2) is None
    assert pick_warp_grid(64, 64, 8) == (2, 4)  # 32x16 and 16x32 tie: the taller warp tile wins


# -- SharedLayout -----------------------------------------------------------------------------------------------

def elem_offset(lay: SharedLayout, row: int, col: int) -> int:
    return SharedTile(0, lay).elem_offset(row, col)


def bank_group(offset: int) -> int:
    """Which 16-byte group of the 32 four-byte banks an aligned 16-byte access falls in."""
    return (offset // 16) % 8


# (rows, cols) of 16-bit tiles: row bytes 32, 64, 128, 256 (panelled) and 512 (4 panels)
SHARED_16 = [(16, 16), (64, 16), (32, 32), (128, 32), (8, 64), (64, 64), (128, 64), (32, 128), (64, 128),
             (16, 256)]


def _ids(cases):
    return [f"{r}x{c}" for r, c in cases]


@pytest.mark.parametrize("rows,cols", SHARED_16, ids=_ids(SHARED_16))
def test_shared_layout_is_a_bijection_onto_the_stage(rows, cols):
    lay = SharedLayout(rows, cols, 2, stages=3)
    assert lay.stage_bytes == rows * cols * 2 and lay.bytes == 3 * lay.stage_bytes
    offsets = [elem_offset(lay, r, c) for r in range(rows) for c in range(cols)]
    assert sorted(offsets) == list(range(0, lay.stage_bytes, 2))
    # the 8 elements of a logical 16-byte chunk stay together, in order, 16-byte aligned
    for r in range(rows):
        for k in range(cols // 8):
            base = lay.chunk_offset(r, k)
            assert base % 16 == 0
            assert [elem_offset(lay, r, 8 * k + e) for e in range(8)] == [base + 2 * e for e in range(8)]


@pytest.mark.parametrize("rows,cols,elem", [(16, 32, 1), (64, 64, 1), (32, 128, 1), (16, 8, 4), (32, 32, 4),
                                            (16, 64, 4), (24, 24, 2), (16, 96, 2), (8, 160, 2)])
def test_shared_layout_bijection_other_element_sizes_and_odd_rows(rows, cols, elem):
    lay = SharedLayout(rows, cols, elem)
    offsets = [elem_offset(lay, r, c) for r in range(rows) for c in range(cols)]
    assert sorted(offsets) == list(range(0, lay.stage_bytes, elem))


@pytest.mark.parametrize("rows,cols", SHARED_16, ids=_ids(SHARED_16))
def test_shared_layout_ldmatrix_reads_are_conflict_free(rows, cols):
    """ldmatrix: 8 lanes give the rows of one 8x8 matrix (8 rows at one logical 16-byte chunk); one
    wavefront when the 8 addresses fall in 8 different bank groups."""
    lay = SharedLayout(rows, cols, 2)
    for r0 in range(0, rows, 8):
        for k in range(cols // 8):
            groups = {bank_group(lay.chunk_offset(r0 + r, k)) for r in range(8)}
            assert len(groups) == 8, (r0, k, sorted(groups))


@pytest.mark.parametrize("rows,cols", SHARED_16, ids=_ids(SHARED_16))
@pytest.mark.parametrize("threads", [32, 128, 256])
def test_shared_layout_cp_async_writes_are_conflict_free(rows, cols, threads):
    """The fast path (lower_memory.SharedCopy.fast): thread tid copies chunk tid % cpr of row tid // cpr
    (+ rows_per_pass each pass), i.e. linear chunk L = tid + pass * threads. A 16-byte store per thread is
    served 8 threads (128 bytes) at a time: each 8 consecutive threads must hit 8 different bank groups."""
    lay = SharedLayout(rows, cols, 2)
    cpr = lay.row_bytes // 16
    chunks = rows * cpr
    assert threads % cpr == 0  # the fast path's single-pass-shape branch
    rpp = threads // cpr
    for tid0 in range(0, threads, 8):
        for j in range(-(-rows // rpp)):
            offs = []
            for tid in range(tid0, tid0 + 8):
                r, k = tid // cpr + j * rpp, tid % cpr
                if r < rows:
                    offs.append(lay.chunk_offset(r, k))
            assert len({bank_group(o) for o in offs}) == len(offs)
    # and together the passes write every chunk of the stage exactly once
    written = sorted(lay.chunk_offset(L // cpr, L % cpr) for L in range(chunks))
    assert written == list(range(0, lay.stage_bytes, 16))


@pytest.mark.parametrize("rows,cols", [(8, 64), (64, 64), (128, 64), (32, 128), (64, 128), (16, 256), (64, 192)])
def test_shared_layout_128b_rows_are_swizzle_128b_atoms(rows, cols):
    """Each 8-row x 128-byte block (of each panel) is the TMA/wgmma SWIZZLE_128B atom: 1024 contiguous,
    1024-aligned bytes holding logical chunk k of row r at 16 * (k ^ r) + 128 * r."""
    lay = SharedLayout(rows, cols, 2)
    assert lay.row_pitch == 128 and lay.swizzle_bits == 3
    assert lay.panelled == (cols * 2 > 128)
    panels = cols * 2 // 128
    assert lay.panel_bytes == rows * 128 and lay.stage_bytes == panels * lay.panel_bytes
    for p in range(panels):
        for q in range(rows // 8):
            base = p * lay.panel_bytes + q * 1024
            assert base % 1024 == 0
            for r in range(8):
                for k in range(8):
                    assert lay.chunk_offset(8 * q + r, 8 * p + k) == base + 128 * r + 16 * (k ^ r), (p, q, r, k)


@pytest.mark.parametrize("rows,cols,expect", [(16, 16, (32, 1)), (16, 32, (64, 2)), (16, 64, (128, 3)),
                                              (16, 128, (128, 3)), (16, 8, (16, 0))])
def test_shared_layout_swizzle_modes(rows, cols, expect):
    lay = SharedLayout(rows, cols, 2)
    assert (lay.row_pitch, lay.swizzle_bits) == expect
    if lay.swizzle_bits:
        assert f"swizzle={16 << lay.swizzle_bits}B" in str(lay)
    else:
        assert "no swizzle" in str(lay)


@pytest.mark.parametrize("rows,cols", SHARED_16 + [(16, 8), (24, 24)], ids=_ids(SHARED_16 + [(16, 8), (24, 24)]))
def test_shared_layout_c_text_matches(rows, cols):
    """The offsets the emitter prints (chunk_offset / elem_offset over CExpr) evaluate to the Python ones."""
    lay = SharedLayout(rows, cols, 2)
    chunk = compile(c_to_python(c_text(lay.chunk_offset(CExpr("r"), CExpr("k")))), "<c>", "eval")
    elem = compile(c_to_python(c_text(SharedTile(0, lay).elem_offset(CExpr("r"), CExpr("c")))), "<c>", "eval")
    for r in range(rows):
        for c in range(cols):
            assert eval(elem, {}, {"r": r, "c": c}) == elem_offset(lay, r, c)  # noqa: S307
            if c % 8 == 0:
                assert eval(chunk, {}, {"r": r, "k": c // 8}) == lay.chunk_offset(r, c // 8)  # noqa: S307


def test_cexpr_arithmetic_renders_c():
    x = CExpr("x")
    assert c_text(x // 8) == "(x >> 3)" and c_text(x % 8) == "(x & 7)"
    assert c_text(x // 6) == "(x / 6)" and c_text(x % 6) == "(x % 6)"
    assert c_text(x * 1) == "x" and (x * 0) == 0 and c_text(x + 0) == "x" and c_text(x // 1) == "x"
    assert c_text(3 ^ x) == "(3 ^ x)" and c_text(x >> 0) == "x"
    for v in range(200):
        for text in (x // 6, x % 6, (x // 4) ^ (x & 3), (x * 3 + 1) // 5, x < 37):
            assert c_eval(c_text(text), x=v) == eval(c_to_python(c_text(text)), {}, {"x": v})  # noqa: S307
        assert c_eval(c_text((x // 6) * 6 + x % 6), x=v) == v


# -- the addresses the code generator emits --------------------------------------------------------------------

@tilejit.kernel
def _nn(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def _nt(A, Bt, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ Bt[n0:n0 + BN, k0:k0 + BK].T
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def _tn(At, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = At.shape[0]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc += At[k0:k0 + BK, m0:m0 + BM].T @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


def _meta(*shape):
    return torch.empty(*shape, dtype=torch.float16, device="meta")


# ldmatrix at the slot's base + a per-thread share set up at the kernel's start (tj_hN, an expression of tid)
# + an immediate
_LDM = re.compile(r"tj_ldmatrix_(x4|x2|x1)(_trans)?_at<(\d+)>\((.*), (tj_[ab]) \+ (tj_h\d+)\);$")
_HOISTED = re.compile(r"const unsigned (tj_h\d+) = tj_opaque\(\(unsigned\)\((.*)\)\);$")


def _emitted_gemm(kernel, bm, bn, bk, warps, a_shape, b_shape):
    fn, source = lower(kernel, _meta(*a_shape), _meta(*b_shape), _meta(256, 256),
                       BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=2)
    gemm = next(op for op in fn.walk() if op.kind.mnemonic == "gemm")
    lay_a, lay_b = gemm.operands[0].type.layout, gemm.operands[1].type.layout
    acc = gemm.result.type.layout
    body = kernel_body(source).splitlines()
    hoisted = {m.group(1): m.group(2) for m in map(_HOISTED.search, body) if m}
    lines = [(width, trans, regs, base, f"(({hoisted[share]}) + {imm})")
             for width, trans, imm, regs, base, share in (m.groups() for m in map(_LDM.search, body) if m)]
    return gemm, lay_a, lay_b, acc, lines


def _inverse(lay: SharedLayout) -> dict[int, tuple[int, int]]:
    return {elem_offset(lay, r, c): (r, c) for r in range(lay.rows) for c in range(lay.cols)}


GEMM_CONFIGS = [(128, 128, 32, 4), (64, 64, 64, 4), (128, 256, 64, 8), (16, 8, 16, 1), (64, 24, 32, 2),
                (32, 64, 128, 2)]


@pytest.mark.parametrize("variant", ["nn", "nt", "tn"])
@pytest.mark.parametrize("bm,bn,bk,warps", GEMM_CONFIGS, ids=[f"{a}x{b}x{c}-w{d}" for a, b, c, d in GEMM_CONFIGS])
def test_emitted_ldmatrix_addresses_match_mma_fragments(variant, bm, bn, bk, warps):
    """Evaluate every ldmatrix address expression of the generated CUDA for every lane (and warp and
    unrolled atom) and check it is the row of the 8x8 matrix the m16n8k16 fragment needs (HARDWARE.md:
    ldmatrix matrix j from lanes 8j..8j+7 goes to dest register j; A regs r0..r3 = (rows 0-7 | 8-15) x
    (k 0-7 | 8-15); B regs b0b1 = k 0-7, b2b3 = k 8-15 of one n8 atom), and that the 8 rows of each matrix are
    read without bank conflicts whenever the tile has a power-of-two row size."""
    kernel, a_shape, b_shape = {"nn": (_nn, (bm, bk), (bk, bn)), "nt": (_nt, (bm, bk), (bn, bk)),
                                "tn": (_tn, (bk, bm), (bk, bn))}[variant]
    gemm, lay_a, lay_b, acc, lines = _emitted_gemm(kernel, bm, bn, bk, warps, a_shape, b_shape)
    assert gemm.attrs.impl == "mma_sync_m16n8k16"
    assert gemm.attrs.transpose_a == (variant == "tn") and gemm.attrs.transpose_b == (variant == "nt")
    wm, wn = acc.warps_m, acc.warps_n
    wtm, wtn = acc.warp_tile
    tm, tn = acc.atoms
    inv = {"tj_a": _inverse(lay_a), "tj_b": _inverse(lay_b)}
    lays = {"tj_a": lay_a, "tj_b": lay_b}
    a_lines = [ln for ln in lines if ln[3] == "tj_a"]
    b_lines = [ln for ln in lines if ln[3] == "tj_b"]
    steps = bk // 16
    assert len(a_lines) == steps * tm  # one per k16 step and m16 atom
    assert len(b_lines) == steps * (tn // 2 + tn % 2)  # one per k16 step and pair of n8 atoms (or odd one)
    assert all(ln[0] == "x4" for ln in a_lines)
    assert all((ln[1] == "_trans") == (variant == "tn") for ln in a_lines)
    assert all((ln[1] == "_trans") == (variant != "nt") for ln in b_lines)

    def check(line, kk, expected_rows, index):
        """expected_rows(lane, wmi, wni, index) -> (stored row, first stored col) of that lane's address; ``index``
        is the atom (A) or atom pair (B) of the line."""
        width, _, _, base, expr = line
        code = compile(c_to_python(expr), "<c>", "eval")
        lay = lays[base]
        lanes = 32 if width == "x4" else 16  # x2 uses the addresses of lanes 0..15
        for wmi in range(wm):
            for wni in range(wn):
                for lv in [index]:
                    offs = []
                    for lane in range(lanes):
                        env = {"tid": (wmi * wn + wni) * 32 + lane}
                        off = eval(code, {}, env)  # noqa: S307
                        assert off % 16 == 0
                        offs.append(off)
                        got = inv[base][off]
                        assert got == expected_rows(lane, wmi, wni, lv), (line, kk, lane, wmi, wni, lv)
                        # the 8 elements at the address are 8 consecutive logical elements of that row
                        assert [inv[base][off + 2 * e] for e in range(8)] == [(got[0], got[1] + e) for e in range(8)]
                    if lay.row_pitch in (16, 32, 64, 128):
                        for j in range(lanes // 8):
                            assert len({bank_group(o) for o in offs[8 * j:8 * j + 8]}) == 8, (line, j)

    for idx, line in enumerate(a_lines):
        kk = idx // tm

        def a_rows(lane, wmi, wni, am, kk=kk):
            j, r = divmod(lane, 8)
            m = wmi * wtm + am * 16 + 8 * (j & 1)
            k = kk * 16 + 8 * (j >> 1)
            return (k + r, m) if variant == "tn" else (m + r, k)
        check(line, kk, a_rows, idx % tm)
    per_step = tn // 2 + tn % 2
    for idx, line in enumerate(b_lines):
        kk = idx // per_step
        odd = line[0] == "x2"

        def b_rows(lane, wmi, wni, p, kk=kk, odd=odd):
            j, r = divmod(lane, 8)
            atom = tn - 1 if odd else 2 * p + (j >> 1)
            n = wni * wtn + atom * 8
            k = kk * 16 + 8 * (j & 1)
            return (n + r, k) if variant == "nt" else (k + r, n)
        check(line, kk, b_rows, idx % per_step)


_DST0 = re.compile(r"const unsigned (tj_c\d+_)dst0 = \1dst \+ (.*);$")
_KR0 = re.compile(r"const int (tj_c\d+_)k = (.*), \1r0 = (.*);$")
_RSTEP = re.compile(r"const int64_t (tj_c\d+_)rstep = \(int64_t\)(\d+) \* .*;$")
_ISSUE = re.compile(r"tj_cp_async_16_zfill_if\((.*), (tj_c\d+_)src \+ (\d+) \* \2rstep, (\d+) >= \2rows")
_GUARD = re.compile(r"if \((tj_c\d+_)r0 \+ (\d+) < (\d+)\)")
_LOOP_RK = re.compile(r"const int tj_r = (.*), (tj_c\d+_)k = (.*);$")
_LOOP_ISSUE = re.compile(r"tj_cp_async_16_if\((tj_c\d+_)dst \+ (.*), tj_src, tj_n, \1fast\);$")


def _fast_path_offsets(body: list[str], threads: int, lays) -> dict[str, list[list[tuple[int, tuple[int, int]]]]]:
    """Per copy prefix, per pass (or per loop trip): [(shared offset, (row, chunk) it copies)] over threads."""
    kr0 = {m.group(1): m.groups()[1:] for m in map(_KR0.search, body) if m}
    dst0 = {m.group(1): m.group(2) for m in map(_DST0.search, body) if m}
    rstep = {m.group(1): int(m.group(2)) for m in map(_RSTEP.search, body) if m}
    guards = {(m.group(1), int(m.group(2))): int(m.group(3)) for m in map(_GUARD.search, body) if m}
    order = [m.group(1) for m in map(re.compile(r"const bool (tj_c\d+_)fast = ").search, body) if m]
    assert len(order) == len(lays), "one copy per gemm operand, in operand order"
    out: dict[str, list] = {}
    for text in body:
        m = _ISSUE.search(text)
        if m:
            dst, x, j, zero_row = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
            rpp = rstep[x]
            assert zero_row == j * rpp
            k_code, r0_code = (compile(c_to_python(e), "<c>", "eval") for e in kr0[x])
            if dst.startswith(x + "dst0 + "):
                extra = int(dst[len(x + "dst0 + "):])
                expr = f"({dst0[x]}) + {extra}"
            else:
                assert dst.startswith(x + "dst + ")
                expr = dst[len(x + "dst + "):]
            code = compile(c_to_python(expr.replace(x + "r0", "r0").replace(x + "k", "k")), "<c>", "eval")
            one = []
            for tid in range(threads):
                k = eval(k_code, {}, {"tid": tid})  # noqa: S307
                r0 = eval(r0_code, {}, {"tid": tid})  # noqa: S307
                row = r0 + j * rpp
                lay_rows = lays[order.index(x)].rows
                guard = guards.get((x, j * rpp))
                if guard is not None and row >= guard:
                    continue
                assert row < lay_rows
                one.append((eval(code, {}, {"r0": r0, "k": k}), (row, k)))  # noqa: S307
            out.setdefault(x, []).append(one)
    rk = {m.group(2): (m.group(1), m.group(3)) for m in map(_LOOP_RK.search, body) if m}
    for text in body:
        m = _LOOP_ISSUE.search(text)
        if m:
            x, expr = m.group(1), m.group(2)
            r_code, k_code = (compile(c_to_python(e), "<c>", "eval") for e in rk[x])
            code = compile(c_to_python(expr.replace(x + "k", "k").replace("tj_r", "r")), "<c>", "eval")
            lay = lays[order.index(x)]
            chunks = lay.rows * (lay.row_bytes // 16)
            one = []
            for c in range(chunks):
                r = eval(r_code, {}, {"tj_c": c})  # noqa: S307
                k = eval(k_code, {}, {"tj_c": c})  # noqa: S307
                one.append((eval(code, {}, {"r": r, "k": k}), (r, k)))  # noqa: S307
            out.setdefault(x, []).append(one)
    return out


@pytest.mark.parametrize("variant", ["nn", "nt", "tn"])
@pytest.mark.parametrize("bm,bn,bk,warps", GEMM_CONFIGS, ids=[f"{a}x{b}x{c}-w{d}" for a, b, c, d in GEMM_CONFIGS])
def test_emitted_cp_async_fast_path_fills_the_swizzled_tile(variant, bm, bn, bk, warps):
    """Evaluate the fast path's per-thread destination for every thread and pass: the copy of logical
    (row, chunk) must land at chunk_offset(row, chunk) of the operand's layout, the passes must cover the stage
    exactly once, and 8 consecutive threads of a pass must write 8 different bank groups (power-of-two rows)."""
    kernel, a_shape, b_shape = {"nn": (_nn, (bm, bk), (bk, bn)), "nt": (_nt, (bm, bk), (bn, bk)),
                                "tn": (_tn, (bk, bm), (bk, bn))}[variant]
    fn, source = lower(kernel, _meta(*a_shape), _meta(*b_shape), _meta(256, 256),
                       BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=1)  # synchronous copies only
    gemm = next(op for op in fn.walk() if op.kind.mnemonic == "gemm")
    lays = [gemm.operands[0].type.layout, gemm.operands[1].type.layout]
    body = kernel_body(source).splitlines()
    copies = _fast_path_offsets(body, 32 * warps, lays)
    assert len(copies) == 2, "one cp.async copy per gemm operand"
    for x, lay in zip(sorted(copies, key=lambda s: int(s[4:-1])), lays):
        assert len(copies[x]) >= 1
        written = []
        for one in copies[x]:
            for off, (row, k) in one:
                assert off == lay.chunk_offset(row, k), (x, row, k)
            if lay.row_pitch in (16, 32, 64, 128):
                offs = [off for off, _ in one]
                for t0 in range(0, len(offs), 8):
                    assert len({bank_group(o) for o in offs[t0:t0 + 8]}) == len(offs[t0:t0 + 8])
            written += [off for off, _ in one]
        assert sorted(written) == list(range(0, lay.stage_bytes, 16))


K8_CONFIGS = [(64, 64, 8, 4), (64, 24, 24, 2), (32, 64, 40, 2)]


@pytest.mark.parametrize("variant", ["nn", "nt", "tn"])
@pytest.mark.parametrize("bm,bn,bk,warps", K8_CONFIGS, ids=[f"{a}x{b}x{c}-w{d}" for a, b, c, d in K8_CONFIGS])
def test_emitted_ldmatrix_addresses_match_m16n8k8_fragments(variant, bm, bn, bk, warps):
    """The m16n8k8 form (K % 16 != 0): A by ldmatrix x2 (matrix j = rows 8j..8j+7 of the m16 atom, k 0-7),
    B by x2 for two n8 atoms (matrix j = atom j) or x1 for one; every lane's address is the row the
    fragment needs (PTX 9.7.14.5.7)."""
    kernel, a_shape, b_shape = {"nn": (_nn, (bm, bk), (bk, bn)), "nt": (_nt, (bm, bk), (bn, bk)),
                                "tn": (_tn, (bk, bm), (bk, bn))}[variant]
    gemm, lay_a, lay_b, acc, lines = _emitted_gemm(kernel, bm, bn, bk, warps, a_shape, b_shape)
    assert gemm.attrs.impl == "mma_sync_m16n8k8"
    wm, wn = acc.warps_m, acc.warps_n
    wtm, wtn = acc.warp_tile
    tm, tn = acc.atoms
    inv = {"tj_a": _inverse(lay_a), "tj_b": _inverse(lay_b)}
    a_lines = [ln for ln in lines if ln[3] == "tj_a"]
    b_lines = [ln for ln in lines if ln[3] == "tj_b"]
    steps = bk // 8
    assert len(a_lines) == steps * tm and all(ln[0] == "x2" for ln in a_lines)
    per_step = tn // 2 + tn % 2
    assert len(b_lines) == steps * per_step

    def check(line, expected, index):
        width, _, _, base, expr = line
        code = compile(c_to_python(expr), "<c>", "eval")
        lanes = {"x4": 32, "x2": 16, "x1": 8}[width]
        for wmi in range(wm):
            for wni in range(wn):
                for lane in range(lanes):
                    got = inv[base][eval(code, {}, {"tid": (wmi * wn + wni) * 32 + lane})]  # noqa: S307
                    assert got == expected(lane, wmi, wni, index), (line, lane, wmi, wni, index)

    for idx, line in enumerate(a_lines):
        kk = idx // tm

        def a_rows(lane, wmi, wni, am, kk=kk):
            j, r = divmod(lane, 8)
            m, k = wmi * wtm + am * 16 + 8 * j, kk * 8
            return (k + r, m) if variant == "tn" else (m + r, k)
        check(line, a_rows, idx % tm)
    for idx, line in enumerate(b_lines):
        kk = idx // per_step
        odd = line[0] == "x1"

        def b_rows(lane, wmi, wni, p, kk=kk, odd=odd):
            j, r = divmod(lane, 8)
            atom = tn - 1 if odd else 2 * p + j
            n, k = wni * wtn + atom * 8, kk * 8
            return (n + r, k) if variant == "nt" else (k + r, n)
        check(line, b_rows, idx % per_step)
