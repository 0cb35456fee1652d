"""Triton's ``tl.`` names that the language spells differently, with the tilejit spelling of each.

A kernel ported from Triton reaches for ``T.load``, ``T.dot`` or ``T.trans``; the frontend's error for an unknown
attribute of ``tilejit.language`` gives the entry of this table as its hint, instead of a did-you-mean that
sends the user to a name that merely looks alike (``T.trans`` is not ``T.tanh``). The "Coming from Triton"
section of docs/language.md is the same table, side by side; ``tilejit port`` translates the common cases.
"""
from __future__ import annotations

_SLICES = ("slices replace pointers, offsets and masks: elements outside the tensor read 0 and are not written, "
           "so no mask is written")

TRITON_SPELLINGS: dict[str, str] = {
    "load": f"a load is a slice of the tensor: x = X[i:i + BLOCK] ({_SLICES})",
    "store": f"a store is a slice assignment: Y[i:i + BLOCK] = y, or T.copy(y, Y[i:i + BLOCK]) ({_SLICES})",
    "dot": ("a matrix product is a @ b; acc += a @ b or acc = T.gemm(a, b, acc) accumulates "
            "(T.gemm takes out_dtype= and precision= as tl.dot does: 'ieee', 'tf32', 'tf32x3')"),
    "dot_scaled": "not supported: scale the operands, then a @ b",
    "trans": "the transpose of a 2-D tile is x.T (in a product, T.gemm(a, b, acc, transpose_b=True))",
    "permute": "the transpose of a 2-D tile is x.T; tiles of 3 or more dims cannot be permuted",
    "make_block_ptr": ("a block pointer is a slice of the tensor: A[m0:m0 + BM, k0:k0 + BK] (out-of-bounds elements "
                       "read 0; no boundary_check or padding_option needed)"),
    "advance": "move the slice's start instead of advancing a block pointer: A[m0:m0 + BM, k0 + BK:k0 + 2 * BK]",
    "make_tensor_descriptor": "a tensor descriptor is a slice of the tensor; the compiler uses the TMA where it can",
    "load_tensor_descriptor": "a descriptor load is a slice of the tensor: A[m0:m0 + BM, k0:k0 + BK]",
    "store_tensor_descriptor": "a descriptor store is a slice assignment: C[m0:m0 + BM, n0:n0 + BN] = acc",
    "expand_dims": "add a dimension with None: x[:, None] or x[None, :]",
    "broadcast_to": "tiles broadcast as in NumPy: x[:, None] + y[None, :] needs no broadcast_to",
    "broadcast": "tiles broadcast as in NumPy: x[:, None] + y[None, :] needs no broadcast",
    "reshape": "tiles cannot be reshaped: load the shape you need (X[...] with that slice) or add dims with None",
    "view": "tiles cannot be reshaped: load the shape you need (X[...] with that slice) or add dims with None",
    "cast": "convert with x.to(T.float16)",
    "static_assert": "assert on constexprs is checked at compile time: assert BLOCK % 16 == 0, '...'",
    "device_assert": "no device asserts: check inputs before the launch, or run under TILEJIT_INTERPRET=1",
    "static_print": "no printing in kernels: kernel.ir(...) shows the IR; run under TILEJIT_INTERPRET=1 to debug",
    "device_print": "no printing in kernels: run under TILEJIT_INTERPRET=1 and compare with torch",
    "debug_barrier": "no barriers are written: the compiler places them",
    "argmax": "not supported yet: compute T.max(x, axis) and compare, e.g. T.min(T.where(x == m[:, None], idx, N), 1)",
    "argmin": "not supported yet: compute T.min(x, axis) and compare, e.g. T.min(T.where(x == m[:, None], idx, N), 1)",
    "softmax": "write it out: p = T.exp(x - T.max(x, 1)[:, None]); p / T.sum(p, 1)[:, None]",
    "clamp": "T.minimum(T.maximum(x, lo), hi)",
    "fdiv": "x / y",
    "div_rn": "x / y",
    "floor": "not in the language yet: for x >= 0, x.to(T.int32) truncates",
    "ceil": "not in the language yet: for ints, T.cdiv(a, b)",
    "log1p": "T.log(1.0 + x)",
    "associative_scan": "T.cumsum(x, axis) is the one scan",
    "swizzle2d": "compute the grouped tile order with integer math on T.program_id(0) (see the matmul tutorial port)",
    "rand": "no random numbers in kernels: generate them with torch and pass the tensor",
    "randn": "no random numbers in kernels: generate them with torch and pass the tensor",
    "inline_asm_elementwise": "not supported",
    "join": "not supported: build the tile with T.where over T.arange",
    "split": "not supported: load each half with its own slice",
    "interleave": "not supported",
    "int1": "T.bool",
    "float8e4nv": "T.float8_e4m3fn",
    "float8e5": "T.float8_e5m2",
    "math": "the math functions are T.exp, T.log, T.sqrt, T.rsqrt, ... directly on T",
    "extra": "libdevice's functions are T.exp, T.log, T.erf, T.tanh, ... directly on T",
    "tensor": "tiles have no type to name: T.zeros((BM, BN), T.float32) makes one",
}


def triton_spelling(name: str) -> str | None:
    """How the language spells Triton's ``tl.<name>``, or None when Triton's name is not in the table."""
    spelling = TRITON_SPELLINGS.get(name)
    return f"Triton's tl.{name}: {spelling}" if spelling is not None else None
