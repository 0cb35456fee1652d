"""Regressions from a contract hunt over docs/language.md: compile-time objects (strings, None, tuples) in truth
tests outside ``if``, integer constants wider than the dtype they would take, and the interpreter's saturating
float -> int64 conversion. CPU only (the interpreter and the frontend)."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


@tilejit.kernel
def truth_forms(X, Y, MODE: T.constexpr, BLOCK: T.constexpr):
    x = X[0:BLOCK]
    if not MODE:
        x = x + 100
    x = x * 2 if MODE else x
    x = T.where(MODE, x, x - 1)
    Y[0:BLOCK] = x


@pytest.mark.parametrize("mode, expect", [("relu", lambda x: 2 * x), ("", lambda x: x + 99), (None, lambda x: x + 99),
                                          ((1, 2), lambda x: 2 * x)])
def test_string_none_tuple_constexprs_in_not_ifexp_and_where(interpret, mode, expect):
    x = torch.randn(16)
    y = torch.full((16,), float("nan"))
    truth_forms[(1,)](x, y, MODE=mode, BLOCK=16)
    assert torch.equal(y, expect(x))


@tilejit.kernel
def asserts_object(X, MODE: T.constexpr):
    assert MODE, "MODE must be given"
    X[0] = 1.0


def test_assert_on_a_string_constexpr(interpret):
    x = torch.zeros(1)
    asserts_object[(1,)](x, MODE="a")
    assert x.item() == 1.0
    with pytest.raises(tilejit.CompilationError, match="assertion failed at compile time: MODE must be given"):
        asserts_object[(1,)](x, MODE="")


@tilejit.kernel
def not_a_tensor(X, Y):
    Y[0] = not X


def test_not_of_a_tensor_is_located(interpret):
    with pytest.raises(tilejit.CompilationError) as info:
        not_a_tensor[(1,)](torch.zeros(1), torch.zeros(1))
    assert not isinstance(info.value, tilejit.InternalError)
    assert "Y[0] = not X" in str(info.value) and "'not' needs a scalar" in str(info.value)


@tilejit.kernel
def big_add(X, Y, BLOCK: T.constexpr):
    X[0:BLOCK] = T.arange(0, BLOCK) + 2 ** 40        # widens to int64, as Python's ints would
    Y[0:BLOCK] = (T.arange(0, BLOCK) + 1000).to(T.int8).to(T.int16) + 1000   # int8 + 1000 computes in int32
    Y[BLOCK] = 1 if (T.arange(0, BLOCK).to(T.int8) + 1000).dtype == T.int32 else 0


@tilejit.kernel
def too_big_full(X, BLOCK: T.constexpr):
    X[0:BLOCK] = T.full((BLOCK,), 1000, T.int8)


@tilejit.kernel
def too_big_anywhere(X, BLOCK: T.constexpr):
    X[0:BLOCK] = X[0:BLOCK] + 2 ** 70


def test_an_int_constant_wider_than_the_tile_widens_the_operation(interpret):
    x, y = torch.zeros(8, dtype=torch.int64), torch.zeros(9, dtype=torch.int64)
    big_add[(1,)](x, y, BLOCK=8)
    assert torch.equal(x, torch.arange(8) + 2 ** 40)
    wrapped = (torch.arange(8) + 1000).to(torch.int8).long()  # an explicit .to() still wraps
    assert torch.equal(y, torch.cat([wrapped + 1000, torch.ones(1, dtype=torch.int64)]))


@pytest.mark.parametrize("kernel, text", [(too_big_full, "the constant 1000 does not fit i8"),
                                          (too_big_anywhere, "the constant 1180591620717411303424 does not fit i64")])
def test_an_int_constant_that_cannot_fit_is_a_located_error(interpret, kernel, text):
    with pytest.raises(tilejit.TypeCheckError, match=text) as info:
        kernel[(1,)](torch.zeros(8, dtype=torch.int64), BLOCK=8)
    assert info.value.lineno is not None and "^" in str(info.value)


@tilejit.kernel
def fitting_constants(X, U, Y, BLOCK: T.constexpr):
    Y[0:BLOCK] = (X[0:BLOCK] & 0xFFFF) + (U[0:BLOCK] - 1)   # a bit pattern, and -1 with a uint8 tile


def test_constants_within_the_bit_width_still_work(interpret):
    x = torch.randint(-2 ** 20, 2 ** 20, (8,), dtype=torch.int32)
    u = torch.randint(0, 255, (8,), dtype=torch.uint8)
    y = torch.zeros(8, dtype=torch.int64)
    fitting_constants[(1,)](x, u, y, BLOCK=8)
    assert torch.equal(y, (x.long() & 0xFFFF) + ((u.long() - 1) % 256))


@tilejit.kernel
def to_int64(X, Y, Z, BLOCK: T.constexpr):
    Y[0:BLOCK] = X[0:BLOCK].to(T.int64)
    Z[0:BLOCK] = X[0:BLOCK]


def test_float_to_int64_saturates_at_both_ends(interpret):
    x = torch.tensor([float("inf"), 1e30, float("-inf"), -1e30, float("nan"), 3e9, -2.5, 0.0])
    expected = torch.tensor([2 ** 63 - 1, 2 ** 63 - 1, -2 ** 63, -2 ** 63, 0, 3000000000, -2, 0])
    y, z = torch.zeros(8, dtype=torch.int64), torch.zeros(8, dtype=torch.int64)
    to_int64[(1,)](x, y, z, BLOCK=8)
    assert torch.equal(y, expected) and torch.equal(z, expected)
