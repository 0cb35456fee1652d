"""``tilejit port``: Triton tutorial-style kernels, translated, give the tutorials' results in the interpreter;
lines outside the subset are kept as comments saying why."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tilejit.cli import main
from tilejit.port import MARK, MASK_KEPT, port_source

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


def test_matmul_with_pointers_advanced_in_the_k_loop(ported):
    # the tutorial's a_ptrs += BLOCK_SIZE_K * stride_ak; K = 40 leaves a partial last K block, M and N partial tiles
    a, b = torch.randn(40, 40).half(), torch.randn(40, 24).half()
    c = torch.empty(40, 24, dtype=torch.float16)
    grid = (math.ceil(40 / 16) * math.ceil(24 / 16),)
    ported["matmul_kernel"][grid](a, b, c, 40, 24, 40, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                  c.stride(0), c.stride(1), BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16,
                                  GROUP_SIZE_M=2)
    torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=2e-2, rtol=2e-2)


def test_masks_proven_bounds_checks_by_the_launches_are_dropped():
    text = port_source(FIXTURE.read_text())
    matmul = text[text.index("def matmul_kernel"):text.index("def layer_norm_fwd")]
    assert "k * BLOCK_SIZE_K:k * BLOCK_SIZE_K + BLOCK_SIZE_K" in matmul and "where" not in matmul
    add = text[text.index("def add_kernel"):text.index("def softmax_kernel")]
    # x and output have n_elements elements (output = torch.empty_like(x); n_elements = output.numel()); y may not
    assert "x = x_ptr[block_start:block_start + BLOCK_SIZE]" in add
    assert f"{MASK_KEPT} mask is not a bounds check of y_ptr" in add
    assert "y = T.where(mask, y_ptr[block_start:block_start + BLOCK_SIZE], 0)" in add


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


MASKS = """
import torch
import triton
import triton.language as tl

@triton.jit
def causal_copy(X, Y, stride, BLOCK: tl.constexpr):
    offs_m = tl.arange(0, BLOCK)
    offs_n = tl.arange(0, BLOCK)
    keep = offs_n[None, :] <= offs_m[:, None]
    x = tl.load(X + offs_m[:, None] * stride + offs_n[None, :], mask=keep)
    tl.store(Y + offs_m[:, None] * stride + offs_n[None, :], x * 2, mask=keep)

@triton.jit
def prefix_double(X, Y, n_valid, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n_valid)
    tl.store(Y + offs, x * 2, mask=offs < n_valid)

def first_half_doubled(x):
    y = torch.zeros_like(x)
    prefix_double[(triton.cdiv(x.numel(), 16), )](x, y, x.numel() // 2, BLOCK=16)
    return y

@triton.jit
def wrapped(X, Y, M, BLOCK: tl.constexpr):
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)) % M
    y = tl.load(X + offs)
    tl.store(Y + offs, y)

@triton.jit
def advanced_then_read(X, Y, stride, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    ptrs = X + offs * stride
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(4):
        acc += tl.load(ptrs)
        ptrs += BLOCK * stride
    tl.store(Y + offs, tl.load(ptrs) + acc)

@triton.jit
def read_after_its_advance(X, Y, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    ptrs = X + offs
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(4):
        ptrs += BLOCK
        acc += tl.load(ptrs)
    tl.store(Y + offs, acc)
"""


@pytest.fixture(scope="module")
def ported_masks(tmp_path_factory):
    path = tmp_path_factory.mktemp("port") / "ported_masks.py"
    path.write_text(port_source(MASKS))
    namespace: dict = {"__name__": "ported_masks"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return path.read_text(), namespace


def test_a_causal_mask_is_kept_and_applied(ported_masks):
    text, namespace = ported_masks
    assert f"{MASK_KEPT} keep is not a bounds check of X" in text
    assert f"{MASK_KEPT} keep is not a bounds check of Y" in text
    x = torch.randn(16, 16)
    y = torch.full((16, 16), 7.0)
    namespace["causal_copy"][(1,)](x, y, x.stride(0), BLOCK=16)
    lower = torch.ones(16, 16).tril().bool()
    torch.testing.assert_close(y, torch.where(lower, x * 2, 7.0))  # the upper triangle is neither read nor written


def test_a_bound_that_is_not_the_extent_is_kept(ported_masks):
    text, namespace = ported_masks
    # the launch passes x.numel() // 2 for n_valid: not X's extent, so the mask stays
    assert f"{MASK_KEPT} offs < n_valid is not a bounds check of X" in text
    x = torch.randn(40)
    y = torch.zeros(40)
    namespace["prefix_double"][(3,)](x, y, 20, BLOCK=16)
    torch.testing.assert_close(y, torch.cat([x[:20] * 2, torch.zeros(20)]))


def test_a_wrap_by_an_unproven_modulus_and_a_pointer_read_after_its_loop_are_refused(ported_masks):
    text, _ = ported_masks
    marked = [line for line in text.splitlines() if MARK in line]
    assert any("% M, which is not known to be the extent of X's dim 0" in m for m in marked)
    assert any("a store through offsets wrapped by % M" in m for m in marked)
    assert any("tl.load(ptrs) + acc" in m and "advanced in a loop and is used after it" in m for m in marked)
    assert "acc += X[i * BLOCK:i * BLOCK + BLOCK]" in text  # inside the loop the advance is the counter
    assert any("ptrs += BLOCK" in m and "after its last use in the body" in m for m in marked)


@pytest.mark.parametrize("content, says", [
    (b"\xff\xfe\x00binary", "not UTF-8 text (byte 0), so not a Python file"),
    (b"import torch\n\ndef f(x):\n    return x + 1\n", "has no top-level @triton.jit function: nothing to port"),
    (b"def f(:\n", ":1: not Python:"),
])
def test_port_of_a_file_it_cannot_port_says_why_in_one_line(tmp_path, capsys, content, says):
    path = tmp_path / "kernels.py"
    path.write_bytes(content)
    assert main(["port", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and says in err, err


def test_port_to_an_unwritable_output_says_so(tmp_path, capsys):
    assert main(["port", str(FIXTURE), "-o", str(tmp_path / "missing" / "out.py")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"tilejit: cannot write {tmp_path / 'missing' / 'out.py'}: No such file or directory"), err
