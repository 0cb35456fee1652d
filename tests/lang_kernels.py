"""Kernels of the language constructs Triton users reach for (issue 16): scalar indexing, atomics, gather and
scatter, the extra math functions. Shared by the interpreter tests (tests/frontend), the compile tests
(tests/backend) and the GPU tests (tests/gpu)."""
from __future__ import annotations

import tilejit
import tilejit.language as T


@tilejit.kernel
def scalar_index(X, Y, BN: T.constexpr):
    """Y[r, c] = 2 * X[r, c] + X[r, 0] for one row per program, element by element along the row's first BN
    columns (scalar loads and stores, out-of-bounds columns read 0 and are not written)."""
    r = T.program_id(0)
    first = X[r, 0]
    for c in T.static_range(BN):
        Y[r, c] = 2.0 * X[r, c] + first


@tilejit.kernel
def scalar_index_mixed(X, Y, Out, i, j, BN: T.constexpr):
    """A scalar read from a runtime position used with tiles, a scalar written at a runtime position (which may
    be out of bounds), and a row tile plus the scalar."""
    v = X[i, j]
    Out[i, j] = v * 3.0
    Y[0:BN] = X[i, 0:BN] + v
