"""The launch model: the ring depth, warp specialization and persistence of a launch that leaves them unsaid.

A launch that gives no ``num_stages`` leaves the pipeline to the compiler: this module chooses ``num_stages``, and
``warp_specialize`` and ``persistent`` where the launch did not give them either, from the kernel's main loop and
the target's resources. A launch that gives ``num_stages`` (every autotune ``Config`` does: its records always
list it) decides the whole pipeline itself, the options it leaves out keeping their fixed defaults, as does
everything with ``TILEJIT_LAUNCH_MODEL=0``. A loop's own ``T.range(..., stages=, warp_specialize=)`` decides for
that loop in every case. ``Kernel.bind`` records what the launch gave (``Specialization.given``); the compiler calls
:func:`resolve` between its ``ir`` and ``passes`` stages, and the cache key names the options left to it.

What the model reads (:func:`loop_shape`, from the frontend IR): the first pipelined ``T.range`` loop of the
kernel's top-level block whose body has a gemm. Its *stage* is the bytes of the gemm operands it loads per
iteration (the tiles the ring holds S copies of); the gemm operands loaded before it (attention's Q) stay in shared
memory once; its accumulators are the loop-carried tiles plus the gemm results that live beside them (attention's
S = Q K^T; not a matmul's ``acc += a @ b``, which accumulates in place), counted in 32-bit registers. That count is a
lower bound of what a thread holds, and the shared bytes leave out the epilogue's and the reductions' scratch, so
the blocks per SM below are an upper bound: "one block per SM" is certain.

The rules (:func:`choose`), each measured on an H100 (``benchmarks/history/investigations.md``; the raw rows in
``benchmarks/results/configs_{ws,persistent,persistent_panels,fp8_nn,tf32_nn}_h100.json``, ``attention_ws_h100``):

1. **Fit.** The ring is never deeper than the arch's dynamic shared memory per block holds (sm_80 163 KiB; sm_86,
   sm_89, sm_120 99 KiB; sm_90a, sm_100a, sm_103a 227 KiB): the fixed default of 3 becomes the deepest that fits.
   The compiler's own fit (``compiler._cuda_stage``, which knows the scratch this estimate leaves out) still has the
   last word, and says nothing when the depth was the model's.
2. **Warp specialization** (sm_90a, ``num_warps`` a multiple of 4): when the kernel at the old depth 3 runs one
   block per SM for certain (shared memory: 228 KiB per SM, 1 KiB of it reserved per block; or registers: 65,536
   per SM), and its accumulators leave 64 registers of headroom under what ``setmaxnreg`` gives the math warps
   (``lower_specialized.consumer_registers``: 232 on 8 warps). The producer warpgroup's 128 threads and
   ``__launch_bounds__(.., 1)`` then cost no second block: measured +1-11% for 128x256 / 256x128 fp16 tiles (3
   stages; 0.985-1.11x with 4), +5% fp8, +7-11% tf32, +6-17% attention 128x128 on 8 warps (D 64 / 128), and the
   deferred gemm on top (+8-9%, from 3 stages). Where the plain kernel held two blocks per SM the producer cost
   10-40% (attention 128x64 on 8 warps and 64-row tiles), so those stay plain. Only where the ring is at least 3
   deep (``warp_specialize.DEFER_STAGES``: with 2, attention measured 500 TFLOP/s against 534 without).
3. **Ring depth.** A kernel that runs one block per SM either way (rule 2's, or one warp-specialized by the launch)
   takes a 4-deep ring where 4 fits: no co-resident block to lose, more loads in flight (128x256 / 256x128 fp16
   3 -> 4 stages: +1-14% plain and warp-specialized alike). Deeper rings (6-12) measured faster only on small tiles
   with few of them, which the model does not know (below); others keep the fixed 3. sm_80 and sm_100a keep 3
   (no measurement of deeper rings there); only rule 1 applies to them.
4. **Persistence** (sm_90a): for a warp-specialized plain matmul main loop (every gemm accumulating in place,
   nothing else in the body) of 128x128 tiles: measured +0.2-8% fp16 (2048^3 to 8192^3), +5-7% fp8, 0.99-1.01x tf32
   over warp specialization alone. Not where an 8-bit operand is given MN-major (B stored K x N): when wgmma
   read it through a transposing copy, 128x128x256 fp8 went 0.64-0.70x (H200, 4096^3 to 8192^3), and
   0.77-0.79x warp-specialized alone (H100), so those 128x128 tiles keep the fixed defaults (rule 2 too);
   128x256 / 256x128 fp8 tiles with the copy gained from warp specialization (1.0-1.05x) and keep it. sm_90a
   now gathers such an operand into registers (``backend_cuda/lower_wgmma_mn8.py``); the rule stays until
   that form is measured. Not for 128x256 / 256x128 tiles (fp8 -17..-26%, tf32 -10%, fp16 0.975x at
   8192^3), not for smaller ones (64x64 / 64x128 at 1024^3: -5%), not for attention (a persistent loop gives up the
   deferred gemm).

5. **Blocks before depth** (sm_90a): a loop that is not a plain matmul (attention's softmax between its gemms) and
   is not warp-specialized relies on co-resident blocks to hide its loads. Where the fixed 3-deep ring lets fewer
   blocks share an SM than a 2-deep one, it takes 2 stages. Registers enter at 1.5x the accumulator count (what
   ptxas gave such loops on an H100: 96, 168 and 104 registers for 64, 97 and 64 accumulator registers). Measured
   on the obvious attention forward at D = 64 (``scripts/probes/one_loop_d64.py``, H100, S 1k/4k, causal and not):
   64x64 on 4 warps +5-13% (five blocks per SM instead of four), 64x128 on 4 warps -3..+21% (three instead of two;
   the loss is causal S = 4k); 128x64 on 8 warps, where registers allow two blocks either way, keeps 3 (2 stages
   measured 0.98-1.02x).

The SM count enters a persistent kernel as its program count (the device's at launch, else
``warp_specialize.DEFAULT_SM_COUNT``, an H100 SXM's 132). The grid does not enter the model: one compiled kernel
serves every grid of its arguments' signature (the launch's fast paths do not key on the grid), so rule 4 keeps to
the tiles measured to gain on grids of 2 to 31 waves.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..ir import BinaryOp, Function, LoopKind, Op, OpKind
from ..ir.rewrite import use_counts
from ..target import Arch, LaunchOptions, Target

#: The fixed default ring depth (``LaunchOptions.num_stages``), what a launch with the model off gets.
OLD_STAGES = 3
#: The deepest ring the model chooses (rule 3).
DEEP_STAGES = 4
#: The ring depth rule 5 takes when it holds more blocks per SM than the fixed default.
SHALLOW_STAGES = 2
#: The shallowest ring warp specialization is chosen for (``warp_specialize.DEFER_STAGES``).
SPECIALIZED_MIN_STAGES = 3
#: Shared memory per SM, by SM number (CUDA C Programming Guide, "Technical Specifications per Compute
#: Capability"); each block also takes 1 KiB of it for the system.
SHARED_PER_SM = {80: 164, 86: 100, 89: 100, 90: 228, 100: 228, 103: 228, 120: 100}
BLOCK_RESERVED_SHARED = 1024
REGISTERS_PER_SM = 65536
THREADS_PER_SM = 2048
#: Registers a warp-specialized math thread must keep beyond its accumulators (addresses, fragments, softmax).
REGISTER_HEADROOM = 64
#: The tile (BM, BN) persistence is chosen for (rule 4).
PERSISTENT_TILE = (128, 128)


@dataclass(frozen=True)
class LoopShape:
    """What the model reads of a kernel: its main loop's ring and accumulators."""
    stage_bytes: int            # gemm operands the loop loads per iteration (one ring stage)
    other_shared_bytes: int     # gemm operands loaded before the loop (kept in shared memory once)
    accumulator_bits: int       # loop-carried tiles and gemm results beside them, per block
    tile: tuple[int, int]       # the first gemm's result (BM, BN)
    plain_matmul: bool          # every gemm accumulates in place from loaded tiles; nothing else in the body
    explicit_stages: int | None  # the loop's own T.range(stages=)
    copied_8bit: bool = False   # an 8-bit operand given MN-major (measured through a transposing copy)


@dataclass(frozen=True)
class Choice:
    """The model's choice for the options left to it, and why (one line per rule that decided)."""
    values: dict
    why: tuple[str, ...]


def resolve(fn: Function, target: Target, given: frozenset | None) -> tuple[Target, Choice | None]:
    """``target`` with the options left to the model chosen for ``fn`` (the frontend IR), and the choice (None
    when the model does not apply)."""
    left = LaunchOptions.left_to_model(given)
    if not left:
        return target, None
    options = target.options
    choice = choose(loop_shape(fn), target.arch, options.num_warps, left,
                    specialized=options.in_effect("warp_specialize"), cut_k=options.split_k > 1)
    return replace(target, options=replace(options, **choice.values)), choice


def choose(shape: LoopShape | None, arch: Arch, warps: int, left: tuple[str, ...] | None = None, *,
           specialized: bool = False, cut_k: bool = False) -> Choice:
    """The values of the options in ``left`` (default: every modelled option) for a kernel whose main loop is
    ``shape`` (None: it has none) on ``arch`` with ``warps`` warps; ``specialized``: the launch warp-specializes
    it itself; ``cut_k``: it is split-K. Pure: the rules of the module docstring."""
    left = LaunchOptions.modelled_names() if left is None else left
    values = dict(num_stages=OLD_STAGES, warp_specialize=False, persistent=False)
    why = []
    if shape is None:
        return Choice({n: values[n] for n in left}, ("no pipelined main loop with a gemm: the fixed defaults",))
    threads = 32 * warps
    limit = arch.max_shared_bytes
    fits = max([s for s in range(1, DEEP_STAGES + 1) if _shared(shape, s) <= limit] or [1])
    own = shape.explicit_stages
    depth = own or min(OLD_STAGES, fits)  # the depth the old defaults compile (rule 1's cut included)
    if own is None and fits < OLD_STAGES:
        values["num_stages"] = depth
        why.append(f"fit: {OLD_STAGES} stages need ~{_shared(shape, OLD_STAGES):,} B of shared memory, {arch} allows "
                   f"{limit:,}: {fits}")
    blocks = blocks_per_sm(_shared(shape, depth), threads, _registers(shape, threads), arch)
    one_block = blocks <= 1
    if arch.has_wgmma and "warp_specialize" in left and not specialized and not cut_k and warps % 4 == 0:
        room = _consumer_registers(threads) - REGISTER_HEADROOM
        if not one_block:
            why.append(f"not warp-specialized: up to {blocks} blocks per SM, which a producer warpgroup would cost")
        elif depth < SPECIALIZED_MIN_STAGES:
            why.append(f"not warp-specialized: a {depth}-deep ring (it pays from {SPECIALIZED_MIN_STAGES})")
        elif _registers(shape, threads) > room:
            why.append(f"not warp-specialized: {_registers(shape, threads)} accumulator registers a thread, over "
                       f"{room}")
        elif shape.copied_8bit and shape.tile == PERSISTENT_TILE:
            why.append("not warp-specialized: 128x128 tiles with an 8-bit operand through a transposing copy "
                       "(measured 0.77-0.79x)")
        else:
            values["warp_specialize"] = specialized = True
            why.append("warp-specialized: one block per SM either way")
    if arch.has_wgmma and own is None and not specialized and not shape.plain_matmul and depth > SHALLOW_STAGES:
        held = _registers(shape, threads) * 3 // 2
        deep = blocks_per_sm(_shared(shape, depth), threads, held, arch)
        shallow = blocks_per_sm(_shared(shape, SHALLOW_STAGES), threads, held, arch)
        if shallow > deep:
            values["num_stages"] = depth = SHALLOW_STAGES
            why.append(f"{SHALLOW_STAGES} stages: {shallow} blocks per SM instead of {deep}, which hide the loads "
                       "of a loop with work between its gemms")
    if arch.has_wgmma and own is None and (one_block or specialized) and fits > depth:
        values["num_stages"] = min(DEEP_STAGES, fits)
        why.append(f"{values['num_stages']} stages: one block per SM, and they fit")
    if arch.has_wgmma and "persistent" in left and specialized and shape.plain_matmul \
            and shape.tile == PERSISTENT_TILE and not shape.copied_8bit:
        values["persistent"] = True
        why.append(f"persistent: a warp-specialized {shape.tile[0]}x{shape.tile[1]} matmul main loop")
    return Choice({n: values[n] for n in left}, tuple(why))


def blocks_per_sm(shared_bytes: int, threads: int, registers: int, arch: Arch) -> int:
    """An upper bound of the blocks one SM holds at once, from the block's shared memory, registers per thread
    (a lower bound) and threads."""
    by_shared = SHARED_PER_SM[arch.sm] * 1024 // (shared_bytes + BLOCK_RESERVED_SHARED)
    by_registers = REGISTERS_PER_SM // (threads * max(registers, 1))
    return min(by_shared, by_registers, THREADS_PER_SM // threads)


def _shared(shape: LoopShape, stages: int) -> int:
    return shape.other_shared_bytes + stages * shape.stage_bytes


def _registers(shape: LoopShape, threads: int) -> int:
    return -(-shape.accumulator_bits // (32 * threads))


def _consumer_registers(threads: int) -> int:
    """What ``setmaxnreg`` leaves each math thread beside a producer warpgroup keeping 40
    (``backend_cuda.lower_specialized.consumer_registers``, repeated here below the backend)."""
    return min(256, (REGISTERS_PER_SM - 128 * 40) // threads // 8 * 8)


# -- reading the kernel ----------------------------------------------------------------------------------------


def main_loop(fn: Function) -> Op | None:
    """The first pipelined ``T.range`` loop of the kernel's top-level block with a gemm in its body."""
    for op in fn.body.ops:
        if op.kind is OpKind.FOR and op.attrs.kind is LoopKind.PIPELINED and \
                any(o.kind is OpKind.GEMM for o in op.regions[0].walk()):
            return op
    return None


def loop_shape(fn: Function) -> LoopShape | None:
    """The :class:`LoopShape` of ``fn``'s main loop (:func:`main_loop`), read from the frontend IR; None without
    one."""
    loop = main_loop(fn)
    if loop is None:
        return None
    body = loop.regions[0]
    inside = {r.id: o for o in body.walk() for r in o.results}
    before = {r.id: o for o in fn.body.ops for r in o.results}
    uses = use_counts(body)
    carried = {a.id for a in body.args[1:]}
    yielded = {v.id for v in body.terminator.operands}
    gemms = [o for o in body.walk() if o.kind is OpKind.GEMM]
    ring: dict[int, Op] = {}
    once: dict[int, Op] = {}
    fed = True
    for gemm in gemms:
        for v in gemm.operands[:2]:
            load, in_body = _loaded(v, inside, before)
            if load is None:
                fed = False
            else:
                (ring if in_body else once)[id(load)] = load
    bits = sum(a.type.numel * a.type.dtype.bits for a in body.args[1:] if a.is_tile)
    fused = set()
    for gemm in gemms:
        in_place = gemm.operands[2].id in carried and gemm.result.id in yielded
        added = _added(gemm, body, uses)
        if in_place or added is not None:
            fused.add(id(gemm))
            if added is not None and any(v.id in carried for v in added.operands):
                fused.add(id(added))  # (a plain matmul's acc += a @ b)
        else:
            bits += gemm.result.type.numel * gemm.result.type.dtype.bits
    shape = gemms[0].result.type.shape
    return LoopShape(
        stage_bytes=sum(_nbytes(o) for o in ring.values()), other_shared_bytes=sum(_nbytes(o) for o in once.values()),
        accumulator_bits=bits, tile=(shape[-2], shape[-1]),
        plain_matmul=fed and not once and all(_matmul_op(o, fused) for o in body.ops),
        explicit_stages=loop.attrs.stages,
        copied_8bit=any(_mn_major(gemm, i, inside, before) for gemm in gemms for i in (0, 1)
                        if gemm.operands[i].type.dtype.itemsize == 1))


def _mn_major(gemm: Op, index: int, inside: dict, before: dict) -> bool:
    """Whether gemm operand ``index`` (0: A, 1: B) comes from its load in the other major-ness than wgmma reads
    8-bit operands in (K-major: A given M x K, B given N x K), counting the transposes on the way."""
    flips = int(gemm.attrs.transpose_a if index == 0 else not gemm.attrs.transpose_b)
    return (flips + _through_transposes(gemm.operands[index], inside, before)[2]) % 2 == 1


def _loaded(v, inside: dict, before: dict) -> tuple[Op | None, bool]:
    """The load a gemm operand comes from (through transposes), and whether it is in the loop's body."""
    op, v, _ = _through_transposes(v, inside, before)
    return (op, v.id in inside) if op is not None and op.kind is OpKind.LOAD and op.result.is_tile else (None, False)


def _through_transposes(v, inside: dict, before: dict):
    """(the op, in the loop's body or before it, that makes ``v`` once the transposes on the way are passed (None:
    an argument or an op elsewhere), the value it makes, how many transposes were passed)."""
    flips = 0
    while (op := inside.get(v.id) or before.get(v.id)) is not None and op.kind is OpKind.TRANSPOSE:
        flips += 1
        v = op.operands[0]
    return op, v, flips


def _added(gemm: Op, body, uses: dict) -> Op | None:
    """The ``acc + a @ b`` add (``acc`` carried, or made from it: attention's ``acc * alpha``) that
    ``canonicalize`` folds into the gemm, which then accumulates in ``acc``'s registers; or None."""
    if uses.get(gemm.result.id) != 1:
        return None
    for op in body.ops:
        if op.kind is OpKind.BINARY and op.attrs.op is BinaryOp.ADD and any(v is gemm.result for v in op.operands) \
                and all(v.type == gemm.result.type for v in op.operands):
            return op
    return None


def _matmul_op(op: Op, fused: set) -> bool:
    """Part of a plain matmul main loop: a load, a gemm accumulating in place, a zero tile, a transpose, scalars."""
    if id(op) in fused or op.kind in (OpKind.LOAD, OpKind.SPLAT, OpKind.TRANSPOSE, OpKind.YIELD):
        return True
    return not op.regions and all(r.is_scalar for r in op.results)


def _nbytes(load: Op) -> int:
    t = load.result.type
    return t.numel * t.dtype.bits // 8
