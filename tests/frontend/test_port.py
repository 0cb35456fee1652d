"""``tilejit port``: Triton tutorial-style kernels, translated, give the tutorials' results in the interpreter;
lines outside the subset are kept as comments saying why."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tilejit.cli import main
from tilejit.port import MARK, port_source

FIXTURE = Path(__file__).resolve().parent.parent / "port_fixtures" / "triton_tutorials.py.txt"


@pytest.fixture(scope="module")
def ported(tmp_path_factory):
    path = tmp_path_factory.mktemp("port") / "ported.py"
    assert main(["port", str(FIXTURE), "-o", str(path)]) == 0
    text = path.read_text()
    assert MARK not in text and "tl." not in text
    namespace: dict = {"__name__": "ported"}
    exec(compile(text, str(path), "exec"), namespace)
    return namespace


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


def test_vector_add(ported):
    x, y = torch.randn(1000), torch.randn(1000)
    out = torch.empty(1000)
    ported["add_kernel"][(math.ceil(1000 / 256),)](x, y, out, 1000, BLOCK_SIZE=256)
    torch.testing.assert_close(out, x + y)


def test_fused_softmax(ported):
    x = torch.randn(5, 40)
    out = torch.empty_like(x)
    ported["softmax_kernel"][(5,)](out, x, x.stride(0), out.stride(0), 40, BLOCK_SIZE=64)
    torch.testing.assert_close(out, torch.softmax(x, 1))


def test_matmul(ported):
    a, b = torch.randn(40, 48).half(), torch.randn(48, 24).half()
    c = torch.empty(40, 24, dtype=torch.float16)
    grid = (math.ceil(40 / 16) * math.ceil(24 / 16),)
    ported["matmul_kernel"][grid](a, b, c, 40, 24, 48, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                  c.stride(0), c.stride(1), BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16,
                                  GROUP_SIZE_M=2)
    torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=2e-2, rtol=2e-2)


def test_layer_norm(ported):
    x, w, b = torch.randn(6, 50), torch.randn(50), torch.randn(50)
    y, mean, rstd = torch.empty_like(x), torch.empty(6), torch.empty(6)
    ported["layer_norm_fwd"][(6,)](x, y, w, b, mean, rstd, x.stride(0), 50, 1e-5, BLOCK_SIZE=16)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (50,), w, b, 1e-5), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(mean, x.mean(1))


def test_attention_forward(ported):
    bh, n, d = 2, 32, 16
    q, k, v = (torch.randn(bh, n, d).half() for _ in range(3))
    out = torch.empty_like(q)
    scale = d ** -0.5
    ported["attn_fwd"][(n // 16, bh)](q, k, v, out, scale, *q.stride(), *k.stride(), *v.stride(), *out.stride(), n,
                                      BLOCK_M=16, BLOCK_N=16, HEAD_DIM=d)
    expected = torch.softmax((q.float() @ k.float().transpose(1, 2)) * scale, -1) @ v.float()
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


REFUSED = '''
import triton
import triton.language as tl

@triton.jit
def k(a_ptr, out_ptr, stride_ak, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a_ptrs = a_ptr + offs
    for i in range(4):
        x = tl.load(a_ptrs)
        a_ptrs += BLOCK * stride_ak
    y = tl.reshape(x, (BLOCK // 2, 2))
    bp = tl.make_block_ptr(a_ptr, (BLOCK,), (1,), (0,), (BLOCK,), (0,))
    tl.store(out_ptr + offs, x)
'''


def test_lines_outside_the_subset_are_marked_with_why():
    text = port_source(REFUSED)
    marked = [line for line in text.splitlines() if MARK in line]
    assert any("a_ptrs += BLOCK * stride_ak" in m and "pointer advanced in a loop" in m for m in marked)
    assert any("tl.reshape" in m and "cannot be reshaped" in m for m in marked)
    assert any("tl.make_block_ptr" in m and "slice of the tensor" in m for m in marked)
    assert "out_ptr[0:BLOCK] = x" in text
    compile(text, "<ported>", "exec")  # still Python
