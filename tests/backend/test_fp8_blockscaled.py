"""Block-scaled float8 products (``T.gemm(..., scale_a=, scale_b=)`` and ``tilejit.ops.fp8_blockscaled``) on CPU:
the interpreter's results against the float64 dequantized product over ragged shapes, dense and grouped; the
scales applied where the sm_90a loop promotes (FileCheck of the generated CUDA); cubins for sm_80, sm_90a and
sm_100a; the errors for bad scales."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
import tilejit.ops.fp8_blockscaled as F
from filecheck import filecheck

E4M3 = torch.float8_e4m3fn


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


def _meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _operands(m: int, n: int, k: int, experts: int | None = None, seed: int = 0):
    """e4m3 operands (B given N x K, (E, N, K) when ``experts``) with scales of a wide range (2^-8 .. 2^8)."""
    gen = torch.Generator().manual_seed(seed)
    kb, nb = tilejit.cdiv(k, 128), tilejit.cdiv(n, 128)
    b_lead = (experts,) if experts else ()
    a = (torch.randn(m, k, generator=gen) * 3).to(E4M3)
    b = (torch.randn(*b_lead, n, k, generator=gen) * 3).to(E4M3)
    sa = torch.exp2(torch.randint(-8, 9, (m, kb), generator=gen).float()) * (1 + torch.rand(m, kb, generator=gen))
    sb = torch.exp2(torch.randint(-8, 9, (*b_lead, nb, kb), generator=gen).float())
    return a, sa, b, sb


def _error(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any()
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("m,n,k", [(200, 136, 300), (64, 256, 128), (1, 72, 40), (130, 129, 257)])
def test_dense_matches_the_dequantized_float64_product(interpret, m, n, k):
    a, sa, b, sb = _operands(m, n, k, seed=m + n + k)
    out = torch.full((m, n), float("nan"))
    F.fp8_blockscaled_matmul(a, sa, b, sb, out=out, BM=64, BN=64, num_warps=4)
    # float32 out: only the tensor cores' short sums over each 128-block (modelled by the interpreter) remain
    assert _error(out, F.reference(a, sa, b, sb)) < 2e-4
    bf16 = F.fp8_blockscaled_matmul(a, sa, b, sb, BM=64, BN=64, num_warps=4)
    assert bf16.dtype == torch.bfloat16 and _error(bf16, F.reference(a, sa, b, sb)) < 3e-3


def test_each_k_block_takes_its_own_scales(interpret):
    """A scale applied to the wrong rows, columns or k-block would miss: one block of each is scaled 2^10, and
    the result matches the product with those scales, not without them."""
    m, n, k = 70, 200, 300
    a, sa, b, sb = _operands(m, n, k, seed=5)
    sa.fill_(1.0)
    sb.fill_(1.0)
    plain = F.reference(a, sa, b, sb)
    sa[3, 1] = 1024.0
    sb[1, 2] = 1024.0
    out = torch.full((m, n), float("nan"))
    F.fp8_blockscaled_matmul(a, sa, b, sb, out=out, BM=64, BN=64, num_warps=4)
    ref = F.reference(a, sa, b, sb)
    for rows, cols in ((slice(3, 4), slice(0, 128)), (slice(0, 3), slice(128, n)), (slice(4, m), slice(0, 128))):
        assert _error(out[rows, cols], ref[rows, cols]) < 2e-4
    assert _error(out[3:4, :128], plain[3:4, :128]) > 0.1 and _error(out[:3, 128:], plain[:3, 128:]) > 0.1
    assert _error(out[4:, :128], plain[4:, :128]) < 2e-4


@pytest.mark.parametrize("offsets", [[0, 70, 70, 150], [0, 0, 1, 129], [0, 200, 200, 200]])
def test_grouped_matches_each_experts_product_and_leaves_other_rows(interpret, offsets):
    m, n, k, experts = 210, 136, 300, 3
    a, sa, b, sb = _operands(m, n, k, experts, seed=sum(offsets))
    group_offsets = torch.tensor(offsets, dtype=torch.int32)
    out = torch.full((m, n), float("nan"))
    F.fp8_blockscaled_grouped_matmul(a, sa, b, sb, group_offsets, out=out, BM=64, BN=64, num_warps=4)
    ref = F.grouped_reference(a, sa, b, sb, group_offsets)
    used = ~ref[:, 0].isnan()
    assert out[~used].isnan().all()  # rows of no expert are not written
    if used.any():
        assert _error(out[used], ref[used]) < 2e-4


@tilejit.kernel
def scaled_tile(A, B, C, SA, SB, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr, SCALE_B: T.constexpr):
    """One tile: C = (A @ B^T) * SA[:, None] * (SB as a scalar or per column)."""
    a = A[0:BM, 0:BK]
    b = B[0:BN, 0:BK]
    if SCALE_B == "column":
        C[0:BM, 0:BN] = T.gemm(a, b, None, transpose_b=True, scale_a=SA[0:BM], scale_b=SB[0:BN])
    else:
        C[0:BM, 0:BN] = T.gemm(a, b, None, transpose_b=True, scale_a=SA[0:BM], scale_b=SB[0])


@pytest.mark.parametrize("scale_b", ["scalar", "column"])
def test_scaled_gemm_semantics(interpret, scale_b):
    torch.manual_seed(1)
    a, b = (torch.randn(32, 64) * 2).to(E4M3), (torch.randn(16, 64) * 2).to(E4M3)
    sa, sb = torch.rand(32) + 0.5, torch.rand(16) + 0.5
    c = torch.full((32, 16), float("nan"))
    scaled_tile[(1,)](a, b, c, sa, sb, BM=32, BN=16, BK=64, SCALE_B=scale_b)
    cols = sb if scale_b == "column" else sb[0]
    ref = (a.double() @ b.double().T) * sa.double()[:, None] * cols.double()
    assert _error(c, ref) < 2e-4


def _dense_compile(arch: str, config: dict, stop_after: str | None = "cuda"):
    m, n, k = 1000, 2112, 7168  # ragged M; DeepSeek-V3's 2112 x 7168 weight
    return F.blockscaled_mm.compile(_meta(m, k, dtype=E4M3), _meta(m, 56), _meta(n, k, dtype=E4M3), _meta(17, 56),
                                    _meta(m, n, dtype=torch.bfloat16), arch=arch, stop_after=stop_after, **config)


@pytest.mark.parametrize("config", [dict(BM=128, BN=128, STAGES=4, num_warps=8, persistent=True),
                                    F.default_config(128, 2112, 9, 7168),
                                    dict(BM=128, BN=128, STAGES=4, num_warps=8, warp_specialize=True),
                                    dict(BM=64, BN=64, STAGES=4, num_warps=4, warp_specialize=True)],
                         ids=["128x128-persistent", "64x64-split2", "128x128-ws", "64x64-ws"])
def test_sm90a_applies_the_scales_where_the_loop_promotes(config):
    """Each 128-block: the scale (the row's scale times the tile's weight scale) computed once for each of the
    thread's two rows (registers 0 and 2; the others are copies), the per-row scales loaded by the threads that
    hold the rows (no shared-memory broadcast); then one promoted gemm (passes/scaled_promotion.py): a fresh
    wgmma sum into a temporary (its first k step writes it with scale-d = 0), waited for, and one FMA by the
    scale per accumulator element, into the accumulator in place."""
    text = _dense_compile("sm_90a", config).cuda
    filecheck(text, """
        CHECK: load v{{[0-9]+}}_SA window into registers
        CHECK: v{{[0-9]+}}[0] = (v{{[0-9]+}}[0] * v{{[0-9]+}}[0]);
        CHECK-NEXT: v{{[0-9]+}}[2] = (v{{[0-9]+}}[2] * v{{[0-9]+}}[2]);
        CHECK-NEXT: v{{[0-9]+}}[1] = v{{[0-9]+}}[0];
        CHECK: auto& [[SCALE:v[0-9]+]] = v{{[0-9]+}};  // broadcast: same registers
        CHECK: gemm {{[0-9]+}}x{{[0-9]+}}x128 on wgmma.m64n{{[0-9]+}}k32
        CHECK-NOT: _acc[i] = v{{[0-9]+}}_acc[i];
        CHECK: promoted every 128 products of K
        CHECK: wgmma.mma_async.sync.aligned.m64n{{[0-9]+}}k32.f32.e4m3.e4m3
        CHECK-NEXT: "=f"(tj_p0[0])
        CHECK-NEXT: "r"(0));
        CHECK: wgmma.mma_async.sync.aligned.m64n{{[0-9]+}}k32.f32.e4m3.e4m3
        CHECK-NEXT: "+f"(tj_p0[0])
        CHECK-NEXT: "r"(1));
        CHECK: tj_wgmma_commit();
        CHECK: wgmma.wait_group.sync.aligned 0;
        CHECK: for (int i = 0; i < {{[0-9]+}}; ++i) [[ACC:v[0-9]+_acc]][0 + i] = fmaf(tj_p0[i], [[SCALE]][0 + i], [[ACC]][0 + i]);
    """)
    assert ", left in flight" not in text
    assert "broadcast through shared memory" not in text


def test_sm90a_wide_tiles_take_each_column_halfs_weight_scale():
    """128x256 tiles span two weight blocks: each accumulator column's scale is picked by its column (below 128:
    the first block's), multiplied by the row's, and applied at the promotion of each of the two 128-column
    chunks; compiled for sm_90a without spills (``compiler._regrant`` lowers the math warps' register grant
    where the default one spills)."""
    compiled = _dense_compile("sm_90a", F.default_config(8192, 8192, 9, 7168), stop_after=None)
    assert compiled.meta["spills"] == 0, compiled.meta
    text = compiled.asm["cuda"]
    assert f"tj_setmaxnreg_inc<{compiled.meta['register_grant']}>();" in text
    filecheck(text, """
        CHECK: load v{{[0-9]+}}_SA window into registers
        CHECK: v{{[0-9]+}}[0] = (v{{[0-9]+}}[0] < v{{[0-9]+}}[0]);
        CHECK: v{{[0-9]+}}[0] = (v{{[0-9]+}}[0] ? v{{[0-9]+}}[0] : v{{[0-9]+}}[0]);
        CHECK: gemm 128x256x128 on wgmma.m64n256k32
        CHECK: promoted every 128 products of K: 2 chunk(s) of 64x128
        CHECK: for (int i = 0; i < 64; ++i) [[ACC:v[0-9]+_acc]][0 + i] = fmaf(tj_p0[i], [[S:v[0-9]+]][0 + i], [[ACC]][0 + i]);
        CHECK: for (int i = 0; i < 64; ++i) [[ACC]][64 + i] = fmaf(tj_p0[i], [[S]][64 + i], [[ACC]][64 + i]);
    """)


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90a", "sm_100a"])
@pytest.mark.parametrize("kind", ["dense", "grouped"])
def test_cubins_for_every_arch_without_spills(arch, kind):
    config = (F.default_config if kind == "dense" else F.grouped_config)(8192, 8192, 9 if arch == "sm_90a" else 8)
    if kind == "dense":
        compiled = _dense_compile(arch, config, stop_after=None)
    else:
        m, n, k = 1000, 4096, 7168
        compiled = F.blockscaled_grouped_mm.compile(
            _meta(m, k, dtype=E4M3), _meta(m, 56), _meta(8, n, k, dtype=E4M3), _meta(8, 32, 56),
            _meta(m, n, dtype=torch.bfloat16), _meta(8 + 8, 3, dtype=torch.int32), arch=arch, **config)
    assert compiled.asm["cubin"][:4] == b"\x7fELF"
    assert compiled.meta["spills"] in (0, None), compiled.meta
    # sm_80 has no float8 tensor-core instruction: its products run on FMAs (lower_gemm's fma_fallback)
    instruction = {"sm_80": "fmaf(", "sm_89": "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3",
                   "sm_90a": "wgmma.mma_async", "sm_100a": "tcgen05.mma"}[arch]
    assert instruction in compiled.asm["cuda"]
    assert "fmaf(" in compiled.asm["cuda"]


@pytest.mark.parametrize("shapes,message", [
    (dict(sa=(64, 2)), r"a_scales must be float32 of shape \(64, 3\)"),
    (dict(sb=(1, 3)), r"b_scales must be float32 of shape \(2, 3\)"),
    (dict(sa_dtype=torch.float16), r"a_scales must be float32"),
    (dict(b=(136, 256)), r"b is given N x K"),
])
def test_bad_operands_are_refused(shapes, message):
    a = torch.zeros(64, 300, dtype=E4M3)
    b = torch.zeros(*shapes.get("b", (136, 300)), dtype=E4M3)
    sa = torch.ones(*shapes.get("sa", (64, 3)), dtype=shapes.get("sa_dtype", torch.float32))
    sb = torch.ones(*shapes.get("sb", (2, 3)))
    with pytest.raises(ValueError, match=message):
        F.fp8_blockscaled_matmul(a, sa, b, sb)


def test_bad_group_offsets_and_tiles_are_refused():
    a, sa, b, sb = _operands(64, 136, 300, experts=2)
    with pytest.raises(ValueError, match=r"group_offsets must be int32 of shape \(3,\)"):
        F.fp8_blockscaled_grouped_matmul(a, sa, b, sb, torch.tensor([0, 64], dtype=torch.int32))
    with pytest.raises(ValueError, match="BN must divide 128"):
        F.fp8_blockscaled_matmul(a, sa, b[0], sb[0], BN=96)


@tilejit.kernel
def bad_scales(A, B, C, SA, SB, WHICH: T.constexpr):
    a = A[0:32, 0:64]
    b = B[0:16, 0:64]
    if WHICH == "rows":
        C[0:32, 0:16] = T.gemm(a, b, None, transpose_b=True, scale_a=SA[0:16])
    elif WHICH == "dtype":
        C[0:32, 0:16] = T.gemm(a, b, None, transpose_b=True, scale_a=SA[0:32].to(T.float16))
    else:
        C[0:32, 0:16] = T.gemm(a.to(T.float16), b.to(T.float16), None, transpose_b=True, scale_b=SB[0])


@pytest.mark.parametrize("which,message", [
    ("rows", "scale_a must be a float32 scalar or a 1-D float32 tile of length M = 32"),
    ("dtype", "scale_a must be float32, got f16"),
    ("operands", "a scaled matrix product .* takes 2-D float8 tiles"),
])
def test_bad_scales_in_a_kernel_are_located_errors(which, message):
    args = (_meta(32, 64, dtype=E4M3), _meta(16, 64, dtype=E4M3), _meta(32, 16), _meta(32), _meta(16))
    with pytest.raises(tilejit.CompilationError, match=message) as info:
        bad_scales.compile(*args, WHICH=which, arch="sm_90a", stop_after="ir")
    assert "test_fp8_blockscaled.py" in str(info.value)


def test_the_ops_trace_under_torch_compile_fullgraph(interpret):
    """Both operators have fake implementations: dynamo traces them without a graph break, and the compiled call
    gives the eager result."""
    a, sa, b, sb = _operands(70, 136, 300, experts=2, seed=3)
    offsets = torch.tensor([0, 30, 70], dtype=torch.int32)

    def both(a, sa, b, sb, offsets):
        dense = F.fp8_blockscaled_matmul(a, sa, b[0], sb[0], BM=64, BN=64, num_warps=4)
        return dense, F.fp8_blockscaled_grouped_matmul(a, sa, b, sb, offsets, BM=64, BN=64, num_warps=4)

    compiled = torch.compile(both, fullgraph=True, backend="eager")
    for got, want in zip(compiled(a, sa, b, sb, offsets), both(a, sa, b, sb, offsets)):
        assert got.dtype == torch.bfloat16 and got.shape == want.shape and torch.equal(got, want)


@tilejit.kernel
def prefetched_scales(A, SA, B, SB, C, BM: T.constexpr, BN: T.constexpr):
    """blockscaled_mm with each iteration loading the next one's scales (carried by the loop)."""
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    sa_next = SA[m0:m0 + BM, 0]
    sb_next = SB[n0 // 128, 0]
    for k0 in T.range(0, K, 128, stages=3):
        kb = k0 // 128
        sa = sa_next
        sb = sb_next
        sa_next = SA[m0:m0 + BM, kb + 1]
        sb_next = SB[n0 // 128, kb + 1]
        acc = T.gemm(A[m0:m0 + BM, k0:k0 + 128], B[n0:n0 + BN, k0:k0 + 128], acc, transpose_b=True,
                     scale_a=sa, scale_b=sb)
    C[m0:m0 + BM, n0:n0 + BN] = acc


def test_a_carried_row_scale_is_loaded_by_the_threads_holding_its_rows():
    """A per-row scale vector carried by the loop (loaded one iteration ahead) is built in the accumulator's row
    slice, as a scale loaded in the iteration is: each thread loads its own rows before the loop and in it (there
    through pointers to its rows set up before the loop and stepped by one K block a trip), and no vector crosses
    shared memory."""
    m, n, k = 1000, 2112, 7168
    text = prefetched_scales.compile(_meta(m, k, dtype=E4M3), _meta(m, 56), _meta(n, k, dtype=E4M3), _meta(17, 56),
                                     _meta(m, n, dtype=torch.bfloat16), BM=128, BN=128, num_warps=8,
                                     arch="sm_90a", stop_after="cuda").cuda
    assert "broadcast through shared memory" not in text
    lines = text.splitlines()
    before = [line for line in lines if "_sa_next[0] = (tj_dropped_ok" in line]
    assert len(before) == 1 and "(tid & 31) >> 2" in before[0]  # the accumulator's row of a lane
    inside = [line for line in lines if "_sa_next[0] = (tj_cl" in line]
    assert len(inside) == 1 and inside[0].rstrip().endswith("? *tj_cl1_p0 : float{};")
    rows = [line for line in lines if "const float* tj_cl1_p0 = " in line]
    assert len(rows) == 1 and "(tid & 31) >> 2" in rows[0]
    header = next(line for line in lines if line.lstrip().startswith("for (int64_t") and "tj_cl1_p0 +=" in line)
    assert "tj_cl1_p1 += tj_cl1_step" in header


def test_a_carried_row_scale_gives_the_product(interpret):
    a, sa, b, sb = _operands(70, 136, 300, seed=5)
    c = torch.full((70, 136), float("nan"), dtype=torch.bfloat16)
    prefetched_scales[(2, 3)](a, sa, b, sb, c, BM=64, BN=64, num_warps=4)
    assert _error(c, F.reference(a, sa, b, sb)) < 1e-2


def test_default_configs_follow_the_output_tiles_and_k():
    """Large outputs: persistent 128-row tiles, 256 columns where fewer waves of them take less time (not where
    2112 columns leave the last wide tile a third full); small M: 64-row tiles, split over a cluster where K is
    long and the tiles are few (DeepSeek-V3's decode-size shapes); no warp specialization or split below
    Hopper. The grouped kernel keeps 128 columns."""
    persistent = dict(BM=128, BN=128, STAGES=4, num_warps=8, persistent=True)
    assert F.default_config(4096, 4096, 9, 7168) == dict(persistent, BN=256)
    assert F.default_config(4096, 7168, 9, 2048) == dict(persistent, BN=256)
    assert F.default_config(4096, 2112, 9, 7168) == persistent
    assert F.default_config(4096, 4096, 9, 7168, sms=1024)["BN"] == 128  # (one wave of 128x128 either way)
    assert F.grouped_config(4096, 4096, 8) == persistent
    assert F.default_config(128, 7168, 9, 2048) == dict(BM=64, BN=128, STAGES=4, num_warps=4, warp_specialize=True)
    # 136 tiles of 64x128 take two waves of 132 SMs, 132 of 128x64 one
    assert F.default_config(512, 2112, 9, 7168) == dict(BM=128, BN=64, STAGES=4, num_warps=8, warp_specialize=True)
    assert F.default_config(128, 4096, 9, 7168) == dict(BM=64, BN=128, STAGES=4, num_warps=4, split_k=2)
    assert F.default_config(128, 2112, 9, 7168) == dict(BM=64, BN=64, STAGES=6, num_warps=4, split_k=2)
    assert F.default_config(128, 2112, 9, 2048) == dict(BM=64, BN=64, STAGES=4, num_warps=4)
    assert F.default_config(128, 2112, 9) == dict(BM=64, BN=64, STAGES=4, num_warps=4)  # K unknown: no split
    for m, n, k in [(4096, 4096, 7168), (128, 4096, 7168), (128, 7168, 2048)]:
        config = F.default_config(m, n, 8, k)
        assert config["BN"] == 64 and config["STAGES"] == 3
        assert not {"split_k", "warp_specialize", "persistent"} & set(config)
