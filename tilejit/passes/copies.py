"""Choose each shared-memory load's global -> shared lowering through the dispatch registry ("copy").

Runs after pipelining: the bulk tensor copy (TMA) is only used for loads a pipelined loop prefetches.
"""
from __future__ import annotations

from dataclasses import replace

from .. import knobs
from ..target import CopyQuery
from ..target import REGISTRY, Target
from ..ir import Block, Function, OpKind, Scope


def select_copies(fn: Function, target: Target) -> None:
    specs = fn.attrs.get("tensor_specs", {})
    for op in fn.walk():
        if op.kind is not OpKind.LOAD or not op.result.is_tile or op.result.type.scope is not Scope.SHARED:
            continue
        tensor = op.operands[0]
        # A view (T.bounded) has no specialization of its own the host-encoded TMA descriptor could follow
        spec = specs.get(tensor.name) if tensor.owner is None or isinstance(tensor.owner, Block) else None
        query = CopyQuery(op, spec, bool(op.attrs.pipeline))
        impl = REGISTRY.select("copy", query, target, op.loc, only=knobs.copy_lowering())
        op.attrs = replace(op.attrs, copy=impl.name)
