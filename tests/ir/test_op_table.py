"""The op table: every op kind is declared once (ir/ops.py) and has a rule in each per-layer table.

Adding an op kind without its interpreter, layout or CUDA emission rule fails here, not in a user's kernel.
"""
from __future__ import annotations

import dataclasses

import pytest

from tilejit import interpreter
from tilejit.backend_cuda import emitter, stages  # noqa: F401  (stages imports every lowering module)
from tilejit.ir import OpKind, Trait
from tilejit.ir.ops import no_rule
from tilejit.passes import layouts

TABLES = {
    "interpreter": interpreter._RULES,
    "layout inference": layouts.LAYOUT_RULES,
    "CUDA emitter": emitter.RULES,
}


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_op_kind_has_a_rule(table):
    rules = TABLES[table]
    missing = [k.mnemonic for k in OpKind if k not in rules]
    assert not missing, f"op kinds without a {table} rule: {missing}"


@pytest.mark.parametrize("kind", list(OpKind), ids=lambda k: k.mnemonic)
def test_declaration_is_complete(kind):
    decl = kind.value
    assert dataclasses.is_dataclass(decl.attrs) and decl.attrs.__dataclass_params__.frozen
    assert callable(decl.verify)
    # a terminator never has regions or effects; an op with regions is never pure (its effects are its body's)
    if kind.has(Trait.TERMINATOR):
        assert not kind.has(Trait.REGIONS) and not kind.writes_memory
    if kind.has(Trait.REGIONS):
        assert not kind.is_pure
    assert not (kind.is_pure and (kind.writes_memory or kind.has(Trait.READS_MEMORY)))


def test_mnemonics_are_unique():
    names = [k.mnemonic for k in OpKind]
    assert len(names) == len(set(names))


def test_kinds_with_structure_declare_a_real_rule():
    """Ops whose operands must agree with each other or with their regions carry a structural rule."""
    structured = {OpKind.BINARY, OpKind.UNARY, OpKind.COMPARE, OpKind.SELECT, OpKind.CAST, OpKind.GEMM,
                  OpKind.LOAD, OpKind.STORE, OpKind.FOR, OpKind.IF, OpKind.WHILE, OpKind.CONVERT_LAYOUT}
    assert all(k.value.verify is not no_rule for k in structured)


def test_passes_read_traits_not_kind_sets():
    """cleanup keeps effects by trait: a store survives with no users, a pure op does not."""
    assert OpKind.STORE.writes_memory and not OpKind.LOAD.writes_memory
    assert OpKind.YIELD.is_terminator
    assert {k for k in OpKind if k.is_elementwise} == {OpKind.BINARY, OpKind.UNARY, OpKind.COMPARE,
                                                        OpKind.SELECT, OpKind.CAST, OpKind.FMA}
