"""Layouts: how a tile's elements are spread over threads (registers) or bytes (shared memory).

A register layout maps (thread, register index) to tile coordinates. Each layout writes that map once,
as Python arithmetic over ``tid`` and ``i``; evaluated on ints it gives concrete coordinates (used by
tests against the PTX fragment formulas), evaluated on :class:`CExpr` it prints the CUDA expression the
code generator emits. ``regs`` is the number of registers a thread holds, ``vec`` how many consecutive
registers are consecutive along the last dim (the widest safe vector access).
"""
from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import Any


class CExpr:
    """A C integer expression built with Python operators (only those layouts use)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    @staticmethod
    def _t(x: Any) -> str:
        return x.text if isinstance(x, CExpr) else str(int(x))

    def _bin(self, op: str, other: Any, reverse: bool = False) -> "CExpr":
        a, b = (self._t(other), self.text) if reverse else (self.text, self._t(other))
        return CExpr(f"({a} {op} {b})")

    def __add__(self, o): return self if o == 0 and not isinstance(o, CExpr) else self._bin("+", o)
    def __radd__(self, o): return self if o == 0 and not isinstance(o, CExpr) else self._bin("+", o, True)
    def __sub__(self, o): return self._bin("-", o)
    def __mul__(self, o):
        if not isinstance(o, CExpr) and o == 1:
            return self
        if not isinstance(o, CExpr) and o == 0:
            return 0
        return self._bin("*", o)
    def __rmul__(self, o): return self.__mul__(o)
    # Layout expressions are never negative, so division by a power of two is a shift and the
    # remainder a mask (signed '/' and '%' would cost extra instructions for negative operands).
    def __floordiv__(self, o):
        if not isinstance(o, CExpr) and o == 1:
            return self
        if not isinstance(o, CExpr) and o > 0 and o & (o - 1) == 0:
            return self._bin(">>", o.bit_length() - 1)
        return self._bin("/", o)

    def __mod__(self, o):
        if not isinstance(o, CExpr) and o > 0 and o & (o - 1) == 0:
            return self._bin("&", o - 1)
        return self._bin("%", o)
    def __rshift__(self, o): return self if not isinstance(o, CExpr) and o == 0 else self._bin(">>", o)
    def __and__(self, o): return self._bin("&", o)
    def __xor__(self, o): return self._bin("^", o)
    def __rxor__(self, o): return self._bin("^", o, True)
    def __lt__(self, o): return self._bin("<", o)
    def __str__(self) -> str: return self.text


def c_text(x: Any) -> str:
    return x.text if isinstance(x, CExpr) else str(int(x))


class RegisterLayout:
    """Base of register layouts. Subclasses define ``shape``, ``regs``, ``vec``, ``coords``, ``valid``."""

    shape: tuple[int, ...]
    regs: int
    vec: int = 1

    def coords(self, tid: Any, i: Any) -> list[Any]:
        raise NotImplementedError

    def valid(self, tid: Any, i: Any) -> Any:
        """True (Python) when every register holds an element; else a condition on (tid, i)."""
        return True

    @property
    def root(self) -> "RegisterLayout":
        """The layout whose registers this one is a view of (views share register indices)."""
        return self


@dataclass(frozen=True)
class BlockedLayout(RegisterLayout):
    """Row-major chunks of ``vec`` elements dealt round-robin to ``threads`` threads.

    Thread ``t`` holds chunks ``t, t + threads, ...``; consecutive threads touch consecutive memory, so
    loads and stores coalesce. Shapes that do not fill the last round leave some registers invalid.
    """
    shape: tuple[int, ...]
    threads: int
    vec: int = 1

    def __post_init__(self) -> None:
        if self.shape[-1] % self.vec:
            raise ValueError(f"vector width {self.vec} does not divide the last dim of {self.shape}")

    @property
    def chunks(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n // self.vec

    @property
    def regs(self) -> int:  # type: ignore[override]
        return -(-self.chunks // self.threads) * self.vec

    def coords(self, tid, i):
        chunk = tid + (i // self.vec) * self.threads
        e = chunk * self.vec + (i % self.vec if self.vec > 1 else 0)
        out = []
        for d in reversed(self.shape):
            out.append(e % d if d > 1 else 0)
            e = e // d
        return list(reversed(out))

    def valid(self, tid, i):
        if self.chunks % self.threads == 0:
            return True
        return (tid + (i // self.vec) * self.threads) < self.chunks

    def __str__(self) -> str:
        return f"#blocked<threads={self.threads}, vec={self.vec}>"


@dataclass(frozen=True)
class MmaLayout(RegisterLayout):
    """The accumulator of m16n8 mma.sync atoms tiled over a ``warps_m x warps_n`` grid of warps.

    Warp ``w`` owns rows ``(w // warps_n) * M/warps_m ...`` and cols ``(w % warps_n) * N/warps_n ...``;
    inside a warp, atom ``(am, an)`` holds registers ``4 * (am * atoms_n + an) + c`` with
    ``c`` at row ``g + 8 * (c >= 2)``, col ``2 * t + (c & 1)`` (g = lane / 4, t = lane % 4; PTX ISA
    9.7.14.5.8, "Matrix fragments for mma.m16n8k16", C/D layout).
    """
    shape: tuple[int, int]
    warps_m: int
    warps_n: int
    vec: int = 2

    def __post_init__(self) -> None:
        m, n = self.shape
        if m % (16 * self.warps_m) or n % (8 * self.warps_n):
            raise ValueError(f"{m}x{n} does not split into m16n8 atoms over {self.warps_m}x{self.warps_n} warps")

    @property
    def warp_tile(self) -> tuple[int, int]:
        return self.shape[0] // self.warps_m, self.shape[1] // self.warps_n

    @property
    def atoms(self) -> tuple[int, int]:
        wm, wn = self.warp_tile
        return wm // 16, wn // 8

    @property
    def regs(self) -> int:  # type: ignore[override]
        am, an = self.atoms
        return am * an * 4

    def coords(self, tid, i):
        warp, lane = tid >> 5, tid & 31
        g, t = lane >> 2, lane & 3
        wtm, wtn = self.warp_tile
        atoms_n = self.atoms[1]
        atom, c = i >> 2, i & 3
        am, an = atom // atoms_n, atom % atoms_n
        row = (warp // self.warps_n) * wtm + am * 16 + g + ((c >> 1) & 1) * 8
        col = (warp % self.warps_n) * wtn + an * 8 + t * 2 + (c & 1)
        return [row, col]

    def __str__(self) -> str:
        return f"#mma<warps={self.warps_m}x{self.warps_n}>"


@dataclass(frozen=True)
class MmaOperandALayout(RegisterLayout):
    """Operand A (M x K, 16-bit elements) of m16n8k16 mma.sync as the instructions read it from registers, over
    ``warps`` warps along M (warp ``w`` owns rows ``w * M/warps ..``; every warp holds all of K).

    Register ``8 * (am * K/16 + kk) + 2 * r + h`` is half ``h`` of fragment register ``a_r`` of the m16 atom
    ``am`` at k step ``kk``: row ``16 am + g + 8 (r & 1)``, col ``16 kk + 8 (r >> 1) + 2 t + h`` (g = lane / 4,
    t = lane % 4; PTX ISA 9.7.14.5.8, "Matrix fragments for mma.m16n8k16" with .f16/.bf16, A). Elements
    ``2 j, 2 j + 1`` are the low and high halves of the 32-bit operand register ``j``. The f32 accumulator
    ``MmaLayout((M, K), warps, 1)`` holds the same elements in the same order (two adjacent n8 atoms are one k16
    step), so a product's result feeds the next product as A after an elementwise cast with no data movement.
    """
    shape: tuple[int, int]
    warps: int
    vec: int = 2

    def __post_init__(self) -> None:
        m, k = self.shape
        if m % (16 * self.warps) or k % 16:
            raise ValueError(f"{m}x{k} does not split into m16k16 A fragments over {self.warps} warps along M")

    @property
    def atoms_m(self) -> int:
        return self.shape[0] // (16 * self.warps)

    @property
    def k_steps(self) -> int:
        return self.shape[1] // 16

    @property
    def regs(self) -> int:  # type: ignore[override]
        return self.atoms_m * self.k_steps * 8

    def coords(self, tid, i):
        warp, lane = tid >> 5, tid & 31
        g, t = lane >> 2, lane & 3
        step, e = i >> 3, i & 7
        am, kk = step // self.k_steps, step % self.k_steps
        r, h = e >> 1, e & 1
        row = warp * (self.shape[0] // self.warps) + am * 16 + g + (r & 1) * 8
        col = kk * 16 + (r >> 1) * 8 + t * 2 + h
        return [row, col]

    def __str__(self) -> str:
        return f"#mma_a<warps={self.warps}>"


@dataclass(frozen=True)
class WgmmaLayout(RegisterLayout):
    """The accumulator of wgmma.m64nNk16 (sm_90a), N = the tile's columns, over warpgroups of 4 warps.

    The tile's rows are cut into slabs of 64; warpgroup ``wg`` owns slabs ``wg, wg + groups, ...``.
    Register ``s * N/2 + j`` of a thread holds slab ``s``'s element at row ``16 * w + g + 8 * ((j >> 1) & 1)``,
    col ``8 * (j >> 2) + 2 * t + (j & 1)`` (w = warp in the warpgroup, g = lane / 4, t = lane % 4; PTX ISA
    9.7.15.5.1, "Matrix fragments for wgmma.mma_async", f32 accumulator D).
    """
    shape: tuple[int, int]
    groups: int  # warpgroups
    vec: int = 2

    def __post_init__(self) -> None:
        m, n = self.shape
        if m % (64 * self.groups) or n % 8 or n > 256:
            raise ValueError(f"{m}x{n} does not split into m64nNk16 slabs over {self.groups} warpgroup(s)")

    @property
    def slabs(self) -> int:
        """64-row slabs per warpgroup."""
        return self.shape[0] // (64 * self.groups)

    @property
    def regs(self) -> int:  # type: ignore[override]
        return self.slabs * self.shape[1] // 2

    def coords(self, tid, i):
        half = self.shape[1] // 2
        wg, warp, lane = tid >> 7, (tid >> 5) & 3, tid & 31
        g, t = lane >> 2, lane & 3
        s, j = i // half, i % half
        row = (s * self.groups + wg) * 64 + warp * 16 + g + ((j >> 1) & 1) * 8
        col = (j >> 2) * 8 + t * 2 + (j & 1)
        return [row, col]

    def __str__(self) -> str:
        return f"#wgmma<warpgroups={self.groups}>"


@dataclass(frozen=True)
class TmemLayout(RegisterLayout):
    """A tcgen05 accumulator (sm_100a): where ``tcgen05.mma`` (cta_group::1) leaves it in tensor memory, and the
    registers of the ``tcgen05.ld`` / ``tcgen05.st`` that move it, over ``warps`` warps (a multiple of 4).

    Warp ``w`` reaches TMEM lanes ``32 (w % 4) .. + 31`` only; the ``warps / 4`` warps sharing a lane quarter split
    the columns, warp ``w`` taking ``C = N / (warps / 4)`` of them from ``(w / 4) * C``. Two data-path layouts
    (PTX ISA 9.7.16.10.5, matrix D of tcgen05.mma), by the M of the instruction (``mma_m``):

    * M = 128 (Layout D): a 128-row slab's row ``r`` in lane ``r``; slab ``s``'s column ``c`` in column
      ``s * N + c``. Read with ``.32x32b``: lane ``l`` of warp ``w`` gets TMEM lane ``32 (w % 4) + l``, register
      ``s * C + j`` slab ``s``'s column ``(w / 4) * C + j``.
    * M = 64 (Layout F, one 64-row tile): row ``r`` in lane ``32 (r / 16) + r % 16`` (the first half of each lane
      quarter), column ``c`` in column ``c``. Read with ``.16x32bx2`` (16 lanes, two column ranges: threads 0-15
      from the address, threads 16-31 from ``immHalfSplitoff = C / 2`` columns further): lane ``l`` of warp ``w``
      gets TMEM lane ``32 (w % 4) + l % 16``, register ``j`` column ``(w / 4) * C + (l / 16) * C / 2 + j``. Any
      even ``C`` splits so (N = 24 over 4 warps: C / 2 = 12 registers), and no access reaches past column N.

    Either way consecutive registers are consecutive columns of one row. ``tmem_coords`` is the (lane, column)
    a register moves; ``coords`` is that position mapped back through the data-path layout (``tile_coords``).
    """
    shape: tuple[int, int]
    warps: int
    mma_m: int = 128

    def __post_init__(self) -> None:
        m, n = self.shape
        groups = self.warps // 4
        ok = self.warps % 4 == 0 and n % groups == 0
        if self.mma_m == 128:
            ok = ok and m % 128 == 0 and self.cols_per_warp % 8 == 0
        elif self.mma_m == 64:
            ok = ok and m == 64 and self.cols_per_warp > 0 and self.cols_per_warp % 2 == 0
        else:
            ok = False
        if not ok:
            raise ValueError(f"{m}x{n} over {self.warps} warps does not fit the tcgen05 M={self.mma_m} TMEM layout")

    @property
    def slabs(self) -> int:
        """tcgen05.mma instructions along M (each ``mma_m`` rows, ``N`` columns of TMEM)."""
        return self.shape[0] // self.mma_m

    @property
    def cols_per_warp(self) -> int:
        return self.shape[1] // (self.warps // 4)

    @property
    def vec(self) -> int:  # type: ignore[override]
        """Registers per aligned run of consecutive columns, 8 at most: a thread's run is its ``C`` columns
        (M = 128) or its half-warp's ``C / 2`` (M = 64), so any power of 2 dividing it starts runs aligned."""
        run = self.cols_per_warp if self.mma_m == 128 else self.cols_per_warp // 2
        vec = 8
        while run % vec:
            vec //= 2
        return vec

    @property
    def access(self) -> str:
        """The tcgen05.ld / tcgen05.st shape that moves this layout's registers."""
        return "32x32b" if self.mma_m == 128 else "16x32bx2"

    @property
    def half_split(self) -> int:
        """``.16x32bx2``'s immHalfSplitoff: the columns between the two half-warps' ranges (0 for ``.32x32b``)."""
        return 0 if self.mma_m == 128 else self.cols_per_warp // 2

    @property
    def regs(self) -> int:  # type: ignore[override]
        return self.slabs * self.cols_per_warp if self.mma_m == 128 else self.cols_per_warp // 2

    def tmem_coords(self, tid, i):
        """(TMEM lane, column from the accumulator's first) that register ``i`` of thread ``tid`` moves."""
        c = self.cols_per_warp
        warp, lane = tid >> 5, tid & 31
        if self.mma_m == 128:
            s, j = i // c, i % c
            return [(warp & 3) * 32 + lane, s * self.shape[1] + (warp >> 2) * c + j]
        return [(warp & 3) * 32 + (lane & 15), (warp >> 2) * c + (lane >> 4) * (c // 2) + i]

    def tile_coords(self, tmem_lane, tmem_col):
        """The data-path layout: the (row, col) of the tile held at a TMEM lane and column."""
        n = self.shape[1]
        if self.mma_m == 128:
            s = tmem_col // n
            return [s * 128 + tmem_lane, tmem_col % n]
        return [(tmem_lane >> 5) * 16 + (tmem_lane & 15), tmem_col]

    def coords(self, tid, i):
        # tile_coords(*tmem_coords(tid, i)), written out so that the emitted expressions stay simple
        c = self.cols_per_warp
        warp, lane = tid >> 5, tid & 31
        if self.mma_m == 128:
            s, j = i // c, i % c
            return [s * 128 + (warp & 3) * 32 + lane, (warp >> 2) * c + j]
        return [(warp & 3) * 16 + (lane & 15), (warp >> 2) * c + (lane >> 4) * (c // 2) + i]

    def __str__(self) -> str:
        return f"#tmem<warps={self.warps}>" if self.mma_m == 128 else f"#tmem<warps={self.warps}, m={self.mma_m}>"


class _ViewLayout(RegisterLayout):
    """A layout that indexes the registers of another one (``base``) and only relabels coordinates:
    the same register count and validity, and the same root."""

    base: RegisterLayout

    @property
    def regs(self):  # type: ignore[override]
        return self.base.regs

    def valid(self, tid, i):
        return self.base.valid(tid, i)

    @property
    def root(self):
        return self.base.root


@dataclass(frozen=True)
class SliceLayout(_ViewLayout):
    """``base`` with dim ``axis`` removed: register i holds the element at base's coords minus axis.

    This is what a reduction along ``axis`` produces; several registers (and threads) then hold the same
    element, which makes broadcasting back over ``axis`` free.
    """
    base: RegisterLayout
    axis: int

    @property
    def parent(self) -> RegisterLayout:
        return self.base

    @property
    def shape(self):  # type: ignore[override]
        return self.base.shape[:self.axis] + self.base.shape[self.axis + 1:]

    @property
    def vec(self):  # type: ignore[override]
        return self.base.vec if self.axis != len(self.base.shape) - 1 else 1

    def coords(self, tid, i):
        c = self.base.coords(tid, i)
        return c[:self.axis] + c[self.axis + 1:]

    def __str__(self) -> str:
        return f"#slice<{self.base}, axis={self.axis}>"


@dataclass(frozen=True)
class ExpandLayout(_ViewLayout):
    """A size-1 dim inserted at ``axis`` (``x[:, None]``); broadcasting it to ``parent`` costs nothing
    when ``base`` is a :class:`SliceLayout` of the target layout along the same axis."""
    base: RegisterLayout
    axis: int

    @property
    def shape(self):  # type: ignore[override]
        s = self.base.shape
        return s[:self.axis] + (1,) + s[self.axis:]

    @property
    def vec(self):  # type: ignore[override]
        return self.base.vec if self.axis != len(self.base.shape) else 1

    def coords(self, tid, i):
        c = self.base.coords(tid, i)
        return c[:self.axis] + [0] + c[self.axis:]

    def __str__(self) -> str:
        return f"#expand<{self.base}, axis={self.axis}>"


@dataclass(frozen=True)
class PermutedLayout(_ViewLayout):
    """``base`` with its dims permuted (a register-level transpose, free)."""
    base: RegisterLayout
    perm: tuple[int, ...]

    @property
    def shape(self):  # type: ignore[override]
        return tuple(self.base.shape[p] for p in self.perm)

    @property
    def vec(self):  # type: ignore[override]
        return self.base.vec if self.perm[-1] == len(self.perm) - 1 else 1

    def coords(self, tid, i):
        c = self.base.coords(tid, i)
        return [c[p] for p in self.perm]

    def __str__(self) -> str:
        return f"#perm<{self.base}, {list(self.perm)}>"


def broadcast_view(src: RegisterLayout, target: RegisterLayout) -> bool:
    """True when a tile in ``src`` (size-1 dims) can be read as ``target`` with no data movement."""
    return (isinstance(src, ExpandLayout) and isinstance(src.base, SliceLayout)
            and src.base.base == target and src.base.axis == src.axis)


@dataclass(frozen=True)
class SharedLayout:
    """A 2-D shared-memory tile of ``rows x cols`` elements, in ``stages`` copies (a ring).

    Rows are stored contiguously up to 128 bytes; a wider tile is split into column panels of 128 bytes,
    each panel holding all rows (``rows x 128 B``) before the next. Inside a row the 16-byte chunks are
    XOR-swizzled so that 8 consecutive rows at one logical chunk fall in 8 different bank groups, which
    makes the cp.async writes (row-wise) and the ldmatrix reads (8 rows at a time) conflict-free: 128-byte
    rows use chunk ^ (row % 8); 64-byte rows chunk ^ ((row / 2) % 4); 32-byte rows chunk ^ ((row / 4) % 2)
    (CUTLASS Swizzle<3,4,3>, <2,4,3>, <1,4,3>).

    These are exactly the 128-, 64- and 32-byte swizzle modes of wgmma and TMA (PTX 9.7.15.5.1.2.1.3, the
    canonical layouts Swizzle<3,4,3>, <2,4,3>, <1,4,3>: byte-address bits [4, 4 + b) XOR bits [7, 7 + b),
    b = 3, 2, 1), in both the K-major and the MN-major orientation, once the tile starts on a multiple of the
    pattern's repeat (``atom_bytes``: 8 rows, 1024 / 512 / 256 bytes; PTX 9.7.15.5.1.2.2, base offset 0):
    with ``row_pitch`` P = 16 * 2^b, chunk c of row r sits at byte r * P + 16 c, whose bits [4, 4 + b) are c
    and bits [7, 7 + b) are (r * P / 128) % 2^b = (r / 2^(3 - b)) % 2^b, the row phase above.
    """
    rows: int
    cols: int
    elem_bytes: int
    stages: int = 1

    @property
    def row_bytes(self) -> int:
        return self.cols * self.elem_bytes

    @property
    def panelled(self) -> bool:
        return self.row_bytes > 128 and self.row_bytes % 128 == 0

    @property
    def row_pitch(self) -> int:
        """Bytes between consecutive rows of one panel (or of the tile when it is not panelled)."""
        return 128 if self.panelled else self.row_bytes

    @property
    def panel_bytes(self) -> int:
        return self.rows * self.row_pitch

    @property
    def stage_bytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def bytes(self) -> int:
        return self.stage_bytes * self.stages

    @property
    def swizzle_bytes(self) -> int:
        """The wgmma / TMA swizzle mode this layout is, by its span in bytes (128, 64 or 32), or 0 (none)."""
        return 16 << self.swizzle_bits if self.swizzle_bits else 0

    @property
    def atom_bytes(self) -> int:
        """Bytes of 8 rows (of one panel): the swizzle pattern's repeat, which a tile's start must be a multiple
        of, and the stride byte offset of its wgmma descriptors."""
        return 8 * self.row_pitch

    @property
    def swizzle_bits(self) -> int:
        """log2 of the number of chunks a row group XORs over (0: no swizzle)."""
        rb = self.row_pitch
        if rb % 16:
            return 0
        return {16: 0, 32: 1, 64: 2, 128: 3}.get(rb, 0)

    def chunk_offset(self, row: Any, chunk: Any) -> Any:
        """Byte offset of 16-byte chunk ``chunk`` of ``row`` inside one stage."""
        bits = self.swizzle_bits
        if self.panelled:
            return (chunk >> 3) * self.panel_bytes + row * 128 + ((chunk & 7) ^ (row & 7)) * 16
        if bits == 0:
            return row * self.row_bytes + chunk * 16
        phase = (row >> (3 - bits)) & ((1 << bits) - 1)
        return row * self.row_bytes + (chunk ^ phase) * 16

    def elem_offset(self, row: Any, col: Any) -> Any:
        """Byte offset of element (row, col) inside one stage."""
        if self.swizzle_bits == 0 and not self.panelled:
            return row * self.row_bytes + col * self.elem_bytes
        per_chunk = 16 // self.elem_bytes
        return self.chunk_offset(row, col // per_chunk) + (col % per_chunk) * self.elem_bytes

    def __str__(self) -> str:
        swz = f"swizzle={16 << self.swizzle_bits}B" if self.swizzle_bits else "no swizzle"
        panels = f", panels={self.row_bytes // 128}" if self.panelled else ""
        return f"#shared<{self.rows}x{self.cols}, {swz}{panels}, stages={self.stages}>"


def coords_table(layout: RegisterLayout, threads: int) -> dict[tuple[int, ...], list[tuple[int, int]]]:
    """Every (tid, reg) that holds each coordinate; for tests and for checking a layout covers its tile."""
    table: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for tid in range(threads):
        for i in range(layout.regs):
            if layout.valid(tid, i) is True or layout.valid(tid, i):
                table.setdefault(tuple(layout.coords(tid, i)), []).append((tid, i))
    return table


def pick_warp_grid(m: int, n: int, num_warps: int) -> tuple[int, int] | None:
    """The warps_m x warps_n split of an m x n accumulator with the squarest per-warp tile, or None."""
    best = None
    for wm in range(1, num_warps + 1):
        if num_warps % wm:
            continue
        wn = num_warps // wm
        if m % (16 * wm) or n % (8 * wn):
            continue
        tm, tn = m // wm, n // wn
        score = (abs(tm - tn), -tm)
        if best is None or score < best[0]:
            best = (score, (wm, wn))
    return best[1] if best else None



@functools.lru_cache(maxsize=256)
def thread_local_permutation(src: RegisterLayout, dst: RegisterLayout, threads: int) -> tuple[int, ...] | None:
    """Register ``j`` of ``src`` for every register ``i`` of ``dst`` when each thread already holds, in ``src``,
    every element it must hold in ``dst``, at register indices that are the same on all threads; else None.

    Such a conversion is a renaming of registers (``dst[i] = src[perm[i]]``), with no shared memory and no
    barrier: e.g. the row statistics of two accumulators of different widths (the softmax of attention).
    Evaluated on integers for every thread, so it is exact for any pair of layouts.
    """
    if tuple(src.shape) != tuple(dst.shape):
        return None
    return _renaming(src, dst, threads, broadcast=())


def thread_local_broadcast(src: RegisterLayout, dst: RegisterLayout, threads: int) -> tuple[int, ...] | None:
    """Like :func:`thread_local_permutation` for a broadcast: ``src`` has extent 1 where ``dst`` is wider, and
    register ``i`` of ``dst`` takes the element of ``src`` at its coordinates with those dims at 0 (e.g. a row
    statistic of one accumulator's layout broadcast over the columns of another accumulator with the same rows)."""
    if len(src.shape) != len(dst.shape) or any(a not in (1, b) for a, b in zip(src.shape, dst.shape)):
        return None
    return _renaming(src, dst, threads, broadcast=tuple(d for d, (a, b) in enumerate(zip(src.shape, dst.shape))
                                                        if a == 1 and b != 1))


def _renaming(src: RegisterLayout, dst: RegisterLayout, threads: int, broadcast: tuple[int, ...]):
    perm: list[int | None] = [None] * dst.regs
    for tid in range(threads):
        where: dict[tuple, int] = {}
        for j in range(src.regs):
            if src.valid(tid, j) is True:
                where.setdefault(tuple(int(c) for c in src.coords(tid, j)), j)
        for i in range(dst.regs):
            if dst.valid(tid, i) is not True:
                continue
            j = where.get(tuple(0 if d in broadcast else int(c) for d, c in enumerate(dst.coords(tid, i))))
            if j is None or perm[i] not in (None, j):
                return None
            perm[i] = j
    if any(j is None for j in perm):
        return None
    return tuple(perm)


@functools.lru_cache(maxsize=256)
def duplicate_registers(layout: RegisterLayout, threads: int) -> tuple[int, ...] | None:
    """For each register ``i``, the first register ``j <= i`` that holds the same element on every thread (a
    row statistic in an accumulator's slice layout keeps one copy per column register); None when no register
    repeats another. Elementwise code computes the first copies and copies the rest, so values carried around a
    loop stay provably equal and the compiler keeps one of each (evaluated on integers: exact)."""
    owner: list[int] | None = None
    for tid in range(threads):
        keys = [(layout.valid(tid, i) is True, tuple(int(c) for c in layout.coords(tid, i)))
                for i in range(layout.regs)]
        if owner is None:
            first: dict[tuple, int] = {}
            owner = [first.setdefault(k, i) for i, k in enumerate(keys)]
        else:  # a copy that differs on this thread is no copy
            owner = [j if keys[j] == keys[i] else i for i, j in enumerate(owner)]
    if owner is None or all(j == i for i, j in enumerate(owner)):
        return None
    return tuple(owner)
