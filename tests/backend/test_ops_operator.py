"""tilejit.ops.custom_ops.Operator: a plain eager call runs the operator's implementation through an
``autograd.Function`` (or directly without a gradient) and never reaches the PyTorch dispatcher of the registered
operator; that road and the operator's (forced by making every call look non-plain) give bitwise the same outputs
and gradients for every op; outputs nobody uses give None gradients on the eager road; meta tensors,
FakeTensorMode, a dispatch mode, torch.func transforms and torch.compile all take the registered operator; double
backward fails the same way (with the same error) on both roads. Through the interpreter, on CPU."""
from __future__ import annotations

import collections

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from attention_tiles import SMALL_ATTENTION_BWD, SMALL_ATTENTION_FWD
from tilejit.ops import custom_ops, embedding_lookup, fused_attention, linear_ops, norm, rotary

MODULES = (norm, rotary, linear_ops, embedding_lookup, fused_attention)
SMALL_FWD, SMALL_BWD = SMALL_ATTENTION_FWD, SMALL_ATTENTION_BWD


@pytest.fixture
def interpret(interpret_torch):
    """The interpreter (``interpret_torch``)."""


@pytest.fixture
def dispatched(monkeypatch):
    """Counts, per operator name, the calls that reach a registered operator (``Operator.op``) of the ops above."""
    counts = collections.Counter()
    for module in MODULES:
        for operator in vars(module._OPS).values():
            if isinstance(operator, custom_ops.Operator):
                monkeypatch.setattr(operator, "op", _counting(operator.op, counts))
    return counts


def _counting(op, counts):
    def call(*args):
        counts[op._qualname] += 1
        return op(*args)
    return call


def _grad_fn_names(t: torch.Tensor) -> set[str]:
    """The names of every node of t's autograd graph."""
    names, todo, seen = set(), [t.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(node.name())
        todo.extend(next_node for next_node, _ in node.next_functions)
    return names


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def _run(case, inputs):
    """(outputs, gradients of the leaves) of ``case`` on fresh leaves made from ``inputs``."""
    leaves = _leaves(*inputs)
    outputs, loss = case(*leaves)
    loss.backward()
    return [o.detach() for o in outputs], [leaf.grad for leaf in leaves]


def _rms_norm(x, w):
    y = norm.rms_norm(x, w, eps=1e-5)
    return (y,), (y * torch.linspace(-1, 1, y.shape[-1])).sum()


def _rms_norm_residual(x, w, r):
    y, s = norm.rms_norm(x, w, eps=1e-5, residual=r)
    return (y, s), (y * torch.linspace(-1, 1, y.shape[-1])).sum() + (s * s).sum()


def _linear(x, w):
    out = linear_ops.linear(x, w)
    return (out,), (out * out).sum()


def _swiglu(x, wg, wu):
    out = linear_ops.swiglu_linear(x, wg, wu)
    return (out,), (out * out).sum()


def _swiglu_recompute(x, wg, wu):
    out = linear_ops.swiglu_linear(x, wg, wu, recompute=True)
    return (out,), (out * out).sum()


TARGETS = torch.tensor([3, 0, 19, -100, 7, 7, 12, 1, -100, 5])


def _cross_entropy(h, w):
    loss = linear_ops.linear_cross_entropy(h, w, TARGETS, chunk_rows=4)
    return (loss,), loss * 3.0


def _rotary(q, k, cos, sin):
    q2, k2 = rotary.rotary_embedding(q, k, cos.detach(), sin.detach())
    return (q2, k2), (q2 * q2.detach().sign()).sum() + (k2 * 2).sum()


TOKENS = torch.tensor([[1, 4, 4, 0], [9, 2, 1, 1]])


def _embedding(w):
    out = embedding_lookup.embedding(TOKENS, w)
    return (out,), (out * out).sum()


def _attention(q, k, v):
    out = fused_attention.attention(q, k, v, causal=True, bwd_config=SMALL_BWD, **SMALL_FWD)
    return (out,), (out * torch.linspace(-1, 1, out.shape[-1])).sum()


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


CASES = {
    "rms_norm": (_rms_norm, lambda: (_randn(6, 32, seed=0), _randn(32, seed=1)), "rms_norm_fwd"),
    "rms_norm_residual": (_rms_norm_residual, lambda: (_randn(2, 3, 32, seed=2), _randn(32, seed=3),
                                                       _randn(2, 3, 32, seed=4)), "rms_norm_fwd"),
    "linear": (_linear, lambda: (_randn(2, 3, 16, seed=5), _randn(8, 16, seed=6)), "linear_fwd"),
    "swiglu": (_swiglu, lambda: (_randn(5, 16, seed=7), _randn(12, 16, seed=8), _randn(12, 16, seed=9)),
               "swiglu_fwd"),
    "swiglu_recompute": (_swiglu_recompute, lambda: (_randn(5, 16, seed=7), _randn(12, 16, seed=8),
                                                     _randn(12, 16, seed=9)), "swiglu_fwd"),
    "linear_cross_entropy": (_cross_entropy, lambda: (_randn(10, 16, seed=10), _randn(20, 16, seed=11)),
                             "linear_cross_entropy"),
    "rotary": (_rotary, lambda: (_randn(2, 5, 3, 8, seed=12), _randn(2, 5, 1, 8, seed=13), _randn(16, 4, seed=14),
                                 _randn(16, 4, seed=15)), "rotary_embedding"),
    "embedding": (_embedding, lambda: (_randn(10, 8, seed=16),), "embedding_fwd"),
    "attention": (_attention, lambda: (_randn(1, 2, 20, 32, seed=17), _randn(1, 1, 20, 32, seed=18),
                                       _randn(1, 1, 20, 32, seed=19)), "attention_fwd"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_eager_road_matches_the_operator_bitwise(interpret, dispatched, monkeypatch, name):
    case, make, forward_op = CASES[name]
    inputs = make()
    leaves = _leaves(*inputs)
    outputs, loss = case(*leaves)
    names = _grad_fn_names(loss)
    assert f"Eager_tilejit_{forward_op}Backward" in names, names
    assert not any(n.startswith("GeneratedBackwardFor") for n in names), names
    loss.backward()
    assert sum(dispatched.values()) == 0, f"the eager road reached the dispatcher: {dict(dispatched)}"
    eager = ([o.detach() for o in outputs], [leaf.grad for leaf in leaves])

    monkeypatch.setattr(custom_ops, "_plain_eager", lambda args: False)
    leaves = _leaves(*inputs)
    outputs, loss = case(*leaves)
    assert f"GeneratedBackwardFor_tilejit_{forward_op}_defaultBackward" in _grad_fn_names(loss)
    loss.backward()
    assert dispatched[f"tilejit::{forward_op}"] >= 1  # (rotary's backward is the same operator again)
    operator = ([o.detach() for o in outputs], [leaf.grad for leaf in leaves])

    for i, (got, want) in enumerate(zip(eager[0], operator[0])):
        assert torch.equal(got, want), f"output {i} differs between the roads"
        assert not torch.isnan(got).any()
    for i, (got, want) in enumerate(zip(eager[1], operator[1])):
        if want is None:  # rotary's cos and sin: not differentiable
            assert got is None, f"gradient {i}: the operator gives None, the eager road a tensor"
            continue
        assert got is not None, f"gradient {i}: None on the eager road"
        assert torch.equal(got, want), f"gradient {i} differs between the roads"
        assert got.abs().sum() > 0, f"gradient {i} is all zeros: nothing to compare"


def test_without_a_gradient_the_implementation_runs_directly(interpret, dispatched):
    x, w = _randn(4, 32, seed=0), _randn(32, seed=1)
    y = norm.rms_norm(x, w)
    assert y.grad_fn is None and sum(dispatched.values()) == 0
    with torch.no_grad():
        y = norm.rms_norm(x.requires_grad_(), w)
    assert y.grad_fn is None and sum(dispatched.values()) == 0
    torch.testing.assert_close(y.double(), norm.reference(x.detach(), w), rtol=1e-5, atol=1e-5)


def test_operators_that_mutate_always_dispatch(interpret, dispatched):
    q, k = _randn(1, 3, 2, 8, seed=0), _randn(1, 3, 1, 8, seed=1)
    cos, sin = _randn(4, 4, seed=2), _randn(4, 4, seed=3)
    version = q._version
    q2, k2 = rotary.rotary_embedding(q, k, cos, sin)
    assert q2 is q and k2 is k and q._version > version  # autograd sees the mutation
    assert dispatched == {"tilejit::rotary_embedding_": 1}


def test_unused_outputs_take_none_gradients_on_the_eager_road(interpret, dispatched):
    """rms_norm's y alone, s alone (the other's gradient is None in the backward: no zeros are made), swiglu's
    saved products alone, the cross-entropy's and attention's side outputs alone: no error, and the gradients
    that exist match the operator road's."""
    x, w, r = _leaves(_randn(3, 32, seed=0), _randn(32, seed=1), _randn(3, 32, seed=2))
    y, _ = norm.rms_norm(x, w, residual=r)
    y.sum().backward()
    assert x.grad is not None and torch.equal(x.grad, r.grad)
    x1, w1, r1 = _leaves(x, w, r)
    norm._OPS.forward.op(x1, w1, r1, 1e-6)[0].sum().backward()  # the operator passes zeros for s's gradient
    assert torch.equal(x.grad, x1.grad) and torch.equal(w.grad, w1.grad)

    x2, w2, r2 = _leaves(x, w, r)
    _, s = norm.rms_norm(x2, w2, residual=r2)
    s.sum().backward()
    assert torch.equal(x2.grad, torch.ones_like(x2)) and torch.equal(r2.grad, torch.ones_like(r2))
    assert torch.equal(w2.grad, torch.zeros_like(w2))  # y unused: dy taken as zeros, dweight sums nothing

    xs, wg, wu = _leaves(_randn(5, 16, seed=3), _randn(12, 16, seed=4), _randn(12, 16, seed=5))
    _, gate, up = linear_ops._OPS.swiglu(xs, wg, wu, True)
    assert gate.grad_fn is not None
    (gate.sum() + up.sum()).backward()  # the products' own gradients are not taken: none flows
    assert xs.grad is None and wg.grad is None and wu.grad is None

    h, head = _leaves(_randn(10, 16, seed=6), _randn(20, 16, seed=7))
    _, dh, _ = linear_ops._OPS.cross_entropy(h, head, TARGETS, -100, "mean", 4, True)
    dh.sum().backward()
    assert h.grad is None and head.grad is None

    q, k, v = _leaves(_randn(1, 2, 20, 32, seed=8), _randn(1, 1, 20, 32, seed=9), _randn(1, 1, 20, 32, seed=10))
    config = custom_ops.encode_config(SMALL_FWD, "attention")
    dkdv = custom_ops.encode_config(SMALL_BWD["dkdv"], "attention")
    dq = custom_ops.encode_config(SMALL_BWD["dq"], "attention")
    _, lse = fused_attention._OPS.forward(q, k, v, None, True, -1, 0, 0.0, 0.2, config, True, dkdv, dq)
    lse.sum().backward()
    assert q.grad is None and k.grad is None and v.grad is None
    assert dispatched == {"tilejit::rms_norm_fwd": 1}  # the one explicit ``.op`` call above


def test_meta_tensors_take_the_shape_function(dispatched):
    x = torch.empty(3, 7, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    w = torch.empty(64, dtype=torch.bfloat16, device="meta")
    y, s = norm.rms_norm(x, w, residual=torch.empty_like(x))
    assert y.device.type == "meta" and y.shape == x.shape and s.shape == x.shape
    out = linear_ops.linear(x, torch.empty(40, 64, dtype=torch.bfloat16, device="meta"))
    assert out.shape == (3, 7, 40) and out.device.type == "meta"
    assert dispatched == {"tilejit::rms_norm_fwd": 1, "tilejit::linear_fwd": 1}


def test_fake_tensors_take_the_shape_function(dispatched):
    with FakeTensorMode():
        x = torch.empty(5, 48, requires_grad=True)
        out = linear_ops.swiglu_linear(x, torch.empty(24, 48), torch.empty(24, 48))
        emb = embedding_lookup.embedding(torch.zeros(2, 3, dtype=torch.int64), torch.empty(10, 48))
        assert out.shape == (5, 24) and emb.shape == (2, 3, 48)
        assert type(out) is not torch.Tensor  # a FakeTensor: no kernel ran
    assert dispatched == {"tilejit::swiglu_fwd": 1, "tilejit::embedding_fwd": 1}


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_dispatch_mode_sees_the_operators(interpret, dispatched):
    x, w = _leaves(_randn(4, 32, seed=0), _randn(8, 32, seed=1))
    with _Recorder() as recorder:
        out = linear_ops.linear(x, w)
        out.sum().backward()
    assert "tilejit.linear_fwd.default" in recorder.names and "tilejit.linear_bwd.default" in recorder.names
    assert dispatched["tilejit::linear_fwd"] == 1
    torch.testing.assert_close(out, x.detach() @ w.detach().T, rtol=4e-3, atol=4e-3)


def test_torch_func_transforms_take_the_operator(interpret, dispatched):
    """torch.func reaches the registered operator, whose generated autograd PyTorch does not run under functorch
    transforms: the same error as before the eager road existed, not a wrong gradient."""
    x, w = _randn(6, 32, seed=0), _randn(32, seed=1)
    with pytest.raises(RuntimeError, match="autograd.Function with functorch transforms"):
        torch.func.grad(lambda x: norm.rms_norm(x, w).pow(2).sum())(x)
    assert dispatched["tilejit::rms_norm_fwd"] == 1


def test_vmap_takes_the_operator(interpret, dispatched):
    """vmap runs the operator once per batch entry (PyTorch's fallback: there is no batching rule): the same
    rows as one call over the whole batch."""
    x, w = _randn(3, 4, 32, seed=0), _randn(32, seed=1)
    y = torch.func.vmap(lambda rows: norm.rms_norm(rows, w))(x)
    assert dispatched == {"tilejit::rms_norm_fwd": 1}
    assert torch.equal(y, norm.rms_norm(x, w))


def test_torch_compile_fullgraph_records_the_operators(interpret, dispatched):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    def step(x, w, wg, wu):
        h = norm.rms_norm(x, w)
        return linear_ops.swiglu_linear(h, wg, wu)

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    x, w, wg, wu = _leaves(_randn(4, 16, seed=0), _randn(16, seed=1), _randn(8, 16, seed=2), _randn(8, 16, seed=3))
    out = compiled(x, w, wg, wu)
    targets = {str(node.target) for gm in graphs for node in gm.graph.nodes if node.op == "call_function"}
    assert "tilejit.rms_norm_fwd.default" in targets and "tilejit.swiglu_fwd.default" in targets, targets
    torch.testing.assert_close(out, step(*_leaves(x, w, wg, wu)), rtol=0, atol=0)


@pytest.mark.parametrize("road", ["eager", "operator"])
@pytest.mark.parametrize("name, backward_op", [("rms_norm", "rms_norm_bwd"), ("linear", "linear_bwd")])
def test_double_backward_raises_on_both_roads(interpret, monkeypatch, road, name, backward_op):
    """The backward operators have no gradient formula: differentiating a gradient raises PyTorch's error for
    that, on the eager road as on the operator's, instead of returning something wrong."""
    if road == "operator":
        monkeypatch.setattr(custom_ops, "_plain_eager", lambda args: False)
    case, make, _ = CASES[name]
    leaves = _leaves(*make())
    _, loss = case(*leaves)
    grads = torch.autograd.grad(loss, leaves, create_graph=True)
    assert all(g.requires_grad for g in grads)
    with pytest.raises(RuntimeError, match=f"backward through tilejit.{backward_op}.default but no autograd "
                                           "formula was registered"):
        torch.autograd.grad(sum(g.sum() for g in grads), leaves)


def test_operand_errors_name_the_first_faulty_operand():
    """linear_ops' checks report x's fault before the weights', and a weight's type before its dtype and its dtype
    before its device."""
    x, w = torch.randn(4, 8), torch.randn(6, 8)
    with pytest.raises(TypeError, match="linear: x must be a torch.Tensor, got list"):
        linear_ops.linear([[1.0]], w)
    with pytest.raises(TypeError, match=r"swiglu_linear: x is torch.int64; the kernels take"):
        linear_ops.swiglu_linear(x.long(), w.long(), 3)
    with pytest.raises(TypeError, match="swiglu_linear: w_up must be a torch.Tensor, got int"):
        linear_ops.swiglu_linear(x, w, 3)
    with pytest.raises(TypeError, match="w_gate is torch.float16 but x is torch.float32"):
        linear_ops.swiglu_linear(x, w.half(), w.to("meta"))
    with pytest.raises(ValueError, match="linear_cross_entropy: weight is on meta but x is on cpu"):
        linear_ops.linear_cross_entropy(x, w.to("meta"), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="x must have at least one dim"):
        linear_ops.linear(torch.tensor(1.0), w)



def test_operators_called_directly_check_their_arguments(interpret):
    """``torch.ops.tilejit.*`` is public too: a wrong call gets the public function's typed error, not an internal
    one from inside the launch."""
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="weight must have shape"):
        norm._OPS.forward(x, torch.ones(32), None, 1e-6)
    with pytest.raises(ValueError, match="weight must have shape"):
        norm._OPS.forward.op(x, torch.ones(32), None, 1e-6)
    q, k = torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16)
    cos, sin = torch.randn(8, 8), torch.randn(8, 8)
    for call in (rotary._OPS.rotate.op, rotary._OPS.rotate):
        with pytest.raises((TypeError, ValueError), match="cos"):
            call(q, k, cos.double(), sin, None, False)
    with pytest.raises((TypeError, ValueError), match="cos"):
        rotary._OPS.rotate_.op(q, k, cos.double(), sin, None)
