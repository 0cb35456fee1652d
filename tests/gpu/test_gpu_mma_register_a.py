"""mma.sync with operand A from registers (``lower_mma_rs``) on the GPU: the attention example (P = exp2(S - m)
cast to 16 bits, fed to P @ V without shared memory) forward and backward against float64 references, and the
chain kernels of tests/chain_kernels.py, with NaN-poisoned outputs and ragged shapes.

The whole module runs with ``TILEJIT_GEMM_LOWERING=mma_sync_m16n8k16`` (its register form included), so an H100
or H200 runs the sm_80 instruction path compiled for sm_90a; an sm_8x GPU runs it as is. Each test checks that
the kernel it launched took the register path. The example is loaded as a module of its own here, so its kernels'
in-process launch caches hold only pinned compiles.

Run on a GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_mma_register_a.py``.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

import tilejit
import tilejit.language as T

import chain_kernels as ck
from attention_checks import check, check_grad, inputs, reference_grads

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("tilejit_ops_attention_gpu_rs",
                                               ROOT / "tilejit" / "ops" / "fused_attention.py")
attention = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(attention)

PIN = "mma_sync_m16n8k16"
RS = "impl = mma_sync_rs_m16n8k16"


@pytest.fixture(scope="module", autouse=True)
def _mma_sync_pinned():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("mma.sync m16n8k16 needs sm_80 or newer")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TILEJIT_GEMM_LOWERING", PIN)
        mp.delenv("TILEJIT_INTERPRET", raising=False)
        yield


def _forward_ir(q, k, v, out, causal, lens=None, **config) -> str:
    """The IR of the forward kernel ``attention.attention`` launched for these arguments (the same
    specialization: a cache hit)."""
    heads, dim = q.shape[1], q.shape[3]
    config = {**attention.default_config(dim), **config}
    lens_arg = lens if lens is not None else torch.zeros(1, dtype=torch.int32, device=q.device)
    return attention.attn_fwd.compile(q, k, v, out, lens_arg, lens_arg, 1.0 / math.sqrt(dim), heads,
                                      GROUP=heads // k.shape[1], D=dim, CAUSAL=causal, VARLEN=lens is not None,
                                      STORE_LSE=False, **config).asm["ir"]


def _assert_p_from_registers(ir: str) -> None:
    gemms = [line for line in ir.splitlines() if "tj.gemm" in line]
    assert [RS in g for g in gemms] == [False, True] * (len(gemms) // 2) and gemms
    assert "wgmma" not in ir and "tcgen05" not in ir


CASES = [(dim, bm, bn, w) for dim, configs in attention.CONFIGS.items() for bm, bn, w in configs]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim, bm, bn, warps", CASES, ids=[f"d{d}-{m}x{n}-w{w}" for d, m, n, w in CASES])
def test_forward_every_config(dim, bm, bn, warps, causal):
    """1000 rows (no multiple of any block), GQA 2, bf16."""
    q, k, v = inputs(2, 4, 1000, dim, 2, seed=dim + bm + bn + causal)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out, BM=bm, BN=bn, num_warps=warps)
    check(out, attention.reference(q, k, v, causal))
    _assert_p_from_registers(_forward_ir(q, k, v, out, causal, BM=bm, BN=bn, num_warps=warps))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seq", [1, 17, 100, 257, 4097])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim", [64, 128])
def test_forward_ragged_lengths_and_dtypes(dim, seq, causal, dtype):
    q, k, v = inputs(1, 2, seq, dim, 1, dtype=dtype, seed=seq + dim)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out)
    check(out, attention.reference(q, k, v, causal))
    _assert_p_from_registers(_forward_ir(q, k, v, out, causal))


@pytest.mark.parametrize("causal", [False, True])
def test_forward_variable_lengths(causal):
    q, k, v = inputs(3, 4, 300, 64, 4, seed=5)
    lens = torch.tensor([300, 1, 129], dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out, lens=lens)
    check(out, attention.reference(q, k, v, causal, lens=lens), rows=lens.tolist())
    _assert_p_from_registers(_forward_ir(q, k, v, out, causal, lens=lens))


def test_scores_with_large_magnitudes_stay_finite():
    """Scores of +-60 after scaling: the online softmax's rescaling with P packed straight from registers."""
    q, k, v = inputs(1, 2, 256, 64, 1, seed=9)
    q = (q * 30).to(q.dtype)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, out=out)
    check(out, attention.reference(q, k, v, False))


# -- backward: P^T @ dO, dS^T @ Q (dK/dV) and dS @ K (dQ) from registers ------------------------------------------

BWD_CASES = [(dim, name, c) for dim, spaces in attention.BWD_CONFIGS.items() for name in ("dkdv", "dq")
             for c in spaces[name]]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim, kernel, config", BWD_CASES,
                         ids=[f"d{d}-{n}-{c[0]}x{c[1]}-w{c[2]}" for d, n, c in BWD_CASES])
def test_backward_every_config(dim, kernel, config, causal):
    """Each backward config of one kernel (the other's default), 1000 rows, GQA 2; 16 rows per warp or more take
    the register path (64 rows over 8 warps, head dim 256's, do not: they run staged, as before)."""
    q, k, v = inputs(2, 4, 1000, dim, 2, seed=dim + sum(config) + causal)
    do = torch.randn_like(q)
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device="cuda")
    attention.attention_forward(q, k, v, causal=causal, out=out, lse=lse)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    bm, bn, warps = config
    attention.attention_backward(do, q, k, v, out, lse, causal=causal, dq=grads[0], dk=grads[1], dv=grads[2],
                                 delta=torch.full(q.shape[:3], float("nan"), device="cuda"),
                                 config={kernel: dict(BM=bm, BN=bn, num_warps=warps)})
    ref = reference_grads(attention.reference, q, k, v, do, causal)
    check(out, ref[0])
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref[1:]):
        check_grad(got, want, name)


# -- the chain kernels ------------------------------------------------------------------------------------------

def _poisoned(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


@pytest.mark.parametrize("acc", [T.float32, T.float16], ids=["f32-acc", "f16-acc"])
@pytest.mark.parametrize("tb", [False, True], ids=["c-kn", "c-nk"])
@pytest.mark.parametrize("tile", [(64, 4), (128, 8), (128, 4)], ids=lambda t: f"{t[0]}-w{t[1]}")
def test_chain_once(monkeypatch, tile, tb, acc):
    """O = ((A @ B) * scale).to(f16) @ C over 1000 rows (a ragged last block), against float64 of the same
    rounded intermediate (the first product rounds to float16 once, like the kernel; last-bit differences of that
    rounding are within the tolerance). A float16 accumulator is another lowering than the pinned one: unpinned,
    sm_8x runs it on mma.sync (register form ``mma_sync_rs_m16n8k16_f16acc``), sm_90 on wgmma (not this test)."""
    if acc == T.float16:
        if torch.cuda.get_device_capability()[0] != 8:
            pytest.skip("unpinned, float16 accumulators take mma.sync on sm_8x only")
        monkeypatch.delenv("TILEJIT_GEMM_LOWERING")
    bm, warps = tile
    rows, k, n1, n2 = 1000, 64, 64, 96
    torch.manual_seed(bm + warps + tb)
    a = torch.randn(rows, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n1, device="cuda", dtype=torch.float16)
    c = torch.randn(n2, n1, device="cuda", dtype=torch.float16) if tb else \
        torch.randn(n1, n2, device="cuda", dtype=torch.float16)
    out = _poisoned(rows, n2, dtype=torch.float32 if acc == T.float32 else torch.float16)
    kw = dict(BM=bm, N1=n1, K=k, N2=n2, TB=tb, ACC=acc, num_warps=warps)
    ck.chain_once[(tilejit.cdiv(rows, bm),)](a, b, c, out, 0.125, **kw)
    torch.cuda.synchronize()
    assert "impl = mma_sync_rs_m16n8k16" in ck.chain_once.compile(a, b, c, out, 0.125, **kw).asm["ir"]
    p = ((a.double() @ b.double()) * 0.125).to(torch.float16).double()
    ref = p @ (c.double().T if tb else c.double())
    assert not torch.isnan(out).any(), "some outputs were never written"
    tol = 2e-2 if acc == T.float16 else 2e-3
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1000, 777), (64, 64), (7, 1)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_chain_loop(shape, dtype):
    """The pipelined two-product loop over ragged column blocks (B's columns and C's rows past N read as 0)."""
    rows, n = shape
    k, n2 = 64, 128
    torch.manual_seed(rows + n)
    a = torch.randn(rows, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    c = torch.randn(n, n2, device="cuda", dtype=dtype)
    out = _poisoned(rows, n2)
    kw = dict(BM=64, BN=64, K=k, N2=n2, num_warps=4)
    ck.chain_loop[(tilejit.cdiv(rows, 64),)](a, b, c, out, 0.125, **kw)
    torch.cuda.synchronize()
    assert "impl = mma_sync_rs_m16n8k16" in ck.chain_loop.compile(a, b, c, out, 0.125, **kw).asm["ir"]
    p = (torch.relu(a.double() @ b.double()) * 0.125).to(dtype).double()
    ref = p @ c.double()
    assert not torch.isnan(out).any(), "some outputs were never written"
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2 * max(ref.abs().max().item(), 1.0))
