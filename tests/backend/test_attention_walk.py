"""The attention forward as one key loop (``fused_attention.attn_fwd``, ``ONE_LOOP``): its per-block mask
decision against a float64 reference in the interpreter (ragged lengths, causal, windows, softcaps, variable
lengths, GQA), and, on sm_90a, ``persistent=True`` for a kernel whose producer warpgroup splits off at the kernel's start: the ring set up
once, the producer walking the programs with the scalars its loads need, a kernel with a second loop left alone."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from attention_tiles import SMALL_ATTENTION_FWD, fwd_meta_args as _args
from tilejit.backend_cuda.nvrtc import nvrtc_supports
from tilejit.ops import fused_attention as attention

ARCHS = [a for a in ("sm_80", "sm_90a", "sm_100a") if nvrtc_supports(a)]


@pytest.fixture
def interpret(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))


# (causal, window, softcap, lens, group)
CASES = [(True, None, None, None, 1), (False, None, None, None, 2), (True, None, None, (70, 21), 2),
         (False, (20, 7), 5.0, None, 1), (True, (24, -1), None, (45, 70), 4)]


@pytest.mark.parametrize("causal, window, softcap, lens, group", CASES,
                         ids=[f"c{int(c)}-w{w}-s{s}-l{n}-g{g}" for c, w, s, n, g in CASES])
def test_one_loop_matches_float64(interpret, causal, window, softcap, lens, group):
    """``persistent=True`` runs the one-loop form (the interpreter runs its programs one by one): 70 rows, not a
    multiple of the 32 x 16 tiles, into a NaN-poisoned output, with the base-2 LSE the backward reads."""
    gen = torch.Generator().manual_seed(len(str((causal, window, softcap, lens, group))))
    q = torch.randn(2, 4, 70, 32, generator=gen)
    k, v = (torch.randn(2, 4 // group, 70, 32, generator=gen) for _ in range(2))
    lens_t = None if lens is None else torch.tensor(lens, dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((2, 4, 70), float("nan"))
    attention.attention_forward(q, k, v, causal=causal, window=window, softcap=softcap, lens=lens_t, out=out,
                                lse=lse, persistent=True, **SMALL_ATTENTION_FWD)
    ref = attention.reference(q, k, v, causal, lens=lens_t, window=window, softcap=softcap)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)
    two_loops = torch.full_like(lse, float("nan"))
    attention.attention_forward(q, k, v, causal=causal, window=window, softcap=softcap, lens=lens_t,
                                lse=two_loops, **SMALL_ATTENTION_FWD)
    torch.testing.assert_close(lse, two_loops, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_one_loop_compiles_for_every_arch(fresh_compile_cache, arch):
    compiled = attention.attn_fwd.compile(*_args(128), GROUP=2, BM=128, BN=64, D=128, CAUSAL=True, VARLEN=True,
                                          STORE_LSE=True, ONE_LOOP=True, num_warps=8, peel_masks=False, arch=arch)
    assert compiled.asm["cubin"][:4] == b"\x7fELF"
    assert compiled.asm["ir"].count("tj.for") == 1, "the key loop must stay one loop"


@pytest.mark.skipif("sm_90a" not in ARCHS, reason="NVRTC cannot target sm_90a")
def test_persistent_producer_first_walks_with_one_ring(fresh_compile_cache):
    """The producer splits off first (Q is staged before the loop) and walks the programs computing its loads'
    scalars per program; the math warps walk them too; the ring's mbarriers are set up once, before the walk, and
    never invalidated inside it; T.program_id reads the walk's program."""
    compiled = attention.attn_fwd.compile(*_args(128), GROUP=2, BM=128, BN=128, D=128, CAUSAL=True, VARLEN=False,
                                          ONE_LOOP=True, num_warps=8, STAGES=3, persistent=True, peel_masks=False,
                                          arch="sm_90a")
    cuda = compiled.asm["cuda"]
    assert "// persistent: programs" in cuda
    walk = "for (long long tj_turn = 0; tj_turn * "
    assert cuda.count(walk) == 2, "the producer and the math warps each walk the programs"
    assert cuda.count("(tj_turn & 1) ? ") == 2, "in a snake over each turn's programs"
    producer, consumers = cuda.split("tj_setmaxnreg_inc")
    assert producer.count("tj_mbar_init") == 2 and "tj_mbar_init" not in consumers
    assert "tj_mbar_inval" not in consumers.split(walk)[1].rsplit("this program's shared memory", 1)[0]
    assert "tj_pid1" in producer.split(walk)[1], "the producer computes each program's (batch, head)"
    assert "blockIdx" not in consumers.split(walk)[1]
    assert "the previous iteration's last gemm" in consumers, "p @ v still runs under the next q @ k^T"


@pytest.mark.skipif("sm_90a" not in ARCHS, reason="NVRTC cannot target sm_90a")
def test_persistent_passes_over_a_kernel_with_a_second_loop(fresh_compile_cache):
    """``attn_fwd`` runs the diagonal's blocks in a second loop, whose ring would need memory beside the walk's:
    ``persistent=True`` leaves it warp-specialized, one program per grid entry."""
    compiled = attention.attn_fwd.compile(*_args(128), GROUP=2, BM=128, BN=128, D=128, CAUSAL=True, VARLEN=False,
                                          num_warps=8, STAGES=3, persistent=True, arch="sm_90a")
    cuda = compiled.asm["cuda"]
    assert "tj_setmaxnreg_dec" in cuda and "// persistent: programs" not in cuda


@pytest.mark.skipif("sm_90a" not in ARCHS, reason="NVRTC cannot target sm_90a")
def test_persistent_producer_first_gemm(fresh_compile_cache):
    """A plain kernel of that form: a tile staged in shared memory before a TMA-fed wgmma loop (a gemm operand:
    the producer cannot run that prelude; the loop releases each slot at the end of its iteration), launched
    persistent; the producer's part computes its loop's bounds and coordinates only, and each walk reads the
    program it runs. (``mm_bias_first`` of tests/backend/test_warp_specialize.py, whose gemms stay in flight,
    is passed over.)"""
    cuda = _rows_times_blocks.compile(*(torch.empty(s, dtype=torch.float16, device="meta")
                                        for s in ((1000, 64), (512, 768), (1000, 768))),
                                      BM=128, BN=128, BK=64, num_warps=4, persistent=True,
                                      arch="sm_90a").asm["cuda"]
    assert "// persistent: programs" in cuda
    producer, consumers = cuda.split("tj_setmaxnreg_inc")
    assert "v0_X" not in producer.split("tj_turn")[1], "the producer stages no X"
    assert "v0_X" in consumers and consumers.count("tj_pid0") >= 2


@tilejit.kernel
def _rows_times_blocks(X, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """C = sum over the row blocks of B of X's rows times that block: X's tile is loaded once, before the loop."""
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    x = X[m0:m0 + BM, 0:BK]
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, B.shape[0], BK, stages=3):
        acc += x @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)
