"""tilejit.torch_op: kernels (plain, autotuned, writing an argument in place) inside
torch.compile(fullgraph=True) on CPU tensors through the interpreter: no graph break, and the same numbers as eager
torch. Inductor needs a C++ compiler; without one those cases are skipped (aot_eager still runs)."""
from __future__ import annotations

import shutil

import pytest
import torch

import tilejit
import lang_kernels as lk

BACKENDS = ["aot_eager", pytest.param("inductor", marks=pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None, reason="inductor needs a C++ compiler"))]


@pytest.fixture
def interpret(interpret_torch):
    """The interpreter (``interpret_torch``)."""


def test_torch_op_runs_eagerly(interpret):
    scale, _, _ = lk.define_torch_ops()
    x, s = torch.randn(40, 50), torch.randn(40)
    torch.testing.assert_close(scale(x, s), x * s[:, None])


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_op_in_fullgraph_compile(interpret, backend):
    scale, scale_tuned, _ = lk.define_torch_ops()

    def model(x, s):
        y = scale(x * 2, s).relu()
        return scale_tuned(y, s + 1).sum(1)

    compiled = torch.compile(model, fullgraph=True, backend=backend)
    x, s = torch.randn(40, 50), torch.randn(40)
    expected = ((x * 2 * s[:, None]).relu() * (s + 1)[:, None]).sum(1)
    torch.testing.assert_close(compiled(x, s), expected, rtol=1e-5, atol=1e-5)
    # explain() counts graph breaks: none
    explanation = torch._dynamo.explain(model)(x, s)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_mutating_torch_op_in_fullgraph_compile(interpret):
    _, _, splitk_add_ = lk.define_torch_ops()

    def model(a, b):
        c = torch.zeros(a.shape[0], b.shape[1])
        splitk_add_(a, b, c, 3)
        return c * 2

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    a, b = torch.randn(33, 70, dtype=torch.float16), torch.randn(70, 40, dtype=torch.float16)
    torch.testing.assert_close(compiled(a, b).double(), 2 * (a.double() @ b.double()), rtol=1e-4, atol=1e-3)


def test_torch_op_needs_a_namespaced_name():
    with pytest.raises(ValueError, match="namespace::op_name"):
        tilejit.torch_op("no_namespace")
