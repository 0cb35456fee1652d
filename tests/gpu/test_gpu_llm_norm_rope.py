"""tilejit.ops.rms_norm and tilejit.ops.rotary_embedding on the GPU: forward and backward against the float64
definitions (``reference`` of tilejit/ops/norm.py and tilejit/ops/rotary.py, which the CPU tests use too) over
ragged shapes and every dtype, fresh random inputs, NaN-poisoned outputs, decode positions, and
torch.compile(fullgraph=True)."""
from __future__ import annotations

import pytest
import torch

import tilejit
from tilejit.ops import norm, rotary

pytestmark = pytest.mark.gpu
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (4e-3, 4e-3), torch.bfloat16: (2e-2, 2e-2)}


def _close(got, want, dtype, name, scale=1.0):
    assert not torch.isnan(got).any(), f"{name}: some elements were never written"
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol * scale, msg=lambda m: f"{name}: {m}")


NORM_SHAPES = [(4, 1000, 4096), (3, 77, 1000), (1, 5, 8192), (257, 64), (33, 8191), (2, 3, 2050), (3, 333, 1024),
               (8, 1024, 1024), (1, 1024)]


@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_forward_backward(requires_sm, shape, dtype, residual):
    requires_sm(80)
    torch.manual_seed(hash((shape, residual)) % 1000)
    x, r, dy, ds = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4))
    w = torch.randn(shape[-1], device="cuda", dtype=dtype)
    y, s = (torch.full(shape, float("nan"), device="cuda", dtype=dtype) for _ in range(2))
    rstd = torch.full((x.numel() // shape[-1],), float("nan"), device="cuda")
    norm.rms_norm_forward(x, w, 1e-6, r if residual else None, out=y, residual_out=s, rstd=rstd)
    dx = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
    dweight = torch.full_like(w, float("nan"))
    normalized = s if residual else x
    norm.rms_norm_backward(dy, ds if residual else None, normalized, w, rstd, dx=dx, dweight=dweight)
    x64, w64, r64 = (t.double().requires_grad_() for t in (x, w, r))
    out = norm.reference(x64, w64, 1e-6, r64 if residual else None)
    want_y, want_s = out if residual else (out, None)
    (want_y * dy.double() + (want_s * ds.double() if residual else 0)).sum().backward()
    _close(y, want_y.detach(), dtype, "y")
    if residual:
        _close(s, want_s.detach(), dtype, "s")
        _close(dx, r64.grad, dtype, "dresidual", r64.grad.abs().max().item())
    _close(dx, x64.grad, dtype, "dx", x64.grad.abs().max().item())
    _close(dweight, w64.grad, dtype, "dweight", w64.grad.abs().max().item())


def test_rms_norm_float32_weight_and_many_rows_per_program(requires_sm):
    """bfloat16 rows with a float32 weight (loaded in another layout than x) and more rows than the backward's
    programs times BM, an odd number (ragged last step): every row's dx and every row's share of dweight."""
    requires_sm(80)
    torch.manual_seed(13)
    rows, dim = 20001, 1024
    x, dy = (torch.randn(rows, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(dim, device="cuda", dtype=torch.float32)
    y, _, rstd = norm.rms_norm_forward(x, w, 1e-5)
    dx = torch.full_like(x, float("nan"))
    dweight = torch.full_like(w, float("nan"))
    norm.rms_norm_backward(dy, None, x, w, rstd, dx=dx, dweight=dweight)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    want = norm.reference(x64, w64, 1e-5)
    (want * dy.double()).sum().backward()
    _close(y, want.detach(), torch.bfloat16, "y")
    _close(dx, x64.grad, torch.bfloat16, "dx", x64.grad.abs().max().item())
    _close(dweight, w64.grad, torch.float32, "dweight", w64.grad.abs().max().item())


ROPE_CASES = [(2, 1000, 32, 8, 128), (3, 77, 12, 4, 64), (1, 5, 3, 1, 96), (4, 33, 40, 40, 80), (2, 9, 6, 3, 300),
              (8, 1024, 16, 4, 64), (2, 1001, 16, 4, 64), (3, 130, 2, 1, 16)]


@pytest.mark.parametrize("case", ROPE_CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("positions_dtype", [None, torch.int32, torch.int64], ids=str)
def test_rotary_forward_backward(requires_sm, case, dtype, positions_dtype):
    requires_sm(80)
    batch, seq, q_heads, k_heads, dim = case
    torch.manual_seed(sum(case))
    q = torch.randn(batch, seq, q_heads, dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, seq, k_heads, dim, device="cuda", dtype=dtype)
    angles = torch.randn(seq + 50, dim // 2, device="cuda") * 3
    cos, sin = angles.cos(), angles.sin()
    positions = None if positions_dtype is None else \
        torch.randint(0, seq + 50, (batch, seq), device="cuda", dtype=positions_dtype)
    q_out, k_out = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    rotary.rotary_forward(q, k, cos, sin, positions, q_out=q_out, k_out=k_out)
    want_q, want_k = rotary.reference(q, k, cos, sin, positions)
    _close(q_out, want_q, dtype, "q")
    _close(k_out, want_k, dtype, "k")
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    got_dq, got_dk = rotary.rotary_forward(dq, dk, cos, sin, positions, inverse=True)
    q64, k64 = q.double().requires_grad_(), k.double().requires_grad_()
    a, b = rotary.reference(q64, k64, cos, sin, positions)
    ((a * dq.double()).sum() + (b * dk.double()).sum()).backward()
    _close(got_dq, q64.grad, dtype, "dq")
    _close(got_dk, k64.grad, dtype, "dk")
    in_q, in_k = q.clone(), k.clone()
    got_q, got_k = tilejit.ops.rotary_embedding(in_q, in_k, cos, sin, positions=positions)
    assert got_q is in_q and torch.equal(got_q, q_out) and torch.equal(got_k, k_out)


def test_decode_positions_differ_per_batch_entry(requires_sm):
    """S = 1, each batch entry at its own position (what decoding over a KV cache passes)."""
    requires_sm(80)
    torch.manual_seed(11)
    q = torch.randn(8, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(8, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    angles = torch.randn(4096, 64, device="cuda")
    positions = torch.tensor([[0], [5], [4095], [17], [1000], [3], [2048], [9]], device="cuda", dtype=torch.int32)
    want_q, want_k = rotary.reference(q, k, angles.cos(), angles.sin(), positions)
    got_q, got_k = tilejit.ops.rotary_embedding(q.clone(), k.clone(), angles.cos(), angles.sin(), positions=positions)
    _close(got_q, want_q, torch.bfloat16, "q")
    _close(got_k, want_k, torch.bfloat16, "k")


def test_fullgraph_compile_forward_backward(requires_sm):
    requires_sm(80)
    torch.manual_seed(12)
    dtype = torch.bfloat16
    h, residual = (torch.randn(2, 100, 1024, device="cuda", dtype=dtype) for _ in range(2))
    w = torch.randn(1024, device="cuda", dtype=dtype)
    wq = torch.randn(1024, 1024, device="cuda", dtype=dtype) / 32
    wk = torch.randn(1024, 256, device="cuda", dtype=dtype) / 32
    angles = torch.randn(100, 64, device="cuda")

    def block(h, residual, w, wq):
        x, residual = tilejit.ops.rms_norm(h, w, eps=1e-5, residual=residual)
        q = (x @ wq).view(2, 100, 8, 128)
        k = (x @ wk).view(2, 100, 2, 128)
        q, k = tilejit.ops.rotary_embedding(q, k, angles.cos(), angles.sin())
        return (q.float().sum(2) * k.float().sum(2)).mean() + residual.float().square().mean()

    compiled = torch.compile(block, fullgraph=True)
    leaves = [t.clone().requires_grad_() for t in (h, residual, w, wq)]
    eager_leaves = [t.clone().requires_grad_() for t in (h, residual, w, wq)]
    got = compiled(*leaves)
    want = block(*eager_leaves)
    got.backward()
    want.backward()
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
    for a, b in zip(leaves, eager_leaves):
        scale = b.grad.abs().max().item()
        torch.testing.assert_close(a.grad.float(), b.grad.float(), rtol=2e-2, atol=2e-2 * scale)
