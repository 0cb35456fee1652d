"""tilejit.ops.embedding on the GPU: forward and backward against a float64 torch reference on fresh random inputs,
repeated tokens, ragged token counts and dims, NaN-poisoned outputs, int32 and int64 ids, torch.compile
(fullgraph=True), a forward replayed in a CUDA graph; both backwards (the one-hot GEMM into NaN-poisoned dW, the
atomic kernel into a zeroed one) against float64 on ragged shapes with repeated and out-of-range ids, the example
model's V = 256, D = 1024, N = 8192 + 37 among them, and the path the op takes.

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


#: (tokens, vocab, dim): the example model's step with a ragged tail, ragged V and D, a vocabulary at the bound.
ONEHOT_SHAPES = [(8192 + 37, 256, 1024), (1000, 5, 600), (999, 50, 77), (4099, 1024, 130), (3, 300, 2048)]


def _tokens(n, vocab, id_dtype):
    tokens = torch.randint(0, vocab, (n,), device="cuda", dtype=id_dtype)
    tokens[: n // 4] = vocab - 1  # a quarter of the tokens repeat one id, in the last row tile
    bad = torch.tensor([-1, vocab, vocab + 77, -vocab], device="cuda", dtype=id_dtype)[: max(0, n - n // 4)]
    tokens[n // 4: n // 4 + bad.numel()] = bad  # ids outside [0, V) add nothing
    return tokens


def _reference_valid(tokens, d_out, vocab):
    valid = (tokens >= 0) & (tokens < vocab)
    return _reference_grad(tokens[valid], d_out[valid], vocab)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n, vocab, dim", ONEHOT_SHAPES, ids=str)
@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
def test_onehot_gemm_backward_against_float64(dtype, n, vocab, dim, id_dtype):
    tokens = _tokens(n, vocab, id_dtype)
    d_out = torch.randn(n, dim, device="cuda", dtype=dtype)
    ref = _reference_valid(tokens, d_out, vocab)
    config = emb.onehot_launch_config(vocab, dim)
    grid = (tilejit.cdiv(vocab, config["BV"]), tilejit.cdiv(dim, config["BD"]))
    d_weight = torch.full((vocab, dim), float("nan"), device="cuda")  # float32: the sums before any rounding
    emb.embedding_bwd_onehot[grid](tokens, d_out, d_weight, **config)
    assert torch.isfinite(d_weight).all()
    # exact products, float32 sums; the tensor cores' adds may truncate where the atomic kernel's round, so the
    # bound is looser than its 1e-5 (a token lost or added would be off by ~1, far past it)
    assert (d_weight.double() - ref).abs().max().item() <= 4e-5 * (ref.abs().max().item() + 1)
    again = torch.full_like(d_weight, float("nan"))
    emb.embedding_bwd_onehot[grid](tokens, d_out, again, **config)
    assert torch.equal(again, d_weight)  # no atomics: the same bits every run
    out16 = torch.full((vocab, dim), float("nan"), device="cuda", dtype=dtype)
    emb.embedding_bwd_onehot[grid](tokens, d_out, out16, **config)
    assert torch.equal(out16, d_weight.to(dtype))  # the store rounds the float32 sums once


@pytest.mark.parametrize("dtype, vocab, path", [(torch.bfloat16, 256, "onehot"), (torch.float16, 1024, "onehot"),
                                                (torch.bfloat16, 1025, "atomic"), (torch.float32, 256, "atomic")])
def test_both_backward_paths_against_float64(dtype, vocab, path):
    assert emb.uses_onehot_gemm(vocab, dtype) == (path == "onehot")
    n, dim = 8192 + 37, 1000
    tokens = _tokens(n, vocab, torch.int64).view(3, -1)  # 8229 = 3 x 2743 tokens
    weight = torch.randn(vocab, dim, device="cuda", dtype=dtype, requires_grad=True)
    d_out = torch.randn(*tokens.shape, dim, device="cuda", dtype=dtype)
    tilejit.ops.embedding(tokens, weight).backward(d_out)
    ref = _reference_valid(tokens.reshape(-1), d_out.reshape(-1, dim), vocab)
    assert weight.grad.dtype == dtype and torch.isfinite(weight.grad).all()
    err = (weight.grad.double() - ref).abs().max().item()
    assert err <= TOL[dtype] * (ref.abs().max().item() + 1e-3), err
    if path == "atomic":  # the atomic kernel itself, into the zeroed float32 buffer it adds to
        config = emb.launch_config(dim)
        flat = tokens.reshape(-1)
        d_weight = torch.zeros(vocab, dim, device="cuda")
        emb.embedding_bwd[emb._grid(flat.numel(), dim, config)](flat, d_out.reshape(-1, dim), d_weight, **config)
        assert (d_weight.double() - ref).abs().max().item() <= 1e-5 * (ref.abs().max().item() + 1)
