"""``tilejit port FILE``: tilejit versions of a Python file's ``@triton.jit`` kernels, for the common subset.

The source is parsed with ``ast`` (Triton is never imported). Pointer arithmetic is followed symbolically: a
tensor argument plus ``tl.arange`` offsets (``start + tl.arange(0, B)``, ``offs[:, None] * stride``) and scalar
row offsets (``row * stride``) becomes a slice of that tensor (``X[row, start:start + B]``), so ``tl.load`` is a
slice read (with ``other=`` a ``T.where`` on the mask) and ``tl.store`` a slice assignment; masks are dropped
(tilejit masks against the tensor's extents). ``tl.dot`` becomes ``@`` (or ``T.gemm`` with an accumulator),
``tl.trans(x)`` ``x.T``, and ``tl.where``, reductions and math map one to one. A pointer's dims are its terms in
order: scalar row offsets first, then ``[:, None]`` offsets, ``[None, :]`` offsets and plain offsets last, as
the tutorials write them (strides in dim order). A line outside the subset is kept as a comment saying why.
"""
from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field

from .frontend.triton_names import TRITON_SPELLINGS

_ONE_TO_ONE = {
    "program_id", "num_programs", "cdiv", "arange", "zeros", "full", "where", "exp", "exp2", "log", "log2", "sqrt",
    "rsqrt", "abs", "maximum", "minimum", "sum", "max", "min", "sin", "cos", "erf", "sigmoid", "fma", "cumsum",
    "multiple_of", "max_contiguous", "constexpr", "range", "static_range", "float16", "bfloat16", "float32",
    "float64", "int8", "int16", "int32", "int64", "uint8", "atomic_add", "atomic_max", "atomic_min", "atomic_xchg",
    "atomic_cas", "tanh",
}
_RENAMED = {"int1": "bool", "float8e4nv": "float8_e4m3fn", "float8e5": "float8_e5m2"}
MARK = "# tilejit port: not translated:"


class Untranslatable(Exception):
    """A construct outside the subset ``port`` translates; the message says why."""


@dataclass(frozen=True)
class Offsets:
    """``start + tl.arange(0, length)`` (``start`` and ``length`` as source text), as a 1-D index tile."""
    start: str
    length: str
    expand: str = ""  # "" plain, "row" for offs[:, None], "col" for offs[None, :]


@dataclass
class Pointer:
    """A tensor argument plus offsets: ``index`` holds scalar row offsets (source text) in order, ``tiles`` the
    Offsets terms in order."""
    tensor: str
    index: list[str] = field(default_factory=list)
    tiles: list[Offsets] = field(default_factory=list)

    def plus(self, term: "Pointer | Offsets | str") -> "Pointer":
        out = Pointer(self.tensor, list(self.index), list(self.tiles))
        if isinstance(term, Offsets):
            out.tiles.append(term)
        elif isinstance(term, Pointer):
            out.index += term.index
            out.tiles += term.tiles
        else:
            out.index.append(term)
        return out

    def window(self) -> str:
        order = {"row": 0, "col": 1, "": 2}
        slices = [f"{t.start}:{t.start} + {t.length}" if t.start != "0" else f"0:{t.length}"
                  for t in sorted(self.tiles, key=lambda t: order[t.expand])]
        return f"{self.tensor}[{', '.join(self.index + slices)}]"


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

    def __init__(self, fn: ast.FunctionDef, tl_names: set[str]) -> None:
        self.fn = fn
        self.tl = tl_names
        self.params = {a.arg for a in fn.args.args if not self._is_constexpr(a)} & self._pointer_roots()
        self.env: dict[str, Pointer | Offsets] = {p: Pointer(p) for p in self.params}
        self.lines: list[str] = []

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
        if isinstance(node, ast.Name) and node.id in self.env:
            return self.env[node.id]
        if isinstance(node, ast.Call) and _is_tl(node.func, self.tl) == "arange":
            start, end = (ast.unparse(a) for a in node.args)
            return Offsets("0", end) if start == "0" else Offsets(start, f"({end} - {start})")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):  # (start + arange) % M: the wrap
            left = self.symbolic(node.left)                                  # trick; tilejit reads 0 past M
            if isinstance(left, Offsets):
                return left
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple) and len(node.slice.elts) == 2:
            inner = self.symbolic(node.value)
            if isinstance(inner, Offsets) and not inner.expand:
                first, second = (":" if isinstance(e, ast.Slice) else ast.unparse(e) for e in node.slice.elts)
                if (first, second) == (":", "None"):
                    return Offsets(inner.start, inner.length, "row")
                if (first, second) == ("None", ":"):
                    return Offsets(inner.start, inner.length, "col")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for a, b in ((node.left, node.right), (node.right, node.left)):
                sym = self.symbolic(a)
                if isinstance(sym, Offsets) and not isinstance(self.symbolic(b), Offsets):
                    return sym  # offs * stride: the stride is the tensor's own
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.symbolic(node.left), self.symbolic(node.right)
            if isinstance(right, Pointer) and not isinstance(left, Pointer):
                left, right = right, left
                node = ast.BinOp(node.right, ast.Add(), node.left)
            if isinstance(left, Pointer):
                if right is None:
                    right = self._scalar_index(node.right)
                return left.plus(right)
            if isinstance(left, Offsets) and right is None and not left.expand:
                return Offsets(self._add(left.start, ast.unparse(node.right)), left.length)
            if isinstance(right, Offsets) and left is None and not right.expand:
                return Offsets(self._add(ast.unparse(node.left), right.start), right.length)
            if isinstance(left, Offsets) or isinstance(right, Offsets):
                raise Untranslatable("a sum of index tiles that is not start + tl.arange(0, B)")
        return None

    @staticmethod
    def _add(a: str, b: str) -> str:
        return b if a == "0" else a if b == "0" else f"{a} + {b}"

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

            def visit_List(self, node: ast.List) -> ast.AST:  # shapes: tl.zeros([B], ...) -> T.zeros((B,), ...)
                return ast.Tuple([self.visit(e) for e in node.elts], ast.Load())

        return Rewriter().visit(node)

    def pointer_of(self, node: ast.AST) -> Pointer:
        sym = self.symbolic(node)
        if not isinstance(sym, Pointer):
            raise Untranslatable(f"cannot tell which tensor {ast.unparse(node)} points into")
        return sym

    def load(self, call: ast.Call) -> str:
        pointer = self.pointer_of(call.args[0])
        keywords = {k.arg: k.value for k in call.keywords}
        unknown = set(keywords) - {"mask", "other", "cache_modifier", "eviction_policy", "boundary_check",
                                   "padding_option", "volatile"}
        if unknown:
            raise Untranslatable(f"tl.load keywords {sorted(unknown)}")
        window = pointer.window()
        other = keywords.get("other")
        if other is not None and not (isinstance(other, ast.Constant) and other.value in (0, 0.0)):
            mask = keywords.get("mask")
            if mask is None:
                raise Untranslatable("tl.load with other= but no mask")
            return f"T.where({self.expr(mask)}, {window}, {self.expr(other)})"
        return window

    # -- statements ---------------------------------------------------------------------------------------------
    def emit(self, text: str, indent: int) -> None:
        self.lines.extend("    " * indent + line for line in text.splitlines())

    def refuse(self, stmt: ast.stmt, why: str, indent: int) -> None:
        for line in ast.unparse(stmt).splitlines():
            self.emit(f"# {line}", indent)
        self.lines[-1] += f"  {MARK} {why}"

    def body(self, stmts: list[ast.stmt], indent: int) -> None:
        for stmt in stmts:
            try:
                self.statement(stmt, indent)
            except Untranslatable as why:
                self.refuse(stmt, str(why), indent)

    def statement(self, stmt: ast.stmt, indent: int) -> None:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            self.emit(ast.unparse(stmt), indent)  # a docstring
            return
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
                and _is_tl(stmt.value.func, self.tl) == "store":
            call = stmt.value
            pointer = self.pointer_of(call.args[0])
            value = call.args[1] if len(call.args) > 1 else {k.arg: k.value for k in call.keywords}["value"]
            self.emit(f"{pointer.window()} = {self.expr(value)}", indent)
            return
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            sym = self.symbolic(stmt.value)
            if isinstance(sym, Pointer):
                self.env[name] = sym  # pointer arithmetic: folded into the slices that use it
                return
            self.env.pop(name, None)
            if isinstance(sym, Offsets):
                self.env[name] = sym  # still emitted: masks and T.where may read the index tile
            self.emit(f"{name} = {self.expr(stmt.value)}", indent)
            return
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            name = stmt.target.id
            if isinstance(self.env.get(name), Pointer):
                if indent > 1:
                    raise Untranslatable("a pointer advanced in a loop: compute the offsets from the loop counter "
                                         "(k0 + tl.arange(0, BK)) instead")
                term = stmt.value
                self.env[name] = self.env[name].plus(self._scalar_index(term))
                return
        if isinstance(stmt, ast.For):
            self.emit(f"for {ast.unparse(stmt.target)} in {self.expr(stmt.iter)}:", indent)
            self.body(stmt.body, indent + 1)
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

    def port(self) -> str:
        args = []
        for a in self.fn.args.args:
            args.append(f"{a.arg}: T.constexpr" if self._is_constexpr(a) else a.arg)
        self.lines = ["@tilejit.kernel", f"def {self.fn.name}({', '.join(args)}):"]
        self.body(self.fn.body, 1)
        return "\n".join(self.lines)


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


def port_source(source: str) -> str:
    """The tilejit versions of ``source``'s ``@triton.jit`` kernels, as a module's text."""
    tree = ast.parse(source)
    tl = _tl_aliases(tree)
    kernels = [node for node in tree.body if isinstance(node, ast.FunctionDef)
               and any(_is_triton_jit(d) for d in node.decorator_list)]
    parts = ["import tilejit", "import tilejit.language as T", ""]
    for fn in kernels:
        parts += ["", _KernelPort(fn, tl).port(), ""]
    return "\n".join(parts).rstrip() + "\n"
