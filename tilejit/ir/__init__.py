"""The tile IR: types, ops, SSA values, a builder, a printer and a verifier."""
from .builder import Builder
from .core import Block, Function, Loc, MultipleOf, Op, Param, Value
from .ops import (ATOMIC_SCOPES, ATOMIC_SEMS, AccessAttrs, ArangeAttrs, AtomicAttrs, AtomicOp, AxisAttrs, BinaryAttrs,
                  BinaryOp, CastAttrs, CompareAttrs, CompareOp, ConstantAttrs, F32_PRECISIONS, FP8_PRECISIONS, Family,
                  OpDecl, Trait, ForAttrs, GemmAttrs, IndexedAttrs, gemm_precisions, is_block_scaled, LoopKind, MX_BLOCK,
                  NoAttrs, OpKind,
                  PermAttrs, ReduceAttrs, ReduceKind, ShapeAttrs, SplitAttrs, StreamKAttrs, UnaryAttrs, UnaryOp)
from .printer import print_function
from .types import Scope, ScalarType, TensorListType, TensorType, TileType
from .verifier import IRVerificationError, verify
