"""How tilejit's errors read: location, source line, caret, hint, candidate lists."""
from __future__ import annotations

import pytest

from tilejit.errors import (
    BackendCompileError,
    CompilationError,
    DispatchError,
    LaunchError,
    NameResolutionError,
    TilejitError,
    TypeCheckError,
    UnsupportedSyntaxError,
)

LINE = "        acc += A[m0:m0 + BM, k0:k] @ B"


def test_compilation_error_format_with_caret_and_hint():
    col = LINE.index("k0:k")  # 0-based, as ast gives it
    err = CompilationError(
        "slice length must be a compile-time constant", filename="path/to/file.py", lineno=12, col=col,
        source_line=LINE, hint="use k0:k0 + BK",
    )
    lines = str(err).split("\n")
    assert lines[0] == f"path/to/file.py:12:{col + 1}: error: slice length must be a compile-time constant"
    assert lines[1] == "    " + LINE
    assert lines[2].index("^") == lines[1].index("k0:k")
    assert lines[2].strip() == "^"
    assert lines[3] == "hint: use k0:k0 + BK"
    assert len(lines) == 4


def test_compilation_error_keeps_attributes():
    err = TypeCheckError("bad", filename="f.py", lineno=3, col=4, source_line="x", hint="h")
    assert (err.message, err.filename, err.lineno, err.col, err.source_line, err.hint) == ("bad", "f.py", 3, 4, "x", "h")


def test_no_hint_line_when_no_hint():
    err = CompilationError("oops", filename="k.py", lineno=1, col=0, source_line="x = 1")
    assert str(err) == "k.py:1:1: error: oops\n    x = 1\n    ^"


def test_caret_counts_tabs_like_the_shown_line():
    src = "\tif\tx:"
    err = CompilationError("m", filename="k.py", lineno=2, col=src.index("x"), source_line=src)
    shown, caret = str(err).split("\n")[1:3]
    assert shown[caret.index("^")] == "x"


def test_partial_locations():
    assert str(CompilationError("m")) == "<unknown>: error: m"
    assert str(CompilationError("m", filename="a.py", lineno=7)) == "a.py:7: error: m"


def test_hierarchy():
    for cls in (UnsupportedSyntaxError, TypeCheckError, NameResolutionError, DispatchError):
        assert issubclass(cls, CompilationError)
    for cls in (CompilationError, BackendCompileError, LaunchError):
        assert issubclass(cls, TilejitError)
    with pytest.raises(TilejitError):
        raise UnsupportedSyntaxError("try is not supported", filename="k.py", lineno=1, col=0)


def test_dispatch_error_lists_every_candidate():
    err = DispatchError(
        "no lowering for gemm(bf16[64x32], bf16[32x64]) on sm_80",
        [("gemm_wgmma", "arch >= sm_90a"), ("gemm_mma_sync_m16n8k16", "K % 16 == 0 (K = 24)")],
        filename="k.py", lineno=5, col=8, source_line="        acc += a @ b",
    )
    assert err.message.startswith("no lowering for gemm")
    text = str(err)
    assert text.startswith("k.py:5:9: error: no lowering for gemm")
    assert "gemm_wgmma" in text and "arch >= sm_90a" in text
    assert "gemm_mma_sync_m16n8k16" in text and "K % 16 == 0 (K = 24)" in text
    assert err.candidates[1] == ("gemm_mma_sync_m16n8k16", "K % 16 == 0 (K = 24)")
    lines = text.split("\n")
    assert lines[1] == "    " + "        acc += a @ b"
    assert lines[2].strip() == "^" and lines[3] == "candidates:"
    assert lines[4].split() == ["gemm_wgmma", "rejected:", "arch", ">=", "sm_90a"]
    assert len(lines) == 6


def test_backend_compile_error_message():
    err = BackendCompileError("k.cu(3): error: boom", arch="sm_80", source="src", source_path="/tmp/k.cu", name="k")
    assert (err.log, err.arch, err.source, err.source_path) == ("k.cu(3): error: boom", "sm_80", "src", "/tmp/k.cu")
    text = str(err)
    assert "sm_80" in text and "/tmp/k.cu" in text and "k.cu(3): error: boom" in text
    err.source_path = "/cache/entry/k.cu"  # the cache moves the source and says where
    assert "/cache/entry/k.cu" in str(err)


def test_dispatch_error_without_candidates_keeps_the_message():
    err = DispatchError("no lowering of copy fits on sm_80 (candidates: a: x; b: y)", hint="change the tile")
    assert str(err) == "<unknown>: error: no lowering of copy fits on sm_80 (candidates: a: x; b: y)\nhint: change the tile"
