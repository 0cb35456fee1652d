"""The sm_80 main loop: address math hoisted out of the pipelined loop, no call in it, one barrier per
iteration, ldmatrix.x4, and no spills for the default BK=32 configs.

The instruction counts are read from the PTX NVRTC makes, with a small parser of its own:

* the kernel's body is cut into basic blocks (a label starts one; a branch, ``ret`` or ``exit`` ends one);
  instructions are split at ``;``, so the ones inside an inline-asm ``{ ... }`` line count one by one;
* the main loop is the innermost back edge whose range holds every block with an ``mma.sync``;
* the steady-state iteration of an interior tile is the cheapest path from the loop's header to its back edge
  that passes through every block with an ``mma.sync`` (the edge-tile copies and the element-wise copies sit in
  blocks off that path); the test checks it still issues every copy of the iteration;
* an integer/predicate instruction is one whose opcode is add, sub, mul, mad, shl, shr, and, or, xor, not,
  setp, selp, cvt, mov, bfi, bfe, prmt, min, max, neg, abs, div, rem, popc, clz, lop3, shf, cvta (and a few
  rarer ones) with only integer or predicate types (``.s32``, ``.u64``, ``.b32``, ``.pred``, ...); a float
  ``mov.f32`` or ``cvt.rn.f16.f32`` is not one.

Before the loop was reworked (HEAD aa7e02b) that count was 166 per 64 mma.sync (2.59) for the 128x256x32 / 8 warps / 3 stages
fp16 matmul, with two calls in the loop.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
import torch

from kernels import matmul, matmul_staged
from tilejit.backend_cuda import nvrtc
from tilejit.backend_cuda.stages import ptxas_resources
from tilejit.configs import matmul_configs

_LABEL = re.compile(r"^(\$?[A-Za-z_][\w$]*):$")
_INT_OPS = {"add", "sub", "mul", "mad", "mul24", "mad24", "shl", "shr", "and", "or", "xor", "not", "cnot", "setp",
            "selp", "set", "slct", "cvt", "cvta", "mov", "bfi", "bfe", "prmt", "min", "max", "neg", "abs", "div",
            "rem", "popc", "clz", "brev", "lop3", "shf", "sad", "bmsk", "szext"}
_INT_TYPE = re.compile(r"^(?:[usb](?:8|16|32|64)|pred)$")
_FLOAT_TYPE = re.compile(r"^(?:f16|f16x2|bf16|bf16x2|f32|f64|tf32|e4m3|e5m2|e4m3x2|e5m2x2)$")


@dataclass
class Instr:
    guard: str | None   # the @p (or @!p) predicate, if any
    opcode: str         # with its modifiers: "setp.lt.s64"
    operands: str


@dataclass
class BasicBlock:
    label: str | None
    instrs: list[Instr] = field(default_factory=list)
    succ: list[int] = field(default_factory=list)


def split_instructions(line: str) -> list[Instr]:
    out = []
    for part in line.split(";"):
        part = part.strip().lstrip("{").strip().rstrip("}").strip()
        if not part or part.startswith((".", "//")):
            continue  # a directive or a declaration (.reg, .loc, ...)
        guard = None
        m = re.match(r"^@(!?%?[\w$]+)\s+(.*)$", part)
        if m:
            guard, part = m.group(1), m.group(2)
        opcode, _, operands = part.partition(" ")
        out.append(Instr(guard, opcode.strip(), operands.strip()))
    return out


def is_int_or_pred(ins: Instr) -> bool:
    base, *mods = ins.opcode.split(".")
    if base not in _INT_OPS:
        return False
    if base == "cvta":
        return True
    types = [m for m in mods if _INT_TYPE.match(m) or _FLOAT_TYPE.match(m)]
    return bool(types) and not any(_FLOAT_TYPE.match(t) for t in types)


def entry_blocks(ptx: str) -> list[BasicBlock]:
    """The basic blocks of the (first) ``.entry`` in ``ptx``, with their successors."""
    start = ptx.index("{", re.search(r"\.entry\s+\w+", ptx).end())
    depth, end = 0, start
    for end in range(start, len(ptx)):
        depth += {"{": 1, "}": -1}.get(ptx[end], 0)
        if depth == 0:
            break
    blocks = [BasicBlock(None)]
    for raw in ptx[start + 1:end].splitlines():
        line = raw.strip()
        if not line or line.startswith("//"):
            continue
        label = _LABEL.match(line)
        if label:
            if blocks[-1].instrs or blocks[-1].label is not None:
                blocks.append(BasicBlock(label.group(1)))
            else:
                blocks[-1].label = label.group(1)
            continue
        for ins in split_instructions(line.split("//")[0]):
            blocks[-1].instrs.append(ins)
            if ins.opcode.startswith("bra") or ins.opcode in ("ret", "exit"):
                blocks.append(BasicBlock(None))
    blocks = [b for b in blocks if b.instrs or b.label]
    index = {b.label: i for i, b in enumerate(blocks) if b.label}
    for i, b in enumerate(blocks):
        last = b.instrs[-1] if b.instrs else None
        if last is not None and last.opcode.startswith("bra"):
            b.succ.append(index[last.operands.rstrip(",").strip()])
            if last.guard is not None and i + 1 < len(blocks):
                b.succ.append(i + 1)
        elif (last is None or last.opcode not in ("ret", "exit")) and i + 1 < len(blocks):
            b.succ.append(i + 1)
    return blocks


def _has(block: BasicBlock, prefix: str) -> bool:
    return any(i.opcode.startswith(prefix) for i in block.instrs)


def main_loop(blocks: list[BasicBlock]) -> tuple[int, int]:
    """(header, latch) of the innermost back edge around every block holding an mma.sync."""
    mma = [i for i, b in enumerate(blocks) if _has(b, "mma.sync")]
    loops = [(s, i) for i, b in enumerate(blocks) for s in b.succ if s <= min(mma) and i >= max(mma)]
    assert loops, "no loop around the mma.sync blocks"
    return min(loops, key=lambda edge: edge[1] - edge[0])


def steady_path(blocks: list[BasicBlock]) -> list[int]:
    """The cheapest header -> latch path (in integer/predicate instructions) through every mma.sync block."""
    head, latch = main_loop(blocks)
    need = {i for i in range(head, latch + 1) if _has(blocks[i], "mma.sync")}
    best: list[int] | None = None

    def cost(path):
        return sum(is_int_or_pred(x) for i in path for x in blocks[i].instrs)

    def walk(i, path):
        nonlocal best
        if i == latch:
            if need <= set(path) and (best is None or cost(path) < cost(best)):
                best = list(path)
            return
        for s in blocks[i].succ:
            if head < s <= latch and s not in path:  # simple paths: inner loops (element-wise copies) are cut
                path.append(s)
                walk(s, path)
                path.pop()

    walk(head, [head])
    assert best is not None
    return best


@dataclass
class LoopCounts:
    int_pred: int
    mma: int
    cp_async: int
    ldmatrix_x4: int
    ldmatrix: int
    barriers: int
    calls_in_loop: int

    @property
    def per_mma(self) -> float:
        return self.int_pred / self.mma


def loop_counts(ptx: str) -> LoopCounts:
    blocks = entry_blocks(ptx)
    head, latch = main_loop(blocks)
    path = [x for i in steady_path(blocks) for x in blocks[i].instrs]
    every = [x for i in range(head, latch + 1) for x in blocks[i].instrs]
    return LoopCounts(
        int_pred=sum(is_int_or_pred(x) for x in path),
        mma=sum(x.opcode.startswith("mma.sync") for x in path),
        cp_async=sum(x.opcode.startswith(("cp.async.cg", "cp.async.ca")) for x in path),
        ldmatrix_x4=sum(x.opcode.startswith("ldmatrix") and ".x4" in x.opcode for x in path),
        ldmatrix=sum(x.opcode.startswith("ldmatrix") for x in path),
        barriers=sum(x.opcode.startswith(("bar.sync", "barrier")) for x in path),
        calls_in_loop=sum(x.opcode.startswith("call") for x in every),
    )


# -- the parser on a hand-written loop --------------------------------------------------------------------------

_TOY = """
.visible .entry toy(.param .u64 p)
{
	.reg .pred 	%p<4>;
	mov.u32 	%r1, 0;
$L__BB0_1:
	bar.sync 	0;
	add.s32 	%r2, %r1, 16;
	setp.lt.s32 	%p1, %r2, 100;
	{ .reg .pred p; setp.ne.b32 p, %r3, 0; @p cp.async.cg.shared.global [%r4+0], [%rd1], 16; }
	mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%r5, %r6, %r7, %r8}, {%r9, %r10}, {%f1, %f2, %f3, %f4};
	mov.f32 	%f5, %f1;
	cvt.rn.f16.f32 	%rs1, %f5;
	@%p1 bra 	$L__BB0_3;
	shl.b64 	%rd2, %rd1, 4;
	mul.lo.s64 	%rd3, %rd2, %rd2;
	{ // callseq 0, 0
	call.uni slow, (param0);
	}
$L__BB0_3:
	add.s32 	%r1, %r1, 1;
	setp.lt.s32 	%p2, %r1, 8;
	@%p2 bra 	$L__BB0_1;
	ret;
}
"""


def test_the_counter_on_a_hand_written_loop():
    counts = loop_counts(_TOY)
    # path header -> $L__BB0_3: add, setp, the setp inside the inline asm; then add, setp (float mov/cvt: no)
    assert (counts.int_pred, counts.mma, counts.cp_async, counts.barriers) == (5, 1, 1, 1)
    assert counts.calls_in_loop == 1  # the call block is off the cheapest path, but in the loop
    assert is_int_or_pred(Instr(None, "and.pred", "%p1, %p2, %p3"))
    assert not is_int_or_pred(Instr(None, "add.f32", "%f1, %f2, %f3"))
    assert is_int_or_pred(Instr(None, "cvt.u32.u64", "%r1, %rd1"))
    assert not is_int_or_pred(Instr(None, "cvt.f32.s32", "%f1, %r1"))


# -- the DESIGN matmul -------------------------------------------------------------------------------------------

def _meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _compile(bm, bn, bk, warps, stages, arch="sm_80", dtype=torch.float16, shape=(4096, 4096, 4096)):
    m, n, k = shape
    return matmul.compile(_meta(m, k, dtype=dtype), _meta(k, n, dtype=dtype), _meta(m, n, dtype=dtype), BM=bm, BN=bn,
                          BK=bk, num_warps=warps, num_stages=stages, arch=arch, stop_after="ptx")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_design_matmul_main_loop(dtype):
    """128x256x32, 8 warps, 3 stages on sm_80: at most 1 integer/predicate instruction per mma.sync on an interior
    tile's iteration (2.59 before), no call anywhere in the loop, one barrier per iteration (per BK k-tile), every
    fragment by ldmatrix.x4 and every chunk of the next tiles by cp.async."""
    st = _compile(128, 256, 32, 8, 3, dtype=dtype)
    c = loop_counts(st.ptx)
    assert c.mma == 64  # (128 x 256 / 8 warps) / (16 x 8) atoms x 2 k16 steps
    assert c.per_mma <= 1.0, c
    assert c.calls_in_loop == 0
    assert c.barriers == 1
    assert c.ldmatrix == c.ldmatrix_x4 == 16  # per k16 step and warp: 4 for A (m16 each), 4 for B (two n8 each)
    assert c.cp_async == (128 * 32 + 32 * 256) // 8 // 256  # 16-byte chunks per thread
    assert "\n.func " not in st.ptx and "call.uni" not in st.ptx


def test_128x128_main_loop():
    """The 4-warp, 4-stage 128x128x32 default config keeps the same shape of loop."""
    c = loop_counts(_compile(128, 128, 32, 4, 4).ptx)
    assert c.mma == 64 and c.per_mma <= 1.0 and c.calls_in_loop == 0 and c.barriers == 1, c


def test_ragged_matmul_keeps_the_edge_path():
    """Ragged shapes (1000 x 777 @ 777 x 3000, K not a multiple of 8 so no 16-byte chunks) compile with the
    edge path (zero fill past the tensor, element-wise copies) in the loop, and still no call."""
    st = _compile(128, 256, 32, 8, 3, shape=(1000, 3000, 777))
    assert "if (tj_prefetch && !tj_inner)" in st.cuda and "tj_cp_async_16_zfill_if(" in st.cuda
    assert "call.uni" not in st.ptx
    assert loop_counts(st.ptx).calls_in_loop == 0


_BK32 = [(c.kwargs["BM"], c.kwargs["BN"], c.kwargs["BK"], c.num_warps, c.num_stages)
         for c in matmul_configs() if c.kwargs["BK"] == 32] + [(128, 256, 32, 8, 3)]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("config", _BK32, ids=lambda c: "{}x{}x{}-w{}-s{}".format(*c))
def test_default_bk32_configs_do_not_spill(config, arch):
    if not nvrtc.nvrtc_supports(arch):
        pytest.skip(f"the installed NVRTC cannot target {arch}")
    st = _compile(*config, arch=arch)
    registers, spills = ptxas_resources(st.nvrtc_log)
    assert registers is not None and spills == 0, st.nvrtc_log


_SRC = re.compile(r"uint64_t (tj_i\d+_)src = \1base \+ \(uint64_t\)\(\(int64_t\)\((.*)\) \* (\d+) \+ "
                  r"\(int64_t\)\((.*)\) \* v\d+_\w+_stride\d+\) \* \d+;$")
_RSTEP = re.compile(r"const int64_t (tj_i\d+_)rstep(\d+) = \(int64_t\)(\d+) \* ")
_HOISTED = re.compile(r"const unsigned (tj_h\d+) = tj_opaque\(\(unsigned\)\((.*)\)\);$")
_ISSUE = re.compile(r"tj_cp_async_16x(\d+)_if<([\d, ]+)>\(tj_wr\d+ \+ (tj_h\d+), \(const void\*\)\((tj_i\d+_)src\)")


@pytest.mark.parametrize("config", [(128, 256, 32, 8, 3), (128, 128, 32, 4, 4), (64, 64, 32, 4, 3)],
                         ids=lambda c: "{}x{}x{}-w{}-s{}".format(*c))
def test_interior_copies_fill_every_chunk_of_the_slot_once(config):
    """Evaluate the interior copies' set-up for every thread: pass j of thread tid reads row r0 + j * rows_per_pass,
    chunk k of the window (from its source address) and writes the slot's byte offset of that (row, chunk) in the
    swizzled layout (shared/HARDWARE.md); together the threads write every 16-byte chunk of the slot once."""
    bm, bn, bk, warps, stages = config
    st = matmul.compile(_meta(4096, 4096), _meta(4096, 4096), _meta(4096, 4096), BM=bm, BN=bn, BK=bk,
                        num_warps=warps, num_stages=stages, arch="sm_80", stop_after="cuda")
    lines = st.cuda.splitlines()
    src = {m.group(1): m.groups()[1:] for m in map(_SRC.search, lines) if m}
    rsteps = {(m.group(1), int(m.group(2))): int(m.group(3)) for m in map(_RSTEP.search, lines) if m}
    hoisted = {m.group(1): m.group(2) for m in map(_HOISTED.search, lines) if m}
    issues = [m.groups() for m in map(_ISSUE.search, lines) if m]
    loads = [op for op in st.fn.walk() if op.kind.mnemonic == "load" and op.attrs.pipeline]
    assert len(issues) == len(loads) == 2
    for (n, shifts, dst, x), load in zip(issues, loads):
        lay = load.result.type.layout
        k_text, per_chunk, r0_text = src[x]
        assert int(per_chunk) == 16 // lay.elem_bytes
        shifts = [int(v) for v in shifts.split(",")]
        rpp = rsteps.get((x, 1), lay.rows)
        assert all(rsteps.get((x, j), j * rpp) == j * rpp for j in range(1, int(n)))
        written = []
        for tid in range(32 * warps):
            k = eval(k_text.replace("/", "//"), {}, {"tid": tid})  # noqa: S307 (CExpr text)
            r0 = eval(r0_text.replace("/", "//"), {}, {"tid": tid})  # noqa: S307
            base = eval(hoisted[dst].replace("/", "//"), {}, {"tid": tid})  # noqa: S307
            for j, shift in enumerate(shifts):
                assert base + shift == lay.chunk_offset(r0 + j * rpp, k), (tid, j)
                written.append(base + shift)
        assert sorted(written) == list(range(0, lay.stage_bytes, 16))


# -- fragments carried across iterations (lower_loops.FragmentCarry) --------------------------------------------

_CARRY = "the gemm's fragments live across iterations"


def _cuda(bm, bn, bk, warps, stages, arch="sm_80"):
    return matmul_staged.compile(_meta(4096, 4096), _meta(4096, 4096), _meta(4096, 4096), BM=bm, BN=bn, BK=bk,
                          num_warps=warps, num_stages=stages, arch=arch, stop_after="cuda").cuda


def _loop_text(cuda: str) -> str:
    """The main loop's body: from its ``for`` to the wait for every copy after it (the kernel's last), or for a
    TMA ring, which has no cp.async group to wait for, to the invalidation of its barriers."""
    end = "tj_cp_async_wait<0>();" if "tj_cp_async_wait<0>();" in cuda else "tj_mbar_inval("
    return cuda[cuda.index("for (int64_t"):cuda.rindex(end)]


def test_the_barrier_moves_under_the_last_k_step():
    """128x128x64 (4 k steps), 3 cp.async stages: the loop's top has no wait and no barrier; the one barrier of
    an iteration follows the wait for the next iteration's group (``wait_group S-3``: this iteration's own group
    is committed at its end) and precedes the last k step's mma.sync, then the next slot's first fragments load
    (into buffer 0, free during the last step). Iteration 0's wait, barrier and fragments come before the loop."""
    cuda = _cuda(128, 128, 64, 4, 3)
    assert _CARRY in cuda
    before, loop = cuda[:cuda.index("for (int64_t")], _loop_text(cuda)
    assert "unsigned tj_af[2][4][4], tj_bf[2][8][2];" in before and "tj_cp_async_wait<1>();" in before
    assert loop.count("__syncthreads()") == 1 and loop.count("tj_cp_async_wait<") == 1
    assert "tj_cp_async_wait<0>();" in loop
    mma_at = [i for i in range(len(loop)) if loop.startswith("tj_mma_m16n8k16", i)]
    barrier = loop.index("__syncthreads()")
    assert len(mma_at) == 4 and mma_at[2] < barrier < mma_at[3]  # one call per k step (in loops over the atoms)
    assert loop.index("tj_ldmatrix_x4_at<0>(tj_af[0][0][0]", barrier) < mma_at[3]
    assert "unsigned tj_af" not in loop  # the fragments are the ones declared before the loop


@pytest.mark.parametrize("config, why", [((128, 128, 32, 4, 2), "2 cp.async stages"),
                                         ((64, 64, 16, 4, 3), "one k step per iteration")])
def test_no_carry_where_it_cannot_hold(config, why):
    cuda = _cuda(*config)
    assert _CARRY not in cuda, why
    assert _loop_text(cuda).count("__syncthreads()") == 1


def test_mma_overlap_knob_turns_the_carry_off(monkeypatch):
    assert _CARRY in _cuda(128, 128, 32, 4, 3)
    monkeypatch.setenv("TILEJIT_MMA_OVERLAP", "0")
    cuda = _cuda(128, 128, 32, 4, 3)
    assert _CARRY not in cuda and "tj_cp_async_wait<1>();  // this iteration's tiles have landed" in cuda


def test_tma_slots_do_not_carry(monkeypatch):
    """sm_90a with mma.sync pinned reads TMA-filled slots: no carry there (it measured from +5% to -10% on an
    H200), the loop waits at its top as before."""
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", "mma_sync_m16n8k16")
    cuda = _cuda(128, 128, 64, 4, 3, arch="sm_90a")
    loop = _loop_text(cuda)
    assert "tj_tma_load_2d" in loop and _CARRY not in cuda
    assert "tj_mbar_wait(tj_smem_u32 + 0 + 8 * (tj_it % 3), (tj_it / 3) & 1);  // TMA tiles landed" in loop


# -- the copy lowering pinned (TILEJIT_COPY_LOWERING) ------------------------------------------------------------

def test_pinned_cp_async_runs_the_sm80_loop_on_sm90a(monkeypatch):
    """With both lowerings pinned an sm_90a compile has the sm_80 loop (cp.async, no TMA, no mbarrier), and the
    pin is in the cache key."""
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", "mma_sync_m16n8k16")
    tma = _cuda(128, 128, 32, 4, 3, arch="sm_90a")
    monkeypatch.setenv("TILEJIT_COPY_LOWERING", "cp_async")
    plain = _cuda(128, 128, 32, 4, 3, arch="sm_90a")
    assert "tj_tma_load_2d(" in tma and "tj_tma_load_2d(" not in plain
    assert "tj_mbar_wait(" not in plain and "tj_cp_async_16x" in plain
    assert _loop_text(plain) == _loop_text(_cuda(128, 128, 32, 4, 3))  # the sm_80 loop, as compiled there
    from tilejit.compiler import target_text
    from tilejit.target import Target

    assert target_text(Target.of("sm_90a")).endswith(":gemm=mma_sync_m16n8k16:copy=cp_async")


def test_a_copy_pin_that_does_not_fit_says_why(monkeypatch):
    """TMA pinned for a load no pipelined loop prefetches (the atom kernel's plain loads): a DispatchError naming
    the knob, not an internal error."""
    from kernels import atom
    from tilejit.errors import DispatchError

    monkeypatch.setenv("TILEJIT_COPY_LOWERING", "tma_bulk_tensor")
    a, b, c = _meta(16, 16), _meta(16, 8), _meta(16, 8, dtype=torch.float32)
    with pytest.raises(DispatchError) as err:
        atom.compile(a, b, c, num_warps=1, arch="sm_90a", stop_after="passes")
    assert "tma_bulk_tensor" in str(err.value) and "TILEJIT_COPY_LOWERING" in str(err.value)
    monkeypatch.setenv("TILEJIT_COPY_LOWERING", "nope")
    with pytest.raises(DispatchError, match="no copy lowering is named 'nope'"):
        atom.compile(a, b, c, num_warps=1, arch="sm_90a", stop_after="passes")


@pytest.mark.parametrize("k, arch", [(777, "sm_80"), (777, "sm_90a")])
def test_rows_not_in_16_byte_chunks_do_not_carry(k, arch):
    """A tensor whose rows are not whole 16-byte chunks (K = 777 halves) is copied element by element after the
    math, which the carry left only the last k step's mma.sync to hide (-47% measured on an H200 at
    1000x3000x777, 64x256x32 w8 s3): such loops keep their wait and barrier at the top. The same config with
    K = 776 carries on sm_80."""
    def cuda(k):
        a, b, c = _meta(1000, k), _meta(k, 3000), _meta(1000, 3000)
        return matmul_staged.compile(a, b, c, BM=64, BN=256, BK=32, num_warps=8, num_stages=3, arch=arch,
                                     stop_after="cuda").cuda
    assert _CARRY not in cuda(k)
    if arch == "sm_80":
        assert _CARRY in cuda(776)


# -- a ring deeper than the shared memory holds ------------------------------------------------------------------

def test_a_ring_too_deep_is_shrunk_with_a_warning():
    """8 stages of 128x128x64 halves need 256 KB: sm_80 (163 KB) compiles 5, and says so once, naming the stages
    asked, the bytes and the limit; a ring that fits compiles silently."""
    import warnings

    with pytest.warns(RuntimeWarning, match=r"kernel matmul_staged: a pipeline of 8 stages needs 262,144 bytes of "
                                            r"shared memory, more than sm_80 allows per block \(166,912\); compiled "
                                            r"with 5 stages") as caught:
        cuda = _cuda(128, 128, 64, 4, 8)
    assert len([w for w in caught if "a pipeline of" in str(w.message)]) == 1
    assert "software pipeline: 5 stages" in cuda
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _cuda(128, 128, 64, 4, 5)


@pytest.mark.parametrize("stop_after", ["cuda", None], ids=["stop_after_cuda", "through_the_cache"])
def test_the_shrunk_ring_warning_names_the_callers_line(stop_after, tmp_path, monkeypatch):
    """The warning points at the line that asked for the compile, not at the compiler's stage runner."""
    import inspect

    import tilejit

    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))  # a cold cache: the full compile runs, and warns
    kernel = tilejit.kernel(matmul_staged.fn)  # no in-memory specializations from other tests
    args = (_meta(4096, 4096), _meta(4096, 4096), _meta(4096, 4096))
    with pytest.warns(RuntimeWarning, match="a pipeline of 8 stages") as caught:
        line = inspect.currentframe().f_lineno + 1
        kernel.compile(*args, BM=128, BN=128, BK=64, num_warps=4, num_stages=8, arch="sm_80", stop_after=stop_after)
    (warning,) = [w for w in caught if "a pipeline of" in str(w.message)]
    assert (warning.filename, warning.lineno) == (__file__, line)
