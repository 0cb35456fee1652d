"""Tensor lists: ``As[g]`` and ``len(As)`` of a tensor-list argument.

A tensor-list parameter reaches the kernel as the address of a table the launch writes on the device
(``runtime/tensor_lists.py``) and the list's length. Row ``g`` of the table holds tensor ``g``'s data pointer,
its sizes and its strides, as int64 (``1 + 2 * rank`` words). An item is then the same three things a tensor
parameter passes by value (``<name>``, ``<name>_size<d>``, ``<name>_stride<d>``), so every load, store, gather
and atomic lowers through it unchanged. The table is never written by a kernel. TMA is never used through an
item: a tensor map is encoded on the host per tensor, and an item is only known on the device.
"""
from __future__ import annotations

from ..ir import Op, OpKind
from .emitter import Emitter, c_type, emits


def table_row_words(rank: int) -> int:
    """int64 words per tensor in a list's table: the pointer, the sizes, the strides."""
    return 1 + 2 * rank


@emits(OpKind.LIST_ITEM)
def _list_item(em: Emitter, op: Op) -> None:
    """Read row ``g`` of the table. An index outside the list reads no row and gives an empty tensor (every
    extent 0): loads through it read 0, stores skip every element."""
    tensors, index = op.operands
    out = op.result
    lst, name, rank = em.name(tensors), em.name(out), out.type.rank
    ok, row = em.fresh("tj_in_list"), em.fresh("tj_row")
    em.comment(op, f"tensor {em.name(index)} of the list {lst}")
    em.line(f"const bool {ok} = (uint64_t)(int64_t)({em.name(index)}) < (uint64_t){lst}_len;")
    em.line(f"const int64_t* const {row} = {lst}_table + ({ok} ? (int64_t)({em.name(index)}) : (int64_t)0) * "
            f"{table_row_words(rank)};")
    ctype = c_type(out.dtype)
    em.line(f"{ctype}* const {name} = {ok} ? reinterpret_cast<{ctype}*>({row}[0]) : ({ctype}*)nullptr;")
    for d in range(rank):
        em.line(f"const int64_t {name}_size{d} = {ok} ? {row}[{1 + d}] : (int64_t)0;")
    for d in range(rank):
        em.line(f"const int64_t {name}_stride{d} = {ok} ? {row}[{1 + rank + d}] : (int64_t)0;")


@emits(OpKind.LIST_LEN)
def _list_len(em: Emitter, op: Op) -> None:
    em.line(f"const int64_t {em.name(op.result)} = {em.name(op.operands[0])}_len;")
