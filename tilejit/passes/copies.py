"""Choose each shared-memory load's global -> shared lowering through the dispatch registry ("copy").

Runs after pipelining: the bulk tensor copy (TMA) is only used for loads a pipelined loop prefetches.
"""
from __future__ import annotations

from dataclasses import replace

from .. import knobs
from ..target import CopyQuery
from ..target import REGISTRY, Target
from ..ir import Block, Function, Op, OpKind, Scope


def load_spec(fn: Function, load: Op):
    """The specialization (``frontend.spec.TensorSpec``) of the tensor a load reads, or None: a view
    (``T.bounded``) has none of its own (nor the host-encoded TMA descriptor one could follow)."""
    tensor = load.operands[0]
    return fn.attrs.get("tensor_specs", {}).get(tensor.name) \
        if tensor.owner is None or isinstance(tensor.owner, Block) else None


def select_copies(fn: Function, target: Target) -> None:
    for op in fn.walk():
        if op.kind is not OpKind.LOAD or not op.result.is_tile or op.result.type.scope is not Scope.SHARED:
            continue
        query = CopyQuery(op, load_spec(fn, op), bool(op.attrs.pipeline))
        impl = REGISTRY.select("copy", query, target, op.loc, only=knobs.copy_lowering())
        op.attrs = replace(op.attrs, copy=impl.name)
