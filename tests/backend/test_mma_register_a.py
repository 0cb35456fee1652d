"""mma.sync with operand A from registers (``lower_mma_rs``): which gemms take it (the layout pass gives the
producing product and the reading one accumulators with the warps along M), which are refused and staged through
shared memory as before, the CUDA it emits, the attention example's PTX (and SASS where a disassembler is
installed) without P's shared-memory round trip, cubins for sm_80, sm_86, sm_89 and sm_90a (mma.sync pinned),
and the chain kernels through the interpreter against torch.

The fragment mapping itself is checked exhaustively in tests/ir/test_mma_operand_a_layout.py; the numbers on a
GPU in tests/gpu/test_gpu_mma_register_a.py.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit.backend_cuda.nvrtc import nvrtc_supports

import chain_kernels as ck
from filecheck import filecheck

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("tilejit_ops_attention_rs",
                                               ROOT / "tilejit" / "ops" / "fused_attention.py")
attention = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(attention)

PIN = "mma_sync_m16n8k16"
# the mma.sync archs, and sm_90a where the mma.sync lowering is pinned (the wgmma lowerings rank above it)
MMA_ARCHS = [a for a in ("sm_80", "sm_86", "sm_89", "sm_90a") if nvrtc_supports(a)]


pytestmark = pytest.mark.usefixtures("fresh_compile_cache")  # tests/conftest.py


def _pin_on_hopper(monkeypatch, arch: str) -> None:
    if arch == "sm_90a":
        monkeypatch.setenv("TILEJIT_GEMM_LOWERING", PIN)


def m(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def gemm_lines(ir: str) -> list[str]:
    return [line.strip() for line in ir.splitlines() if "tj.gemm" in line]


def staged_operands(ir: str) -> list[str]:
    return [line.strip() for line in ir.splitlines() if "tj.convert_layout" in line and ", shared," in line]


# -- which gemms read A from registers ---------------------------------------------------------------------------

def _once(bm=64, n1=64, k=64, n2=128, warps=4, tb=False, acc=T.float32, dtype=torch.float16):
    c = m(n2, n1, dtype=dtype) if tb else m(n1, n2, dtype=dtype)
    out = m(1000, n2, dtype=torch.float32 if acc == T.float32 else dtype)
    return ck.chain_once, (m(1000, k, dtype=dtype), m(k, n1, dtype=dtype), c, out, 0.125), \
        dict(BM=bm, N1=n1, K=k, N2=n2, TB=tb, ACC=acc, num_warps=warps)


def _loop(bm=64, bn=64, k=64, n2=64, warps=4, dtype=torch.bfloat16):
    return ck.chain_loop, (m(1000, k, dtype=dtype), m(k, 777, dtype=dtype), m(777, n2, dtype=dtype),
                           m(1000, n2, dtype=torch.float32), 0.125), dict(BM=bm, BN=bn, K=k, N2=n2, num_warps=warps)


TAKEN = {
    "once-64x64x128-w4": (_once(), 4, "mma_sync_rs_m16n8k16"),
    "once-128-w8-b-nk": (_once(bm=128, warps=8, tb=True), 8, "mma_sync_rs_m16n8k16"),
    "once-two-atoms-per-warp": (_once(bm=128, n1=32, n2=40, warps=4), 4, "mma_sync_rs_m16n8k16"),
    "once-f16-accumulator": (_once(acc=T.float16), 4, "mma_sync_rs_m16n8k16_f16acc"),
    "loop-bf16": (_loop(), 4, "mma_sync_rs_m16n8k16"),
    "loop-128x32-w8": (_loop(bm=128, bn=32, n2=128, warps=8), 8, "mma_sync_rs_m16n8k16"),
}


@pytest.mark.parametrize("arch", MMA_ARCHS)
@pytest.mark.parametrize("case", TAKEN)
def test_the_second_product_reads_the_first_from_registers(monkeypatch, case, arch):
    (kernel, args, kwargs), warps, impl = TAKEN[case]
    if arch == "sm_90a" and impl.endswith("f16acc"):
        pytest.skip("a pinned mma_sync_m16n8k16 refuses float16 accumulators (its own f16acc lowering is another)")
    _pin_on_hopper(monkeypatch, arch)
    ir = kernel.compile(*args, arch=arch, stop_after="passes", **kwargs).final_ir
    first, second = gemm_lines(ir)
    assert "impl = mma_sync_m16n8k16}" in first and f"#mma<warps={warps}x1>" in first
    assert f"impl = {impl}}}" in second and f"#mma<warps={warps}x1>" in second
    assert " = tj.gemm %p, " in second
    assert not staged_operands(ir)


def test_pass_output(monkeypatch):
    """The IR after the passes: both accumulators with the warps along M, the cast tile read by the second gemm
    as it is (no conversion between them)."""
    kernel, args, kwargs = _once()
    ir = kernel.compile(*args, arch="sm_80", stop_after="passes", **kwargs).final_ir
    filecheck(ir, r"""
        CHECK: %s = tj.gemm {{.*}}impl = mma_sync_m16n8k16} : tile<64x64xf32, reg, #mma<warps=4x1>>
        CHECK-NOT: tj.convert_layout
        CHECK: %p = tj.cast {{.*}} : tile<64x64xf16, reg, #mma<warps=4x1>>
        CHECK-NOT: tj.convert_layout
        CHECK: %o = tj.gemm %p, {{%[0-9]+}}, {{%[0-9]+}} {transpose_a = false, transpose_b = false, impl = mma_sync_rs_m16n8k16} : tile<64x128xf32, reg, #mma<warps=4x1>>
    """)


def test_generated_cuda_packs_the_fragments():
    """The second gemm packs the cast tile's registers pairwise into f16x2 words (no st.shared, no barrier, no
    ldmatrix of A), loads B with ldmatrix.trans (given K x N) and issues mma.sync with A from the words."""
    kernel, args, kwargs = _once()
    cuda = kernel.compile(*args, arch="sm_80", stop_after="cuda", **kwargs).cuda
    body = cuda[cuda.index('extern "C" __global__'):]
    filecheck(body, r"""
        CHECK: // gemm 64x64x64 on mma.sync.m16n8k16 (4x1 warps, 1x8 atoms per warp)
        CHECK: tj_ldmatrix_x4_at<{{[0-9]+}}>(tj_af[0][0][0]
        CHECK: // gemm 64x128x64 on mma.sync.m16n8k16 (4x1 warps, 1x16 atoms per warp)
        CHECK-NOT: __syncthreads
        CHECK: const unsigned tj_b = {{.*}};
        CHECK-NEXT: unsigned tj_pa[16];
        CHECK-NEXT: #pragma unroll
        CHECK-NEXT: for (int i = 0; i < 16; ++i) tj_pa[i] = (unsigned)[[P:v[0-9]+_p]][2 * i].bits | ((unsigned)[[P]][2 * i + 1].bits << 16);
        CHECK-NEXT: unsigned tj_bf[2][16][2];
        CHECK-NOT: tj_af
        CHECK: tj_ldmatrix_x4_trans_at<0>(tj_bf[0][0][0], tj_bf[0][0][1], tj_bf[0][1][0], tj_bf[0][1][1],
        CHECK-NOT: tj_af
        CHECK: tj_mma_m16n8k16_f16(tj_d[0], tj_d[1], tj_d[2], tj_d[3], tj_pa[((tj_am * 4) * 4)], tj_pa[(((tj_am * 4) * 4) + 1)], tj_pa[(((tj_am * 4) * 4) + 2)], tj_pa[(((tj_am * 4) * 4) + 3)], tj_bf[0][tj_an][0], tj_bf[0][tj_an][1]);
        CHECK-NOT: tj_af
        CHECK: tj_mma_m16n8k16_f16(tj_d[0], tj_d[1], tj_d[2], tj_d[3], tj_pa[(((tj_am * 4) + 3) * 4)], {{.*}}, tj_bf[1][tj_an][0], tj_bf[1][tj_an][1]);
        CHECK-NOT: tj_af
        CHECK: // store into
    """)
    assert "write a register tile to shared memory" not in body


# -- refusals: the shared-memory path, as before ------------------------------------------------------------------

REFUSED = {
    # 32 rows do not give 4 warps 16 rows each: the first product keeps its square warp grid (split along N)
    "m-not-16-per-warp": _once(bm=32, warps=4),
    # float32 operands (tf32): the fragment holds 16-bit elements only
    "tf32": _once(dtype=torch.float32),
    # K = 8: the second product is m16n8k8, no k16 step to pack
    "k8": _once(n1=8),
    # the result is operand A transposed
    "transposed": (ck.chain_transposed, (m(256, 64), m(64, 64), m(256, 64), m(64, 64, dtype=torch.float32)),
                   dict(BM=64, N1=64, K=64, N2=64, num_warps=4)),
    # summed over a K loop: the main loop keeps its 2 x 2 warp grid, the result is staged once after it
    "after-k-loop": (ck.chain_after_k_loop, (m(256, 256), m(256, 64), m(64, 64), m(256, 64, dtype=torch.float32)),
                     dict(BM=64, N1=64, BK=32, N2=64, num_warps=4)),
}


@pytest.mark.parametrize("case", REFUSED)
def test_layouts_that_do_not_fit_are_staged(case):
    kernel, args, kwargs = REFUSED[case]
    stages = kernel.compile(*args, arch="sm_80", stop_after="cuda", **kwargs)
    second = gemm_lines(stages.final_ir)[1]
    assert "mma_sync_rs" not in second and "impl = mma_sync_m16n8k" in second
    assert len(staged_operands(stages.final_ir)) == 1
    assert "write a register tile to shared memory for the tensor cores" in stages.cuda


def test_refusal_keeps_the_warp_grid_of_the_first_product():
    """M = 32 over 4 warps: neither accumulator is rearranged (the square 1 x 4 grid both had before)."""
    kernel, args, kwargs = REFUSED["m-not-16-per-warp"]
    ir = kernel.compile(*args, arch="sm_80", stop_after="passes", **kwargs).final_ir
    assert ["#mma<warps=1x4>>" in g for g in gemm_lines(ir)] == [True, True]


def test_the_dispatch_listing_names_why_the_register_form_was_refused():
    """Pinned to the register form, a gemm whose A is loaded (in shared memory) is a located DispatchError listing
    the predicate that rejected it."""
    kernel, args, kwargs = _once()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TILEJIT_GEMM_LOWERING", "mma_sync_rs_m16n8k16")
        with pytest.raises(tilejit.CompilationError) as info:
            kernel.compile(*args, arch="sm_80", stop_after="passes", **kwargs)
    text = str(info.value)
    assert "A is a register tile whose layout renames into the m16n8k16 A fragment" in text
    assert "chain_kernels.py" in text


# -- pinning (TILEJIT_GEMM_LOWERING) and sm_90a ----------------------------------------------------------------------

def test_a_pinned_mma_sync_admits_its_register_form_on_sm90a(monkeypatch):
    kernel, args, kwargs = _once()
    ir = kernel.compile(*args, arch="sm_90a", stop_after="passes", **kwargs).final_ir
    assert [("wgmma_rs_m64nNk16" in g) for g in gemm_lines(ir)] == [False, True]  # unpinned: wgmma, as before
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", PIN)
    ir = kernel.compile(*args, arch="sm_90a", stop_after="passes", **kwargs).final_ir
    assert [g.split("impl = ")[1].split("}")[0] for g in gemm_lines(ir)] == [PIN, "mma_sync_rs_m16n8k16"]


def test_another_pinned_lowering_does_not_admit_it(monkeypatch):
    """A pin of m16n8k8 keeps every gemm on m16n8k8 (whose fragments the register form does not pack)."""
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", "mma_sync_m16n8k8")
    kernel, args, kwargs = _once()
    ir = kernel.compile(*args, arch="sm_80", stop_after="passes", **kwargs).final_ir
    assert all("impl = mma_sync_m16n8k8}" in g for g in gemm_lines(ir)) and len(staged_operands(ir)) == 1


@pytest.mark.parametrize("bn", [32, 48, 64])
def test_head_dim_256_reads_p_from_registers_on_wgmma(bn):
    """sm_90a, unpinned, head dim 256 with 32- to 64-key blocks: S = Q K^T runs on wgmma and, where P's rows
    (the key block: 64 or 128 bytes) take a wgmma swizzle, P V on wgmma with A from registers (V's 512-byte rows
    are 128-byte panels). With 48 keys (96-byte rows) the accumulator's layout is inferred for mma.sync, which
    wgmma would not write: P V stays on mma.sync (offering it wgmma there made the compile fail inside tilejit).
    Every form compiles to a cubin."""
    compiled = attention.attn_fwd.compile(*_attention_args(256), GROUP=2, BM=64, BN=bn, D=256, CAUSAL=True,
                                          VARLEN=False, num_warps=4, arch="sm_90a", peel_masks=False)
    ir = compiled.asm["ir"]
    impls = [g.split("impl = ")[1].split("}")[0] for g in gemm_lines(ir)]
    second = "mma_sync_m16n8k16" if bn == 48 else "wgmma_rs_m64nNk16"
    assert impls == ["wgmma_m64nNk16", second] * 2
    assert compiled.asm["cubin"][:4] == b"\x7fELF"
    if bn != 48:
        assert not staged_operands(ir)


# -- the attention example ----------------------------------------------------------------------------------------

def _attention_args(dim: int, seq: int = 1000, heads: int = 4, group: int = 2):
    q = m(2, heads, seq, dim, dtype=torch.bfloat16)
    kv = m(2, heads // group, seq, dim, dtype=torch.bfloat16)
    lens = m(2, dtype=torch.int32)
    lse = m(2, heads, seq, dtype=torch.float32)
    return (q, kv, kv, q, lse, lens, 0.125, heads)


def _attention(arch, bm=128, bn=64, warps=8, dim=128, causal=False):
    # (peel_masks=False: as attention() launches the kernels, whose unmasked blocks are split from the masked
    # ones by hand; the loops' lowerings are the subject here)
    return attention.attn_fwd.compile(*_attention_args(dim), GROUP=2, BM=bm, BN=bn, D=dim, CAUSAL=causal,
                                      VARLEN=False, num_warps=warps, arch=arch, peel_masks=False)


def ptx_loops(ptx: str) -> list[str]:
    """The text of each PTX loop holding an mma.sync: from a label to the last backward branch to it."""
    lines = ptx.splitlines()
    labels, spans = {}, {}
    for i, line in enumerate(lines):
        label = re.match(r"^(\$L__BB\d+_\d+):", line)
        if label:
            labels[label.group(1)] = i
        branch = re.search(r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+);", line)
        if branch and branch.group(1) in labels:
            spans[labels[branch.group(1)]] = i
    loops = ["\n".join(lines[a:b + 1]) for a, b in sorted(spans.items())]
    return [text for text in loops if "mma.sync" in text]


# In each key loop, P goes from the exponentials and their cast straight into the second product: no shared
# store, no barrier and no (non-transposing) ldmatrix before V's ldmatrix.trans and the mma that reads P.
P_IN_REGISTERS = r"""
    CHECK: ex2.approx.ftz.f32
    CHECK: cvt.rn.bf16x2.f32
    CHECK-NOT: st.shared
    CHECK-NOT: bar.sync
    CHECK-NOT: ldmatrix.sync.aligned.m8n8.x4.shared.b16
    CHECK: ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16
    CHECK-NOT: st.shared
    CHECK-NOT: bar.sync
    CHECK-NOT: ldmatrix.sync.aligned.m8n8.x4.shared.b16
    CHECK: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
"""


@pytest.mark.parametrize("arch", MMA_ARCHS)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_ptx_has_no_shared_round_trip_for_p(monkeypatch, arch, causal):
    """Both key loops (unmasked blocks, then the masked ones): P in registers (FileCheck above); one barrier per
    iteration (the pipeline's); the non-transposing ldmatrix of a loop are Q's and K's fragments only."""
    _pin_on_hopper(monkeypatch, arch)
    compiled = _attention(arch, causal=causal)
    assert compiled.meta["spills"] == 0, compiled.meta
    loops = ptx_loops(compiled.asm["ptx"])
    assert len(loops) == 2
    for text in loops:
        filecheck(text, P_IN_REGISTERS)
        assert len(re.findall(r"\bbar\.sync\b", text)) == 1
        # 8 warps x 16 rows: per k16 step of D = 128 one ldmatrix.x4 of Q and four of K (64 keys), 8 steps
        assert len(re.findall(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16", text)) == 8 * (1 + 4)
        # V (64 x 128, K x N): 8 pairs of n8 atoms per k16 step of the 64 keys, 4 steps
        assert len(re.findall(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16", text)) == 4 * 8


def test_the_ptx_check_fails_where_p_is_staged():
    """The check above can fail: 64 query rows over 8 warps do not give each warp 16 whole rows, so P goes
    through shared memory (a barrier, st.shared, ldmatrix) as before."""
    compiled = _attention("sm_80", bm=64, bn=64, warps=8)
    assert "mma_sync_rs" not in compiled.asm["ir"]
    loops = ptx_loops(compiled.asm["ptx"])
    assert len(loops) == 2
    for text in loops:
        with pytest.raises(AssertionError):
            filecheck(text, P_IN_REGISTERS)
        assert len(re.findall(r"\bbar\.sync\b", text)) > 1


def test_attention_sass_has_one_barrier_per_key_loop():
    """In the SASS (when cuobjdump or nvdisasm is installed): each key loop holds one BAR.SYNC, its HMMAs, and
    the f32 -> bf16x2 packing (F2FP) of P but no STS of it (the loop's STS are the element-wise fallback of the
    K/V copies, which the 16-byte cp.async path skips)."""
    from tilejit.backend_cuda.sass import disassemble

    compiled = _attention("sm_80")
    sass = disassemble(compiled.asm["cubin"])
    if sass is None:
        pytest.skip("cuobjdump/nvdisasm is not installed (pip install -e '.[sass]')")
    lines = sass.splitlines()
    at = {}
    for i, line in enumerate(lines):
        address = re.match(r"\s*/\*([0-9a-f]{4,})\*/", line)
        if address:
            at.setdefault(int(address.group(1), 16), i)
    loops = []
    for i, line in enumerate(lines):
        branch = re.search(r"\bBRA\b[^;]*?0x([0-9a-f]+)\s*;", line)
        address = re.match(r"\s*/\*([0-9a-f]{4,})\*/", line)
        if branch and address and int(branch.group(1), 16) < int(address.group(1), 16):
            text = "\n".join(lines[at[int(branch.group(1), 16)]:i + 1])
            if "HMMA" in text:
                loops.append(text)
    assert len(loops) == 2
    for text in loops:
        assert len(re.findall(r"\bBAR\.SYNC\b", text)) == 1
        assert len(re.findall(r"\bHMMA\.16816\.F32\.BF16\b", text)) == 128
        assert len(re.findall(r"\bF2FP\.BF16(\.F32)?\.PACK_AB\b", text)) == 16


CONFIGS = [(dim, bm, bn, w) for dim, configs in attention.CONFIGS.items() for bm, bn, w in configs]


@pytest.mark.parametrize("arch", MMA_ARCHS)
@pytest.mark.parametrize("dim, bm, bn, warps", CONFIGS, ids=[f"d{d}-{m}x{n}-w{w}" for d, m, n, w in CONFIGS])
def test_every_attention_config_compiles_with_p_in_registers(monkeypatch, arch, dim, bm, bn, warps):
    _pin_on_hopper(monkeypatch, arch)
    limit = tilejit.target.Arch.parse(arch).max_shared_bytes
    try:
        compiled = _attention(arch, bm=bm, bn=bn, warps=warps, dim=dim, causal=True)
    except tilejit.SharedMemoryError:
        assert limit < 163 * 1024  # sm_86/89 (99 KB): the 64 x 128 blocks of head dim 128 do not fit
        pytest.skip(f"does not fit the {limit // 1024} KB of shared memory of {arch}")
    assert compiled.asm["cubin"][:4] == b"\x7fELF" and compiled.shared_bytes <= limit
    if arch in ("sm_80", "sm_90a"):  # 99 KB on sm_86/89 leave 128 x 128 blocks one stage (P no longer staged
        assert compiled.meta["spills"] == 0, compiled.meta  # makes them fit at all), which spills a little
    impls = [g.split("impl = ")[1].split("}")[0] for g in gemm_lines(compiled.asm["ir"])]
    assert impls == ["mma_sync_m16n8k16", "mma_sync_rs_m16n8k16"] * 2
    assert all(f"#mma<warps={warps}x1>" in g for g in gemm_lines(compiled.asm["ir"]))


def _backward(name, dim, bm, bn, warps, arch):
    q, kv = m(2, 4, 1000, dim, dtype=torch.bfloat16), m(2, 2, 1000, dim, dtype=torch.bfloat16)
    rows = m(2, 4, 1000, dtype=torch.float32)
    lens = m(2, dtype=torch.int32)
    if name == "dkdv":
        return attention.attn_bwd_dkdv.compile(q, kv, kv, q, rows, rows, kv, kv, lens, 0.125, 2, GROUP=2, BM=bm,
                                               BN=bn, D=dim, CAUSAL=True, num_warps=warps, arch=arch,
                                               peel_masks=False)
    return attention.attn_bwd_dq.compile(q, kv, kv, q, rows, rows, q, lens, 0.125, 4, GROUP=2, BM=bm, BN=bn, D=dim,
                                         CAUSAL=True, num_warps=warps, arch=arch, peel_masks=False)


@pytest.mark.parametrize("arch", [a for a in MMA_ARCHS if a in ("sm_80", "sm_90a")])
@pytest.mark.parametrize("dim", [64, 128])
def test_backward_products_of_p_and_ds_read_registers(monkeypatch, arch, dim):
    """dK/dV: P^T @ dO and dS^T @ Q; dQ: dS @ K, each from the registers of an elementwise result of the products
    before it (the default backward configs; 255 registers at most, as before)."""
    _pin_on_hopper(monkeypatch, arch)
    cfg = attention.default_bwd_config(dim)
    for name, per_step in (("dkdv", [False, True, False, True]), ("dq", [False, False, True])):
        c = cfg[name]
        compiled = _backward(name, dim, c["BM"], c["BN"], c["num_warps"], arch)
        assert compiled.asm["cubin"][:4] == b"\x7fELF" and compiled.meta["registers"] <= 255
        gemms = gemm_lines(compiled.asm["ir"])
        assert [("mma_sync_rs_m16n8k16" in g) for g in gemms] == per_step * 2


# -- the chain kernels: cubins, and the interpreter against torch -------------------------------------------------

@pytest.mark.parametrize("arch", MMA_ARCHS)
@pytest.mark.parametrize("case", ["once-128-w8-b-nk", "loop-bf16", "once-f16-accumulator"])
def test_chain_kernels_compile(monkeypatch, arch, case):
    (kernel, args, kwargs), _, impl = TAKEN[case]
    if arch == "sm_90a" and impl.endswith("f16acc"):
        pytest.skip("a pinned mma_sync_m16n8k16 refuses float16 accumulators")
    _pin_on_hopper(monkeypatch, arch)
    compiled = kernel.compile(*args, arch=arch, **kwargs)
    assert compiled.asm["cubin"][:4] == b"\x7fELF" and compiled.meta["spills"] == 0, compiled.meta
    assert f"impl = {impl}}}" in compiled.asm["ir"]
    assert "mma.sync.aligned.m16n8k16" in compiled.asm["ptx"]


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


def chain_once_reference(a, b, c, scale, tb, acc_dtype=torch.float32):
    """The kernel's roundings: the first product in float32, scaled in float32, rounded to the operands' dtype;
    the second product of the rounded values in float64 (float32 or float16 accumulators round less or more)."""
    p = ((a.float() @ b.float()) * scale).to(a.dtype)
    return p.double() @ (c.double().T if tb else c.double())


@pytest.mark.parametrize("tb", [False, True])
def test_chain_once_in_the_interpreter(interpret, tb):
    """The kernel the GPU tests run (its sm_80 compile takes the register path: TAKEN above), on CPU tensors."""
    torch.manual_seed(3)
    rows, k, n1, n2 = 150, 64, 64, 128  # 150 rows: a ragged last block of 64
    a, b = torch.randn(rows, k, dtype=torch.float16), torch.randn(k, n1, dtype=torch.float16)
    c = torch.randn(n2, n1, dtype=torch.float16) if tb else torch.randn(n1, n2, dtype=torch.float16)
    out = torch.full((rows, n2), float("nan"))
    ck.chain_once[(tilejit.cdiv(rows, 64),)](a, b, c, out, 0.125, BM=64, N1=n1, K=k, N2=n2, TB=tb, ACC=T.float32)
    torch.testing.assert_close(out.double(), chain_once_reference(a, b, c, 0.125, tb), rtol=1e-3, atol=1e-3)


def test_chain_loop_in_the_interpreter(interpret):
    torch.manual_seed(4)
    rows, k, n, n2 = 100, 64, 150, 64  # 150 columns of B: blocks of 64, the last one ragged
    a, b, c = (torch.randn(*s, dtype=torch.bfloat16) for s in ((rows, k), (k, n), (n, n2)))
    out = torch.full((rows, n2), float("nan"))
    ck.chain_loop[(tilejit.cdiv(rows, 64),)](a, b, c, out, 0.125, BM=64, BN=64, K=k, N2=n2)
    p = (torch.relu(a.float() @ b.float()) * 0.125).to(torch.bfloat16)
    torch.testing.assert_close(out.double(), p.double() @ c.double(), rtol=1e-3, atol=1e-3)
