"""The launch fast path's signature distinguishes everything the cache key distinguishes.

For many argument variants of one kernel, the Python fast path's signature (``Kernel._fast_args``) and the
specialization key (``compiler.cache_key``) are derived side by side; two calls that share a signature must
share a key, or a launch would reuse a kernel compiled for other arguments (silently wrong results).
"""
from __future__ import annotations

import itertools

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit import compiler
from tilejit.target import Target


@tilejit.kernel
def scaled(X, Y, n, s, C: T.constexpr, BLOCK: T.constexpr, MODE: T.constexpr = "plain"):
    i = T.program_id(0) * BLOCK
    Y[i:i + BLOCK] = X[i:i + BLOCK] * C + n + s


def _tensor(kind: str) -> torch.Tensor:
    base = torch.zeros(4096, dtype=torch.float32)
    return {
        "f32": base[:1024],
        "f16": torch.zeros(1024, dtype=torch.float16),
        "i8": torch.zeros(1024, dtype=torch.int8),
        "unaligned": base[1:1025],
        "strided": base[::2][:1024],
        "empty": base[:0],
        "empty-unaligned": base[1:1],
        "long": base,
    }[kind]


TENSORS = ["f32", "f16", "i8", "unaligned", "strided", "empty", "empty-unaligned", "long"]
INTS = [1, 16, 17, 0, -1, 2**40]
SCALARS = [0.5, 1, True, False, 32]
CONSTEXPRS = [2, 2.0, True, 1, 1.0, False, 0, "2", None, (2,), 3]
MODES = [None, "plain", "double"]  # None: left at its default


def _variants():
    for x, n, s, c, mode in itertools.product(TENSORS, INTS, SCALARS, CONSTEXPRS, MODES):
        if (TENSORS.index(x) + INTS.index(n) + SCALARS.index(s)) % 3:  # a spread of the product, not all of it
            continue
        kwargs = {"C": c, "BLOCK": 128}
        if mode is not None:
            kwargs["MODE"] = mode
        yield (_tensor(x), _tensor("f32"), n, s), kwargs


def test_calls_sharing_a_fast_signature_share_the_cache_key():
    kernel = tilejit.kernel(scaled.fn)
    target = Target.of("sm_90a")
    seen: dict[tuple, tuple[str, str]] = {}
    checked = 0
    for args, kwargs in _variants():
        fast = kernel._fast_args(args, dict(kwargs))
        assert fast is not None, (args, kwargs)
        key = compiler.cache_key(kernel.bind(args, dict(kwargs)).spec, target)
        described = f"{[type(a).__name__ for a in args]} {kwargs}"
        if fast[0] in seen:
            other_key, other = seen[fast[0]]
            assert other_key == key, f"one fast signature for two specializations:\n  {other}\n  {described}"
        else:
            seen[fast[0]] = (key, described)
        checked += 1
    assert checked > 500 and len(seen) > 100


@pytest.mark.parametrize("a, b", [(2, 2.0), (2, True), (1, True), (0, False), (2.0, "2"), (1, 1.0), (0.0, -0.0),
                                  ((2,), (2.0,)), ((True,), (1,)), ((0.0,), (-0.0,)), (((1,),), ((1.0,),))])
def test_equal_constexprs_of_other_types_sign_apart(a, b):
    kernel = tilejit.kernel(scaled.fn)
    args = (_tensor("f32"), _tensor("f32"), 3, 0.5)
    assert kernel._fast_args(args, {"C": a, "BLOCK": 128})[0] != kernel._fast_args(args, {"C": b, "BLOCK": 128})[0]


def test_an_empty_tensor_signs_apart_from_a_full_one_with_the_same_strides():
    kernel = tilejit.kernel(scaled.fn)
    full, empty = _tensor("f32"), _tensor("empty")
    assert full.stride() == empty.stride() and full.data_ptr() % 16 == empty.data_ptr() % 16
    sign = lambda x: kernel._fast_args((x, full, 3, 0.5), {"C": 2, "BLOCK": 128})[0]  # noqa: E731
    assert sign(full) != sign(empty)


def test_an_unhashable_constexpr_takes_the_slow_path_and_gets_a_clear_error():
    kernel = tilejit.kernel(scaled.fn)
    args = (_tensor("f32"), _tensor("f32"), 3, 0.5)
    assert kernel._fast_args(args, {"C": [16], "BLOCK": 128}) is None
    with pytest.raises(TypeError, match="constexpr argument 'C' must be"):
        kernel.bind(args, {"C": [16], "BLOCK": 128})


def test_int_and_float_constexpr_give_different_results_in_the_interpreter(monkeypatch):
    """The repro of the issue: C=2 then C=2.0 on int8 data must not share a kernel."""
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")

    @tilejit.kernel
    def mul(X, Y, C: T.constexpr, BLOCK: T.constexpr):
        Y[0:BLOCK] = X[0:BLOCK] * C

    x = torch.full((64,), 100, dtype=torch.int8)
    y_int, y_float = torch.zeros(64, dtype=torch.float32), torch.zeros(64, dtype=torch.float32)
    mul[(1,)](x, y_int, C=2, BLOCK=64)
    mul[(1,)](x, y_float, C=2.0, BLOCK=64)
    assert y_int[0].item() == -56.0   # int8 arithmetic wraps: 200 -> -56
    assert y_float[0].item() == 200.0  # promoted to float


@pytest.mark.parametrize("a, b", [(0.0, -0.0), ((2,), (2.0,)), ((True,), (1,))])
def test_constexprs_that_compile_apart_sign_apart(a, b):
    """Values equal in Python but compiled to different code have different cache keys and fast signatures."""
    kernel = tilejit.kernel(scaled.fn)
    args = (_tensor("f32"), _tensor("f32"), 3, 0.5)
    target = Target.of("sm_90a")
    keys = [compiler.cache_key(kernel.bind(args, {"C": 1, "BLOCK": 128, "MODE": v}).spec, target) for v in (a, b)]
    assert keys[0] != keys[1]
    signatures = [kernel._fast_args(args, {"C": 1, "BLOCK": 128, "MODE": v})[0] for v in (a, b)]
    assert signatures[0] != signatures[1]


def test_a_nan_constexpr_signs_the_same_each_call():
    kernel = tilejit.kernel(scaled.fn)
    args = (_tensor("f32"), _tensor("f32"), 3, 0.5)
    first = kernel._fast_args(args, {"C": float("nan"), "BLOCK": 128})[0]
    assert first == kernel._fast_args(args, {"C": float("nan"), "BLOCK": 128})[0]
