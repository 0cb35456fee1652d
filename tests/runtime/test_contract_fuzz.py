"""Property-based fuzz of the launch contract.

Random small kernels (a family of templates with their op, scale, transpose and reduction chosen by constexprs)
and random launches go through the interpreter (TILEJIT_INTERPRET=1), an sm_90a compile that stops after
CUDA emission, and the argument checks: lengths 0, 1 and primes, strided, offset (unaligned), ``as_strided`` and
overlapping ``expand()`` views (torch has no negative strides), transposed 2-d views, wrong dtypes and arities,
huge ints, bad grids, constexpr misuse. Generated kernels add names in other scripts than Latin, float constants
outside float32's range, flat expressions past the nesting limit, tiles past the element limit and outputs that
overlap themselves or require grad. Every outcome must be a correct result (against a float64 torch reference, or
float32 op by op for the generated kernels) or a TilejitError (a CompilationError located at a line of the
kernel): never another exception from inside tilejit, a hang or a crash. Examples are derandomized so CI runs the
same ~1,300 cases every time.
"""
from __future__ import annotations

import hashlib
import importlib.util
import math

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import tilejit
import tilejit.language as T
from tilejit.errors import CompilationError, TilejitError

from kernels import matmul


@tilejit.kernel
def ew_binary(X, Y, Z, s, C: T.constexpr, BLOCK: T.constexpr, OP: T.constexpr):
    i = T.program_id(0) * BLOCK
    x = X[i:i + BLOCK]
    y = Y[i:i + BLOCK]
    if OP == "add":
        r = x + y
    elif OP == "mul":
        r = x * y
    elif OP == "max":
        r = T.maximum(x, y)
    else:
        r = x - y
    Z[i:i + BLOCK] = r * C + s


@tilejit.kernel
def tile2d(X, Y, BM: T.constexpr, BN: T.constexpr, TRANS: T.constexpr):
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    if TRANS:
        Y[n0:n0 + BN, m0:m0 + BM] = X[m0:m0 + BM, n0:n0 + BN].T
    else:
        Y[m0:m0 + BM, n0:n0 + BN] = X[m0:m0 + BM, n0:n0 + BN] * 2


@tilejit.kernel
def rowsum(X, Y, BM: T.constexpr, BN: T.constexpr):
    m0 = T.program_id(0) * BM
    acc = T.zeros((BM,), T.float32)
    for n0 in range(0, X.shape[1], BN):
        acc += T.sum(X[m0:m0 + BM, n0:n0 + BN].to(T.float32), axis=1)
    Y[m0:m0 + BM] = acc.to(Y.dtype)


LENGTHS = [0, 1, 2, 3, 5, 7, 13, 16, 17, 31, 37, 64, 97]
FLOATS = [torch.float16, torch.bfloat16, torch.float32]
ODD_DTYPES = [torch.int8, torch.int32, torch.int64, torch.float64, torch.bool, torch.complex64, torch.uint8]
TOL = {torch.float16: 4e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5, torch.float64: 1e-5}
BAD_BLOCKS = [0, -16, 3, 1.5, "16", None, [16], (16,), 2 ** 70, True, torch.float32]
BAD_GRIDS = [(0,), (-1,), (), (1, 1, 1, 1), (1.5,), ("1",), (2 ** 31,), None, [2], (1, 2 ** 17)]
BAD_SCALARS = [2 ** 70, -(2 ** 64), "1", None, [1.0], object(), torch.zeros(2), complex(1, 2)]


@pytest.fixture(scope="module", autouse=True)
def interpret():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TILEJIT_INTERPRET", "1")
        yield


def outcome(run) -> str:
    """'ok', or 'error' for a TilejitError (a CompilationError must point at a line of the kernel); any other
    exception propagates and fails the example."""
    try:
        run()
    except TilejitError as error:
        if isinstance(error, CompilationError):
            assert error.lineno and error.lineno > 0, f"unlocated: {error}"
        return "error"
    return "ok"


def layout(draw, n: int, dtype: torch.dtype, *, out: bool = False) -> torch.Tensor:
    """A 1-d tensor of length ``n`` in one of several memory layouts."""
    kind = draw(st.sampled_from(["contiguous", "strided", "offset", "as_strided", "expand"]
                                if not out else ["contiguous", "strided", "offset", "as_strided"]))
    make = (lambda k: torch.full((k,), math.nan, dtype=dtype)) if out else (
        lambda k: torch.randn(k).to(dtype) if dtype.is_floating_point or dtype.is_complex
        else torch.randint(-3, 4, (k,)).to(dtype))
    if kind == "contiguous":
        return make(n)
    if kind == "strided":
        return make(2 * n + 1)[::2][:n]
    if kind == "offset":
        return make(n + 1)[1:]
    if kind == "as_strided":
        return make(3 * n + 1).as_strided((n,), (3,), 1)
    return make(1).expand(n)


@st.composite
def binary_case(draw):
    n = draw(st.sampled_from(LENGTHS))
    dtype = draw(st.sampled_from(FLOATS))
    block = draw(st.sampled_from([16, 32, 64]))
    x, y = layout(draw, n, dtype), layout(draw, n, dtype)
    z = layout(draw, n, dtype, out=True)
    args = [x, y, z, draw(st.sampled_from([0.5, -1.0, 0, 3, True]))]
    kwargs = {"C": draw(st.sampled_from([1, 2, 0.5, -1, True])), "BLOCK": block,
              "OP": draw(st.sampled_from(["add", "mul", "max", "sub"]))}
    grid = (max(1, -(-n // block)) + draw(st.sampled_from([0, 0, 0, 1, 3])),)
    mutation = draw(st.sampled_from(["none"] * 4 + ["dtype", "mixed", "block", "grid", "scalar", "arity",
                                                    "keyword", "constexpr", "rank", "overlap_out", "lambda_grid"]))
    if mutation == "dtype":
        args[draw(st.sampled_from([0, 1, 2]))] = layout(draw, n, draw(st.sampled_from(ODD_DTYPES)))
    elif mutation == "mixed":
        args[1] = layout(draw, n, draw(st.sampled_from(FLOATS)))
    elif mutation == "block":
        kwargs["BLOCK"] = draw(st.sampled_from(BAD_BLOCKS))
    elif mutation == "grid":
        grid = draw(st.sampled_from(BAD_GRIDS))
    elif mutation == "scalar":
        args[3] = draw(st.sampled_from(BAD_SCALARS))
    elif mutation == "arity":
        args = args[:draw(st.integers(0, 3))] if draw(st.booleans()) else args + [x]
    elif mutation == "keyword":
        kwargs[draw(st.sampled_from(["FOO", "X", "num_warps", "num_stages"]))] = draw(
            st.sampled_from([3, 4, "4", None, -1]))
    elif mutation == "constexpr":
        kwargs[draw(st.sampled_from(["C", "OP"]))] = draw(st.sampled_from(["add", "nope", None, (1, 2), 1e300, x]))
    elif mutation == "rank":
        args[draw(st.sampled_from([0, 1, 2]))] = torch.zeros(n, 2, dtype=dtype)
    elif mutation == "overlap_out":
        args[2] = torch.zeros(1, dtype=dtype).expand(n)
    elif mutation == "lambda_grid":
        grid = draw(st.sampled_from([lambda meta: (-(-n // meta["BLOCK"]) or 1,), lambda meta: (0,),
                                     lambda meta: "x", lambda meta: (1, 1, 1, 1)]))
    return mutation, grid, args, kwargs


def _reference(op: str, x, y, c, s):
    x, y = x.double(), y.double()
    r = {"add": x + y, "mul": x * y, "max": torch.maximum(x, y), "sub": x - y}[op]
    return r * float(c) + float(s)


@settings(max_examples=700, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(binary_case())
def test_random_elementwise_launches_are_correct_or_a_tilejit_error(case):
    mutation, grid, args, kwargs = case
    result = outcome(lambda: ew_binary[grid](*args, **kwargs))
    event(f"{mutation}: {result}")
    if result == "error":
        assert mutation != "none", "a valid launch failed"
        return
    if mutation in ("none", "mixed"):
        x, y, z, s = args
        ref = _reference(kwargs["OP"], x, y, kwargs["C"], s)
        tol = max(TOL[x.dtype], TOL[y.dtype], TOL[z.dtype])
        assert not z.isnan().any(), "elements were not written"
        torch.testing.assert_close(z.double(), ref, rtol=tol, atol=tol * (1 + ref.abs().max().item() if len(ref)
                                                                                   else 1))


@st.composite
def tile_case(draw):
    m, n = draw(st.sampled_from(LENGTHS[:10])), draw(st.sampled_from(LENGTHS[:10]))
    dtype = draw(st.sampled_from(FLOATS))
    base = torch.randn(m, n).to(dtype)
    view = draw(st.sampled_from(["contiguous", "transposed", "sliced", "expand"]))
    if view == "transposed":
        x = torch.randn(n, m).to(dtype).t()
    elif view == "sliced":
        x = torch.randn(m + 1, 2 * n + 1).to(dtype)[1:, ::2][:, :n]
    elif view == "expand":
        x = torch.randn(1, n).to(dtype).expand(m, n)
    else:
        x = base
    bm, bn = draw(st.sampled_from([16, 32])), draw(st.sampled_from([16, 32]))
    kernel = draw(st.sampled_from(["tile2d", "rowsum"]))
    trans = draw(st.booleans())
    if kernel == "tile2d":
        y = torch.full((n, m) if trans else (m, n), math.nan, dtype=dtype)
        kwargs = {"BM": bm, "BN": bn, "TRANS": trans}
        grid = (max(1, -(-m // bm)), max(1, -(-n // bn)))
    else:
        y = torch.full((m,), math.nan, dtype=dtype)
        kwargs = {"BM": bm, "BN": bn}
        grid = (max(1, -(-m // bm)),)
    mutation = draw(st.sampled_from(["none"] * 3 + ["block", "grid", "arity", "dtype", "rank"]))
    args = [x, y]
    if mutation == "block":
        kwargs[draw(st.sampled_from(["BM", "BN"]))] = draw(st.sampled_from(BAD_BLOCKS))
    elif mutation == "grid":
        grid = draw(st.sampled_from(BAD_GRIDS))
    elif mutation == "arity":
        args = args[:1] if draw(st.booleans()) else args + [y]
    elif mutation == "dtype":
        args[0] = x.to(draw(st.sampled_from(ODD_DTYPES)))
    elif mutation == "rank":
        args[draw(st.sampled_from([0, 1]))] = torch.zeros(3, dtype=dtype)
    return kernel, mutation, grid, args, kwargs


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(tile_case())
def test_random_2d_tile_and_reduction_launches_are_correct_or_a_tilejit_error(case):
    name, mutation, grid, args, kwargs = case
    kernel = {"tile2d": tile2d, "rowsum": rowsum}[name]
    result = outcome(lambda: kernel[grid](*args, **kwargs))
    event(f"{name} {mutation}: {result}")
    if result == "error":
        assert mutation != "none", "a valid launch failed"
        return
    if mutation != "none":
        return
    x, y = args
    if name == "tile2d":
        ref = x.double().t() if kwargs["TRANS"] else x.double() * 2
    else:
        ref = x.double().sum(dim=1)
    tol = TOL[y.dtype] * (1 + (x.double().abs().sum(dim=1).max().item() if x.numel() else 0))
    assert not y.isnan().any(), "elements were not written"
    torch.testing.assert_close(y.double(), ref, rtol=TOL[y.dtype], atol=tol)


@st.composite
def compile_case(draw):
    which = draw(st.sampled_from(["ew", "tile2d", "rowsum", "matmul"]))
    dtype = draw(st.sampled_from(FLOATS + [torch.int8, torch.float64]))
    n = draw(st.sampled_from([0, 1, 7, 16, 64]))
    sizes = st.sampled_from([1, 2, 3, 8, 16, 32, 64, 128])
    if which == "ew":
        v = torch.zeros(n, dtype=dtype)
        args = (v, v, v, draw(st.sampled_from([1, 2 ** 40, 0.5, True])))
        kwargs = {"C": draw(st.sampled_from([1, 2.0, True])), "BLOCK": draw(sizes),
                  "OP": draw(st.sampled_from(["add", "mul", "max", "sub", "nope"]))}
    elif which == "tile2d":
        v = torch.zeros(n, n + 1, dtype=dtype)
        args, kwargs = (v, v), {"BM": draw(sizes), "BN": draw(sizes), "TRANS": draw(st.booleans())}
    elif which == "rowsum":
        args = (torch.zeros(n, 3, dtype=dtype), torch.zeros(n, dtype=dtype))
        kwargs = {"BM": draw(sizes), "BN": draw(sizes)}
    else:
        a = torch.zeros(n, 32, dtype=dtype)
        args = (a, torch.zeros(32, n, dtype=dtype), torch.zeros(n, n, dtype=dtype))
        kwargs = {"BM": draw(sizes), "BN": draw(sizes), "BK": draw(sizes)}
    kwargs["num_warps"] = draw(st.sampled_from([1, 4, 8]))
    return which, args, kwargs


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(compile_case(), st.sampled_from(["sm_90a", "sm_100a"]))
def test_random_sm90a_compiles_emit_cuda_or_a_tilejit_error(case, arch):
    which, args, kwargs = case
    kernel = {"ew": ew_binary, "tile2d": tile2d, "rowsum": rowsum, "matmul": matmul}[which]
    made = {}
    result = outcome(lambda: made.setdefault("st", kernel.compile(*args, arch=arch, stop_after="cuda",
                                                                   **kwargs)))
    event(f"{which}: {result}")
    if result == "ok":
        assert "__global__" in made["st"].cuda


# -- generated kernels: names in any script, extreme float constants, deep expressions, huge tiles, overlapping
# outputs. Each kernel is written to a file of its own (kernels need their source on disk) and goes through the
# interpreter and a compile that stops after CUDA emission or NVRTC's PTX.

NAMES = ["x", "ядро", "Икс", "β", "变量", "名前", "x_1", "_я", "ñandú", "Ω2", "δέλτα", "tile", "אב", "z_ß"]
EXTREME_FLOATS = [1e39, -1e39, 1e308, 5e-324, -5e-324, 1e-40, 3.4028236e38, -0.0, 0.5, float("inf"), 2.0 ** -149]
TERMS = [1, 2, 7, 60, 150, 250, 600]
BLOCKS = [16, 64, 2 ** 17, 2 ** 40]


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("generated_kernels")


def _generated_kernel(directory, names: list[str], terms: int):
    """A kernel Z[i:i + B] = X[...] * C + s (+ X[...] repeated): ``terms`` terms in one flat expression."""
    kernel, x, z, s, c, b, i, v = names
    tail = "".join(f" + {v}" for _ in range(terms - 1))
    source = (f"import tilejit\nimport tilejit.language as T\n\n\n@tilejit.kernel\n"
              f"def {kernel}({x}, {z}, {s}, {c}: T.constexpr, {b}: T.constexpr):\n"
              f"    {i} = T.program_id(0) * {b}\n"
              f"    {v} = {x}[{i}:{i} + {b}]\n"
              f"    {z}[{i}:{i} + {b}] = {v} * {c} + {s}{tail}\n")
    stem = "gen_" + hashlib.sha256(source.encode()).hexdigest()[:16]
    path = directory / f"{stem}.py"
    if not path.exists():
        path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, kernel)


@st.composite
def generated_case(draw):
    names = draw(st.lists(st.sampled_from(NAMES), min_size=8, max_size=8, unique=True))
    terms = draw(st.sampled_from(TERMS + [t for t in TERMS if t <= 150] * 2))  # mostly within the limits
    block = draw(st.sampled_from(BLOCKS + [b for b in BLOCKS if b <= 2 ** 16] * 2))
    constant = draw(st.sampled_from(EXTREME_FLOATS))
    n = draw(st.sampled_from([1, 5, 16, 37]))
    output = draw(st.sampled_from(["plain"] * 3 + ["expand", "requires_grad"]))
    stage = draw(st.sampled_from(["cuda", "cuda", "ptx"]))
    scalar = draw(st.sampled_from([0.25, -3.0, 1e30]))
    return names, terms, block, constant, n, output, stage, scalar


def _generated_reference(x, c: float, s: float, terms: int):
    """The kernel's float32 computation, op by op as the interpreter and the GPU do it."""
    r = x * torch.tensor(c, dtype=torch.float32) + torch.tensor(s, dtype=torch.float32)
    for _ in range(terms - 1):
        r = r + x
    return r


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(generated_case())
def test_generated_kernels_with_extreme_inputs_run_compile_or_give_a_located_error(kernel_dir, case):
    names, terms, block, constant, n, output, stage, scalar = case
    kernel = _generated_kernel(kernel_dir, names, terms)
    too_deep, too_large = terms > 200, block > 2 ** 16
    x = torch.randn(n)
    z = {"plain": lambda: torch.full((n,), math.nan), "expand": lambda: torch.zeros(1).expand(n),
         "requires_grad": lambda: torch.zeros(n, requires_grad=True)}[output]()
    bad_output = output == "requires_grad" or (output == "expand" and n > 1)
    kwargs = {names[4]: constant, names[5]: block}
    result = outcome(lambda: kernel[(-(-n // block),)](x, z, scalar, **kwargs))
    event(f"interpret terms={terms} block={block} output={output}: {result}")
    if too_deep or too_large or bad_output:
        assert result == "error", (terms, block, output)
    elif terms <= 150:
        assert result == "ok", case
        expected = _generated_reference(x, constant, scalar, terms)
        torch.testing.assert_close(z, expected, equal_nan=True, rtol=0, atol=0)
    made = {}
    result = outcome(lambda: made.setdefault("st", kernel.compile(x, torch.zeros(n), scalar, arch="sm_90a",
                                                                  stop_after=stage, **kwargs)))
    event(f"compile {stage} terms={terms} block={block}: {result}")
    if too_deep or too_large:
        assert result == "error"
    elif terms <= 150:
        assert result == "ok", case
        assert made["st"].cuda.isascii()
