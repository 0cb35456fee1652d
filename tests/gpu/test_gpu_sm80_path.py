"""The sm_80 path run whole on a Hopper GPU: ``TILEJIT_GEMM_LOWERING=mma_sync_m16n8k16`` with
``TILEJIT_COPY_LOWERING=cp_async`` compiles an sm_90a kernel whose main loop is the one an A100 runs (cp.async
ring, ldmatrix, mma.sync), and with the gemm pinned alone the loop reads TMA-filled slots with mma.sync.

Each case compares with a float64 reference on fresh random operands, the output poisoned with NaN, on shapes
that are not multiples of the tile (K not a multiple of 8 too, which takes the element-wise copies). The configs
cover the ways the loop is built: fragments carried across iterations (``lower_loops.FragmentCarry``: cp.async
rings of 3+ stages, an even number of k steps, rows of whole 16-byte chunks), and not (2 stages, one k step per
iteration, ragged rows, TMA-filled slots);
the default autotune configs of 16-bit operands; every operand major-ness; a fused epilogue.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import tilejit
from attention_checks import check, check_grad, inputs, reference_grads
from kernels import MAJORS, bmm_epilogue, matmul, matmul_any, matmul_staged
from tilejit.configs import matmul_configs

_spec = importlib.util.spec_from_file_location(
    "tilejit_ops_attention_sm80", Path(__file__).resolve().parents[2] / "tilejit" / "ops" / "fused_attention.py")
attention = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(attention)

pytestmark = pytest.mark.gpu

PATHS = {"cp_async": {"TILEJIT_GEMM_LOWERING": "mma_sync_m16n8k16", "TILEJIT_COPY_LOWERING": "cp_async"},
         "tma": {"TILEJIT_GEMM_LOWERING": "mma_sync_m16n8k16"}}
SHAPES = [(1, 8, 16), (77, 130, 45), (200, 150, 100), (257, 383, 517), (512, 640, 1000), (130, 260, 4100)]
# (BM, BN, BK, num_warps, num_stages): BK=16 has one k step (nothing to carry), s2 keeps cp.async rings plain
CONFIGS = [(128, 128, 64, 4, 3), (128, 256, 64, 8, 3), (64, 64, 32, 4, 2), (64, 128, 32, 4, 4), (128, 128, 32, 4, 4),
           (64, 64, 16, 4, 3), (256, 128, 32, 8, 3)]
DEFAULT_16BIT = sorted({(c.kwargs["BM"], c.kwargs["BN"], c.kwargs["BK"], c.num_warps, c.num_stages)
                        for c in matmul_configs() if c.split_k == 1 and not c.options.sm90a_only})


@pytest.fixture(params=sorted(PATHS))
def path(request, monkeypatch):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the sm_80 path is measured through sm_90a compiles here (an sm_80 cubin loads on sm_80 only)")
    for name, value in PATHS[request.param].items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TILEJIT_INTERPRET", raising=False)
    return request.param


def _operands(m, n, k, dtype, seed):
    torch.manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    return a, b, c


def _check(c, ref, k):
    assert not torch.isnan(c).any(), "an output element was left unwritten"
    err = (c.double() - ref).abs().max().item()
    assert err <= 2e-2 * k ** 0.5 + 1e-2 * ref.abs().max().item(), err


def _launch(kernel, a, b, c, bm, bn, bk, warps, stages):
    m, n = c.shape
    kernel[(tilejit.cdiv(m, bm), tilejit.cdiv(n, bn))](a, b, c, BM=bm, BN=bn, BK=bk, num_warps=warps,
                                                       num_stages=stages)


def _ir_and_cuda(kernel, a, b, c, bm, bn, bk, warps, stages):
    compiled = kernel.compile(a, b, c, BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages)
    return compiled.asm["ir"], compiled.asm["cuda"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "{}x{}x{}w{}s{}".format(*c))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matmul(path, shape, config, dtype):
    m, n, k = shape
    a, b, c = _operands(m, n, k, dtype, seed=m * 7 + k)
    _launch(matmul_staged, a, b, c, *config)
    torch.cuda.synchronize()
    _check(c, a.double() @ b.double(), k)
    ir, cuda = _ir_and_cuda(matmul_staged, a, b, c, *config)
    assert "impl = mma_sync_m16n8k16" in ir
    if path == "cp_async":
        assert "tj_tma_load" not in cuda
    steps, stages = config[2] // 16, config[4]
    carried = "the gemm's fragments live across iterations" in cuda
    # the carry: cp.async rings of 3+ stages, an even number of k steps, rows of whole 16-byte chunks
    assert carried == (path == "cp_async" and steps >= 2 and steps % 2 == 0 and stages >= 3 and k % 8 == 0
                       and n % 8 == 0)


@pytest.mark.parametrize("config", DEFAULT_16BIT, ids=lambda c: "{}x{}x{}w{}s{}".format(*c))
def test_default_configs(path, config):
    """Every plain config of the default autotune space, on a ragged shape that is several tiles each way."""
    m, n, k = 333, 555, 777
    a, b, c = _operands(m, n, k, torch.bfloat16, seed=3)
    _launch(matmul_staged, a, b, c, *config)
    torch.cuda.synchronize()
    _check(c, a.double() @ b.double(), k)


@pytest.mark.parametrize("major", sorted(MAJORS))
@pytest.mark.parametrize("shape", [(77, 130, 96), (257, 200, 300)], ids=lambda s: "x".join(map(str, s)))
def test_every_major(path, shape, major):
    m, n, k = shape
    ta, tb = MAJORS[major]
    torch.manual_seed(m + n)
    a = torch.randn(k, m, device="cuda", dtype=torch.float16) if ta else torch.randn(m, k, device="cuda",
                                                                                       dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16) if tb else torch.randn(k, n, device="cuda",
                                                                                       dtype=torch.float16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    matmul_any[(tilejit.cdiv(m, 64), tilejit.cdiv(n, 64))](a, b, c, BM=64, BN=64, BK=32, TA=ta, TB=tb,
                                                          ACC=tilejit.language.float32, num_warps=4)
    torch.cuda.synchronize()
    ref = (a.double().T if ta else a.double()) @ (b.double().T if tb else b.double())
    _check(c, ref, k)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim", sorted(attention.SM80_BWD_CONFIGS))
def test_attention_backward_sm80_defaults(path, dim, causal):
    """The backward's sm_80 defaults (``SM80_BWD_CONFIGS``) and the forward's non-Hopper default, 300 rows (not
    a multiple of any block), GQA 2, against float64 autograd; every output poisoned first."""
    q, k, v = inputs(2, 4, 300, dim, group=2, seed=dim)
    do = torch.randn_like(q)
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device=q.device)
    attention.attention_forward(q, k, v, causal=causal, out=out, lse=lse, **attention.default_config(dim))
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    attention.attention_backward(do, q, k, v, out, lse, causal=causal, dq=grads[0], dk=grads[1], dv=grads[2],
                                 config=attention.default_bwd_config(dim, sm80=True))
    torch.cuda.synchronize()
    ref = reference_grads(attention.reference, q, k, v, do, causal)
    check(out, ref[0])
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref[1:]):
        check_grad(got, want, name)


def test_design_matmul_and_fused_epilogue(path):
    """The DESIGN matmul (3 stages) and a batched matmul with scale, bias and relu after its loop (2 stages)."""
    m, n, k = 300, 260, 520
    a, b, c = _operands(m, n, k, torch.float16, seed=11)
    _launch(matmul, a, b, c, 128, 128, 32, 4, 3)
    torch.cuda.synchronize()
    _check(c, a.double() @ b.double(), k)
    torch.manual_seed(12)
    batch = 3
    a = torch.randn(batch, m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(batch, k, n, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    c = torch.full((batch, m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    bmm_epilogue[(tilejit.cdiv(m, 64), tilejit.cdiv(n, 64), batch)](a, b, bias, c, 0.5, BM=64, BN=64, BK=32,
                                                                     num_warps=4)
    torch.cuda.synchronize()
    ref = torch.relu(0.5 * (a.double() @ b.double()) + bias.double())
    _check(c, ref, k)
