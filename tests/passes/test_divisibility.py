"""The divisibility analysis (passes/divisibility.py): each rule on the frontend IR of small kernels, the facts it
must not claim, and what it says about tensors (alignment, strides, extents, bounded views, list items)."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit.ir import MultipleOf, Op, OpKind, Value
from tilejit.ir.rewrite import blocks
from tilejit.passes.divisibility import UNKNOWN, Divisibility, Facts, power_of_two_part


def meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def frontend_ir(kernel, *args, **kwargs):
    return kernel.compile(*args, arch="sm_80", stop_after="ir", **kwargs).fn


def values_named(fn, name: str) -> list[Value]:
    found = [p.value for p in fn.params if p.value is not None and p.value.name == name]
    for block in blocks(fn.body):
        found += [a for a in block.args if a.name == name]
        found += [r for op in block.ops for r in op.results if r.name == name]
    return found


def facts_of(fn, name: str, kind: OpKind | None = None) -> Facts:
    """The facts of the one value called ``name`` (defined by an op of ``kind``, when given)."""
    candidates = values_named(fn, name)
    if kind is not None:
        candidates = [v for v in candidates if isinstance(v.owner, Op) and v.owner.kind is kind]
    assert len(candidates) == 1, (name, candidates)
    return Divisibility(fn).of(candidates[0])


# -- the arithmetic rules ---------------------------------------------------------------------------------------

@tilejit.kernel
def arith(Out, n, m):
    pid = T.program_id(0)
    a = pid * 48
    b = pid * 64 + pid * 16
    c = pid * 64 + m
    d = pid * 64 - pid * 32
    e = (pid * 4) * (pid * 8)
    f = n * 3
    g = pid * 64 // 16
    h = pid * 64 // 128
    i = pid // 4
    j = (pid * 64) % 48
    lo = min(pid * 32, pid * 64)
    hi = max(pid * 16, m)
    neg = -(pid * 32)
    shl = (pid * 32) << 2
    shr = (pid * 32) >> 3
    band = (pid * 48) & m
    bor = (pid * 16) | 3
    wide = (pid * 64).to(T.int64)
    narrow = (pid * 1024).to(T.int8)
    Out[0] = a + b + c + d + e
    Out[1] = f + g + h + i + j
    Out[2] = lo + hi + neg + shl + shr
    Out[3] = band + bor + wide + narrow


ARITH = {  # value: (divisor, >= 0)
    "pid": (1, True),              # a program id
    "a": (16, True),               # program id * 48: the power-of-two part of the constant
    "b": (16, True),               # a sum: the smaller divisor
    "c": (1, False),               # + an int argument not divisible by 16 (m = 5): nothing known
    "d": (32, False),              # a difference: divisor kept, sign lost
    "e": (32, True),               # a product: divisors multiply
    "f": (16, False),              # n = 32 at the call: the specialization's 16; its sign is not known
    "g": (4, True),                # an exact division by a power of two
    "h": (1, True),                # ... not exact: nothing known
    "i": (1, True),
    "j": (16, True),               # x % 48: a multiple of both divisors' smaller; >= 0 (positive divisor)
    "lo": (32, True),              # min: one of the two
    "hi": (1, True),               # max with an unknown: >= 0 since one side is
    "neg": (32, False),
    "shl": (128, True),
    "shr": (4, True),
    "band": (16, True),            # & keeps either operand's low zero bits; >= 0 when either is
    "bor": (1, True),
    "wide": (64, True),            # a widening cast keeps everything
    "narrow": (128, False),        # a narrowing one keeps the low bits only (capped at 2**7) and loses the sign
}


@pytest.mark.parametrize("name", sorted(ARITH))
def test_arithmetic_rules(name):
    fn = frontend_ir(arith, meta(32, dtype=torch.int64), 32, 5)
    divisor, nonnegative = ARITH[name]
    assert facts_of(fn, name) == Facts(divisor, nonnegative)


def test_int_arguments_divisible_by_16_and_not():
    fn = frontend_ir(arith, meta(32, dtype=torch.int64), 32, 5)
    assert facts_of(fn, "n") == Facts(16, False)
    assert facts_of(fn, "m") == UNKNOWN
    assert values_named(fn, "n")[0].multiple_of == MultipleOf((16,))
    fn = frontend_ir(arith, meta(32, dtype=torch.int64), 24, -32)  # 24: not a multiple of 16; -32 is
    assert facts_of(fn, "n") == UNKNOWN
    assert facts_of(fn, "m") == Facts(16, False)
    assert facts_of(fn, "f") == UNKNOWN


@tilejit.kernel
def promised(Out, n, m, k):
    h = T.multiple_of(m, 48)
    T.multiple_of(k, 32)
    T.multiple_of(k, 12)
    s = Out[0]
    t = T.multiple_of(Out[1], 64)
    Out[2] = h + n + k + s + t


def test_promises():
    fn = frontend_ir(promised, meta(8, dtype=torch.int64), 3, 5, 7)
    assert facts_of(fn, "m") == Facts(16, False)     # the power-of-two part of 48, on the value itself
    assert facts_of(fn, "k") == Facts(32, False)     # two promises: lcm(32, 12) = 96, whose part is 32
    assert values_named(fn, "k")[0].multiple_of == MultipleOf((96,))
    assert facts_of(fn, "s") == UNKNOWN              # a value read from memory: nothing known
    assert facts_of(fn, "t") == Facts(64, False)     # ... unless promised
    assert facts_of(fn, "n") == UNKNOWN


# -- loops and branches -----------------------------------------------------------------------------------------

@tilejit.kernel
def control(Out, K, lo, flag, m):
    for k0 in range(0, K, 32):
        Out[k0] = 1
    for k1 in range(16, K, 64):
        Out[k1] = 1
    for k2 in range(lo, K, 32):
        Out[k2] = 1
    for k3 in range(-64, K, 64):
        Out[k3] = 1
    for k4 in T.range(0, K, m):
        Out[k4] = 1
    acc = 0
    for k5 in range(0, K, 16):
        acc = acc + 16
    Out[0] = acc
    i = 0
    while i < K:
        i = i + 32
    Out[1] = i
    pid = T.program_id(0)
    if flag:
        v = pid * 32
        w = pid * 32
    else:
        v = pid * 64
        w = m
    Out[2] = v + w


@pytest.mark.parametrize("name, expected", [
    ("k0", Facts(32, True)),        # the induction variable of range(0, K, 32)
    ("k1", Facts(16, True)),        # start 16, step 64: the smaller
    ("k2", Facts(1, False)),        # an unknown start (lo = 5): nothing
    ("k3", Facts(64, False)),       # a negative start: divisor kept, sign not known
    ("k4", Facts(16, False)),       # a step m = 48, specialized divisible by 16 (its sign is not known)
])
def test_induction_variables(name, expected):
    fn = frontend_ir(control, meta(64, dtype=torch.int64), 1000, 5, True, 48)
    assert facts_of(fn, name) == expected


def test_carried_and_while_values_are_not_known():
    """A loop-carried value (acc += 16 from 0) and a while loop's value are not analyzed: nothing is known."""
    fn = frontend_ir(control, meta(64, dtype=torch.int64), 1000, 5, True, 48)
    an = Divisibility(fn)
    for name in ("acc", "i"):
        carried = [v for v in values_named(fn, name)
                   if not isinstance(v.owner, Op) or v.owner.kind is not OpKind.BINARY]
        assert carried and all(an.of(v) == UNKNOWN for v in carried), name


def test_if_results_take_both_branches():
    fn = frontend_ir(control, meta(64, dtype=torch.int64), 1000, 5, True, 48)
    assert facts_of(fn, "v", OpKind.IF) == Facts(32, True)
    assert facts_of(fn, "w", OpKind.IF) == Facts(16, False)  # m = 48 in one branch: its 16, not 32


# -- tensors ----------------------------------------------------------------------------------------------------

@tilejit.kernel
def tensors(X, Y, Out, n, BN: T.constexpr):
    T.multiple_of(X.shape[0], 16)
    T.multiple_of(X.shape[1], 32)
    T.multiple_of(Y.stride(0), 8)
    Xv = T.bounded(X, (n, X.shape[1]))
    Out[0, 0:BN] = Xv[0, 0:BN]
    Out[1, 0] = T.sum(Y[0, :], 0)


def tensor_facts(x, y, n):
    fn = frontend_ir(tensors, x, y, meta(4, 64), n, BN=64)
    an = Divisibility(fn)
    X, Y = (p.value for p in fn.params[:2])
    (Xv,) = [op.result for op in fn.walk() if op.kind is OpKind.BOUNDED]  # named X too, as views are
    return an, X, Y, Xv


def test_tensor_alignment_strides_and_extents():
    an, X, Y, Xv = tensor_facts(meta(100, 64), meta(10, 48, dtype=torch.float32), 32)
    assert an.pointer_alignment(X) == 16
    assert an.stride_divisor(X, 0) == 8          # 128-byte rows (strides16): 8 f16 elements
    assert an.stride_divisor(X, 1) == 1          # the unit stride
    assert an.extent_divisor(X, 0) == 16 and an.extent_divisor(X, 1) == 32   # promised
    assert an.extent_divisor(Y, 1) == 16         # 48, a compile-time extent (Y[0, :])
    assert an.extent_divisor(Y, 0) == 1          # run time, not promised
    assert an.stride_divisor(Y, 0) == 8          # 192-byte rows: strides16 gives 4 f32 elements, the promise 8
    # a bounded view: its extent is its source's or its bound's (or 0), its strides its source's
    assert an.extent_divisor(Xv, 0) == 16        # min(16, n = 32 -> 16)
    assert an.extent_divisor(Xv, 1) == 32        # bounded by the promised X.shape[1] itself
    assert an.stride_divisor(Xv, 0) == 8 and an.pointer_alignment(Xv) == 16


def test_tensor_facts_not_claimed():
    x = torch.empty(100 * 33 + 1, dtype=torch.float16)[1:].view(100, 33)  # odd rows, off 16-byte alignment
    an, X, Y, Xv = tensor_facts(x, meta(10, 34, dtype=torch.float32), 5)
    assert an.pointer_alignment(X) == 2          # the element size only
    assert an.stride_divisor(X, 0) == 1          # 66-byte rows
    assert an.extent_divisor(Y, 1) == 2          # 34
    assert an.stride_divisor(Y, 0) == 8          # 136-byte rows are not 16-byte multiples; the promise holds
    assert an.extent_divisor(Xv, 0) == 1         # n = 5


@tilejit.kernel
def list_items(Xs, Out, BLOCK: T.constexpr):
    X = Xs[T.program_id(0)]
    T.multiple_of(X.shape[0], 16)
    Out[0:BLOCK] = X[0:BLOCK]


def test_tensor_list_items_know_only_promises():
    """An item's pointer and strides are not specialized (only its unit strides are): nothing is known of them,
    a promise on its extent holds."""
    fn = frontend_ir(list_items, [torch.empty(64, dtype=torch.float16, device="meta")] * 2, meta(64), BLOCK=64)
    an = Divisibility(fn)
    (item,) = [r for op in fn.walk() if op.kind is OpKind.LIST_ITEM for r in op.results]
    assert an.pointer_alignment(item) == 2 and an.stride_divisor(item, 0) == 1
    assert an.extent_divisor(item, 0) == 16


# -- the pieces -------------------------------------------------------------------------------------------------

def test_power_of_two_part_and_facts():
    assert [power_of_two_part(n, 1 << 31) for n in (1, 2, 12, 48, -48, 1024, 3)] == [1, 2, 4, 16, 16, 1024, 1]
    assert power_of_two_part(0, 1 << 31) == 1 << 31   # every power of two divides 0
    assert power_of_two_part(1 << 40, 1 << 31) == 1 << 31
    with pytest.raises(ValueError):
        Facts(12)
    with pytest.raises(ValueError):
        Facts(0)


def test_zero_is_a_multiple_of_everything():
    @tilejit.kernel
    def zero(Out):
        z = T.program_id(0) * 0
        Out[z] = 1

    fn = frontend_ir(zero, meta(4, dtype=torch.int64))
    assert facts_of(fn, "z") == Facts(1 << 31, True)


def test_multiple_of_attribute_checks_itself():
    assert MultipleOf((16,)).merged(MultipleOf((24,))) == MultipleOf((48,))
    assert MultipleOf((16, 1)).merged(None) == MultipleOf((16, 1))
    for bad in ((), (0,), (-16,), (True,), (1.5,)):
        with pytest.raises(ValueError):
            MultipleOf(bad)
    with pytest.raises(ValueError):
        MultipleOf((16,)).merged(MultipleOf((16, 1)))


def test_the_pipeline_leaves_the_facts_for_the_emitter():
    stages = arith.compile(meta(32, dtype=torch.int64), 32, 5, arch="sm_80", stop_after="passes")
    assert isinstance(stages.fn.attrs["divisibility"], Divisibility)
    assert "divisibility" not in stages.final_ir  # an analysis, not printed
