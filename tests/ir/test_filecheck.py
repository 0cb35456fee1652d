"""The pure-Python FileCheck used by the expected-text tests: it must pass when it should and fail when it should."""
from __future__ import annotations

import pytest

from filecheck import FileCheckSyntaxError, filecheck

IR = """\
tj.func @k(%A: tensor<2d x f16>) constexprs {BM = 64} {
  %0 = tj.program_id {axis = 0} : i32
  %1 = tj.constant {value = 64} : i32
  %m0 = tj.binary %0, %1 {op = mul} : i32
  %x = tj.load %A[%m0, %1] {shape = [64, 32]} : tile<64x32xf16>
  tj.store %x, %A[%m0, %1] {shape = [64, 32]}
}
"""


def fails(checks: str, text: str = IR) -> str:
    with pytest.raises(AssertionError) as info:
        filecheck(text, checks)
    return str(info.value)


def test_check_in_order():
    filecheck(IR, """
        CHECK: tj.func @k
        CHECK: tj.program_id
        CHECK: tj.load
        CHECK: tj.store
    """)


def test_check_out_of_order_fails():
    msg = fails("""
        CHECK: tj.load
        CHECK: tj.program_id
    """)
    assert "CHECK failed: pattern not found" in msg
    assert "CHECK: tj.program_id" in msg
    assert "check line 3" in msg
    # the search started right after the load, on input line 5
    assert "input line 5" in msg
    assert ">>5 |   %x = tj.load" in msg


def test_missing_pattern_fails_and_shows_text():
    msg = fails("CHECK: tj.gemm")
    assert "CHECK: tj.gemm" in msg
    assert "input line 1, column 1" in msg
    assert "tj.func @k" in msg and "tj.store" in msg


def test_check_next():
    filecheck(IR, """
        CHECK: tj.program_id
        CHECK-NEXT: tj.constant
        CHECK-NEXT: tj.binary
    """)
    msg = fails("""
        CHECK: tj.program_id
        CHECK-NEXT: tj.binary
    """)
    assert "CHECK-NEXT failed" in msg
    assert "line after the previous match" in msg


def test_check_next_at_end_of_input_fails():
    msg = fails("CHECK: b\nCHECK-NEXT: c", text="a\nb")
    assert "no next line" in msg


def test_check_same():
    filecheck(IR, """
        CHECK: tj.load
        CHECK-SAME: {shape = [64, 32]}
        CHECK-SAME: tile<64x32xf16>
    """)
    # SAME only looks after the previous match on its line
    msg = fails("""
        CHECK: tile<64x32xf16>
        CHECK-SAME: tj.load
    """)
    assert "CHECK-SAME failed" in msg


def test_check_not_between_matches():
    filecheck(IR, """
        CHECK: tj.program_id
        CHECK-NOT: tj.gemm
        CHECK: tj.store
    """)
    msg = fails("""
        CHECK: tj.program_id
        CHECK-NOT: tj.load
        CHECK: tj.store
    """)
    assert "CHECK-NOT failed" in msg
    assert "input line 5" in msg  # where the forbidden text was found
    assert "'tj.load'" in msg


def test_check_not_only_looks_between_its_neighbours():
    # tj.load occurs later in the text, but not between the header and the program id
    filecheck(IR, """
        CHECK: tj.func
        CHECK-NOT: tj.load
        CHECK: tj.program_id
    """)


def test_trailing_check_not_runs_to_the_end():
    filecheck(IR, "CHECK: tj.store\nCHECK-NOT: tj.load")
    msg = fails("CHECK: tj.binary\nCHECK-NOT: tj.store")
    assert "CHECK-NOT failed" in msg


def test_leading_check_not():
    filecheck(IR, "CHECK-NOT: tj.gemm\nCHECK: tj.func")
    assert "CHECK-NOT failed" in fails("CHECK-NOT: tj.constant\nCHECK: tj.store")


def test_regex_blocks():
    filecheck(IR, "CHECK: %{{[0-9]+}} = tj.constant {value = {{[0-9]+}}} : i32")
    fails("CHECK: %{{[a-z]+}} = tj.constant")


def test_captures_and_uses():
    filecheck(IR, """
        CHECK: [[PID:%[0-9]+]] = tj.program_id
        CHECK: [[C:%[0-9]+]] = tj.constant
        CHECK: %m0 = tj.binary [[PID]], [[C]] {op = mul}
    """)
    msg = fails("""
        CHECK: [[PID:%[0-9]+]] = tj.program_id
        CHECK: [[C:%[0-9]+]] = tj.constant
        CHECK: %m0 = tj.binary [[C]], [[PID]]
    """)
    assert "variables" in msg and "'PID': '%0'" in msg


def test_capture_used_in_the_same_pattern():
    filecheck("x = add %a, %a", "CHECK: add [[V:%[a-z]]], [[V]]")
    fails("CHECK: add [[V:%[a-z]]], [[V]]", text="x = add %a, %b")


def test_literal_bracket_before_a_variable():
    filecheck("tj.load %Y[%3] {shape = [16]}", "CHECK: %Y[[[C:%[0-9]+]]] {shape = [16]}")
    filecheck("x = %3\ntj.load %Y[%3]", "CHECK: x = [[C:%[0-9]+]]\nCHECK: %Y[[[C]]]")
    fails("CHECK: x = [[C:%[0-9]+]]\nCHECK: %Y[[[C]]]", text="x = %3\ntj.load %Y[%4]")


def test_undefined_variable_fails():
    msg = fails("CHECK: [[NOPE]]")
    assert "before it is defined" in msg


def test_literal_text_is_not_a_regex():
    filecheck("a.b (c) [d] $e", "CHECK: a.b (c) [d] $e")
    fails("CHECK: a.b", text="axb")


def test_whitespace_runs_match_any_horizontal_whitespace():
    filecheck("a    b\tc", "CHECK: a b c")
    fails("CHECK: a b", text="a\nb")  # never across lines


def test_label_splits_blocks():
    text = "func @f\n  tj.load\nfunc @g\n  tj.store\n"
    filecheck(text, """
        CHECK-LABEL: func @f
        CHECK: tj.load
        CHECK-LABEL: func @g
        CHECK: tj.store
    """)
    # tj.store exists, but only in @g's block
    msg = fails("""
        CHECK-LABEL: func @f
        CHECK: tj.store
        CHECK-LABEL: func @g
    """, text)
    assert "CHECK failed" in msg and "tj.store" in msg
    # CHECK-NOT inside a block stops at the next label
    filecheck(text, """
        CHECK-LABEL: func @f
        CHECK-NOT: tj.store
        CHECK-LABEL: func @g
    """)
    assert "label not found" in fails("CHECK-LABEL: func @h", text)


def test_matches_do_not_overlap():
    filecheck("aa", "CHECK: a\nCHECK-SAME: a")
    fails("CHECK: a\nCHECK-SAME: a", text="a")
    fails("CHECK: x\nCHECK: x", text="x\n")


def test_malformed_checks_are_rejected():
    with pytest.raises(FileCheckSyntaxError):
        filecheck(IR, "CHEK: tj.func")
    with pytest.raises(FileCheckSyntaxError):
        filecheck(IR, "")
    with pytest.raises(FileCheckSyntaxError):
        filecheck(IR, "CHECK:")
    with pytest.raises(FileCheckSyntaxError):
        filecheck(IR, "CHECK-NEXT: tj.func")
    with pytest.raises(FileCheckSyntaxError):
        filecheck(IR, "CHECK: {{[}}")
    with pytest.raises(FileCheckSyntaxError):
        filecheck(IR, "CHECK: {{oops")
    with pytest.raises(FileCheckSyntaxError):
        filecheck(IR, "CHECK: [[1bad]]")
    with pytest.raises(FileCheckSyntaxError):
        filecheck(IR, "CHECK: [[V:%[0-9]+")
    with pytest.raises(FileCheckSyntaxError):
        filecheck(IR, "CHECK-LABEL: [[F:@[a-z]+]]")


def test_comments_and_blank_lines_are_ignored():
    filecheck(IR, "\n# the header\nCHECK: tj.func\n\n// then\nCHECK: tj.store\n")
