"""A warp-specialized loop's last gemm issued one iteration late (``passes.warp_specialize.deferred_gemm``,
``lower_loops.Deferred``): FlashAttention-3's intra-warpgroup overlap, derived from the ordinary attention loop.
Iteration j issues q @ k_j^T, then iteration j-1's p @ v, waits for the first alone and runs the softmax while the
second works; the accumulator is read only after its wait. The first iteration is emitted on its own (no previous
gemm), so no wgmma is issued under a condition (ptxas would serialize them all, C7514)."""
from __future__ import annotations

import re

import pytest
import torch

import tilejit
import tilejit.language as T
from _lowering import braced_block
from tilejit.ops import fused_attention as attention

pytestmark = pytest.mark.usefixtures("fresh_compile_cache")  # tests/conftest.py

BF16 = torch.bfloat16


def _meta(*shape, dtype=BF16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _attention(dim=128, bm=128, bn=128, warps=8, causal=False, stages=3, **kw):
    q, kv = _meta(2, 4, 4096, dim), _meta(2, 2, 4096, dim)
    return attention.attn_fwd.compile(q, kv, kv, q, q, _meta(2, dtype=torch.int32), 0.125, 4, GROUP=2, BM=bm, BN=bn,
                                      D=dim, CAUSAL=causal, VARLEN=False, num_warps=warps, arch="sm_90a",
                                      warp_specialize=True, STAGES=stages, **kw)


@tilejit.kernel
def rescale_first(Q, K, V, O, BM: T.constexpr, BN: T.constexpr, D: T.constexpr):
    """Attention-like, but the accumulator is read before the loop's first gemm: no deferral."""
    m0 = T.program_id(0) * BM
    q = Q[m0:m0 + BM, 0:D]
    acc = T.zeros((BM, D), T.float32)
    for n0 in T.range(0, K.shape[0], BN, stages=3):
        acc = acc * 0.5
        s = T.gemm(q, K[n0:n0 + BN, 0:D], T.zeros((BM, BN), T.float32), transpose_b=True)
        acc += T.exp2(s).to(V.dtype) @ V[n0:n0 + BN, 0:D]
    O[m0:m0 + BM, 0:D] = acc.to(O.dtype)


@tilejit.kernel
def rescale_after(Q, K, V, O, BM: T.constexpr, BN: T.constexpr, D: T.constexpr, STAGES: T.constexpr = 3):
    """The same loop with the accumulator read after the first gemm: deferred (from 3 stages on)."""
    m0 = T.program_id(0) * BM
    q = Q[m0:m0 + BM, 0:D]
    acc = T.zeros((BM, D), T.float32)
    for n0 in T.range(0, K.shape[0], BN, stages=STAGES):
        s = T.gemm(q, K[n0:n0 + BN, 0:D], T.zeros((BM, BN), T.float32), transpose_b=True)
        acc = acc * 0.5
        acc += T.exp2(s).to(V.dtype) @ V[n0:n0 + BN, 0:D]
    O[m0:m0 + BM, 0:D] = acc.to(O.dtype)


def _small(kernel, **kw):
    q, k = _meta(1024, 64), _meta(2048, 64)
    return kernel.compile(q, k, k, q, BM=128, BN=64, D=64, num_warps=8, arch="sm_90a", warp_specialize=True, **kw)


def test_attention_loop_is_rotated():
    compiled = _attention()
    assert "defer_mma = true" in compiled.asm["ir"]
    assert compiled.meta["wgmma_serialized"] is False and compiled.meta["spills"] == 0
    cuda = compiled.asm["cuda"]
    body = cuda[cuda.index("__global__"):]
    declared = body.index("bool tj_pend = false;")
    # the first iteration on its own: its own gemms, each waited for, nothing of a previous iteration
    first = braced_block(body, body.index("if (", declared))
    assert "tj_mbar_wait(" in first and "issued under" not in first and "wait_group.sync.aligned 1;" not in first
    assert first.count("wgmma.mma_async") == 8 and "tj_pp[i] =" in first and "tj_pend = true;" in first
    assert "tj_mbar_arrive(" not in first  # its slot is handed back by the next iteration
    after_first = body[body.index(first) + len(first):]
    loop = braced_block(after_first, after_first.index("for (int64_t"))
    # q @ k_j^T, then iteration j-1's p @ v (A from the packed registers, V from the previous slot), then the wait
    # for the first gemm alone
    issue = loop.index("issued under this iteration's math")
    commits = [m.start() for m in re.finditer(r"tj_wgmma_commit\(\);", loop)]
    assert len(commits) == 2 and commits[0] < issue < commits[1] < loop.index("wait_group.sync.aligned 1;")
    assert '"r"(tj_pp[0])' in loop and "((tj_it + 2) % 3)) * 32768" in loop
    # softmax, then the accumulator's wait and the previous slot's hand-back, then the rescale
    settle = loop.index("its accumulator is read next")
    assert loop.index("max over axis 1") < settle
    rest = loop[settle:]
    assert rest.index("wait_group.sync.aligned 0;") < rest.index("tj_mbar_arrive(") < rest.index("] * ")
    assert "tj_mbar_arrive(tj_smem_u32 + 24 + 8 * ((tj_it + 2) % 3))" in rest and loop.count("tj_mbar_arrive(") == 1
    assert "if (tj_pend)" not in loop  # no wgmma under a condition inside the loop
    drain = braced_block(after_first, after_first.index("if (tj_pend)", after_first.index(loop) + len(loop)))
    assert drain.count("wgmma.mma_async") == 8 and "wait_group.sync.aligned 0;" in drain and "tj_mbar_arrive(" in drain


def test_knob_keeps_each_gemm_in_its_iteration(monkeypatch):
    monkeypatch.setenv("TILEJIT_MMA_OVERLAP", "0")
    compiled = _attention()
    assert "defer_mma" not in compiled.asm["ir"] and "tj_pend" not in compiled.asm["cuda"]


def test_which_loops_are_deferred():
    assert "defer_mma = true" in _small(rescale_after).asm["ir"]
    assert "defer_mma" not in _small(rescale_first).asm["ir"]  # the accumulator is read before the first gemm
    q, k = _meta(1024, 64), _meta(2048, 64)
    plain = rescale_after.compile(q, k, k, q, BM=128, BN=64, D=64, num_warps=8, arch="sm_90a")
    assert "defer_mma" not in plain.asm["ir"]  # no producer warpgroup: thread 0's refills would wait on it
    assert "defer_mma" not in _small(rescale_after, STAGES=2).asm["ir"]  # 2 stages: the next loads would stall


@tilejit.kernel
def chained(Q, K, V, O, BM: T.constexpr, BN: T.constexpr, D: T.constexpr):
    """Nothing loaded before the loop (q too is a ring tile): a candidate for the persistent launch option."""
    m0 = T.program_id(0) * BM
    acc = T.zeros((BM, D), T.float32)
    for n0 in T.range(0, K.shape[0], BN, stages=3):
        s = T.gemm(Q[m0:m0 + BM, 0:D], K[n0:n0 + BN, 0:D], T.zeros((BM, BN), T.float32), transpose_b=True)
        acc = acc * 0.5
        acc += T.exp2(s).to(V.dtype) @ V[n0:n0 + BN, 0:D]
    O[m0:m0 + BM, 0:D] = acc.to(O.dtype)


def test_persistent_loops_are_not_deferred():
    """The deferred form of a persistent kernel has not run on a GPU: the loop stays in the plain specialized form
    (deferred when launched plainly warp-specialized)."""
    q, k = _meta(4096, 64), _meta(2048, 64)
    persistent = chained.compile(q, k, k, q, BM=128, BN=64, D=64, num_warps=8, arch="sm_90a", persistent=True)
    assert "tj_prog += " in persistent.asm["cuda"]  # it is persistent: a walk over the grid's programs
    assert "defer_mma" not in persistent.asm["ir"] and "producer_warpgroup = true" in persistent.asm["ir"]
    assert "defer_mma = true" in chained.compile(q, k, k, q, BM=128, BN=64, D=64, num_warps=8, arch="sm_90a",
                                                 warp_specialize=True).asm["ir"]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim, bm, bn, warps", [(d, m, n, w) for d, cs in attention.CONFIGS.items() for m, n, w in cs],
                         ids=lambda x: str(x))
def test_every_config_deferred_without_serialized_wgmma(dim, bm, bn, warps, causal):
    assert "defer_mma" not in _attention(dim, bm, bn, warps, causal, stages=2).asm["ir"]
    compiled = _attention(dim, bm, bn, warps, causal)
    assert "defer_mma = true" in compiled.asm["ir"]
    assert compiled.meta["wgmma_serialized"] is False, "ptxas serialized the wgmma (C7514)"
    assert compiled.meta["spills"] == 0
