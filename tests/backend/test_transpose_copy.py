"""The transposing shared-memory copy (``transpose_copy``) that puts MN-major fp8 / int8 / tf32 operands on wgmma
(with one operand MN-major only with the descriptor lowering pinned: ``COPIED``; by default sm_90a gathers it into
registers, ``lower_wgmma_mn`` and ``lower_wgmma_mn8``).

The generated C of each copy is replayed here in Python, thread by thread: every byte of the source tile must land
exactly once at the destination's place of the transposed element (both tiles in their swizzled SharedLayout),
and the warps' 32-bit shared loads and stores must be free of bank conflicts for the default tiles. The structure
around it (ring of 3 destination tiles in a loop whose wgmma stays in flight, the proxy fence and the barrier, the
K-major descriptor) is checked on the generated source, and the kernels compile to cubins without spills.
"""
from __future__ import annotations

import os
import re

import pytest
import torch

from _lowering import kernel_body, lower
from kernels import fixed_b, matmul_any, matmul_staged

import tilejit.language as T
from tilejit.ir.layouts import SharedLayout

E4M3 = torch.float8_e4m3fn
#: tf32 takes the copy with the descriptor lowering pinned (by default its MN-major operand is read into registers:
#: lower_wgmma_mn); so do fp8 and int8 (lower_wgmma_mn8)
TF32_COPIED = "wgmma_m64nNk8_tf32"
COPIED = {torch.float32: TF32_COPIED, E4M3: "wgmma_m64nNk32_fp8", torch.int8: "wgmma_m64nNk32_int8"}


def _meta(*shape, dtype):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _lower(dtype, ta, tb, bm, bn, bk, warps, m=1024, n=1024, k=1024, stages=3, **options):
    a = _meta(k, m, dtype=dtype) if ta else _meta(m, k, dtype=dtype)
    b = _meta(n, k, dtype=dtype) if tb else _meta(k, n, dtype=dtype)
    acc = T.int32 if dtype == torch.int8 else T.float32
    out = _meta(m, n, dtype=torch.int32 if dtype == torch.int8 else torch.float32)
    extra = dict(PRECISION="tf32") if dtype == torch.float32 else {}
    with pytest.MonkeyPatch.context() as patch:
        if dtype in COPIED and "TILEJIT_GEMM_LOWERING" not in os.environ:  # (a test's own pin stays)
            patch.setenv("TILEJIT_GEMM_LOWERING", COPIED[dtype])
        return lower(matmul_any, a, b, out, BM=bm, BN=bn, BK=bk, TA=ta, TB=tb, ACC=acc, num_warps=warps,
                     num_stages=stages, arch="sm_90a", **extra, **options)


def _copies(fn):
    return [op for op in fn.walk() if op.kind.mnemonic == "transpose_copy"]


def _c_to_py(expr: str) -> str:
    # the emitted index math is non-negative integer arithmetic, fully parenthesised
    return expr.replace("/", "//")


class _Replay:
    """The statements of one generated transposing copy, evaluated per (thread, iteration)."""

    def __init__(self, block: str) -> None:
        self.iters = int(re.search(r"tj_i < (\d+);", block).group(1))
        self.threads = int(re.search(r"tj_w = tid \+ tj_i \* (\d+);", block).group(1))
        bound = re.search(r"if \(tj_w >= (\d+)\) break;", block)
        self.total = int(bound.group(1)) if bound else self.iters * self.threads
        self.index = []  # (name, python expression) of tj_cb / tj_rb, in order
        for line in re.findall(r"const int (tj_[cr]b = .*);", block):
            for part in re.split(r", (?=tj_rb = )", line):
                name, expr = part.split(" = ", 1)
                self.index.append((name, _c_to_py(expr)))
        self.loads = [(n, _c_to_py(e)) for n, e in re.findall(
            r"const unsigned (tj_x\d) = \*reinterpret_cast<const unsigned\*>\(tj_src \+ (.*)\);", block)]
        self.perms = re.findall(r"(tj_\w+) = __byte_perm\((tj_\w+), (tj_\w+), (0x[0-9a-f]+)\)", block)
        self.copies = re.findall(r"(tj_y0) = (tj_x0);", block)
        self.stores = [(_c_to_py(e), n) for e, n in re.findall(
            r"\*reinterpret_cast<unsigned\*>\(tj_dst \+ (.*)\) = (tj_y\d);", block)]
        assert self.loads and self.stores and len(self.index) == 2

    def run(self, src: dict[int, object]):
        """Replays every thread over ``src`` (byte offset -> label); returns the destination bytes and, per warp
        instruction, the word addresses its 32 lanes touch."""
        dst: dict[int, object] = {}
        writes: dict[int, int] = {}
        accesses: dict[tuple, list[int]] = {}
        for tid in range(self.threads):
            for i in range(self.iters):
                w = tid + i * self.threads
                if w >= self.total:
                    break
                env = {"tj_w": w}
                for name, expr in self.index:
                    env[name] = eval(expr, {}, env)
                regs = {}
                for k, (name, expr) in enumerate(self.loads):
                    at = eval(expr, {}, env)
                    assert at % 4 == 0
                    regs[name] = [src[at + b] for b in range(4)]
                    accesses.setdefault(("ld", tid // 32, i, k), []).append(at // 4)
                for out, x, y, sel in self.perms:
                    pool = regs[x] + regs[y]
                    regs[out] = [pool[(int(sel, 16) >> (4 * b)) & 7] for b in range(4)]
                for out, x in self.copies:
                    regs[out] = regs[x]
                for k, (expr, name) in enumerate(self.stores):
                    at = eval(expr, {}, env)
                    for b in range(4):
                        dst[at + b] = regs[name][b]
                    writes[at] = writes.get(at, 0) + 1
                    accesses.setdefault(("st", tid // 32, i, k), []).append(at // 4)
        assert set(writes.values()) == {1}, "a destination word is written twice"
        return dst, accesses


def _replay(cuda: str, op) -> tuple[dict, dict]:
    body = kernel_body(cuda)
    start = body.index("// transposing copy")
    block = body[start:body.index("tj_fence_proxy_async();", start)]
    src_lay: SharedLayout = op.operands[0].type.layout
    dst_lay: SharedLayout = op.result.type.layout
    rows, cols = op.operands[0].type.shape
    size = op.result.dtype.itemsize
    src = {}
    for r in range(rows):
        for c in range(cols):
            for b in range(size):
                src[src_lay.elem_offset(r, c) + b] = (r, c, b)
    dst, accesses = _Replay(block).run(src)
    for r in range(rows):
        for c in range(cols):
            for b in range(size):
                assert dst[dst_lay.elem_offset(c, r) + b] == (r, c, b), (r, c, b)
    assert len(dst) == rows * cols * size
    return dst, accesses


def _worst_conflict(accesses: dict) -> int:
    worst = 1
    for words in accesses.values():
        banks: dict[int, set] = {}
        for word in words:
            banks.setdefault(word % 32, set()).add(word)
        worst = max(worst, max(len(v) for v in banks.values()))
    return worst


# (dtype, TA, TB, BM, BN, BK, warps, most ways of bank conflict allowed)
CASES = [
    (E4M3, False, False, 128, 128, 128, 8, 1),      # B given K x N: 128 x 128 bytes
    (E4M3, False, False, 128, 256, 128, 8, 1),      # 256-byte source rows (two 128-byte panels)
    (torch.int8, True, True, 128, 128, 128, 4, 1),  # A given K x M, 128 threads
    (torch.float32, False, False, 128, 128, 32, 8, 1),  # tf32: one f32 per word, 512-byte source rows
    (torch.float32, False, False, 64, 256, 32, 4, 1),
    (E4M3, False, False, 128, 64, 128, 4, 2),       # 64-byte source rows: correct, at most 2-way conflicts
    (torch.int8, True, True, 64, 128, 128, 4, 2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{'T' if c[1] else 'N'}{'T' if c[2] else 'N'}-"
                         f"{c[3]}x{c[4]}x{c[5]}-w{c[6]}".replace("torch.", ""))
def test_generated_copy_moves_every_element_once_without_bank_conflicts(case):
    dtype, ta, tb, bm, bn, bk, warps, ways = case
    fn, cuda = _lower(dtype, ta, tb, bm, bn, bk, warps)
    copies = _copies(fn)
    assert len(copies) == 1
    _, accesses = _replay(cuda, copies[0])
    assert _worst_conflict(accesses) <= ways


def test_16_bit_words_are_transposed_in_pairs():
    """The 2 x 2 block form (halves), replayed on whichever 16-bit operand the dispatch chooses to transpose:
    N-major B of 24 columns (48-byte rows: no wgmma swizzle mode), which wgmma then reads K-major."""
    fn, cuda = _lower(torch.float16, False, False, 128, 24, 64, 4, n=1000)
    copies = _copies(fn)
    assert len(copies) == 1 and copies[0].result.dtype.itemsize == 2
    _replay(cuda, copies[0])


def test_in_flight_loop_keeps_a_ring_of_three_copies_and_one_barrier_per_iteration():
    fn, cuda = _lower(E4M3, False, False, 128, 128, 128, 8, stages=4)
    loop = next(op for op in fn.walk() if op.kind.mnemonic == "for")
    assert loop.attrs.async_mma == "wgmma"
    copy = _copies(fn)[0]
    assert copy.result.type.layout.stages == 3
    body = kernel_body(cuda)
    start = body.index("// transposing copy")
    block = body[start:body.index("tj_wgmma_commit();", start)]
    assert "ring of 3 tiles" in block and "(tj_it % 3)" in block
    # no barrier before the copy (the ring makes it safe); the proxy fence, then one barrier, before the wgmma
    copy_code = block[:block.index("tj_wgmma_fence")]
    assert copy_code.count("__syncthreads();") == 1
    assert copy_code.index("tj_fence_proxy_async();") < copy_code.index("__syncthreads();")
    # the gemm reads the copy K-major: both operands' descriptors with LBO 16 (unused), SBO 1024
    assert "tj_bdesc = tj_wgmma_desc(tj_b, 16, 1024);" in block


def test_copy_outside_an_in_flight_loop_waits_for_the_previous_readers(monkeypatch):
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", COPIED[E4M3])
    a, b, c = _meta(1024, 1024, dtype=E4M3), _meta(1024, 1024, dtype=E4M3), _meta(1024, 1024, dtype=torch.float32)
    fn, cuda = lower(matmul_staged, a, b, c, BM=128, BN=128, BK=128, num_warps=8, num_stages=1, arch="sm_90a")
    copy = _copies(fn)[0]
    assert copy.result.type.layout.stages == 1
    body = kernel_body(cuda)
    start = body.index("// transposing copy")
    block = body[start:body.index("tj_wgmma_fence", start)]
    assert block.count("__syncthreads();") == 2  # before (previous wgmma readers) and after (this one's)


def test_warp_specialized_loop_uses_the_math_warps_barrier():
    fn, cuda = _lower(E4M3, False, False, 128, 256, 128, 8, stages=4, warp_specialize=True)
    loop = next(op for op in fn.walk() if op.kind.mnemonic == "for")
    assert loop.attrs.producer_warpgroup
    body = kernel_body(cuda)
    start = body.index("// transposing copy")
    block = body[start:body.index("tj_wgmma_fence", start)]
    assert "__syncthreads();" not in block
    assert re.search(r"bar\.sync 1, 256", block)


def test_pinned_lowering_is_honoured(monkeypatch):
    """With the mma.sync lowering pinned, which reads MN-major operands itself, no copy is made."""
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", "mma_sync_m16n8k32_fp8")
    fn, _ = _lower(E4M3, False, False, 128, 128, 128, 8)
    assert not _copies(fn)


@pytest.mark.parametrize("dtype, bk", [(E4M3, 128), (torch.int8, 128), (torch.float32, 32)],
                         ids=["fp8", "int8", "tf32"])
@pytest.mark.parametrize("warp_specialize", [False, True], ids=["plain", "ws"])
def test_nn_compiles_to_wgmma_without_spills(dtype, bk, warp_specialize, monkeypatch):
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", COPIED[dtype])
    a, b = _meta(1024, 1024, dtype=dtype), _meta(1024, 1024, dtype=dtype)
    acc = T.int32 if dtype == torch.int8 else T.float32
    out = _meta(1024, 1024, dtype=torch.int32 if dtype == torch.int8 else torch.float32)
    # (fp8: the fast loop; the precise one's promotion temporaries next to the copy's registers spill at
    # 128x256, and the autotuner refuses spilling configs where others do not spill)
    extra = dict(PRECISION="tf32") if dtype == torch.float32 else dict(PRECISION="fast") if dtype == E4M3 else {}
    compiled = matmul_any.compile(a, b, out, BM=128, BN=256, BK=bk, TA=False, TB=False, ACC=acc, num_warps=8,
                                  num_stages=4, warp_specialize=warp_specialize, arch="sm_90a", **extra)
    assert compiled.meta["spills"] == 0
    assert "transpose_copy" in compiled.asm["ir"] and "wgmma.mma_async" in compiled.asm["cuda"]
    assert "mma.sync.aligned" not in kernel_body(compiled.asm["cuda"])


def test_a_tile_loaded_before_a_loop_is_transposed_once_there(monkeypatch):
    """The copy goes right after the load, not before each gemm: outside the loop, one copy for both gemms."""
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", COPIED[E4M3])
    a = _meta(1024, 128, dtype=E4M3)
    fn, _ = lower(fixed_b, a, _meta(128, 128, dtype=E4M3), _meta(128, 128, dtype=torch.float32), a, BM=128, BN=128,
                  BK=128, num_warps=8, arch="sm_90a")
    top = [op.kind.mnemonic for op in fn.body.ops]
    assert top.count("transpose_copy") == 1 and top.index("transpose_copy") < top.index("for")
    copy = next(op for op in fn.body.ops if op.kind.mnemonic == "transpose_copy")
    gemms = [op for op in fn.walk() if op.kind.mnemonic == "gemm"]
    assert len(gemms) == 2 and all(g.operands[1] is copy.result and g.attrs.transpose_b for g in gemms)
    assert all(g.attrs.impl == "wgmma_m64nNk32_fp8" for g in gemms)
