"""tilejit.ops.embedding on the GPU: forward and backward against a float64 torch reference on fresh random inputs,
repeated tokens, ragged token counts and dims, NaN-poisoned outputs, int32 and int64 ids, torch.compile
(fullgraph=True), and a forward replayed in a CUDA graph.

Run on a machine with a GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_embedding.py``.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tilejit
from tilejit.ops import embedding_lookup as emb

pytestmark = pytest.mark.gpu

#: dW's error bound relative to the reference's largest magnitude: float32 sums, then the weight's rounding.
TOL = {torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-5}


def _reference_grad(tokens, d_out, vocab):
    return torch.zeros(vocab, d_out.shape[-1], dtype=torch.float64, device="cuda").index_add_(
        0, tokens.reshape(-1).long(), d_out.reshape(-1, d_out.shape[-1]).double())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape, vocab, dim", [((8, 1024), 256, 1024), ((8192,), 32000, 1024), ((3, 333), 50, 77),
                                               ((1000,), 5, 600), ((17,), 128256, 2048)], ids=lambda v: str(v))
@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
def test_forward_and_backward(dtype, shape, vocab, dim, id_dtype):
    tokens = torch.randint(0, vocab, shape, device="cuda", dtype=id_dtype)
    tokens.view(-1)[: tokens.numel() // 4] = vocab - 1  # a quarter of the tokens repeat one id
    weight = torch.randn(vocab, dim, device="cuda", dtype=dtype)
    out = emb._forward(tokens, weight)
    assert torch.equal(out, F.embedding(tokens.long(), weight))
    d_out = torch.randn(*shape, dim, device="cuda", dtype=dtype)
    flat = tokens.reshape(-1)
    config = emb.launch_config(dim)
    d_weight = torch.zeros(vocab, dim, device="cuda")  # what the kernel adds into (the op's float32 buffer)
    emb.embedding_bwd[emb._grid(flat.numel(), dim, config)](flat, d_out.reshape(-1, dim), d_weight, **config)
    ref = _reference_grad(tokens, d_out, vocab)
    assert (d_weight.double() - ref).abs().max().item() <= 1e-5 * (ref.abs().max().item() + 1)
    leaf = weight.clone().requires_grad_()
    got = tilejit.ops.embedding(tokens, leaf)
    got.backward(d_out)
    assert leaf.grad.dtype == dtype and torch.isfinite(leaf.grad).all()
    err = (leaf.grad.double() - ref).abs().max().item()
    assert err <= TOL[dtype] * (ref.abs().max().item() + 1e-3), err


def test_forward_writes_every_element():
    tokens = torch.randint(0, 1000, (4099,), device="cuda")
    weight = torch.randn(1000, 1031, device="cuda", dtype=torch.bfloat16)
    out = torch.full((4099, 1031), float("nan"), device="cuda", dtype=torch.bfloat16)
    config = emb.launch_config(1031)
    emb.embedding_fwd[emb._grid(4099, 1031, config)](tokens, weight, out, **config)
    assert torch.equal(out, weight[tokens])


def test_under_torch_compile_fullgraph():
    torch._dynamo.reset()

    def step(tokens, weight, proj):
        return (tilejit.ops.embedding(tokens, weight).float() @ proj).square().mean()

    tokens = torch.randint(0, 256, (4, 300), device="cuda")
    weight = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    proj = torch.randn(128, 8, device="cuda", requires_grad=True)
    loss = torch.compile(step, fullgraph=True)(tokens, weight, proj)
    loss.backward()
    w64, p64 = weight.detach().double().requires_grad_(), proj.detach().double().requires_grad_()
    loss64 = (F.embedding(tokens, w64) @ p64).square().mean()
    loss64.backward()
    assert abs(loss.item() - loss64.item()) <= 1e-4 * loss64.item()
    err = (weight.grad.double() - w64.grad).abs().max().item()
    assert err <= TOL[torch.bfloat16] * w64.grad.abs().max().item()


def test_forward_replays_in_a_cuda_graph():
    weight = torch.randn(300, 64, device="cuda", dtype=torch.bfloat16)
    tokens = torch.randint(0, 300, (128,), device="cuda")
    tilejit.ops.embedding(tokens, weight)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tilejit.ops.embedding(tokens, weight)
    tokens.copy_(torch.randint(0, 300, (128,), device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, weight[tokens])
