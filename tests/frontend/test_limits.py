"""The compiler's limits (tilejit/frontend/limits.py) give a located LimitError in seconds, in compile and in the
interpreter alike, where a huge tile hung in the emitter and a deep expression exhausted Python's stack."""
from __future__ import annotations

import importlib.util
import time

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit.errors import LimitError
from tilejit.frontend.limits import MAX_KERNEL_OPS, MAX_NESTING_DEPTH, MAX_TILE_ELEMENTS


def _load(tmp_path, source: str, name: str):
    """A kernel defined in a file of its own (kernels need their source on disk)."""
    path = tmp_path / f"{name}_module.py"
    path.write_text("import tilejit\nimport tilejit.language as T\n\n\n" + source)
    spec = importlib.util.spec_from_file_location(f"{name}_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name), path


def _sum_kernel(tmp_path, terms: int):
    total = " + ".join(["x"] * terms)
    return _load(tmp_path, f"""@tilejit.kernel
def flat_sum(X, Z, BLOCK: T.constexpr):
    i = T.program_id(0) * BLOCK
    x = X[i:i + BLOCK]
    Z[i:i + BLOCK] = {total}
""", "flat_sum")


@tilejit.kernel
def scale(X, Z, BLOCK: T.constexpr):
    i = T.program_id(0) * BLOCK
    Z[i:i + BLOCK] = X[i:i + BLOCK] * 2


@tilejit.kernel
def unrolled(X, Z, N: T.constexpr, BLOCK: T.constexpr):
    acc = T.zeros((BLOCK,), T.float32)
    for j in T.static_range(N):
        acc += X[j:j + BLOCK]
    Z[0:BLOCK] = acc


def _check_located(error: LimitError, path, line: int) -> None:
    assert str(error.filename) == str(path) and error.lineno == line, str(error)
    assert "^" in str(error)


@pytest.mark.parametrize("terms", [600, 3 * MAX_NESTING_DEPTH])
def test_a_flat_expression_past_the_depth_limit_is_a_located_error(tmp_path, terms, monkeypatch):
    kernel, path = _sum_kernel(tmp_path, terms)
    x = torch.zeros(16)
    with pytest.raises(LimitError, match=f"nest more than {MAX_NESTING_DEPTH}") as info:
        kernel.compile(x, x, BLOCK=16, arch="sm_90a", stop_after="cuda")
    _check_located(info.value, path, 9)
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    with pytest.raises(LimitError, match="nest more than") as info:
        kernel[(1,)](x, x, BLOCK=16)
    _check_located(info.value, path, 9)


def test_a_flat_expression_within_the_limit_compiles_and_runs(tmp_path, monkeypatch):
    kernel, _ = _sum_kernel(tmp_path, MAX_NESTING_DEPTH - 10)
    x = torch.ones(16)
    assert "__global__" in kernel.compile(x, x, BLOCK=16, arch="sm_90a", stop_after="cuda").cuda
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    z = torch.zeros(16)
    kernel[(1,)](x, z, BLOCK=16)
    assert torch.equal(z, torch.full((16,), float(MAX_NESTING_DEPTH - 10)))


@pytest.mark.parametrize("block", [2 * MAX_TILE_ELEMENTS, 2 ** 40])
def test_a_tile_past_the_element_limit_is_a_located_error_in_seconds(block, monkeypatch):
    x = torch.zeros(16)
    start = time.monotonic()
    with pytest.raises(LimitError, match=f"at most {MAX_TILE_ELEMENTS:,}") as info:
        scale.compile(x, x, BLOCK=block, arch="sm_90a", stop_after="cuda")
    assert info.value.lineno == scale.fn.__code__.co_firstlineno + 3
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    with pytest.raises(LimitError):
        scale[(1,)](x, x, BLOCK=block)
    assert time.monotonic() - start < 10


def test_a_tile_at_the_element_limit_compiles():
    x = torch.zeros(16)
    assert "__global__" in scale.compile(x, x, BLOCK=MAX_TILE_ELEMENTS, arch="sm_90a", stop_after="cuda").cuda


def test_a_kernel_past_the_op_limit_is_a_located_error_in_seconds():
    x = torch.zeros(16)
    start = time.monotonic()
    with pytest.raises(LimitError, match=f"more than {MAX_KERNEL_OPS:,} operations") as info:
        unrolled.compile(x, x, N=MAX_KERNEL_OPS, BLOCK=16, arch="sm_90a", stop_after="ir")
    assert info.value.lineno == unrolled.fn.__code__.co_firstlineno + 4
    assert time.monotonic() - start < 20


def test_the_language_docs_state_the_limits_values():
    text = open(tilejit.docs().split("#")[0], encoding="utf-8").read()
    assert f"| elements of one tile | {MAX_TILE_ELEMENTS:,} (2**{MAX_TILE_ELEMENTS.bit_length() - 1}) |" in text
    assert f"| nesting of expressions and statements | {MAX_NESTING_DEPTH} levels |" in text
    assert f"| operations in one kernel | {MAX_KERNEL_OPS:,} |" in text
