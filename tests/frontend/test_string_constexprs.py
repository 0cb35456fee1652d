"""String (and None / tuple) constexprs select code at compile time: ==, !=, in, truth, and/or, if."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T


@tilejit.kernel
def activation(X, Y, ACTIVATION: T.constexpr, BLOCK: T.constexpr):
    x = X[0:BLOCK]
    if ACTIVATION == "leaky_relu":
        x = T.where(x > 0, x, x * 0.01)
    elif ACTIVATION in ("relu", "relu6"):
        x = T.maximum(x, 0.0)
        if ACTIVATION == "relu6":
            x = T.minimum(x, 6.0)
    if ACTIVATION and ACTIVATION != "none":
        x = x + 0.0
    Y[0:BLOCK] = x


@pytest.mark.parametrize("mode, expected", [
    ("leaky_relu", lambda x: torch.where(x > 0, x, x * 0.01)),
    ("relu", lambda x: x.clamp(min=0)),
    ("relu6", lambda x: x.clamp(0, 6)),
    ("none", lambda x: x),
    ("", lambda x: x),
])
def test_string_constexprs_select_code_in_the_interpreter(mode, expected, monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    x = torch.linspace(-10, 10, 64)
    y = torch.full((64,), float("nan"))
    activation[(1,)](x, y, ACTIVATION=mode, BLOCK=64)
    torch.testing.assert_close(y, expected(x))


def test_the_comparison_is_folded_away():
    ir = activation.ir(torch.empty(64, device="meta"), torch.empty(64, device="meta"), ACTIVATION="relu", BLOCK=64)
    assert "tj.select" not in ir and "max" in ir  # the leaky branch is pruned, the relu one kept
    assert "tj.if" not in ir


def test_comparing_a_string_with_a_runtime_value_is_a_located_error():
    @tilejit.kernel
    def bad(X, n, MODE: T.constexpr):
        if MODE == n:
            X[0:16] = T.zeros((16,), T.float32)

    with pytest.raises(tilejit.CompilationError) as info:
        bad.ir(torch.empty(16, device="meta"), 3, MODE="a")
    assert "cannot compare" in str(info.value) and "test_string_constexprs.py" in str(info.value)
