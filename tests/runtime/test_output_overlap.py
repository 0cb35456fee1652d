"""Outputs (the tensors a kernel writes) whose elements share memory, or that require grad while autograd
records, are refused with an error naming the argument: by the interpreter at the kernel's line, and by a launch
before the kernel runs (the GPU half is tests/gpu/test_runtime_gpu.py). Inputs may be either."""
from __future__ import annotations

import types

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit.errors import ArgumentValueError, TilejitError


@tilejit.kernel
def double(X, Z, BLOCK: T.constexpr):
    i = T.program_id(0) * BLOCK
    Z[i:i + BLOCK] = X[i:i + BLOCK] * 2


@tilejit.kernel
def count(X, Hits, BLOCK: T.constexpr):
    i = T.program_id(0) * BLOCK
    T.atomic_add(Hits[0], T.sum(X[i:i + BLOCK]), sem="relaxed")


@tilejit.kernel
def scatter_items(X, Ys, BLOCK: T.constexpr):
    for g in T.static_range(2):
        Ys[g][0:BLOCK] = X[0:BLOCK] + g


STORE_LINE = double.fn.__code__.co_firstlineno + 3


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


def test_the_ir_knows_which_parameters_are_written():
    x = torch.zeros(16)
    assert list(double.build_ir(double.bind((x, x), {"BLOCK": 16})).writers()) == ["Z"]
    assert list(count.build_ir(count.bind((x, x), {"BLOCK": 16})).writers()) == ["Hits"]
    assert list(scatter_items.build_ir(scatter_items.bind((x, [x, x]), {"BLOCK": 16})).writers()) == ["Ys"]


def test_a_compiled_kernel_records_what_it_writes():
    x = torch.zeros(16)
    assert double.compile(x, x, BLOCK=16, arch="sm_90a").written == ("Z",)


def test_the_interpreter_refuses_an_expanded_output_at_the_store(interpret):
    x = torch.randn(16)
    with pytest.raises(TilejitError, match="output 'Z' has stride 0 in dimension 0 over 16 elements") as info:
        double[(1,)](x, torch.zeros(1).expand(16), BLOCK=16)
    assert f":{STORE_LINE}:" in str(info.value) and "^" in str(info.value)


def test_the_interpreter_refuses_an_output_that_requires_grad_unless_grad_is_off(interpret):
    x = torch.randn(16)
    z = torch.zeros(16, requires_grad=True)
    with pytest.raises(TilejitError, match="output 'Z' requires grad"):
        double[(1,)](x, z, BLOCK=16)
    with torch.no_grad():
        double[(1,)](x, z, BLOCK=16)
    assert torch.equal(z.detach(), x * 2)


def test_an_input_may_share_memory_or_require_grad(interpret):
    z = torch.zeros(16)
    double[(1,)](torch.ones(1, requires_grad=True).expand(16), z, BLOCK=16)
    assert torch.equal(z, torch.full((16,), 2.0))


def test_atomics_and_tensor_list_items_are_outputs(interpret):
    x = torch.ones(16)
    with pytest.raises(TilejitError, match="output 'Hits' has stride 0"):
        count[(1,)](x, torch.zeros(1).expand(4), BLOCK=16)
    with pytest.raises(TilejitError, match=r"output 'Ys\[1\]' has stride 0"):
        scatter_items[(1,)](x, [torch.zeros(16), torch.zeros(1).expand(16)], BLOCK=16)


def test_an_empty_or_single_element_stride_0_output_shares_nothing(interpret):
    x = torch.randn(16)
    double[(1,)](x[:0], torch.zeros(1).expand(0), BLOCK=16)
    z = torch.zeros(1).as_strided((1,), (0,))
    double[(1,)](x[:1], z, BLOCK=16)
    assert z.item() == x[0].item() * 2


def _bound(kernel, args, kwargs):
    call = kernel.bind(args, dict(kwargs))
    return call, types.SimpleNamespace(written=None)  # an entry that does not record it: the frontend tells


def test_the_launch_check_names_the_output_and_says_what_to_remember():
    kernel = tilejit.kernel(double.fn)
    x = torch.randn(16)
    with pytest.raises(ArgumentValueError, match="kernel double: output 'Z' has stride 0"):
        kernel._check_outputs(*_bound(kernel, (x, torch.zeros(1).expand(16)), {"BLOCK": 16}))
    with pytest.raises(ArgumentValueError, match="output 'Z' requires grad"):
        kernel._check_outputs(*_bound(kernel, (x, torch.zeros(16, requires_grad=True)), {"BLOCK": 16}))
    assert kernel._check_outputs(*_bound(kernel, (x, torch.zeros(16)), {"BLOCK": 16})) is True
    assert kernel._check_outputs(*_bound(kernel, (torch.zeros(1).expand(16), torch.zeros(16)), {"BLOCK": 16}))
    with torch.no_grad():  # allowed, but never remembered: grad mode is not in the fast signature
        assert kernel._check_outputs(*_bound(kernel, (x, torch.zeros(16, requires_grad=True)), {"BLOCK": 16})) is False
    # one element along a stride-0 dimension shares nothing, but the signature has no extents: not remembered
    assert kernel._check_outputs(*_bound(kernel, (x[:1], torch.zeros(1).as_strided((1,), (0,))), {"BLOCK": 16})) is False


def test_requires_grad_and_stride_0_list_items_change_the_fast_signature():
    kernel = tilejit.kernel(scatter_items.fn)
    x = torch.zeros(16)
    plain = kernel._fast_args((x, [torch.zeros(16), torch.zeros(16)]), {"BLOCK": 16})[0]
    graded = kernel._fast_args((x, [torch.zeros(16), torch.zeros(16, requires_grad=True)]), {"BLOCK": 16})[0]
    strided = kernel._fast_args((x, [torch.zeros(16), torch.zeros(32)[::2]]), {"BLOCK": 16})[0]
    shared = kernel._fast_args((x, [torch.zeros(16), torch.zeros(1).expand(16)]), {"BLOCK": 16})[0]
    assert len({plain, graded, strided, shared}) == 4
    single = tilejit.kernel(double.fn)
    assert single._fast_args((x, torch.zeros(16)), {"BLOCK": 16})[0] != single._fast_args(
        (x, torch.zeros(16, requires_grad=True)), {"BLOCK": 16})[0]
