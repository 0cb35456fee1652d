"""The package's import graph: layers point down, and there is no circle.

Every ``import`` in ``tilejit/`` (module level and inside functions alike) is read from the source with ``ast``.
A layer may import its own layer and the layers below it, never one above; and the graph of modules has no
cycle. This is what lets a pass be read (and tested) without the CUDA backend, and the compiler without a GPU.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tilejit

PACKAGE = Path(tilejit.__file__).resolve().parent

# Bottom to top. A module's layer is that of its subpackage (tilejit/passes/x.py -> "passes") or, for a
# top-level module, its own name.
LAYERS: list[set[str]] = [
    {"errors", "knobs", "dtypes", "version", "target", "private_io"},  # facts everything reads; private files
    {"cache"},                                                # the cache directory's layout, entries, locks
    {"ir", "language"},                                      # the IR; the user-facing language stubs
    {"frontend", "passes", "interpreter"},                   # AST -> IR; IR -> IR; IR run on CPU tensors
    {"backend_cuda"},                                         # IR -> CUDA C++ -> NVRTC
    {"compiler"},                                             # the staged compile, through the cache
    {"runtime"},                                              # kernels, launches, the driver
    {"autotuner", "configs", "testing", "cli", "launch_heuristics", "torch_ops", "port", "__init__"},  # tools on top
    {"ops"},                                                  # kernels written in the language: a user of it
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> str:
    return module.split(".")[0]


def _imports(path: Path) -> set[str]:
    """tilejit modules imported by ``path`` (absolute ``tilejit.x`` and relative forms)."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name[len("tilejit."):] for a in node.names if a.name.startswith("tilejit."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and (node.module == "tilejit" or node.module.startswith("tilejit.")):
                target = node.module[len("tilejit."):] if node.module != "tilejit" else ""
            else:
                continue
            if node.module is None or target == "" or target == ".".join(base if node.level else []):
                # `from . import x` / `from tilejit import x`: the names are modules of that package
                found.update(".".join(filter(None, [target, a.name])) for a in node.names)
            else:
                found.add(target)
    return {m for m in found if m and _exists(m)}


def _exists(module: str) -> bool:
    path = PACKAGE.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


GRAPH = {_module_name(p): _imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_has_a_layer():
    assert {_layer(m) for m in GRAPH} <= set(RANK), sorted({_layer(m) for m in GRAPH} - set(RANK))


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down(module):
    rank = RANK[_layer(module)]
    upward = sorted(m for m in GRAPH[module] if RANK[_layer(m)] > rank)
    assert not upward, f"{module} (layer {_layer(module)}) imports from above: {upward}"


def test_passes_never_import_the_backend():
    offenders = {m: sorted(i for i in deps if _layer(i) == "backend_cuda")
                 for m, deps in GRAPH.items() if _layer(m) == "passes"}
    assert not any(offenders.values()), offenders


def test_the_compiler_never_imports_ops():
    """tilejit.ops is written in the language like a user's code: no module outside it (``tilejit/__init__.py``
    included) may import it, at module level or inside a function."""
    offenders = {m: sorted(i for i in deps if _layer(i) == "ops") for m, deps in GRAPH.items() if _layer(m) != "ops"}
    assert not any(offenders.values()), {m: deps for m, deps in offenders.items() if deps}
    assert {m for m in GRAPH if _layer(m) == "ops"} >= {"ops", "ops.fused_attention", "ops.custom_ops"}


def test_no_import_cycle():
    """Depth-first search over modules; a back edge is a cycle (reported as the path that closes it)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for dep in sorted(GRAPH.get(m, ())):
            if dep == m:
                continue
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(GRAPH):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, " -> ".join(cycle)


def test_the_checker_sees_relative_and_function_level_imports():
    """Guard the guard: known edges of each form are found."""
    assert "target" in GRAPH["passes.layouts"]                   # from ..target import ...
    assert "frontend.visitor" in GRAPH["compiler"]               # inside a function
    assert "runtime.native" in GRAPH["runtime.jit"]              # from . import native
    assert "compiler" in GRAPH["runtime.jit"]                    # from .. import compiler
