"""MLIR-like text form of the IR, for users (``kernel.ir(...)``), tests (FileCheck) and debugging."""
from __future__ import annotations

import dataclasses
import enum

from .core import Block, Function, Op, Value
from .ops import OpKind


def _attr_text(value) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_attr_text(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


class _Namer:
    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.used: set[str] = set()
        self.counter = 0

    def define(self, value: Value) -> str:
        if value.name:
            base = value.name
            name = base
            n = 1
            while name in self.used:
                name = f"{base}_{n}"
                n += 1
        else:
            while str(self.counter) in self.used:
                self.counter += 1
            name = str(self.counter)
            self.counter += 1
        self.used.add(name)
        self.names[value.id] = name
        return "%" + name

    def __call__(self, value: Value) -> str:
        name = self.names.get(value.id)
        return "%" + name if name is not None else f"%<undefined {value.id}>"


def _promise_text(value: Value) -> str:
    """`` {multiple_of = 16}`` for a value with a promise (``[16, 1]`` per dim of a tile), else nothing."""
    if value.multiple_of is None:
        return ""
    divisors = value.multiple_of.divisors
    return f" {{multiple_of = {_attr_text(divisors) if value.is_tile else divisors[0]}}}"


class Printer:
    def __init__(self) -> None:
        self.namer = _Namer()
        self.lines: list[str] = []

    def define(self, value: Value) -> str:
        """The name a value is defined under, with its promise if it has one."""
        return self.namer.define(value) + _promise_text(value)

    def function(self, fn: Function) -> str:
        params = []
        consts = []
        for p in fn.params:
            if p.kind == "constexpr":
                consts.append(f"{p.name} = {_attr_text(p.constant) if not hasattr(p.constant, 'short') else p.constant}")
            else:
                params.append(f"{self.namer.define(p.value)}: {p.value.type}{_promise_text(p.value)}")
        header = f"tj.func @{fn.name}({', '.join(params)})"
        if consts:
            header += " constexprs {" + ", ".join(consts) + "}"
        facts = {k: v for k, v in fn.attrs.items() if isinstance(v, (int, str, bool))}
        if facts:
            header += " attributes {" + ", ".join(f"{k} = {_attr_text(v)}" for k, v in sorted(facts.items())) + "}"
        self.lines.append(header + " {")
        self.block(fn.body, 1)
        self.lines.append("}")
        return "\n".join(self.lines) + "\n"

    def block(self, block: Block, depth: int) -> None:
        for op in block.ops:
            self.op(op, depth)

    def _attrs(self, op: Op) -> str:
        fields = dataclasses.fields(op.attrs)
        if not fields:
            return ""
        parts = [f"{f.name} = {_attr_text(getattr(op.attrs, f.name))}" for f in fields
                 if getattr(op.attrs, f.name) not in ((), None) and not (f.name == "pipeline" and not getattr(op.attrs, f.name))]
        return " {" + ", ".join(parts) + "}" if parts else ""

    def op(self, op: Op, depth: int) -> None:
        pad = "  " * depth
        n = self.namer
        if op.kind is OpKind.FOR:
            lo, hi, step, *inits = op.operands
            body = op.regions[0]
            results = ", ".join(self.define(r) for r in op.results)
            iv = self.define(body.args[0])
            # a carried value held elsewhere inside the body (a tcgen05 accumulator in TMEM) shows its type there
            carried = ", ".join(f"{self.define(a)}{'' if a.type == i.type else f': {a.type}'} = {n(i)}"
                                for a, i in zip(body.args[1:], inits))
            text = f"{pad}{results + ' = ' if results else ''}tj.for {iv} = {n(lo)} to {n(hi)} step {n(step)}"
            if inits:
                text += f" iter_args({carried}) -> ({', '.join(str(r.type) for r in op.results)})"
            self.lines.append(text + self._attrs(op) + " {")
            self.block(body, depth + 1)
            self.lines.append(pad + "}")
            return
        if op.kind is OpKind.WHILE:
            cond, body = op.regions
            results = ", ".join(self.define(r) for r in op.results)
            carried = ", ".join(f"{self.define(a)} = {n(i)}" for a, i in zip(cond.args, op.operands))
            self.lines.append(f"{pad}{results + ' = ' if results else ''}tj.while ({carried}) -> "
                              f"({', '.join(str(r.type) for r in op.results)}) {{")
            self.block(cond, depth + 1)
            args = ", ".join(self.define(a) for a in body.args)
            self.lines.append(f"{pad}}} do ({args}) {{")
            self.block(body, depth + 1)
            self.lines.append(pad + "}")
            return
        if op.kind is OpKind.IF:
            results = ", ".join(self.define(r) for r in op.results)
            text = f"{pad}{results + ' = ' if results else ''}tj.if {n(op.operands[0])}"
            if op.results:
                text += f" -> ({', '.join(str(r.type) for r in op.results)})"
            self.lines.append(text + " {")
            self.block(op.regions[0], depth + 1)
            if len(op.regions) > 1 and op.regions[1].ops:
                self.lines.append(pad + "} else {")
                self.block(op.regions[1], depth + 1)
            self.lines.append(pad + "}")
            return
        operands = ", ".join(n(v) for v in op.operands)
        if op.kind in (OpKind.LOAD, OpKind.STORE):
            tensor, *rest = op.operands
            if op.kind is OpKind.STORE:
                value, *rest = rest
                operands = f"{n(value)}, {n(tensor)}[{', '.join(n(v) for v in rest)}]"
            else:
                operands = f"{n(tensor)}[{', '.join(n(v) for v in rest)}]"
        results = ", ".join(self.define(r) for r in op.results)
        text = f"{pad}{results + ' = ' if results else ''}tj.{op.kind.mnemonic}"
        if operands:
            text += " " + operands
        text += self._attrs(op)
        if op.results:
            text += " : " + ", ".join(str(r.type) for r in op.results)
        self.lines.append(text)


def print_function(fn: Function) -> str:
    return Printer().function(fn)
