"""``tilejit port FILE``: tilejit versions of a Python file's ``@triton.jit`` kernels, for the common subset.

The source is parsed with ``ast`` (Triton is never imported). Pointer arithmetic is followed symbolically: a
tensor argument plus ``tl.arange`` offsets (``start + tl.arange(0, B)``, ``offs[:, None] * stride``) and scalar
row offsets (``row * stride``) becomes a slice of that tensor (``X[row, start:start + B]``), so ``tl.load`` is a
slice read and ``tl.store`` a slice assignment. A pointer advanced by a constant step in a loop
(``a_ptrs += BLOCK_K * stride_ak``) becomes a slice whose start moves with the loop counter.

A tilejit slice is masked against its tensor's extent, so a mask is dropped only where it is provably that
bounds check: ``offs < n`` on the dim ``offs`` indexes, where every launch of the kernel in the file passes for
``n`` that dim's extent of the tensor it passes for the pointer (``M, K = a.shape``, ``n = out.numel()`` with
``out = torch.empty_like(x)``, ``torch.empty((M, N))``). Any other mask (a causal mask, a bound that is not the
extent, a kernel never launched in the file) is kept, as ``T.where`` around the load or the stored value, with a
comment saying why; ``other=`` is a ``T.where`` on the whole mask. The same proof lets the ``% M`` wrap of the
matmul tutorial's offsets go (tilejit reads 0 past the extent instead).

``tl.dot`` becomes ``@`` (or ``T.gemm`` with an accumulator), ``tl.trans(x)`` ``x.T``, and ``tl.where``,
reductions and math map one to one. A pointer's dims are its terms in order: scalar row offsets first, then
``[:, None]`` offsets, ``[None, :]`` offsets and plain offsets last, as the tutorials write them (strides in dim
order). A line outside the subset is kept as a comment saying why.
"""
from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field, replace

from .frontend.triton_names import TRITON_SPELLINGS
from .target import LaunchOptions

_ONE_TO_ONE = {
    "program_id", "num_programs", "cdiv", "arange", "zeros", "full", "where", "exp", "exp2", "log", "log2", "sqrt",
    "rsqrt", "abs", "maximum", "minimum", "sum", "max", "min", "sin", "cos", "erf", "sigmoid", "fma", "cumsum",
    "multiple_of", "max_contiguous", "constexpr", "range", "static_range", "float16", "bfloat16", "float32",
    "float64", "int8", "int16", "int32", "int64", "uint8", "atomic_add", "atomic_max", "atomic_min", "atomic_xchg",
    "atomic_cas", "tanh",
}
_RENAMED = {"int1": "bool", "float8e4nv": "float8_e4m3fn", "float8e5": "float8_e5m2"}
MARK = "# tilejit port: not translated:"
MASK_KEPT = "# tilejit port: mask kept:"
_ATOMICS = ("atomic_add", "atomic_max", "atomic_min", "atomic_xchg", "atomic_cas")
_RANGE_HINTS = ("loop_unroll_factor", "disallow_acc_multi_buffer", "flatten")  # tl.range keywords T.range lacks


class Untranslatable(Exception):
    """A construct outside the subset ``port`` translates; the message says why."""


@dataclass(frozen=True)
class Offsets:
    """``start + tl.arange(0, length)`` (``start`` and ``length`` as source text), as a 1-D index tile;
    ``stride`` is the source of the stride it was multiplied by, ``wrap`` of the ``% M`` applied to it."""
    start: str
    length: str
    expand: str = ""  # "" plain, "row" for offs[:, None], "col" for offs[None, :]
    stride: str = ""
    wrap: str = ""


@dataclass
class Pointer:
    """A tensor argument plus offsets: ``index`` holds scalar row offsets (source text) in order, ``tiles`` the
    Offsets terms in order. A sum of offsets not yet added to a tensor has ``tensor`` empty."""
    tensor: str
    index: list[str] = field(default_factory=list)
    tiles: list[Offsets] = field(default_factory=list)
    bare: bool = False  # the last index term is a bare element offset (not ``row * stride``)

    def plus(self, term: "Pointer | Offsets | str", bare: bool = False) -> "Pointer":
        """``self + term``; a ``bare`` scalar (an element offset, unit stride) adds to the innermost dim: to the
        start of the one plain offsets tile, or to a bare offset just before it (``Lock + i + G`` is one index,
        ``i + G``), else it opens a dim of its own (``X + row * stride + col`` is ``X[row, col]``)."""
        out = Pointer(self.tensor, list(self.index), list(self.tiles), self.bare)
        if isinstance(term, Offsets):
            out.tiles.append(term)
        elif isinstance(term, Pointer):
            out.tensor = out.tensor or term.tensor
            out.index += term.index
            out.tiles += term.tiles
            out.bare = term.bare
        elif bare and out.tiles:
            plain = [i for i, t in enumerate(out.tiles) if not t.expand and not t.wrap]
            if len(plain) != 1 or len(out.tiles) != 1:
                raise Untranslatable(f"a scalar offset {term} added to a pointer with index tiles: add it to the "
                                     "tl.arange offsets' start instead")
            tile = out.tiles[plain[0]]
            out.tiles[plain[0]] = replace(tile, start=term if tile.start == "0" else f"{tile.start} + {term}")
        elif bare and out.bare and out.index:
            out.index[-1] = f"{out.index[-1]} + {term}"
        else:
            out.index.append(term)
            out.bare = bare
        return out

    def dims(self) -> list[Offsets]:
        """The tile terms in the tensor's dim order (after the scalar index)."""
        order = {"row": 0, "col": 1, "": 2}
        return sorted(self.tiles, key=lambda t: order[t.expand])


def _linear(source: str) -> dict[str, int] | None:
    """``source`` as a sum of terms with integer coefficients (``"1"`` is the constant term; a product of
    names is one term, its factors sorted), or None when it is not an integer expression of that form."""
    def walk(node: ast.AST) -> dict[str, int] | None:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return {"1": node.value}
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = walk(node.operand)
            return None if inner is None else {k: -v for k, v in inner.items()}
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            left, right = walk(node.left), walk(node.right)
            if left is None or right is None:
                return None
            sign = 1 if isinstance(node.op, ast.Add) else -1
            out = dict(left)
            for k, v in right.items():
                out[k] = out.get(k, 0) + sign * v
            return {k: v for k, v in out.items() if v}
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for a, b in ((node.left, node.right), (node.right, node.left)):
                if isinstance(a, ast.Constant) and type(a.value) is int:
                    inner = walk(b)
                    return None if inner is None else {k: a.value * v for k, v in inner.items() if v}
            factors: list[str] = []
            stack = [node]
            while stack:
                item = stack.pop()
                if isinstance(item, ast.BinOp) and isinstance(item.op, ast.Mult):
                    stack += [item.left, item.right]
                else:
                    factors.append(ast.unparse(item))
            return {" * ".join(sorted(factors)): 1}
        return {ast.unparse(node): 1}

    return walk(ast.parse(source, mode="eval").body)


def _sum(*parts: tuple[int, str]) -> dict[str, int] | None:
    """The linear form of ``sum(sign * source)``."""
    out: dict[str, int] = {}
    for sign, source in parts:
        form = _linear(source)
        if form is None:
            return None
        for k, v in form.items():
            out[k] = out.get(k, 0) + sign * v
    return {k: v for k, v in out.items() if v}


class _HostExtents:
    """What the file's launches of a kernel tell: which scalar parameters always receive the extent of a dim of
    the tensor passed for a pointer parameter. Within the launching function, an extent is followed through
    ``M, K = a.shape``, ``n = x.shape[0]`` / ``x.size(0)`` / ``x.numel()``, tensors made as
    ``torch.empty_like(x)`` (x's extents) or ``torch.empty((M, N), ...)`` (those extents), and ``assert`` s of
    equal extents (``assert a.shape[1] == b.shape[0]``). A name takes its last assignment before the line that
    reads it; one assigned inside a branch or loop is not followed."""

    _LIKE = ("empty_like", "zeros_like", "ones_like", "randn_like", "rand_like", "full_like")
    _NEW = ("empty", "zeros", "ones", "randn", "rand")

    def __init__(self, tree: ast.Module, kernel: ast.FunctionDef) -> None:
        self.param_names = [a.arg for a in kernel.args.args]
        self.launches: list[dict[str, object]] = []  # per launch: parameter -> symbol of what it receives
        self.equal: dict[object, object] = {}  # union-find over extent symbols, from asserts
        scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                           and n is not kernel]
        for scope in scopes:
            launches = [call for call in self._own_nodes(scope) if isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Subscript) and isinstance(call.func.value, ast.Name)
                        and call.func.value.id == kernel.name]
            if not launches:
                continue
            self.names = self._assignments(scope)
            for node in scope.body:
                if isinstance(node, ast.Assert):
                    self._assume(node.test)
            for call in launches:
                args = dict(zip(self.param_names, call.args))
                args.update({k.arg: k.value for k in call.keywords if k.arg})
                self.launches.append({param: self._symbol(value, call.lineno, 0) for param, value in args.items()})

    @staticmethod
    def _own_nodes(scope: ast.AST):
        """The nodes of ``scope`` outside nested function definitions."""
        stack = list(ast.iter_child_nodes(scope))
        while stack:
            node = stack.pop()
            yield node
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                stack += list(ast.iter_child_nodes(node))

    def _assignments(self, scope: ast.AST) -> dict[str, list[tuple[int, ast.AST]] | None]:
        """name -> its assignments in the scope's top-level statements as (line, value) (``a, b = x.shape``
        gives ``x.shape[0]`` and ``x.shape[1]``); None for a name also assigned in a nested block."""
        found: dict[str, list[tuple[int, ast.AST]] | None] = {}
        top = set(map(id, scope.body))
        for node in self._own_nodes(scope):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For)) else []
            for target in targets:
                pairs = [(target, node.value if not isinstance(node, (ast.AugAssign, ast.For)) else None)]
                if isinstance(target, ast.Tuple) and isinstance(node, ast.Assign):
                    pairs = [(e, ast.Subscript(node.value, ast.Constant(i), ast.Load()))
                             for i, e in enumerate(target.elts)]
                for name, value in pairs:
                    if not isinstance(name, ast.Name):
                        continue
                    if id(node) not in top or value is None or found.get(name.id, []) is None:
                        found[name.id] = None
                    else:
                        found.setdefault(name.id, []).append((node.lineno, value))  # type: ignore[union-attr]
        return found

    def _assume(self, test: ast.expr) -> None:
        """Record the equal extents an ``assert`` states."""
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            for value in test.values:
                self._assume(value)
        elif isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            left = self._symbol(test.left, test.lineno, 0)
            right = self._symbol(test.comparators[0], test.lineno, 0)
            if left is not None and right is not None:
                self.equal[self._find(left)] = self._find(right)

    def _find(self, symbol: object) -> object:
        while symbol in self.equal:
            symbol = self.equal[symbol]
        return symbol

    def _symbol(self, node: ast.AST, line: int, depth: int) -> object:
        """A hashable symbol of what ``node`` holds at ``line``: ("tensor", base, shape) for a tensor (shape a
        tuple of extent symbols, or None when only its base is known), ("dim", base, d) / ("numel", base) for
        extents, None when unknown."""
        if depth > 20:
            return None
        if isinstance(node, ast.Name):
            if node.id not in self.names:  # a parameter of the launching function, or a global
                return ("tensor", node.id, None)
            assignments = self.names[node.id]
            before = [(at, value) for at, value in assignments or [] if at < line]
            if not before:
                return None
            at, value = before[-1]
            return self._symbol(value, at, depth + 1)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method, base = node.func.attr, node.func.value
            if method in self._LIKE and node.args:
                return self._symbol(node.args[0], line, depth + 1)
            if method in self._NEW and isinstance(base, ast.Name) and base.id == "torch" and node.args:
                dims = node.args[0].elts if isinstance(node.args[0], (ast.Tuple, ast.List)) else node.args
                shape = tuple(self._symbol(d, line, depth + 1) for d in dims)
                return ("tensor", id(node), shape)
            if method == "size" and len(node.args) == 1:
                return self._dim(self._symbol(base, line, depth + 1), node.args[0])
            if method == "numel" and not node.args:
                tensor = self._symbol(base, line, depth + 1)
                if isinstance(tensor, tuple) and tensor[0] == "tensor":
                    if tensor[2] is None:
                        return ("numel", tensor[1])
                    return tensor[2][0] if len(tensor[2]) == 1 else None
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "shape":
            return self._dim(self._symbol(node.value.value, line, depth + 1), node.slice)
        return None

    @staticmethod
    def _dim(tensor: object, index: ast.AST) -> object:
        if not (isinstance(tensor, tuple) and tensor[0] == "tensor"):
            return None
        if not (isinstance(index, ast.Constant) and type(index.value) is int and index.value >= 0):
            return None
        d = index.value
        if tensor[2] is None:
            return ("dim", tensor[1], d)
        return tensor[2][d] if d < len(tensor[2]) else None

    def is_extent(self, param: str, pointer: str, dim: int, rank: int) -> bool:
        """Whether every launch in the file passes for ``param`` the extent along ``dim`` of the tensor it
        passes for ``pointer`` (a window of ``rank`` dims)."""
        def holds(launch: dict[str, object]) -> bool:
            value, tensor = launch.get(param), launch.get(pointer)
            if value is None or not (isinstance(tensor, tuple) and tensor[0] == "tensor"):
                return False
            if tensor[2] is not None:
                extents = [tensor[2][dim]] if dim < len(tensor[2]) else []
            else:
                extents = [("dim", tensor[1], dim)] + ([("numel", tensor[1])] if rank == 1 else [])
            return any(e is not None and self._find(e) == self._find(value) for e in extents)
        return bool(self.launches) and all(holds(launch) for launch in self.launches)


def _is_tl(node: ast.AST, names: set[str]) -> str | None:
    """The name ``x`` of ``tl.x`` / ``tl.math.x`` / ``triton.language.x`` (``names`` are tl's aliases)."""
    if isinstance(node, ast.Attribute):
        base = node.value
        if isinstance(base, ast.Name) and base.id in names:
            return node.attr
        if isinstance(base, ast.Attribute) and base.attr in ("math", "language") and isinstance(base.value, ast.Name):
            return node.attr
        if isinstance(base, ast.Name) and base.id == "triton" and node.attr == "cdiv":
            return "cdiv"
    return None


class _KernelPort:
    """Translates one kernel's body statement by statement, following pointers and offsets."""

    def __init__(self, fn: ast.FunctionDef, tl_names: set[str], extents: _HostExtents) -> None:
        self.fn = fn
        self.tl = tl_names
        self.extents = extents
        self.params = {a.arg for a in fn.args.args if not self._is_constexpr(a)} & self._pointer_roots()
        self.env: dict[str, Pointer | Offsets] = {p: Pointer(p) for p in self.params}
        self.values: dict[str, ast.expr] = {}  # name -> what it was last assigned (masks are read through it)
        stores = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
        self.reassigned = {a.arg for a in fn.args.args} & {n.id for n in stores}
        self.advanced: set[str] = set()  # pointers advanced in a loop, unusable after it
        self.notes: list[str] = []  # comments for the statement being translated, put above it
        self.lines: list[str] = []
        self.untranslated: dict[str, int] = {}  # name -> line of its assignment that was not translated

    def _pointer_roots(self) -> set[str]:
        """The names used as pointers: the leftmost term of each tl.load/tl.store address, and of what is
        assigned to such a name, to a fixed point (a stride or a size is never one)."""
        def root(node: ast.AST) -> str | None:
            while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
                node = node.left
            return node.id if isinstance(node, ast.Name) else None

        roots = {root(n.args[0]) for n in ast.walk(self.fn) if isinstance(n, ast.Call) and n.args
                 and _is_tl(n.func, self.tl) in ("load", "store")} - {None}
        while True:
            more = {root(n.value) for n in ast.walk(self.fn) if isinstance(n, ast.Assign) and len(n.targets) == 1
                    and isinstance(n.targets[0], ast.Name) and n.targets[0].id in roots} - {None} - roots
            if not more:
                return roots  # type: ignore[return-value]
            roots |= more

    def _is_constexpr(self, arg: ast.arg) -> bool:
        return arg.annotation is not None and _is_tl(arg.annotation, self.tl) == "constexpr"

    # -- symbolic values ----------------------------------------------------------------------------------------
    def symbolic(self, node: ast.AST) -> Pointer | Offsets | str | None:
        """The pointer or offsets ``node`` computes, the source of a scalar term, or None for a plain value."""
        if isinstance(node, ast.Name) and node.id in self.untranslated:
            raise Untranslatable(f"{node.id} is not translated (its assignment, line {self.untranslated[node.id]}, "
                                 "was not)")
        if isinstance(node, ast.Name) and node.id in self.advanced:
            raise Untranslatable(f"{node.id} was advanced in a loop and is used after it: compute its offsets "
                                 "from the loop's counter instead")
        if isinstance(node, ast.Name) and node.id in self.env:
            return self.env[node.id]
        if isinstance(node, ast.Call) and _is_tl(node.func, self.tl) == "arange":
            start, end = (ast.unparse(a) for a in node.args)
            return Offsets("0", end) if start == "0" else Offsets(start, f"({end} - {start})")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):  # (start + arange) % M: the wrap
            left = self.symbolic(node.left)                                  # trick, checked where it indexes
            if isinstance(left, Offsets) and not left.wrap and not left.expand:
                return replace(left, wrap=ast.unparse(node.right))
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple) and len(node.slice.elts) == 2:
            inner = self.symbolic(node.value)
            if isinstance(inner, Offsets) and not inner.expand:
                first, second = (":" if isinstance(e, ast.Slice) else ast.unparse(e) for e in node.slice.elts)
                if (first, second) == (":", "None"):
                    return replace(inner, expand="row")
                if (first, second) == ("None", ":"):
                    return replace(inner, expand="col")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for a, b in ((node.left, node.right), (node.right, node.left)):
                sym = self.symbolic(a)
                if isinstance(sym, Offsets) and not isinstance(self.symbolic(b), Offsets):
                    return replace(sym, stride=ast.unparse(b))  # the stride is the tensor's own
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.symbolic(node.left), self.symbolic(node.right)
            if isinstance(right, Pointer) and not isinstance(left, Pointer):
                left, right = right, left
                node = ast.BinOp(node.right, ast.Add(), node.left)
            if isinstance(left, Pointer):
                if right is None:
                    return left.plus(self._scalar_index(node.right), bare=self._is_bare(node.right))
                return left.plus(right)
            if isinstance(left, Offsets) and right is None and not left.expand and not left.wrap:
                return Offsets(self._add(left.start, ast.unparse(node.right)), left.length)
            if isinstance(right, Offsets) and left is None and not right.expand and not right.wrap:
                return Offsets(self._add(ast.unparse(node.left), right.start), right.length)
            if isinstance(left, Offsets) and isinstance(right, Offsets) and (left.stride and right.stride or (
                    {left.expand, right.expand} == {"row", "col"}  # offs_m[:, None] * s_m + offs_n[None, :]
                    and (left.stride or left.expand == "col") and (right.stride or right.expand == "col"))):
                return Pointer("", tiles=[left, right])  # offs_m[:, None] * s_m + offs_k[None, :] * s_k
            if isinstance(left, Offsets) or isinstance(right, Offsets):
                raise Untranslatable("a sum of index tiles that is not start + tl.arange(0, B)")
        return None

    @staticmethod
    def _add(a: str, b: str) -> str:
        return b if a == "0" else a if b == "0" else f"{a} + {b}"

    @staticmethod
    def _is_bare(node: ast.AST) -> bool:
        """Whether a scalar pointer offset is an element offset (not ``row * stride``)."""
        return not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult))

    def _scalar_index(self, node: ast.AST) -> str:
        """``row * stride`` -> ``row``; a bare scalar is an element index."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            return self.expr(node.left)
        return self.expr(node)

    # -- expressions --------------------------------------------------------------------------------------------
    def expr(self, node: ast.AST) -> str:
        return ast.unparse(self.rewrite(copy.deepcopy(node)))

    def rewrite(self, node: ast.AST) -> ast.AST:
        port = self

        class Rewriter(ast.NodeTransformer):
            def visit_Call(self, call: ast.Call) -> ast.AST:
                name = _is_tl(call.func, port.tl)
                if name == "load":
                    return ast.parse(port.load(call), mode="eval").body
                if name in ("dot", "trans", "store"):
                    call.args = [self.visit(a) for a in call.args]
                    call.keywords = [ast.keyword(k.arg, self.visit(k.value)) for k in call.keywords]
                    if name == "trans":
                        return ast.Attribute(call.args[0], "T", ast.Load())
                    if name == "store":
                        raise Untranslatable("tl.store inside an expression")
                    keywords = {k.arg: k.value for k in call.keywords}
                    acc = call.args[2] if len(call.args) > 2 else keywords.pop("acc", None)
                    if acc is None and not keywords:
                        return ast.BinOp(call.args[0], ast.MatMult(), call.args[1])
                    call.func = ast.Attribute(ast.Name("T", ast.Load()), "gemm", ast.Load())
                    call.args = [call.args[0], call.args[1], acc if acc is not None else ast.Constant(None)]
                    call.keywords = [ast.keyword(k, v) for k, v in keywords.items() if k in ("out_dtype",)]
                    precision = keywords.get("input_precision")
                    if precision is not None:
                        call.keywords.append(ast.keyword("precision", precision))
                    return call
                if name in _ATOMICS and call.args:
                    return port.atomic(call, name)
                if name in ("range", "static_range") and call.keywords:
                    kept = []
                    for k in call.keywords:
                        if k.arg == "num_stages":
                            kept.append(ast.keyword("stages", self.visit(k.value)))
                        elif k.arg in _RANGE_HINTS:
                            port.notes.append(f"# tilejit port: tl.range's {k.arg}= dropped: a tuning hint T.range "
                                              "does not take")
                        else:
                            kept.append(ast.keyword(k.arg, self.visit(k.value)))
                    call.keywords = kept
                    call.args = [self.visit(a) for a in call.args]
                    call.func = self.visit(call.func)
                    return call
                if name in ("sum", "max", "min") and call.keywords:
                    keywords = {k.arg: k.value for k in call.keywords}
                    call.args = [self.visit(a) for a in call.args] + ([self.visit(keywords["axis"])]
                                                                      if "axis" in keywords else [])
                    call.keywords = []
                    call.func = ast.Attribute(ast.Name("T", ast.Load()), name, ast.Load())
                    return call
                if name == "program_id" and call.keywords:
                    call.args = [k.value for k in call.keywords if k.arg == "axis"]
                    call.keywords = []
                return self.generic_visit(call)

            def visit_Attribute(self, attr: ast.Attribute) -> ast.AST:
                name = _is_tl(attr, port.tl)
                if name is None:
                    return self.generic_visit(attr)
                if name in _ONE_TO_ONE or name in _RENAMED:
                    return ast.Attribute(ast.Name("T", ast.Load()), _RENAMED.get(name, name), ast.Load())
                spelling = TRITON_SPELLINGS.get(name, "not in the language")
                raise Untranslatable(f"tl.{name}: {spelling}")

            def visit_Name(self, node: ast.Name) -> ast.AST:
                if node.id in port.untranslated and isinstance(node.ctx, ast.Load):
                    raise Untranslatable(f"{node.id} is not translated (its assignment, line "
                                         f"{port.untranslated[node.id]}, was not)")
                return node

            def visit_List(self, node: ast.List) -> ast.AST:  # shapes: tl.zeros([B], ...) -> T.zeros((B,), ...)
                return ast.Tuple([self.visit(e) for e in node.elts], ast.Load())

        return Rewriter().visit(node)

    def pointer_of(self, node: ast.AST) -> Pointer:
        sym = self.symbolic(node)
        if not isinstance(sym, Pointer) or not sym.tensor:
            raise Untranslatable(f"cannot tell which tensor {ast.unparse(node)} points into")
        return sym

    def _is_extent(self, bound: dict[str, int] | None, pointer: Pointer, dim: int) -> bool:
        """Whether the linear form ``bound`` is one kernel parameter that every launch passes the extent of
        ``pointer``'s tensor along ``dim`` for."""
        if bound is None or len(bound) != 1:
            return False
        (name, coefficient), = bound.items()
        rank = len(pointer.index) + len(pointer.tiles)
        return coefficient == 1 and name not in self.reassigned \
            and self.extents.is_extent(name, pointer.tensor, dim, rank)

    def window(self, pointer: Pointer, store: bool = False) -> str:
        """``pointer`` as a slice of its tensor; a ``% M`` wrap of a load's offsets goes only where M is provably
        the extent (the wrapped lanes then read 0 instead of rows from the start; a wrapped store is refused)."""
        slices = []
        for dim, tile in enumerate(pointer.dims(), start=len(pointer.index)):
            if tile.wrap and store:
                raise Untranslatable(f"a store through offsets wrapped by % {tile.wrap}: tilejit skips elements "
                                     "past the extent instead of wrapping")
            if tile.wrap and not self._is_extent(_linear(tile.wrap), pointer, dim):
                raise Untranslatable(f"offsets wrapped by % {tile.wrap}, which is not known to be the extent of "
                                     f"{pointer.tensor}'s dim {dim}: tilejit reads 0 past the extent, not a wrap")
            start, length = (self.expr(ast.parse(text, mode="eval").body) for text in (tile.start, tile.length))
            slices.append(f"{start}:{start} + {length}" if start != "0" else f"0:{length}")
        return f"{pointer.tensor}[{', '.join(pointer.index + slices)}]"

    def _conjuncts(self, node: ast.expr) -> list[ast.expr]:
        """The terms of ``a & b & ...``, read through names assigned a mask."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd):
            return self._conjuncts(node.left) + self._conjuncts(node.right)
        if isinstance(node, ast.Name) and node.id in self.values:
            value = self.values[node.id]
            if isinstance(value, (ast.Compare, ast.BinOp)):
                return self._conjuncts(value)
        return [node]

    def _bounds_check(self, term: ast.expr, pointer: Pointer) -> bool:
        """Whether ``term`` is ``offs < n`` (or ``n > offs``, ``<=`` ...) with ``offs`` the offsets of one of
        ``pointer``'s dims and ``start + offs < n`` there meaning ``index < extent``."""
        if not (isinstance(term, ast.Compare) and len(term.ops) == 1):
            return False
        left, op, right = term.left, term.ops[0], term.comparators[0]
        if isinstance(op, (ast.Gt, ast.GtE)):
            left, right, op = right, left, ast.Lt() if isinstance(op, ast.Gt) else ast.LtE()
        if not isinstance(op, (ast.Lt, ast.LtE)):
            return False
        offsets = self.symbolic(left)
        if not isinstance(offsets, Offsets) or offsets.wrap or self.symbolic(right) is not None:
            return False
        for dim, tile in enumerate(pointer.dims(), start=len(pointer.index)):
            if tile.expand != offsets.expand or tile.length != offsets.length:
                continue
            # mask: s + i < R (or <= R); the window's index is p + i, so the mask is p + i < R + p - s (+ 1)
            bound = _sum((1, ast.unparse(right)), (1, tile.start), (-1, offsets.start),
                         (1, "1" if isinstance(op, ast.LtE) else "0"))
            if self._is_extent(bound, pointer, dim):
                return True
        return False

    def _kept_mask(self, mask: ast.expr | None, pointer: Pointer) -> str | None:
        """The part of ``mask`` a slice of ``pointer`` does not already apply (as source), noting why it is
        kept; None when the whole mask is bounds checks."""
        if mask is None:
            return None
        kept = [term for term in self._conjuncts(mask) if not self._bounds_check(term, pointer)]
        if not kept:
            return None
        if len(kept) == len(self._conjuncts(mask)):
            text = self.expr(mask)
        else:
            text = " & ".join(self.expr(t) if len(kept) == 1 else f"({self.expr(t)})" for t in kept)
        self.notes.append(f"{MASK_KEPT} {text} is not a bounds check of {pointer.tensor} that this file's launches "
                          "prove (a slice masks only against its tensor's extent), so T.where applies it")
        return text

    def load(self, call: ast.Call) -> str:
        pointer = self.pointer_of(call.args[0])
        keywords = {k.arg: k.value for k in call.keywords}
        if len(call.args) > 1:
            keywords.setdefault("mask", call.args[1])
        if len(call.args) > 2:
            keywords.setdefault("other", call.args[2])
        unknown = set(keywords) - {"mask", "other", "cache_modifier", "eviction_policy", "boundary_check",
                                   "padding_option", "volatile"}
        if unknown:
            raise Untranslatable(f"tl.load keywords {sorted(unknown)}")
        window = self.window(pointer)
        mask, other = keywords.get("mask"), keywords.get("other")
        if other is not None and not (isinstance(other, ast.Constant) and other.value in (0, 0.0)):
            if mask is None:
                raise Untranslatable("tl.load with other= but no mask")
            return f"T.where({self.expr(mask)}, {window}, {self.expr(other)})"
        kept = self._kept_mask(mask, pointer)
        if kept is None:
            return window
        return f"T.where({kept}, {window}, {self.expr(other) if other is not None else 0})"

    def store(self, call: ast.Call) -> str:
        pointer = self.pointer_of(call.args[0])
        keywords = {k.arg: k.value for k in call.keywords}
        value = call.args[1] if len(call.args) > 1 else keywords["value"]
        mask = call.args[2] if len(call.args) > 2 else keywords.get("mask")
        window = self.window(pointer, store=True)
        kept = self._kept_mask(mask, pointer)
        if kept is None:
            return f"{window} = {self.expr(value)}"
        self.notes[-1] += " (the masked-off elements are read and written back unchanged)"
        return f"{window} = T.where({kept}, {self.expr(value)}, {window})"

    def atomic(self, call: ast.Call, name: str) -> ast.AST:
        """``tl.atomic_*(pointer, ...)`` -> ``T.atomic_*(window, ...)``; a mask that is not a proven bounds check
        is refused (a window's atomic updates every element in it)."""
        pointer = self.pointer_of(call.args[0])
        keywords = {k.arg: k.value for k in call.keywords}
        unknown = set(keywords) - {"mask", "sem", "scope", "val", "cmp"}
        if unknown:
            raise Untranslatable(f"tl.{name} keywords {sorted(unknown)}")
        mask = keywords.pop("mask", None)
        if mask is not None and self._kept_mask(mask, pointer) is not None:
            self.notes.pop()
            raise Untranslatable(f"tl.{name} with mask={ast.unparse(mask)}, which is not a bounds check of "
                                 f"{pointer.tensor} that this file's launches prove: an atomic updates every "
                                 "element of its window")
        args = [self.window(pointer)] + [self.expr(a) for a in call.args[1:]]
        args += [f"{k}={self.expr(v)}" for k, v in keywords.items()]
        return ast.parse(f"T.{name}({', '.join(args)})", mode="eval").body

    # -- statements ---------------------------------------------------------------------------------------------
    def emit(self, text: str, indent: int) -> None:
        self.lines.extend("    " * indent + line for line in text.splitlines())

    def refuse(self, stmt: ast.stmt, why: str, indent: int) -> None:
        for line in ast.unparse(stmt).splitlines():
            self.emit(f"# {line}", indent)
        self.lines[-1] += f"  {MARK} line {stmt.lineno}: {why}"

    def body(self, stmts: list[ast.stmt], indent: int) -> None:
        outer_notes = self.notes
        start = len(self.lines)
        for stmt in stmts:
            first = len(self.lines)
            self.notes = notes = []
            try:
                self.statement(stmt, indent)
            except Untranslatable as why:
                del self.lines[first:]
                self.refuse(stmt, str(why), indent)
                targets = stmt.targets if isinstance(stmt, ast.Assign) else \
                    [stmt.target] if isinstance(stmt, (ast.AugAssign, ast.AnnAssign, ast.For)) else []
                for target in targets:
                    for node in ast.walk(target):
                        if isinstance(node, ast.Name):
                            self.untranslated.setdefault(node.id, stmt.lineno)
                            self.env.pop(node.id, None)
            else:
                self.lines[first:first] = ["    " * indent + note for note in dict.fromkeys(notes)]
        self.notes = outer_notes
        if all(line.lstrip().startswith("#") for line in self.lines[start:]):
            self.emit("pass", indent)  # every statement of the block was refused: the block stays Python

    def statement(self, stmt: ast.stmt, indent: int) -> None:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            self.emit(ast.unparse(stmt), indent)  # a docstring
            return
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
                and _is_tl(stmt.value.func, self.tl) == "store":
            self.emit(self.store(stmt.value), indent)
            return
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            sym = self.symbolic(stmt.value)
            self.advanced.discard(name)
            self.untranslated.pop(name, None)
            if isinstance(sym, Pointer):
                self.env[name] = sym  # pointer arithmetic: folded into the slices that use it
                return
            self.env.pop(name, None)
            self.values[name] = stmt.value
            if isinstance(sym, Offsets):
                self.env[name] = sym  # still emitted: masks and T.where may read the index tile
            self.emit(f"{name} = {self.expr(stmt.value)}", indent)
            return
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name) \
                and isinstance(self.env.get(stmt.target.id), Pointer):
            if indent > 1:
                raise Untranslatable("a pointer advanced in a loop other than by step * the stride of one of its "
                                     "offsets, after its last use in the body: compute the offsets from the loop "
                                     "counter (k0 + tl.arange(0, BK))")
            name = stmt.target.id
            self.env[name] = self.env[name].plus(self._scalar_index(stmt.value),  # type: ignore[union-attr]
                                                 bare=self._is_bare(stmt.value))
            return
        if isinstance(stmt, ast.For):
            self.loop(stmt, indent)
            return
        if isinstance(stmt, ast.While) and not stmt.orelse:
            self.emit(f"while {self.expr(stmt.test)}:", indent)
            self.body(stmt.body, indent + 1)
            return
        if isinstance(stmt, ast.Return):
            self.emit("return" + (f" {self.expr(stmt.value)}" if stmt.value is not None else ""), indent)
            return
        if isinstance(stmt, ast.If):
            self.emit(f"if {self.expr(stmt.test)}:", indent)
            self.body(stmt.body, indent + 1)
            if stmt.orelse:
                self.emit("else:", indent)
                self.body(stmt.orelse, indent + 1)
            return
        if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Assert, ast.Pass)):
            self.emit(ast.unparse(self.rewrite(copy.deepcopy(stmt))), indent)
            return
        raise Untranslatable(f"a {type(stmt).__name__} statement")

    def _advance(self, stmt: ast.stmt) -> tuple[str, int, str] | None:
        """``ptrs += step * stride`` (a pointer of the loop, advanced along the dim whose offsets were
        multiplied by ``stride``): (the pointer, that dim's position in its tiles, step); None otherwise."""
        if not (isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add)
                and isinstance(stmt.target, ast.Name) and isinstance(self.env.get(stmt.target.id), Pointer)):
            return None
        pointer: Pointer = self.env[stmt.target.id]  # type: ignore[assignment]
        value = stmt.value
        factors = [(value.left, value.right), (value.right, value.left)] \
            if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult) else [(value, None)]
        for step, stride in factors:
            stride_text = ast.unparse(stride) if stride is not None else ""
            dims = [i for i, tile in enumerate(pointer.tiles) if tile.stride == stride_text]
            if len(dims) == 1 and self.symbolic(step) is None:
                return stmt.target.id, dims[0], ast.unparse(step)
        return None

    def loop(self, stmt: ast.For, indent: int) -> None:
        """A ``for`` loop; pointers advanced at the end of its body by a constant step become slices whose
        start is the loop counter's iteration number times the step."""
        self.emit(f"for {ast.unparse(stmt.target)} in {self.expr(stmt.iter)}:", indent)
        advances = {i: a for i, s in enumerate(stmt.body) if (a := self._advance(s)) is not None}
        if not advances:
            self.body(stmt.body, indent + 1)
            return
        iterable = stmt.iter
        if not (isinstance(stmt.target, ast.Name) and isinstance(iterable, ast.Call)
                and ast.unparse(iterable.func) in ("range", "T.range", "tl.range", "tl.static_range")
                and 1 <= len(iterable.args) <= 3 and not iterable.keywords):
            self.body(stmt.body, indent + 1)  # the advances are refused, each saying why
            return
        counter = stmt.target.id
        low = ast.unparse(iterable.args[0]) if len(iterable.args) > 1 else "0"
        step = ast.unparse(iterable.args[2]) if len(iterable.args) > 2 else "1"
        iteration = counter if low == "0" else f"({counter} - {low})"
        iteration = iteration if step == "1" else f"{iteration} // {step}"
        names = {a[0] for a in advances.values()}
        assigned_in_loop = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for position, (name, _, amount) in advances.items():
            used_after = {n.id for s in stmt.body[position + 1:] for n in ast.walk(s) if isinstance(n, ast.Name)}
            step_names = {n.id for n in ast.walk(ast.parse(amount, mode="eval")) if isinstance(n, ast.Name)}
            if name in used_after or step_names & assigned_in_loop or len(names) != len(advances):
                self.body(stmt.body, indent + 1)  # the advances are refused, each saying why
                return
        saved = {name: self.env[name] for name in names}
        for name, dim, amount in advances.values():
            pointer: Pointer = self.env[name]  # type: ignore[assignment]
            tiles = list(pointer.tiles)
            tile = tiles[dim]
            tiles[dim] = replace(tile, start=self._add(tile.start, f"{iteration} * {amount}"))
            self.env[name] = Pointer(pointer.tensor, list(pointer.index), tiles)
        self.body([s for i, s in enumerate(stmt.body) if i not in advances], indent + 1)
        for name in names:
            self.env[name] = saved[name]
            self.advanced.add(name)

    def port(self, helper: bool = False) -> str:
        """The kernel's text; a ``helper`` (a @triton.jit function other kernels call) becomes a @tilejit.func."""
        head: list[str] = []
        for decorator in self.fn.decorator_list:
            if not _is_triton_jit(decorator):
                head += self._decorator(decorator)
        head.append("@tilejit.func" if helper else "@tilejit.kernel")
        reserved = set(LaunchOptions.reserved_names()) & {a.arg for a in self.fn.args.args}
        if reserved and not helper:
            taken = {n.id for n in ast.walk(self.fn) if isinstance(n, ast.Name)} | {a.arg for a in self.fn.args.args}
            renames = {}
            for old in sorted(reserved):
                new = old + "_"
                while new in taken:
                    new += "_"
                renames[old] = new
                head.insert(0, f"# tilejit port: parameter {old} renamed {new}: {old}= is a tilejit launch option; "
                               f"pass it positionally or as {new}=")
            self.fn = copy.deepcopy(self.fn)
            for node in ast.walk(self.fn):
                if isinstance(node, ast.Name) and node.id in renames:
                    node.id = renames[node.id]
                elif isinstance(node, ast.arg) and node.arg in renames:
                    node.arg = renames[node.arg]
        args = []
        for a in self.fn.args.args:
            args.append(f"{a.arg}: T.constexpr" if self._is_constexpr(a) else a.arg)
        self.lines = head + [f"def {self.fn.name}({', '.join(args)}):"]
        self.body(self.fn.body, 1)
        return "\n".join(self.lines)

    def _decorator(self, decorator: ast.expr) -> list[str]:
        """``@triton.autotune`` / ``@triton.heuristics`` as their tilejit spellings (``triton.Config`` ->
        ``tilejit.Config``), with a note naming what they read from the Triton file; anything else a comment."""
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = ast.unparse(target).rsplit(".", 1)[-1]
        if name not in ("autotune", "heuristics") or not isinstance(decorator, ast.Call):
            return [f"# @{ast.unparse(decorator)}  {MARK} line {decorator.lineno}: a decorator port does not know"]
        decorator = copy.deepcopy(decorator)
        decorator.func = ast.Attribute(ast.Name("tilejit", ast.Load()), name, ast.Load())
        for node in ast.walk(decorator):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("triton.Config", "Config"):
                node.func = ast.Attribute(ast.Name("tilejit", ast.Load()), "Config", ast.Load())
        lambdas = {a.arg for n in ast.walk(decorator) if isinstance(n, ast.Lambda) for a in n.args.args}
        free = sorted({n.id for n in ast.walk(decorator) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
                      - {"tilejit", "triton", "T"} - lambdas - set(dir(__builtins__) if isinstance(
                          __builtins__, type(ast)) else __builtins__))
        notes = [f"# tilejit port: the @triton.{name} of line {decorator.lineno} reads {', '.join(free)} from the "
                 "Triton file: define them before this kernel"] if free else []
        return notes + [f"@{ast.unparse(decorator)}"]


def _tl_aliases(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "triton":
            names |= {a.asname or a.name for a in node.names if a.name == "language"}
        if isinstance(node, ast.Import):
            names |= {a.asname for a in node.names if a.name == "triton.language" and a.asname}
    return names or {"tl"}


def _is_triton_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return ast.unparse(target) in ("triton.jit", "jit")


class NoKernels(ValueError):
    """The source has no top-level ``@triton.jit`` function: nothing to port."""


def port_source(source: str) -> str:
    """The tilejit versions of ``source``'s ``@triton.jit`` kernels, as a module's text (``NoKernels`` when it has
    none; ``SyntaxError`` when it is not Python)."""
    tree = ast.parse(source)
    tl = _tl_aliases(tree)
    kernels = [node for node in tree.body if isinstance(node, ast.FunctionDef)
               and any(_is_triton_jit(d) for d in node.decorator_list)]
    if not kernels:
        raise NoKernels("no top-level @triton.jit function")
    # a helper: called by another kernel, or returning a value, and never launched (kernel[grid](...))
    called = {n.func.id for fn in kernels for n in ast.walk(fn) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Name)}
    launched = {n.func.value.id for n in ast.walk(tree) if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Subscript) and isinstance(n.func.value, ast.Name)}
    parts = ["import tilejit", "import tilejit.language as T", ""]
    for fn in kernels:
        returns = any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(fn))
        helper = fn.name not in launched and (fn.name in called or returns)
        parts += ["", _KernelPort(fn, tl, _HostExtents(tree, fn)).port(helper), ""]
    return "\n".join(parts).rstrip() + "\n"
