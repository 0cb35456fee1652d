"""Global -> shared copies: the ``copy`` table of the dispatch registry, and the TMA lowering.

* ``tma_bulk_tensor`` (sm_90+): one thread issues ``cp.async.bulk.tensor`` per 128-byte panel of the tile, or one
  for a tile of 64- or 32-byte rows (PTX 9.7.9.25.5.2), described by a CUtensorMap the host encodes per launch
  with the swizzle mode of the tile's row (128-, 64- or 32-byte: the box's inner extent is one row of the panel,
  and the runtime takes the mode from it), which writes exactly the swizzled layout of
  :class:`~tilejit.ir.layouts.SharedLayout` into a tile starting on the pattern's repeat; completion is counted
  in bytes on an mbarrier per ring slot (PTX 9.7.13.15), and out-of-bounds parts of the box are zero-filled by
  the hardware. Needs a 16-byte aligned tensor with 16-byte multiple strides.
* ``cp_async`` (sm_80+): per-thread 16-byte cp.async with an element-wise fallback chosen at run time
  (``lower_memory.SharedCopy``).

And the other way, shared -> global (``emit_store``): a wgmma accumulator tile stored through swizzled shared boxes
by bulk tensor stores, or added into its tensor by bulk tensor reductions (a relaxed tile atomic_add).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .. import dtypes as D
from ..frontend.spec import TensorSpec
from ..ir import Op
from ..ir.layouts import CExpr, SharedLayout, WgmmaLayout, c_text
from ..ir.rewrite import defining_op
from ..target import REGISTRY, Target
from .emitter import BYTE_ORIGINS, KERNEL_HOOKS, c_type
from .lower_wgmma import swizzled_rows


# The widest box inner extent: one 128-byte swizzle span (TMA requires inner box bytes <= the swizzle span).
SPAN_BYTES = 128


@dataclass(frozen=True)
class CopyQuery:
    """What a copy lowering's predicates look at: the load, its tensor's specialization, its loop."""
    op: Op
    spec: TensorSpec | None
    pipelined: bool

    @property
    def tile_dims(self) -> list[int]:
        return [d for d in range(self.op.operands[0].type.rank) if d not in self.op.attrs.dropped]


@dataclass(frozen=True)
class TensorMapSpec:
    """One CUtensorMap kernel parameter: which tensor argument, and the box it copies. The box's inner extent is
    one swizzle span (``swizzle_bytes``: 128, 64 or 32), and the runtime encodes the map with that swizzle mode
    (``runtime.tma.encode``)."""
    tensor: str                 # parameter name
    box: tuple[int, ...]        # box extents, innermost (the tensor's last dim) first
    elem_bytes: int
    # the element type the TMA unit computes with ("float32", "int32"): a bulk reduction adds elements of the map's
    # type; "" for copies, which move bytes (the runtime encodes unsigned integers of elem_bytes)
    data_type: str = ""

    @property
    def swizzle_bytes(self) -> int:
        return self.box[0] * self.elem_bytes

    def to_json(self) -> dict:
        typed = {"data_type": self.data_type} if self.data_type else {}
        return {"tensor": self.tensor, "box": list(self.box), "elem_bytes": self.elem_bytes, **typed}


def box_of(op: Op, lay: SharedLayout) -> tuple[int, ...]:
    """Box extents, innermost first: one row of the tile's 128-byte panels (or its whole 64- or 32-byte row), its
    rows, 1 for dropped dims."""
    rank = op.operands[0].type.rank
    extents = []
    for d in reversed(range(rank)):
        if d == rank - 1:
            extents.append(lay.row_pitch // lay.elem_bytes)
        else:
            extents.append(1 if d in op.attrs.dropped else op.attrs.shape[d])
    return tuple(extents)


def _tensor_ok(q: CopyQuery, target: Target) -> bool:
    s = q.spec
    rank = q.op.operands[0].type.rank
    return s is not None and s.chunks16() and 2 <= rank <= 5


def _tile_ok(q: CopyQuery, target: Target) -> bool:
    rank = q.op.operands[0].type.rank
    dims = q.tile_dims
    if len(dims) != 2 or dims[-1] != rank - 1:
        return False
    rows, cols = q.op.attrs.shape[dims[0]], q.op.attrs.shape[dims[1]]
    elem = q.op.result.dtype.itemsize
    # the ring (all its stages) decides the tile's alignment, which a 64- or 32-byte swizzle needs to be 1024
    lay = getattr(q.op.result.type, "layout", None)
    ring = lay.bytes if isinstance(lay, SharedLayout) else rows * cols * elem
    # 64- and 32-byte rows: run on an H100 only; sm_100a keeps cp.async for them until a Blackwell GPU runs them
    short = (cols * elem) % SPAN_BYTES != 0
    return (swizzled_rows(cols * elem, ring) and not (short and target.sm >= 100) and rows <= 256 and rows % 8 == 0
            and elem in (1, 2, 4))


REGISTRY.register("copy", "tma_bulk_tensor", min_sm=90, priority=10, predicates={
    "the load is prefetched by a pipelined loop": lambda q, t: q.pipelined,
    "tensor is 16-byte aligned, unit-stride in its last dim, other strides 16-byte multiples, rank 2..5": _tensor_ok,
    "tile is 2-D along the tensor's last dim, rows of 128-byte multiples (or, on sm_90, of 64 or 32 bytes in a "
    "ring of >= 1024 bytes), <= 256 rows, a multiple of 8": _tile_ok,
})(object())

REGISTRY.register("copy", "cp_async", min_sm=80, priority=5)(object())


def _panel_boxes(lay: SharedLayout, starts: list[str]):
    """(panel index, box coordinates innermost first as C text) of each 128-byte panel of a tile whose window
    starts at ``starts`` (one per tensor dim): panel ``p`` starts ``p * 128`` bytes further along the last dim. A
    tile of 64- or 32-byte rows is one panel."""
    panel_cols = lay.row_pitch // lay.elem_bytes
    for p in range(lay.row_bytes // lay.row_pitch):
        yield p, _box_coords(starts, {len(starts) - 1: p * panel_cols})


def _box_coords(starts: list[str], shifts: dict[int, int]) -> str:
    """A box's coordinates, innermost first, as C text: the window's ``starts`` (one per tensor dim), dim ``d``
    moved ``shifts[d]`` elements further where given and non-zero."""
    return ", ".join(f"(int)({starts[d]})" + (f" + {shifts[d]}" if shifts.get(d) else "")
                     for d in reversed(range(len(starts))))


def tma_issue(em, op: Op, tile, starts: list[str], slot: str, bar: str, param: str, multicast: str = "") -> None:
    """The calling thread issues one bulk tensor copy per panel of ``op``'s tile into ``slot``. Where the C
    condition ``multicast`` holds (the tile is the same in both programs of a cluster), each program issues every
    other panel (program 0 all of a one-panel tile) into both programs' slots; each program's mbarrier counts the
    whole tile's bytes either way."""
    lay: SharedLayout = tile.layout
    rank = op.operands[0].type.rank
    panels = lay.row_bytes // lay.row_pitch
    if multicast:
        em.require_header("tma_multicast")
    for p, coords in _panel_boxes(lay, starts):
        stage = f" + ({slot}) * {lay.stage_bytes}" if slot != "0" else ""
        dst = f"{tile.origin} + {tile.offset}{stage} + {p * lay.panel_bytes}"
        plain = f"tj_tma_load_{rank}d({dst}, &{param}, {coords}, {bar});"
        if multicast:
            em.line(f"if (!({multicast})) {plain}")
            em.line(f"else if (tj_crank == {p % 2 if panels > 1 else 0}) tj_tma_load_{rank}d_mc({dst}, &{param}, "
                    f"{coords}, {bar}, (unsigned short)3);  // into both programs")
        else:
            em.line(plain)


# -- the TMA store epilogue ------------------------------------------------------------------------

#: Panel buffers the TMA store epilogue stages through: panel p is written into buffer p % 2 while the store of
#: panel p - 1 reads the other.
STORE_BUFFERS = 2


def _store_staging(em, rows: int, cols: int, esize: int, chunk_rows: int) -> tuple[SharedLayout, int] | None:
    """The staging of a TMA-stored tile: the layout of one box (a 128-byte panel of columns, or the whole tile
    when its rows are not panelled) and how many such buffers the store cycles through; None when not even one
    fits the shared memory left.

    A box holds all the tile's rows when two such buffers fit (or the tile is one box). Otherwise, where the rows
    split into ``chunk_rows`` (the rows of one register slab across the warpgroups, so each register falls in one
    box whatever the thread), boxes of that many rows in two buffers: the threads write one while the TMA reads
    the other. Else one buffer of all the rows (each store waited for before the next box is written)."""
    whole = SharedLayout(rows, cols, esize)
    panel_cols = SPAN_BYTES // esize if whole.panelled else cols
    free = em.target.arch.max_shared_bytes - em.scratch_bytes - 1024 - -(-em.smem_top // 1024) * 1024
    heights = [rows] + ([chunk_rows] if chunk_rows < rows and rows % chunk_rows == 0 else [])
    choices = [(h, 2) for h in heights] + [(h, 1) for h in heights]
    for height, buffers in choices:
        lay = SharedLayout(height, panel_cols, esize)
        if buffers <= (rows // height) * (cols // panel_cols) and buffers * lay.stage_bytes <= free:
            return lay, buffers
    return None


def stageable(em, op: Op) -> bool:
    """Whether a register tile written into a tensor window (a store, or a tile atomic add: ``lower_atomic``
    checks the rest) has the form the TMA epilogue takes, its staging's fit aside: sm_90+, the tile in a wgmma
    accumulator layout (pairs of adjacent columns per thread) of 2- or 4-byte elements of the tensor's dtype, a
    plain tensor argument TMA can describe (not a T.bounded view: TMA clips at the tensor's own extents), a 2-D
    window along the last dim whose rows are whole 128-byte panels."""
    tensor, value = op.operands[0], op.operands[1]
    if em.target.sm < 90 or not value.is_tile or not isinstance(value.type.layout, WgmmaLayout):
        return False
    esize = value.dtype.itemsize
    halves = value.dtype in (D.float16, D.bfloat16)  # 16-bit values are packed through their .bits
    if value.dtype != tensor.dtype or not (halves or esize == 4) or defining_op(tensor) is not None:
        return False
    q = CopyQuery(op, em.fn.attrs.get("tensor_specs", {}).get(tensor.name), True)
    if not _tensor_ok(q, em.target) or len(q.tile_dims) != 2 or q.tile_dims[-1] != tensor.type.rank - 1:
        return False
    rows, cols = value.type.shape
    return not ((cols * esize) % SPAN_BYTES or rows > 256 or rows % 8)


def store_staging(em, op: Op) -> tuple[SharedLayout, int] | None:
    """The staging (``_store_staging``) of a register tile that takes the TMA epilogue, or None when it does not:
    it has the form (``stageable``) and a panel buffer fits the shared memory left."""
    if not stageable(em, op):
        return None
    value = op.operands[1]
    rows, cols = value.type.shape
    return _store_staging(em, rows, cols, value.dtype.itemsize, 64 * value.type.layout.groups)


#: What ``emit_store`` gives each staged box to (``tj_tma_<instruction>_<rank>d``): a bulk tensor store, or a bulk
#: tensor reduction adding it into the tensor (a relaxed tile atomic_add: ``lower_atomic``).
STORE, REDUCE_ADD = "store", "reduce_add"


def emit_store(em, op: Op, staging: tuple[SharedLayout, int], instruction: str = STORE) -> None:
    """Registers -> 128-byte-swizzled shared boxes -> one bulk tensor store (or reduction) per box, issued by
    thread 0.

    The tile goes out one box at a time (a 128-byte panel of columns, of all its rows or of one register slab's;
    ``_store_staging``) through ``buffers`` box buffers: the threads write box b's column pairs (8 rows x 16 bytes
    per warp access, conflict-free) into buffer b % 2 once the store that last read it has
    (``cp.async.bulk.wait_group.read 1``), while the store of box b - 1 is still reading the other (one buffer,
    waiting for each store, where two do not fit). The first boxes, one per buffer, wait for nothing more than the
    first wait, for every earlier store, at the start. The staging memory is boxes, not the whole tile, so a
    persistent kernel's ring and the epilogue fit together.

    ``REDUCE_ADD``: each box is added into the tensor by ``cp.reduce.async.bulk.tensor`` (PTX 9.7.9.25.5.3: every
    element's add a relaxed atomic at gpu scope), through a tensor map typed with the tile's dtype. Nothing waits
    for the reductions here: in a loop the next iteration's reduction waits at its start before it rewrites the
    staging (the math of the iteration in between runs while they read it), the loop before it gives its shared
    memory back (``lower_loops``), and the kernel's end for their completion (``_complete_bulk_reductions``)."""
    reduce = instruction == REDUCE_ADD
    tensor, value = op.operands[0], op.operands[1]
    layout: WgmmaLayout = value.type.layout
    rows, cols = value.type.shape
    esize = value.dtype.itemsize
    lay, buffers = staging  # from store_staging
    panel_cols, box_rows = lay.cols, lay.rows
    rank = tensor.type.rank
    row_dim = CopyQuery(op, None, True).tile_dims[0]  # (store_staging: a 2-D window along the last dim)
    em.require_header("tma")
    em.require_header("tma_store")
    if reduce:
        em.require_header("tma_reduce")
    offset = em.allocate_shared(buffers * lay.stage_bytes, 1024)  # the 128-byte swizzle repeats every 1024 bytes
    origin = em.smem_origin
    byte_origin = BYTE_ORIGINS[origin]
    box = list(box_of(op, SharedLayout(rows, cols, esize)))
    box[rank - 1 - row_dim] = box_rows
    param = em.tensor_map_param(TensorMapSpec(tensor.name, tuple(box), esize, value.dtype.name if reduce else ""))
    starts = [em.name(v) for v in op.operands[2:]]
    x = em.name(value)
    # the register pairs of each box: a pair's column does not depend on the thread beyond its 8-column block, nor
    # its row beyond its slab (box_rows is all the rows or one slab's: lower_tma._store_staging)
    pairs: dict[tuple[int, int], list[int]] = {}
    for q in range(layout.regs // 2):
        row, col = (int(c) for c in layout.coords(0, 2 * q))
        pairs.setdefault((row // box_rows, col // panel_cols), []).append(q)
    if reduce:
        em.comment(op, f"atomic add ({op.attrs.sem}) into {em.name(tensor)} window by TMA: registers -> swizzled "
                   "shared boxes -> bulk reductions into global")
    else:
        em.comment(op, f"store into {em.name(tensor)} window by TMA: registers -> swizzled shared boxes -> global")
    what = "reduction" if reduce else "store"
    em.open("")
    em.line(f"if (tid == 0) tj_bulk_wait_read0();  // an earlier TMA {what} has finished reading shared memory")
    boxes = [(c, p) for c in range(rows // box_rows) for p in range(cols // panel_cols)]
    for b, (c, p) in enumerate(boxes):
        base = offset + (b % buffers) * lay.stage_bytes
        if b >= buffers:  # (the first wait freed every buffer for the first boxes)
            em.line(f"if (tid == 0) tj_bulk_wait_read{buffers - 1}();  // the {what} that last read this "
                    "buffer is done")
        if b == 0 or b >= buffers:
            em.barrier("... and every earlier reader of this memory is done")
        for first, count in _runs(pairs.get((c, p), [])):
            em.line("#pragma unroll")
            em.open(f"for (int tj_q = {first}; tj_q < {first + count}; ++tj_q)")
            em.line("const int i = 2 * tj_q;")
            row, col = em.coords(layout, "i")
            off = c_text(lay.elem_offset(CExpr(f"(({row}) - {c * box_rows})"),
                                         CExpr(f"(({col}) - {p * panel_cols})")))
            if esize == 2:
                em.line(f"*reinterpret_cast<unsigned*>({byte_origin} + {base} + {off}) = "
                        f"(unsigned){x}[i].bits | ((unsigned){x}[i + 1].bits << 16);")
            else:  # 4-byte values (f32, i32) keep their bits
                ctype = c_type(value.dtype)
                em.line(f"{ctype}* tj_d = reinterpret_cast<{ctype}*>({byte_origin} + {base} + {off});")
                em.line(f"tj_d[0] = {x}[i]; tj_d[1] = {x}[i + 1];")
            em.close()
        em.line("tj_fence_proxy_async();  // the generic-proxy writes, visible to the TMA")
        em.barrier()
        coords = _box_coords(starts, {rank - 1: p * panel_cols, row_dim: c * box_rows})
        em.line(f"if (tid == 0) {{ tj_tma_{instruction}_{rank}d(&{param}, {coords}, {origin} + {base}); "
                "tj_bulk_commit(); }")
    if reduce:
        em.bulk_reads_pending = em.bulk_reduced = True
    elif em.fn.attrs.get("persistent") and em.ring_phase == "consumer":
        # in a persistent walk the next program's store waits before it writes the buffers again, and the walk's
        # end before the program leaves (lower_specialized.emit_specialized): the math warps go on to the next main loop
        em.store_reads_pending = True
    else:
        em.line("if (tid == 0) tj_bulk_wait_read0();  // the CTA's shared memory stays valid until the TMA has read it")
    em.close()


def _complete_bulk_reductions(em) -> Callable[[], None]:
    """The kernel's end waits, in each thread that issued TMA bulk reductions, for them to complete
    (``cp.async.bulk.wait_group 0``): the PTX ISA says when a bulk async-group's writes are done and visible
    (9.7.9.25.6.2), not that a CTA's exit completes them, and the CTA's shared memory must outlive their reads."""
    def finish() -> None:
        if em.bulk_reduced:
            em.line("if (tid == 0) tj_bulk_wait0();  // the TMA bulk reductions are complete before the program exits")
    return finish


KERNEL_HOOKS.append(_complete_bulk_reductions)


def _runs(values: list[int]):
    """(first, length) of each run of consecutive integers in ``values`` (sorted)."""
    start = None
    for v in values:
        if start is None:
            start, prev = v, v
        elif v == prev + 1:
            prev = v
        else:
            yield start, prev - start + 1
            start, prev = v, v
    if start is not None:
        yield start, prev - start + 1
