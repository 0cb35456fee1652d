"""Arithmetic on bools counts them as the ints 0 and 1 (int32), as Python does (``True + 1 == 2``); bitwise
``& | ^`` keep them bools. Checked on the IR's dtypes, against torch through the interpreter, and through NVRTC."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T


@tilejit.kernel
def plus_one(X, Y, BN: T.constexpr):
    x = X[0:BN]
    Y[0:BN] = (x > 0) + 1


@tilejit.kernel
def one_minus(X, Y, BN: T.constexpr):
    x = X[0:BN]
    Y[0:BN] = 1 - (x > 0)


@tilejit.kernel
def difference(X, Y, BN: T.constexpr):
    x = X[0:BN]
    Y[0:BN] = (x > 0) - (x > 1)


@tilejit.kernel
def count(X, Y, BN: T.constexpr):
    x = X[0:BN]
    Y[0:BN] = (x > 0) + (x > 1) + (x > -1)


@tilejit.kernel
def times_three(X, Y, BN: T.constexpr):
    x = X[0:BN]
    Y[0:BN] = (x > 0) * 3


@tilejit.kernel
def floordiv_mod(X, Y, BN: T.constexpr):
    x = X[0:BN]
    Y[0:BN] = (x > 0) // 1 + (x > 1) % 2


@tilejit.kernel
def differs(X, Y, BN: T.constexpr):
    x = X[0:BN]
    Y[0:BN] = (x > 0) ^ (x > 1)


def _ints(b: torch.Tensor) -> torch.Tensor:
    return b.to(torch.int32)


CASES = [
    (plus_one, lambda x: _ints(x > 0) + 1),
    (one_minus, lambda x: 1 - _ints(x > 0)),
    (difference, lambda x: _ints(x > 0) - _ints(x > 1)),
    (count, lambda x: _ints(x > 0) + _ints(x > 1) + _ints(x > -1)),
    (times_three, lambda x: _ints(x > 0) * 3),
    (floordiv_mod, lambda x: _ints(x > 0) // 1 + _ints(x > 1) % 2),
]


def _binary_dtypes(kernel) -> list[str]:
    """The result dtype of every ``tj.binary`` op in the kernel's IR (``tile<16xi32>``: "i32")."""
    ir = kernel.ir(torch.empty(16, device="meta"), torch.empty(16, dtype=torch.int32, device="meta"), BN=16)
    return [line.rsplit("x", 1)[1].rstrip(">") for line in ir.splitlines() if " tj.binary " in line]


@pytest.mark.parametrize("kernel, reference", CASES, ids=[k.__name__ for k, _ in CASES])
def test_arithmetic_on_bools_is_on_int32(kernel, reference):
    dtypes = _binary_dtypes(kernel)
    assert dtypes and set(dtypes) == {"i32"}, dtypes


def test_bitwise_operators_keep_bools():
    assert _binary_dtypes(differs) == ["i1"]


@pytest.mark.parametrize("kernel, reference", CASES, ids=[k.__name__ for k, _ in CASES])
def test_arithmetic_on_bools_counts_like_python(kernel, reference, monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    x = torch.randn(64) * 2
    y = torch.full((64,), -99, dtype=torch.int32)
    kernel[(1,)](x, y, BN=64)
    assert torch.equal(y, reference(x)), (y, reference(x))


def test_arithmetic_on_bools_compiles():
    x = torch.empty(64, device="meta")
    compiled = count.compile(x, torch.empty(64, dtype=torch.int32, device="meta"), BN=64, arch="sm_80")
    assert compiled.asm["cubin"][:4] == b"\x7fELF"
