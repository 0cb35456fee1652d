"""The argument checks of the public entry points of tilejit.ops (tilejit/ops/arg_checks.py and each op's
wrapper), on CPU: a wrong tensor, shape, dtype, device or scalar is refused before anything compiles or launches
with a typed error (ArgumentError, a TypeError; ArgumentValueError, a ValueError) that names the op and the
argument; empty inputs give the result torch gives for the same shapes, without a launch. Most calls take meta
tensors (shapes only: the checks never read a value, so the ops stay capturable in CUDA graphs); the empty and
zero results run on CPU tensors, through the interpreter where a kernel could run."""
from __future__ import annotations

import math

import pytest
import torch

from tilejit import ops
from tilejit.errors import ArgumentError, ArgumentValueError
from tilejit.ops import fused_attention as attention

E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu
SMALL = dict(BM=32, BN=16, num_warps=4)


@pytest.fixture
def interpret(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))


@pytest.fixture
def no_interpreter(monkeypatch):
    monkeypatch.delenv("TILEJIT_INTERPRET", raising=False)


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _refused(error, call, *words):
    """``call()`` raises ``error`` whose message names every one of ``words``; returns the message."""
    with pytest.raises(error) as info:
        call()
    text = str(info.value)
    for word in words:
        assert word in text, (word, text)
    return text


# ----------------------------------------------------------------------------------------------- attention

Q = (2, 4, 64, 32)
KV = (2, 2, 64, 32)


@pytest.mark.parametrize("k_shape, v_shape, words", [
    ((2, 2, 64, 16), (2, 2, 64, 16), ["k and v", "(2, 2, 64, 16)", "head_dim 32"]),  # the fuzzer's case
    (KV, (2, 2, 64, 16), ["k (2, 2, 64, 32)", "v (2, 2, 64, 16)", "one shape"]),
    ((2, 2, 48, 32), (2, 2, 48, 32), ["k and v", "seq 64"]),
    ((3, 2, 64, 32), (3, 2, 64, 32), ["k and v", "batch 2"]),
    ((2, 3, 64, 32), (2, 3, 64, 32), ["query heads 4", "key/value heads 3"]),
])
def test_attention_refuses_keys_and_values_that_do_not_fit_q(k_shape, v_shape, words):
    """k and v of another head dim, sequence length or batch were read out of bounds (zeros): wrong results."""
    _refused(ArgumentValueError, lambda: ops.attention(_meta(*Q), _meta(*k_shape), _meta(*v_shape)), "attention:",
             *words)


@pytest.mark.parametrize("out, words", [
    (_meta(2, 4, 32, 32), ["out", "(2, 4, 64, 32)", "(2, 4, 32, 32)"]),
    (_meta(*Q, dtype=torch.float16), ["out", "bfloat16", "float16"]),
    (torch.empty(*Q, dtype=torch.bfloat16), ["out", "on meta", "on cpu"]),
])
def test_attention_out_must_be_like_q(out, words):
    _refused(ArgumentValueError, lambda: ops.attention(_meta(*Q), _meta(*KV), _meta(*KV), out=out), *words)
    with torch.no_grad():  # the plain forward checks it too
        _refused(ArgumentValueError, lambda: ops.attention_forward(_meta(*Q), _meta(*KV), _meta(*KV), out=out),
                 *words)


def test_attention_refuses_a_3d_q_and_says_the_layout():
    text = _refused(ArgumentValueError, lambda: ops.attention(_meta(4, 64, 32), _meta(2, 64, 32), _meta(2, 64, 32)),
                    "attention: q must be 4-D (batch, heads, seq, head_dim)", "(4, 64, 32)")
    assert "attention_varlen" in text and "decode_attention" in text


@pytest.mark.parametrize("dtypes, words", [
    ((torch.float64,) * 3, ["q is torch.float64", "float16, bfloat16 or float32"]),
    ((torch.int32,) * 3, ["q is torch.int32"]),
    ((torch.float32, torch.float16, torch.float16), ["k is torch.float16 but q is torch.float32", "one dtype"]),
    ((torch.bfloat16, torch.bfloat16, torch.float16), ["v is torch.float16", "one dtype"]),
])
def test_attention_dtypes_are_checked_before_compiling(dtypes, words):
    """float64 or mixed dtypes used to fail inside tilejit's own kernel source."""
    q, k, v = (_meta(*shape, dtype=d) for shape, d in zip((Q, KV, KV), dtypes))
    _refused(ArgumentError, lambda: ops.attention(q, k, v), "attention:", *words)


@pytest.mark.parametrize("dim", [0, 300])
def test_attention_head_dims_from_1_to_256(dim):
    _refused(ArgumentValueError, lambda: ops.attention(_meta(1, 2, 8, dim), _meta(1, 2, 8, dim), _meta(1, 2, 8, dim)),
             "head_dim must be from 1 to 256", str(dim))


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(sm_scale="x"), ArgumentError, ["sm_scale", "str"]),
    (dict(sm_scale=True), ArgumentError, ["sm_scale", "bool"]),
    (dict(sm_scale=math.nan), ArgumentValueError, ["sm_scale must be finite"]),
    (dict(softcap="x"), ArgumentError, ["softcap", "str"]),
    (dict(softcap=-1.0), ArgumentValueError, ["softcap must be a finite number"]),
    (dict(window="x"), ArgumentError, ["window must be (left, right)", "str"]),
    (dict(window=(1, 2, 3)), ArgumentValueError, ["window must be (left, right)"]),
    (dict(lens=[64, 64]), ArgumentError, ["lens must be a torch.Tensor"]),
    (dict(lens=torch.full((2,), 64, dtype=torch.int32)), ArgumentValueError, ["lens is on cpu", "q is on meta"]),
    (dict(out=[0]), ArgumentError, ["out must be a torch.Tensor"]),
    (dict(bwd_config="dq"), ArgumentValueError, ["bwd_config's keys are 'dkdv' and 'dq'"]),
])
def test_attention_scalars_and_optional_tensors(kwargs, error, words):
    _refused(error, lambda: ops.attention(_meta(*Q), _meta(*KV), _meta(*KV), **kwargs), "attention:", *words)


def test_attention_non_tensors_are_argument_errors():
    _refused(ArgumentError, lambda: ops.attention([1.0], _meta(*KV), _meta(*KV)), "attention: q must be a torch.Tensor")
    _refused(ArgumentError, lambda: ops.attention(_meta(*Q), None, _meta(*KV)), "attention: k must be a torch.Tensor")


@pytest.mark.parametrize("name, value, words", [
    ("do", _meta(2, 4, 64, 16), ["do", "(2, 4, 64, 32)", "like q"]),
    ("do", _meta(*Q, dtype=torch.float16), ["do", "float16"]),
    ("lse", _meta(2, 4, 64, dtype=torch.bfloat16), ["lse", "float32 of shape (2, 4, 64)"]),
    ("dk", _meta(3), ["dk", "like k"]),
    ("config", {"dk": {}}, ["config's keys are 'dkdv' and 'dq'"]),  # was a KeyError
])
def test_attention_backward_checks_its_tensors(name, value, words):
    args = dict(do=_meta(*Q), out=_meta(*Q), lse=_meta(2, 4, 64, dtype=torch.float32))
    args[name] = value
    do, out, lse = args.pop("do"), args.pop("out"), args.pop("lse")
    _refused((ArgumentValueError), lambda: ops.attention_backward(do, _meta(*Q), _meta(*KV), _meta(*KV), out, lse,
                                                                  **args), "attention_backward:", *words)


@pytest.mark.parametrize("shape", [(1, 2, 0, 32), (0, 2, 16, 32), (1, 0, 16, 32)], ids=["S=0", "B=0", "H=0"])
def test_attention_of_empty_inputs_is_empty_without_a_launch(no_interpreter, shape):
    """No row, batch entry or head: the empty output SDPA gives, and nothing launched (a CPU tensor without the
    interpreter would refuse a launch); the forward's log-sum-exp and the backward's gradients empty as well."""
    q = torch.randn(shape)
    k = torch.randn(shape[0], 1 if shape[1] else 0, *shape[2:])
    out = ops.attention(q, k, k, causal=True, **SMALL)
    assert out.shape == shape
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, q, q))
    out, lse = ops.attention_forward(q, k, k, **SMALL)
    assert out.shape == shape and lse.shape == shape[:3]
    dq, dk, dv = ops.attention_backward(q, q, k, k, out, lse)
    assert dq.shape == shape and dk.shape == k.shape and not dk.count_nonzero()


def test_attention_of_empty_inputs_differentiates(no_interpreter):
    q, k, v = (torch.randn(1, 2, 0, 32, requires_grad=True) for _ in range(3))
    ops.attention(q, k, v, **SMALL).sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_attention_on_cpu_tensors_needs_the_interpreter(no_interpreter):
    q = torch.randn(1, 2, 8, 32)
    _refused(ArgumentValueError, lambda: ops.attention(q, q, q), "attention: q is on cpu", "runs on CUDA tensors",
             "TILEJIT_INTERPRET=1")


class _Launches:
    """Stands in for a kernel: records the constexprs and options of each launch."""

    def __init__(self):
        self.keywords = []

    def __getitem__(self, grid):
        return lambda *args, **keywords: self.keywords.append(keywords)


@pytest.mark.parametrize("dtype, hopper_config", [(torch.float32, False), (torch.bfloat16, True)])
def test_hopper_defaults_are_for_16_bit_inputs(monkeypatch, dtype, hopper_config):
    """float32 q at head dim 128 took the Hopper default (128 x 128 float32 tiles, a 3-deep ring): 262,656 bytes
    of shared memory, a SharedMemoryError located in tilejit's kernel on an H100/H200. float32 takes the portable
    config, which fits; 16-bit inputs keep the measured Hopper one."""
    launches = _Launches()
    monkeypatch.setattr(attention, "_hopper", lambda t: True)
    monkeypatch.setattr(attention, "attn_fwd", launches)
    q = _meta(1, 2, 256, 128, dtype=dtype)
    attention.attention_forward(q, q, q)
    hopper = attention.default_config(128, False, hopper=True)
    portable = attention.default_config(128, False, hopper=False)
    want = hopper if hopper_config else portable
    assert {key: launches.keywords[0][key] for key in want} == want


# ----------------------------------------------------------------------------------------------- decode

def _decode_args(batch=2, heads=8, dim=64):
    return (_meta(batch, heads, dim, dtype=torch.float16), _meta(10, 16, 2, dim, dtype=torch.float16),
            _meta(10, 16, 2, dim, dtype=torch.float16), _meta(batch, dtype=torch.int32),
            _meta(batch, 4, dtype=torch.int32))


def test_decode_of_an_empty_batch_is_empty(interpret):
    """Batch 0 raised the launcher's grid error (and, planning the split on a GPU, a ZeroDivisionError)."""
    q = torch.randn(0, 4, 32, dtype=torch.float16)
    cache = torch.randn(0, 16, 2, 32, dtype=torch.float16)
    lens = torch.zeros(0, dtype=torch.int32)
    assert ops.decode_attention(q, cache, cache, lens).shape == (0, 4, 32)
    assert ops.decode_attention_forward(q, cache, cache, lens).shape == (0, 4, 32)


@pytest.mark.parametrize("change, error, words", [
    (dict(sm_scale="x"), ArgumentError, ["sm_scale", "str"]),
    (dict(softcap="x"), ArgumentError, ["softcap", "str"]),
    (dict(window="x"), ArgumentError, ["window must be (left, right)"]),
    (dict(dim=0), ArgumentValueError, ["head_dim must be a multiple of 16 from 16 to 256, got 0"]),  # was 1/0
    (dict(q_dtype=torch.float64), ArgumentError, ["q must be float16, bfloat16 or float32"]),
])
def test_decode_checks_are_typed(change, error, words):
    q, k, v, lens, table = _decode_args(dim=change.get("dim", 64))
    if "q_dtype" in change:
        q = q.to(change["q_dtype"])
    keywords = {key: value for key, value in change.items() if key not in ("dim", "q_dtype")}
    _refused(error, lambda: ops.decode_attention(q, k, v, lens, table, **keywords), "decode_attention:", *words)


def test_decode_out_must_be_like_q():
    q, k, v, lens, table = _decode_args()
    _refused(ArgumentValueError, lambda: ops.decode_attention_forward(q, k, v, lens, table, out=_meta(2, 8, 32)),
             "decode_attention_forward: out", "(2, 8, 64)", "(2, 8, 32)")


# ----------------------------------------------------------------------------------------------- varlen, fp8

CU = torch.tensor([0, 3, 8], dtype=torch.int32)


@pytest.mark.parametrize("args, kwargs, error, words", [
    (([0.0], torch.zeros(8, 2, 32), torch.zeros(8, 2, 32)), {}, ArgumentError, ["q must be a torch.Tensor"]),
    ((torch.zeros(8, 4, 32), _meta(8, 2, 32, dtype=torch.float32), _meta(8, 2, 32, dtype=torch.float32)), {},
     ArgumentValueError, ["k is on meta but q is on cpu"]),
    ((torch.zeros(8, 4, 32),) * 3, dict(sm_scale="x"), ArgumentError, ["sm_scale", "str"]),
    ((torch.zeros(8, 4, 32),) * 3, dict(softcap="x"), ArgumentError, ["softcap", "str"]),
])
def test_varlen_checks_are_typed(interpret, args, kwargs, error, words):
    _refused(error, lambda: ops.attention_varlen(*args, CU, CU, 5, 5, **kwargs), "attention_varlen:", *words)


def test_varlen_without_heads_is_empty(no_interpreter):
    out = ops.attention_varlen(torch.zeros(8, 0, 32), torch.zeros(8, 2, 32), torch.zeros(8, 2, 32), CU, CU, 5, 5)
    assert out.shape == (8, 0, 32)


def _fp8_qkv(shape=(1, 2, 16, 32)):
    return (torch.zeros(shape, dtype=E4M3),) * 3


ONE = torch.ones(())


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(sm_scale="x"), ArgumentError, ["sm_scale", "str"]),
    (dict(out_dtype="bf16"), ArgumentError, ["out_dtype must be one of", "bf16"]),
    (dict(out=_meta(1, 2, 16, 32)), ArgumentValueError, ["out must be", "on cpu", "on meta"]),
])
def test_fp8_attention_checks_are_typed(kwargs, error, words):
    _refused(error, lambda: ops.attention_fp8(*_fp8_qkv(), q_scale=ONE, k_scale=ONE, v_scale=ONE, **kwargs),
             "attention_fp8:", *words)
    _refused(ArgumentError, lambda: ops.attention_fp8(None, *_fp8_qkv()[1:], q_scale=ONE, k_scale=ONE, v_scale=ONE),
             "attention_fp8: q must be a torch.Tensor")


@pytest.mark.parametrize("shape", [(1, 2, 0, 32), (0, 2, 16, 32)], ids=["S=0", "B=0"])
def test_fp8_attention_of_empty_inputs_is_empty(no_interpreter, shape):
    out = ops.attention_fp8(*_fp8_qkv(shape), q_scale=ONE, k_scale=ONE, v_scale=ONE)
    assert out.shape == shape and out.dtype == torch.bfloat16


# ----------------------------------------------------------------------------------------------- fp8 products

def _blockscaled(m, n, k, experts=None, device="cpu"):
    kb, nb = -(-k // 128), -(-n // 128)
    lead = (experts,) if experts else ()
    return (torch.zeros(m, k, dtype=E4M3, device=device), torch.ones(m, kb, device=device),
            torch.zeros(*lead, n, k, dtype=E4M3, device=device), torch.ones(*lead, nb, kb, device=device))


@pytest.mark.parametrize("out_dtype, words", [("bf16", ["str", "'bf16'"]), (torch.int32, ["torch.int32"]),
                                              (torch.float8_e4m3fn, ["float8_e4m3fn"])])
def test_blockscaled_out_dtype_is_one_of_the_supported(out_dtype, words):
    """out_dtype="bf16" failed in torch.empty; torch.int32 was accepted."""
    for call in (lambda: ops.fp8_blockscaled_matmul(*_blockscaled(4, 128, 256), out_dtype=out_dtype),
                 lambda: ops.fp8_blockscaled_grouped_matmul(*_blockscaled(4, 128, 256, experts=2),
                                                            torch.tensor([0, 2, 4], dtype=torch.int32),
                                                            out_dtype=out_dtype),
                 lambda: ops.mxfp8_matmul(torch.zeros(4, 64, dtype=E4M3), torch.ones(4, 2).to(E8M0),
                                          torch.zeros(8, 64, dtype=E4M3), torch.ones(8, 2).to(E8M0),
                                          out_dtype=out_dtype)):
        _refused(ArgumentError, call, "out_dtype must be one of torch.bfloat16, torch.float16, torch.float32", *words)


def test_blockscaled_out_and_operands_are_checked():
    a, sa, b, sb = _blockscaled(4, 128, 256)
    _refused(ArgumentValueError, lambda: ops.fp8_blockscaled_matmul(a, sa, b, sb, out=torch.empty(4, 128,
                                                                                                    dtype=torch.int32)),
             "fp8_blockscaled_matmul: out must be bfloat16, float16 or float32 of shape (4, 128)", "torch.int32")
    _refused(ArgumentError, lambda: ops.fp8_blockscaled_matmul([0], sa, b, sb),
             "fp8_blockscaled_matmul: a must be a torch.Tensor")
    _refused(ArgumentValueError, lambda: ops.fp8_blockscaled_matmul(a, sa, b.to("meta"), sb.to("meta")),
             "fp8_blockscaled_matmul: b is on meta but a is on cpu")
    a, sa, b, sb = _blockscaled(4, 128, 256, experts=2)
    _refused(ArgumentValueError, lambda: ops.fp8_blockscaled_grouped_matmul(
        a, sa, b, sb, _meta(3, dtype=torch.int32)), "group_offsets is on meta but a is on cpu")
    _refused(ArgumentError, lambda: ops.mxfp8_matmul(None, sa, b, sb), "mxfp8_matmul: a must be a torch.Tensor")


@pytest.mark.parametrize("m, n, k", [(0, 128, 256), (4, 0, 256), (4, 128, 0)], ids=["M=0", "N=0", "K=0"])
def test_blockscaled_products_of_empty_operands(no_interpreter, m, n, k):
    """M or N of 0: an empty product (the launcher's grid error before); K = 0: zeros, as torch.mm gives. No launch
    (CPU tensors without the interpreter)."""
    out = ops.fp8_blockscaled_matmul(*_blockscaled(m, n, k), out_dtype=torch.float32)
    assert out.shape == (m, n) and not out.count_nonzero()
    out = torch.full((m, n), math.nan)
    ops.fp8_blockscaled_matmul(*_blockscaled(m, n, k), out=out)
    assert not out.count_nonzero()
    kb = -(-k // 32)
    out = ops.mxfp8_matmul(torch.zeros(m, k, dtype=E4M3), torch.ones(m, kb).to(E8M0), torch.zeros(n, k, dtype=E4M3),
                           torch.ones(n, kb).to(E8M0), out_dtype=torch.float32)
    assert out.shape == (m, n) and not out.count_nonzero()


def test_grouped_product_without_rows_or_columns(no_interpreter):
    offsets = torch.zeros(3, dtype=torch.int32)
    assert ops.fp8_blockscaled_grouped_matmul(*_blockscaled(0, 128, 256, experts=2), offsets).shape == (0, 128)
    assert ops.fp8_blockscaled_grouped_matmul(*_blockscaled(4, 0, 256, experts=2), offsets).shape == (4, 0)


# ----------------------------------------------------------------------------------------------- linear ops

@pytest.mark.parametrize("call, arg", [
    (lambda x, w: ops.linear(x, w), "x"),
    (lambda x, w: ops.swiglu_linear(x, w, w), "x"),
    (lambda x, w: ops.linear_cross_entropy(x, w, torch.zeros(4, dtype=torch.int64)), "h"),
], ids=["linear", "swiglu_linear", "linear_cross_entropy"])
def test_linear_ops_on_cpu_tensors_say_they_need_cuda(no_interpreter, call, arg):
    """They said 'pass arch=' (from compiling for autotuning), which no op takes."""
    text = _refused(ArgumentValueError, lambda: call(torch.randn(4, 8), torch.randn(6, 8)), f"{arg} is on cpu",
                    "runs on CUDA tensors", "TILEJIT_INTERPRET=1")
    assert "arch" not in text


@pytest.mark.parametrize("lead", [(4,), (2, 3)])
def test_linear_with_k_0_gives_zeros(no_interpreter, lead):
    """x (..., 0) @ weight (N, 0).T: zeros, as torch.nn.functional.linear (a raw reshape error before), and zero
    gradients; swiglu_linear's silu(0) * 0 too."""
    x = torch.randn(*lead, 0, requires_grad=True)
    w = torch.randn(6, 0, requires_grad=True)
    y = ops.linear(x, w)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w))
    y.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
    assert ops.swiglu_linear(x.detach(), w.detach(), w.detach()).shape == (*lead, 6)
    assert not ops.swiglu_linear(x.detach(), w.detach(), w.detach()).count_nonzero()


# ----------------------------------------------------------------------------------------------- the others

@pytest.mark.parametrize("call, words", [
    (lambda: ops.rms_norm(torch.randn(3, 64), torch.randn(64)), ["rms_norm: x is on cpu"]),
    (lambda: ops.rotary_embedding(torch.randn(1, 4, 2, 16), torch.randn(1, 4, 2, 16), torch.randn(8, 8),
                                  torch.randn(8, 8)), ["rotary_embedding: q is on cpu"]),
    (lambda: ops.embedding(torch.tensor([1, 2]), torch.randn(5, 8)), ["embedding: weight is on cpu"]),
    (lambda: ops.fp8_blockscaled_matmul(*_blockscaled(4, 128, 256)), ["fp8_blockscaled_matmul: a is on cpu"]),
    (lambda: ops.attention_fp8(*_fp8_qkv(), q_scale=ONE, k_scale=ONE, v_scale=ONE), ["attention_fp8: q is on cpu"]),
    (lambda: ops.attention_varlen(*(torch.zeros(8, 2, 32),) * 3, CU, CU, 5, 5), ["attention_varlen: q is on cpu"]),
], ids=["rms_norm", "rotary_embedding", "embedding", "fp8_blockscaled_matmul", "attention_fp8", "attention_varlen"])
def test_every_op_names_itself_when_given_cpu_tensors(no_interpreter, call, words):
    """The launcher's message named the kernel's parameter ('Q', 'X', 'Tokens'), not the op's argument."""
    _refused(ArgumentValueError, call, *words, "runs on CUDA tensors")


def test_norm_and_rotary_errors_are_typed():
    x, w = torch.randn(3, 64), torch.randn(64)
    _refused(ArgumentError, lambda: ops.rms_norm(x, w, eps="x"), "rms_norm: eps must be a number", "str")
    _refused(ArgumentValueError, lambda: ops.rms_norm(x, torch.randn(63)), "rms_norm: weight must have shape (64,)")
    q = torch.randn(4, 2, 16)
    _refused(ArgumentValueError, lambda: ops.rotary_embedding(q, q, torch.randn(8, 8), torch.randn(8, 8)),
             "rotary_embedding: q and k must be (B, S, H, D)")


def test_config_keys_are_argument_value_errors():
    _refused(ArgumentValueError, lambda: ops.attention(_meta(*Q), _meta(*KV), _meta(*KV), BQ=64),
             "unknown config key", "BQ")
    _refused(ArgumentValueError, lambda: ops.fp8_blockscaled_matmul(*_blockscaled(4, 128, 256), BN=96),
             "BN must divide 128")


def test_the_shared_checks_read_no_values():
    """Every check above ran on meta tensors somewhere: here the whole padded-attention check, on tensors that
    have no data, returns the GQA group."""
    from tilejit.ops import arg_checks

    assert arg_checks.attention_operands("attention", _meta(*Q), _meta(*KV), _meta(*KV)) == 2
    assert arg_checks.attention_operands("attention", _meta(1, 0, 8, 32), _meta(1, 0, 8, 32), _meta(1, 0, 8, 32)) == 1

