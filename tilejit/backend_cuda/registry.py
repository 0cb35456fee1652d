"""The lowering dispatch registry.

Each op kind that has several lowerings (``gemm``, ``copy``) keeps a table of implementations, each
registered with an arch range, a priority and named predicates. ``select`` returns the highest-priority
implementation whose arch range contains the target and whose predicates all hold; when none fits,
the :class:`~tilejit.errors.DispatchError` lists every candidate with the predicate that rejected it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import DispatchError


@dataclass(frozen=True)
class Target:
    """What a lowering may depend on: the arch and the launch's thread count."""
    arch: str          # "sm_80", "sm_90a", ...
    num_warps: int
    num_stages: int

    @property
    def sm(self) -> int:
        return int("".join(ch for ch in self.arch[3:] if ch.isdigit()))

    @property
    def threads(self) -> int:
        return 32 * self.num_warps


Predicate = Callable[[Any, Target], bool]


@dataclass(frozen=True)
class Impl:
    name: str
    op: str
    min_sm: int
    max_sm: int
    priority: int
    predicates: tuple[tuple[str, Predicate], ...]
    payload: Any = None  # what the lowering needs (an object with emit / layout methods)

    def rejection(self, op: Any, target: Target) -> str | None:
        """Why this implementation does not fit, or None when it does."""
        if not self.min_sm <= target.sm <= self.max_sm:
            return f"arch {target.arch} outside sm_{self.min_sm}..sm_{self.max_sm}"
        for name, pred in self.predicates:
            if not pred(op, target):
                return name
        return None


@dataclass
class Registry:
    impls: dict[str, list[Impl]] = field(default_factory=dict)

    def register(self, op: str, name: str, *, min_sm: int = 80, max_sm: int = 999, priority: int = 0,
                 predicates: dict[str, Predicate] | None = None):
        def add(payload):
            impl = Impl(name, op, min_sm, max_sm, priority, tuple((predicates or {}).items()), payload)
            table = self.impls.setdefault(op, [])
            if any(i.name == name for i in table):
                raise ValueError(f"{op} implementation {name!r} registered twice")
            table.append(impl)
            table.sort(key=lambda i: -i.priority)
            return payload
        return add

    def candidates(self, op: str) -> list[Impl]:
        return list(self.impls.get(op, []))

    def select(self, op_name: str, op: Any, target: Target, loc: Any = None, source_line: str | None = None) -> Impl:
        rejected = []
        for impl in self.impls.get(op_name, []):
            why = impl.rejection(op, target)
            if why is None:
                return impl
            rejected.append((impl.name, why))
        raise DispatchError(
            f"no lowering of {op_name} fits on {target.arch}" + ("" if rejected else ": none is registered"),
            candidates=rejected,
            filename=getattr(loc, "filename", None), lineno=getattr(loc, "lineno", None),
            col=getattr(loc, "col", None), source_line=source_line,
            hint="change the tile shape, dtypes or num_warps so that one candidate's predicates hold")


REGISTRY = Registry()
