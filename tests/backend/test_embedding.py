"""tilejit.ops.embedding (tilejit/ops/embedding_lookup.py): forward and backward through the interpreter against torch
(repeated tokens, ragged token counts and dims, int32 and int64 ids), NaN-poisoned outputs, ids out of range,
torch.compile(fullgraph=True), typed errors, and the kernels compiled for sm_80, sm_90a and sm_100a; the one-hot
GEMM backward against float64 (ragged N, V and D, repeated and out-of-range ids, float16 and bfloat16), the rule
that picks it, and its tensor-core instructions."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import tilejit
from tilejit.backend_cuda.nvrtc import nvrtc_supports
from tilejit.ops import embedding_lookup as emb

ARCHS = [a for a in ("sm_80", "sm_90a", "sm_100a") if nvrtc_supports(a)]


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


CASES = [((37,), 11, 20, torch.float32, torch.int64), ((3, 7), 5, 33, torch.bfloat16, torch.int32),
         ((2, 1, 9), 40, 16, torch.float16, torch.int64)]


@pytest.mark.parametrize("shape, vocab, dim, dtype, id_dtype", CASES)
def test_forward_and_backward_match_torch(interpret, shape, vocab, dim, dtype, id_dtype):
    torch.manual_seed(0)
    tokens = torch.randint(0, vocab, shape, dtype=id_dtype)
    tokens.view(-1)[:3] = vocab - 1  # repeated on purpose, and the last row
    weight = torch.randn(vocab, dim, dtype=dtype, requires_grad=True)
    out = tilejit.ops.embedding(tokens, weight)
    d_out = torch.randn(out.shape, dtype=dtype)
    out.backward(d_out)
    assert out.shape == (*shape, dim) and out.dtype == dtype
    assert torch.equal(out, F.embedding(tokens.long(), weight.detach()))
    w64 = weight.detach().double().requires_grad_()
    F.embedding(tokens.long(), w64).backward(d_out.double())
    assert weight.grad.dtype == dtype
    torch.testing.assert_close(weight.grad.double(), w64.grad, rtol=1e-2 if dtype != torch.float32 else 1e-6,
                               atol=1e-2 if dtype != torch.float32 else 1e-6)
    assert torch.all(weight.grad[vocab - 1] != 0)


def test_kernels_write_every_element_and_add_repeats(interpret):
    torch.manual_seed(1)
    tokens = torch.tensor([4, 4, 4, 0, 2, 4, 1, 0, 3, 4, 2])   # 11 ids, 8 a program: a ragged second program
    weight = torch.randn(5, 21)
    config = emb.launch_config(21)
    out = torch.full((11, 21), float("nan"))
    emb.embedding_fwd[emb._grid(11, 21, config)](tokens, weight, out, **config)
    assert torch.equal(out, weight[tokens])
    d_out = torch.randn(11, 21)
    d_weight = torch.zeros(5, 21)
    emb.embedding_bwd[emb._grid(11, 21, config)](tokens, d_out, d_weight, **config)
    expected = torch.zeros(5, 21, dtype=torch.float64).index_add_(0, tokens, d_out.double())
    torch.testing.assert_close(d_weight.double(), expected)
    assert d_weight[4].double().sub(d_out[tokens == 4].double().sum(0)).abs().max() < 1e-5


def test_ids_out_of_range_read_zeros_and_add_nothing(interpret):
    weight = torch.randn(6, 8, requires_grad=True)
    tokens = torch.tensor([1, 6, -1, 1])
    out = tilejit.ops.embedding(tokens, weight)
    assert torch.all(out[1:3] == 0) and torch.equal(out[0], weight[1].detach())
    out.sum().backward()
    assert torch.equal(weight.grad.sum(1), torch.tensor([0.0, 16.0, 0, 0, 0, 0]))


def test_no_tokens(interpret):
    weight = torch.randn(6, 8, requires_grad=True)
    out = tilejit.ops.embedding(torch.empty(0, 3, dtype=torch.int64), weight)
    assert out.shape == (0, 3, 8)
    out.sum().backward()
    assert torch.equal(weight.grad, torch.zeros(6, 8))


def test_under_torch_compile_fullgraph(interpret):
    torch.manual_seed(2)

    def step(tokens, weight, proj):
        return (tilejit.ops.embedding(tokens, weight) @ proj).square().mean()

    tokens = torch.randint(0, 9, (2, 7))
    tokens[0, :4] = 3
    leaves = [torch.randn(9, 16, requires_grad=True), torch.randn(16, 4, requires_grad=True)]
    compiled = torch.compile(step, fullgraph=True)
    loss = compiled(tokens, *leaves)
    loss.backward()
    grads = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    eager = step(tokens, *leaves)
    eager.backward()
    torch.testing.assert_close(loss, eager)
    for got, t in zip(grads, leaves):
        torch.testing.assert_close(got, t.grad)
    w64, p64 = (t.detach().double().requires_grad_() for t in leaves)
    (F.embedding(tokens, w64) @ p64).square().mean().backward()
    torch.testing.assert_close(grads[0].double(), w64.grad, rtol=1e-5, atol=1e-6)


def test_errors_are_typed_and_say_what_to_fix():
    weight = torch.randn(6, 8)
    with pytest.raises(TypeError, match="tokens are torch.float32; pass int32 or int64 token ids"):
        tilejit.ops.embedding(torch.zeros(3), weight)
    with pytest.raises(TypeError, match="weight is torch.int32; the kernels take float16, bfloat16 or float32"):
        tilejit.ops.embedding(torch.zeros(3, dtype=torch.int64), weight.int())
    with pytest.raises(ValueError, match=r"weight must be 2-D \(num_embeddings, dim\), got shape \(48,\)"):
        tilejit.ops.embedding(torch.zeros(3, dtype=torch.int64), weight.view(-1))
    with pytest.raises(TypeError, match="tokens and weight must be tensors, got list and Tensor"):
        tilejit.ops.embedding([1, 2], weight)
    for error in (tilejit.errors.UsageTypeError, tilejit.errors.UsageValueError):
        assert issubclass(error, tilejit.errors.TilejitError)


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_kernels_compile(fresh_compile_cache, arch, id_dtype):
    config = emb.launch_config(1024)
    tokens = _meta(8192, dtype=id_dtype)
    forward = emb.embedding_fwd.compile(tokens, _meta(32000, 1024), _meta(8192, 1024), arch=arch, **config)
    backward = emb.embedding_bwd.compile(tokens, _meta(8192, 1024), _meta(32000, 1024, dtype=torch.float32),
                                         arch=arch, **config)
    for compiled in (forward, backward):
        assert compiled.asm["cubin"][:4] == b"\x7fELF" and compiled.meta["spills"] == 0, compiled.meta
    assert "red." in backward.asm["ptx"] or "atom." in backward.asm["ptx"]


def _onehot_reference(tokens, d_out, vocab):
    """float64 dW of the first len(tokens) rows of d_out, ids outside [0, vocab) skipped."""
    rows = d_out[:tokens.shape[0]].double()
    valid = (tokens >= 0) & (tokens < vocab)
    return torch.zeros(vocab, d_out.shape[1], dtype=torch.float64).index_add_(0, tokens[valid].long(), rows[valid])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_onehot_gemm_matches_float64(interpret, dtype, id_dtype):
    torch.manual_seed(3)
    vocab, dim, n = 37, 50, 103   # 16x16 tiles of dW, 8 tokens a k step: every extent ragged
    tokens = torch.randint(0, vocab, (n,), dtype=id_dtype)
    tokens[:20] = 33                                       # repeated, and in the last row tile
    tokens[20:26] = torch.tensor([-1, -7, vocab, vocab + 3, 47, 2 ** 30], dtype=id_dtype)  # add nothing
    if id_dtype == torch.int64:   # ids that a cast to int32 would wrap onto rows 33 and 2
        tokens[26:28] = torch.tensor([2 ** 32 + 33, 2 - 2 ** 32])
    d_out = torch.randn(n + 5, dim, dtype=dtype)  # rows past n are real numbers: tokens past n must not add them
    config = emb.onehot_launch_config(vocab, dim)
    d_weight = torch.full((vocab, dim), float("nan"))
    grid = (tilejit.cdiv(vocab, config["BV"]), tilejit.cdiv(dim, config["BD"]))
    emb.embedding_bwd_onehot[grid](tokens, d_out, d_weight, **config)
    ref = _onehot_reference(tokens, d_out, vocab)
    assert torch.isfinite(d_weight).all()
    torch.testing.assert_close(d_weight.double(), ref, rtol=1e-6, atol=1e-5)
    assert torch.all(d_weight[0] == ref[0].float()) and torch.all(d_weight[33] != 0)
    got = emb._backward(d_out[:n], tokens, torch.empty(vocab, dim, dtype=dtype))  # the op's path: weight's dtype
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), ref, rtol=1e-2, atol=1e-2)


def test_onehot_gemm_rule():
    assert emb.uses_onehot_gemm(256, torch.bfloat16) and emb.uses_onehot_gemm(1024, torch.float16)
    assert not emb.uses_onehot_gemm(1025, torch.bfloat16)
    assert not emb.uses_onehot_gemm(256, torch.float32)   # tf32 products would round float32 dOut


class _Recorder:
    """Stands in for a kernel: records that it was launched, then launches it."""

    def __init__(self, kernel, launched: list, name: str):
        self.kernel, self.launched, self.name = kernel, launched, name

    def __getitem__(self, grid):
        self.launched.append(self.name)
        return self.kernel[grid]


@pytest.mark.parametrize("vocab, dtype, path", [(300, torch.bfloat16, "onehot"), (1024, torch.float16, "onehot"),
                                                (1025, torch.bfloat16, "atomic"), (300, torch.float32, "atomic")])
def test_backward_takes_the_path_the_rule_names(interpret, monkeypatch, vocab, dtype, path):
    launched = []
    monkeypatch.setattr(emb, "embedding_bwd_onehot", _Recorder(emb.embedding_bwd_onehot, launched, "onehot"))
    monkeypatch.setattr(emb, "embedding_bwd", _Recorder(emb.embedding_bwd, launched, "atomic"))
    torch.manual_seed(4)
    tokens = torch.randint(0, vocab, (2, 9))
    weight = torch.randn(vocab, 12, dtype=dtype, requires_grad=True)
    d_out = torch.randn(2, 9, 12, dtype=dtype)
    tilejit.ops.embedding(tokens, weight).backward(d_out)
    assert launched == [path]
    ref = _onehot_reference(tokens.view(-1), d_out.view(-1, 12), vocab)
    torch.testing.assert_close(weight.grad.double(), ref, rtol=1e-2 if dtype != torch.float32 else 1e-6,
                               atol=1e-2 if dtype != torch.float32 else 1e-6)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_onehot_gemm_compiles_to_tensor_cores(fresh_compile_cache, arch, dtype):
    config = emb.onehot_launch_config(256, 1024)
    assert (config["BV"], config["BD"], config["BK"]) == (64, 32, 64)   # 4 x 32 = 128 programs for the example
    compiled = emb.embedding_bwd_onehot.compile(_meta(8192 + 37, dtype=torch.int64), _meta(8192 + 37, 1024, dtype=dtype),
                                                _meta(256, 1024, dtype=dtype), arch=arch, **config)
    assert compiled.asm["cubin"][:4] == b"\x7fELF" and compiled.meta["spills"] == 0, compiled.meta
    ptx = compiled.asm["ptx"]
    assert not re.search(r"^\s*(red|atom)\.", ptx, re.M)   # written once: no atomics
    expected = {"sm_80": "mma.sync.aligned.m16n8k16", "sm_90a": "wgmma.mma_async", "sm_100a": None}[arch]
    if expected is None:
        assert "tcgen05.mma" in ptx or "mma.sync.aligned" in ptx
    else:
        assert expected in ptx
