"""What a compilation is for: the GPU arch, the launch options, and the registry of lowerings.

The bottom layer of the compiler. The frontend, the passes, the backends, the compiler and the runtime all read
it, and it imports nothing of tilejit but ``errors``:

* :class:`Arch` is an arch string parsed once ("sm_90a", "90a", 80 ...) with the features lowerings test
  (``has_wgmma``, ``has_tma``, ``has_tcgen05`` ...), so no other module parses arch strings.
* :class:`LaunchOptions` declares the launch options once (``num_warps``, ``num_stages``, ``split_k`` ...): a
  field each, with its check and doc; ``Kernel.bind``, ``tilejit.Config``, :class:`Target`, the cache key and
  the autotune space read the fields.
* :class:`Registry` is the lowering dispatch table: each op that has several lowerings (``gemm``, ``copy``)
  keeps implementations registered with an arch range, a priority and named predicates; ``select`` returns the
  first that fits and, when none does, a :class:`~tilejit.errors.DispatchError` lists every candidate with the
  predicate that rejected it. Backends register into :data:`REGISTRY` when imported; passes select from it.
* :class:`GemmLowering` is what a ``gemm`` lowering provides (the registry refuses a payload that is not one):
  the methods the layout pass and the emitter call, required or with a default that says "does not apply".
* :class:`CopyQuery` is what the ``copy`` predicates look at.
"""
from __future__ import annotations

import functools
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from .errors import DispatchError, UsageValueError

# -- arch ----------------------------------------------------------------------------------------------------

SUPPORTED_ARCHS: tuple[str, ...] = ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_103a", "sm_120a")
_ARCH_RE = re.compile(r"^(?:sm_?)?(\d{2,3})(a?)$")


@dataclass(frozen=True)
class Arch:
    """A supported compilation target, by its canonical name ("sm_90a")."""
    name: str

    def __post_init__(self) -> None:
        if self.name not in SUPPORTED_ARCHS:
            raise UsageValueError(f"unsupported arch {self.name!r}; tilejit supports: {', '.join(SUPPORTED_ARCHS)}")

    @classmethod
    def parse(cls, arch: "str | int | Arch") -> "Arch":
        """"sm_90a", "90a", "SM_90A" -> sm_90a; 80 -> sm_80. The suffix is kept exactly: "sm_90" is not
        "sm_90a" (wgmma needs the "a" target), so it is rejected with a suggestion rather than changed."""
        if isinstance(arch, Arch):
            return arch
        text = str(arch).strip().lower()
        m = _ARCH_RE.match(text)
        canonical = f"sm_{m.group(1)}{m.group(2)}" if m else text
        if canonical in SUPPORTED_ARCHS:
            return cls(canonical)
        suggestion = ""
        if m and f"sm_{m.group(1)}a" in SUPPORTED_ARCHS:
            suggestion = f" (did you mean 'sm_{m.group(1)}a'?)"
        raise UsageValueError(f"unsupported arch {arch!r}{suggestion}; tilejit supports: {', '.join(SUPPORTED_ARCHS)}")

    @classmethod
    def for_capability(cls, major: int, minor: int) -> "Arch":
        """The arch tilejit compiles for on a GPU of compute capability (major, minor)."""
        name = {(9, 0): "sm_90a", (10, 0): "sm_100a", (10, 3): "sm_103a", (12, 0): "sm_120a"}.get((major, minor))
        if major == 8:
            name = f"sm_8{minor}"
        if name not in SUPPORTED_ARCHS:  # e.g. 8.7 (Jetson Orin)
            raise UsageValueError(f"no tilejit target for compute capability {major}.{minor}; supported: "
                                  f"{', '.join(SUPPORTED_ARCHS)}")
        return cls(name)

    @property
    def sm(self) -> int:
        """The SM number: 80, 90, 100 ..."""
        return int(_ARCH_RE.match(self.name).group(1))

    @property
    def family(self) -> int:
        """The compute capability's major version (8 for Ampere/Ada, 9 Hopper, 10 and 12 Blackwell)."""
        return self.sm // 10

    @property
    def arch_specific(self) -> bool:
        """An "a" target: its cubin runs on this exact family and may use the family's special instructions."""
        return self.name.endswith("a")

    @property
    def has_fp8_mma(self) -> bool:
        """mma.sync on fp8 operands (sm_89+)."""
        return self.sm >= 89

    @property
    def has_tma(self) -> bool:
        """The bulk tensor copy engine (cp.async.bulk.tensor) and transaction-count mbarriers."""
        return self.sm >= 90

    @property
    def has_wgmma(self) -> bool:
        """Warpgroup MMA from shared-memory descriptors: sm_90a only."""
        return self.name == "sm_90a"

    @property
    def has_tcgen05(self) -> bool:
        """Fifth-generation tensor cores with tensor memory (data-center Blackwell, sm_100a / sm_103a)."""
        return self.family == 10 and self.arch_specific

    @property
    def max_shared_bytes(self) -> int:
        """Dynamic shared memory one block may use (the opt-in maximum; CUDA C Programming Guide, "Technical
        Specifications per Compute Capability"): 163 KB on sm_80, 99 KB on sm_86/89/120, 227 KB on sm_90/100/103."""
        return {80: 163, 86: 99, 89: 99, 90: 227, 100: 227, 103: 227, 120: 99}[self.sm] * 1024

    @property
    def has_setmaxnreg(self) -> bool:
        return self.has_wgmma or self.has_tcgen05

    def __str__(self) -> str:
        return self.name


# -- launch options ------------------------------------------------------------------------------------------

VALID_WARPS = (1, 2, 4, 8, 16)
VALID_SPLIT_K = (1, 2, 3, 4, 5, 6, 7, 8)  # a portable cluster holds at most 8 blocks
VALID_CLUSTER = (1, 2)  # TMA multicast clusters: one program, or a pair along x


@dataclass(frozen=True)
class Check:
    """What a launch option's value must be: ``holds(value)``, and ``expected`` for the error ("num_warps must
    be <expected>, got 3")."""
    holds: Callable[[Any], bool]
    expected: str


def one_of(values: tuple[int, ...], why: str = "") -> Check:
    """An int among ``values`` (a bool is not an int here)."""
    return Check(lambda v: type(v) is int and v in values, f"one of {values}" + (f" ({why})" if why else ""))


def int_at_least(low: int) -> Check:
    return Check(lambda v: type(v) is int and v >= low, f"an int >= {low}")


FLAG = Check(lambda v: type(v) is bool, "True or False")


@dataclass(frozen=True)
class OptionSpec:
    """The declaration of one launch option, held in its field's metadata (see :func:`launch_option`)."""
    check: Check
    doc: str
    # set, it turns this other option on too (pingpong implies persistent): see ``LaunchOptions.in_effect``
    implies: str | None = None
    # One of the original options (num_warps, num_stages): always listed, in the compile key, Config records and
    # reprs, and no kernel parameter may take its name. An option added later is listed only when set, so the
    # keys and records made before it existed keep their text, and a kernel parameter of its name (written
    # before the option existed) takes that keyword for itself.
    reserved: bool = False
    # a set value enters the compile key as the bare value rather than tagged with the name (split_k's token,
    # kept so that keys made before the other options existed stay equal)
    bare_in_key: bool = False
    # set, it changes the kernel on sm_90a only (elsewhere it is accepted and has no effect)
    sm90a_only: bool = False
    # the compiler's launch model chooses it for a launch that gives neither it nor num_stages (passes/launch_model.py)
    modelled: bool = False


_OPTION = "tilejit.launch_option"  # the metadata key of a field's OptionSpec


def launch_option(default: Any, check: Check, doc: str, **spec: Any) -> Any:
    """A field of :class:`LaunchOptions`: its default, the check of its values and a one-line doc (and the
    :class:`OptionSpec` flags in ``spec``)."""
    return field(default=default, metadata={_OPTION: OptionSpec(check, doc, **spec)})


@dataclass(frozen=True)
class LaunchOptions:
    """The launch keywords a kernel launch, ``tilejit.Config`` and :meth:`Target.of` take, declared once: each
    field is one option, and its metadata (an :class:`OptionSpec`) holds its check and doc. Validation, ``names``,
    ``as_dict``, the compile key's tokens, ``Config``'s keywords and records, which kernel parameters may shadow an
    option and the autotune space's sm_90a-only test all read the fields, so adding an option is adding a field.
    """
    num_warps: int = launch_option(4, one_of(VALID_WARPS), "warps per program: threads = 32 x num_warps",
                                   reserved=True)
    num_stages: int = launch_option(
        3, int_at_least(1), "the pipeline depth of T.range loops that do not give stages=", reserved=True,
        modelled=True)
    split_k: int = launch_option(
        1, one_of(VALID_SPLIT_K, "the programs of one thread-block cluster"),
        "the K loop of a GEMM-like kernel cut over that many programs of one thread-block cluster, their partial "
        "accumulators summed before the epilogue; 1 = off; sm_90+, see passes/split_k.py", bare_in_key=True)
    warp_specialize: bool = launch_option(
        False, FLAG,
        "the pipelined main loops that qualify get a producer warpgroup issuing their TMA loads while the "
        "num_warps warps only compute; a loop's own T.range(..., warp_specialize=) overrides it; see "
        "passes/warp_specialize.py", sm90a_only=True, modelled=True)
    persistent: bool = launch_option(
        False, FLAG,
        "a warp-specialized kernel runs as one program per SM walking the grid's programs, so the producer loads "
        "the next tile while the math warps finish this one; warp-specializes loops that do not say",
        implies="warp_specialize", sm90a_only=True, modelled=True)
    pingpong: bool = launch_option(
        False, FLAG,
        "a persistent kernel whose block holds two groups of num_warps warps, each running its own programs from "
        "one shared ring: one group's epilogue runs while the other's main loop uses the tensor cores",
        implies="persistent", sm90a_only=True)
    cluster: int = launch_option(
        1, one_of(VALID_CLUSTER, "programs per thread-block cluster along x"),
        "2: a warp-specialized kernel runs in clusters of two programs adjacent along x, and each ring tile whose "
        "window is the same in both is loaded once by TMA multicast into both; a grid whose x extent is odd runs "
        "without clusters; see passes/warp_specialize.multicast_loads", implies="warp_specialize", sm90a_only=True)
    stream_k: bool = launch_option(
        False, FLAG,
        "a persistent kernel whose K loop is shared out in equal runs of iterations, so the output tiles of the "
        "last, partial wave are computed by every SM in parts that one of them sums: no SM idles through the "
        "tail; see passes/split_k.stream_k", implies="persistent", sm90a_only=True)
    peel_masks: bool = launch_option(
        True, FLAG,
        "loops whose T.where masks are provably all true over a run of iterations (the causal diagonal, a ragged "
        "tail) are split into an unmasked loop over that run and masked loops over the rest; False keeps every "
        "loop whole; see passes/peel_masks.py")
    longest_first: bool = launch_option(
        True, FLAG,
        "a kernel whose loop runs longer the higher its program id along an axis (a causal attention forward's "
        "key loop) starts its programs in the reverse order along that axis, the longest first; results are "
        "unchanged; False keeps the grid's order; see passes/program_order.py")

    def __post_init__(self) -> None:
        for f, spec in _declared(type(self)):
            value = getattr(self, f.name)
            if not spec.check.holds(value):
                raise UsageValueError(f"{f.name} must be {spec.check.expected}, got {value!r}")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every option, in declaration order."""
        return tuple(f.name for f, _ in _declared(cls))

    @classmethod
    def reserved_names(cls) -> tuple[str, ...]:
        """The options always listed, whose names no kernel parameter may take (``OptionSpec.reserved``)."""
        return tuple(f.name for f, spec in _declared(cls) if spec.reserved)

    @classmethod
    def modelled_names(cls) -> tuple[str, ...]:
        """The options the launch model chooses where the launch leaves them unsaid (``OptionSpec.modelled``)."""
        return tuple(f.name for f, spec in _declared(cls) if spec.modelled)

    @classmethod
    def left_to_model(cls, given: frozenset | None) -> tuple[str, ...]:
        """The options the launch model (``passes.launch_model``) chooses for a launch that gave the options
        ``given`` (None: all of them): those of ``modelled_names`` it did not give, none when it gave
        ``num_stages`` or with ``TILEJIT_LAUNCH_MODEL=0``. Part of the cache key, so here and not beside the
        model: a disk hit or a launch reads it without loading the IR."""
        from . import knobs

        if given is None or "num_stages" in given or not knobs.launch_model():
            return ()
        return tuple(n for n in cls.modelled_names() if n not in given)

    @classmethod
    def spec(cls, name: str) -> OptionSpec:
        """The declaration of option ``name``."""
        return cls.__dataclass_fields__[name].metadata[_OPTION]

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f, _ in _declared(type(self))}

    def is_set(self, name: str) -> bool:
        """Whether option ``name`` differs from its default."""
        return getattr(self, name) != type(self).__dataclass_fields__[name].default

    def listed(self) -> dict[str, Any]:
        """The options as records and reprs list them: the reserved ones always, the others when set."""
        return {f.name: getattr(self, f.name) for f, spec in _declared(type(self))
                if spec.reserved or self.is_set(f.name)}

    def key_tokens(self) -> list[Any]:
        """The options as they enter the compile key: a reserved option's value always, a set option's bare value
        (``bare_in_key``), its name (a flag) or its name and value ("cluster2")."""
        tokens: list[Any] = []
        for f, spec in _declared(type(self)):
            value = getattr(self, f.name)
            if spec.reserved or spec.bare_in_key and self.is_set(f.name):
                tokens.append(value)
            elif self.is_set(f.name):
                tokens.append(f.name if type(value) is bool else f"{f.name}{value}")
        return tokens

    def in_effect(self, name: str) -> bool:
        """Whether option ``name`` is on: set itself, or implied by an option that is on (pingpong and stream_k
        imply persistent, which implies warp_specialize for the loops that do not say)."""
        return self.is_set(name) or any(spec.implies == name and self.in_effect(f.name)
                                        for f, spec in _declared(type(self)))

    @property
    def walks_grid(self) -> bool:
        """The kernel runs one program per SM walking the grid's programs (persistent, pingpong or stream_k), so
        it is compiled for the GPU's SM count."""
        return self.in_effect("persistent")

    @property
    def sm90a_only(self) -> bool:
        """Whether an option is set that changes the kernel on sm_90a only (``OptionSpec.sm90a_only``)."""
        return any(spec.sm90a_only and self.is_set(f.name) for f, spec in _declared(type(self)))


@functools.cache
def _declared(cls: type) -> tuple[tuple[Any, OptionSpec], ...]:
    """The option fields of a :class:`LaunchOptions` class with their declarations, in order."""
    return tuple((f, f.metadata[_OPTION]) for f in fields(cls))


# -- target --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What a lowering may depend on: the arch and the launch options (``target.num_warps`` and every other
    option name reads ``target.options``)."""
    arch: Arch
    options: LaunchOptions = LaunchOptions()
    # SMs of the GPU a persistent kernel is compiled for (its program count); 0: not known (no GPU at compile time)
    sm_count: int = 0

    @classmethod
    def of(cls, arch: "str | int | Arch", *, sm_count: int = 0, **options: Any) -> "Target":
        """``Target.of("sm_90a", num_warps=8, persistent=True, sm_count=132)``: the launch options by keyword."""
        return cls(Arch.parse(arch), LaunchOptions(**options), sm_count)

    def __getattr__(self, name: str) -> Any:
        # only reached for names that are not attributes: the launch options (``options`` itself is a field, unset
        # only while unpickling, when this raises AttributeError as it should)
        options = object.__getattribute__(self, "options")
        if name in type(options).__dataclass_fields__:
            return getattr(options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def sm(self) -> int:
        return self.arch.sm

    @property
    def persistent(self) -> bool:
        """The kernel walks the grid, one program per SM (``LaunchOptions.walks_grid``): persistent, pingpong or
        stream_k."""
        return self.options.walks_grid

    @property
    def threads(self) -> int:
        return 32 * self.options.num_warps

    def may_walk_grid(self, given: frozenset | None) -> bool:
        """Whether the launch model may make this kernel persistent for a launch that gave the options ``given``
        (then its SM count is part of the compile)."""
        return "persistent" in type(self.options).left_to_model(given) and self.arch.has_wgmma


# -- lowering dispatch ---------------------------------------------------------------------------------------

Predicate = Callable[[Any, Target], bool]


@dataclass(frozen=True)
class Impl:
    name: str
    op: str
    min_sm: int
    max_sm: int
    priority: int
    predicates: tuple[tuple[str, Predicate], ...]
    payload: Any = None  # the lowering itself (for gemm a GemmLowering: its layouts and its emission)

    def rejection(self, op: Any, target: Target) -> str | None:
        """Why this implementation does not fit, or None when it does."""
        if not self.min_sm <= target.sm <= self.max_sm:
            return f"arch {target.arch} outside sm_{self.min_sm}..sm_{self.max_sm}"
        for name, pred in self.predicates:
            if not pred(op, target):
                return name
        return None


class GemmLowering(ABC):
    """What a lowering of ``gemm`` registered in the dispatch registry provides (``REGISTRY.register("gemm", ...)``
    refuses any other payload).

    Required: :meth:`acc_layout` (the layout pass seeds the gemm's result with it) and :meth:`emit` (the emitter's
    gemm rule calls it). The rest is optional; each default says the feature does not apply:

    * reading operand A from registers: :attr:`register_a`, :attr:`register_a_of`;
    * an accumulator with the warps along M only, for a result that feeds another gemm's register operand A:
      :meth:`rows_acc_layout`, :meth:`fits_rows`;
    * operand fragments carried across the iterations of a pipelined loop (``lower_loops.FragmentCarry``):
      :meth:`carries`, with :meth:`declare_carried` and :meth:`load_first`, which a lowering whose ``carries``
      may hold overrides (the registry checks that it does).

    ``op`` is the gemm (an ``ir.Op``), ``target`` a :class:`Target`, ``em`` the backend's emitter.
    """

    #: Operand A is read from registers: the layout pass may hand this lowering a register tile for A
    #: (``passes.layouts.keep_register_operands``).
    register_a: bool = False
    #: The name of the shared-A lowering whose pin (``TILEJIT_GEMM_LOWERING``) admits this register-A form too.
    register_a_of: str | None = None
    #: Reads the e8m0 block scales of a block-scaled gemm (``ir.is_block_scaled``: five operands) itself; such a
    #: gemm is rewritten into ordinary ops (``passes.microscaled``) where no lowering declaring this fits.
    block_scaled: bool = False
    #: Reads an MN-major operand itself, gathering its fragment from the shared tile: ``passes.transpose_operands``
    #: copies no operand for it (a copy's code beside the gathered fragment's registers spills).
    gathers_mn_major: bool = False

    @abstractmethod
    def acc_layout(self, op: Any, target: Target) -> Any:
        """The register layout of the accumulator (and result) of ``op``."""

    @abstractmethod
    def emit(self, em: Any, op: Any) -> None:
        """Emit the CUDA for ``op`` into ``em``."""

    def rows_acc_layout(self, op: Any, target: Target) -> Any:
        """The accumulator layout that gives each warp whole rows, or None (the default: this lowering has none,
        and the layout pass keeps :meth:`acc_layout`)."""
        return None

    def fits_rows(self, op: Any, target: Target) -> bool:
        """Whether this lowering (one reading A from registers) fits ``op`` once its accumulator and operand A give
        each warp whole rows, judged on what does not depend on layouts. Default: no."""
        return False

    def carries(self, op: Any) -> bool:
        """Whether a pipelined loop may carry this gemm's operand fragments across iterations. Default: no."""
        return False

    def declare_carried(self, em: Any, op: Any) -> None:
        """Declare the carried fragment registers before the loop; called only where :meth:`carries` holds."""
        raise NotImplementedError(f"{type(self).__name__} carries no fragments")

    def load_first(self, em: Any, op: Any) -> None:
        """Load the first step's fragments before the loop; called only where :meth:`carries` holds."""
        raise NotImplementedError(f"{type(self).__name__} carries no fragments")

    @classmethod
    def violations(cls, payload: Any) -> list[str]:
        """How ``payload`` breaks this contract (empty when it keeps it)."""
        if not isinstance(payload, cls):
            return [f"{type(payload).__name__} is not a {cls.__name__}"]
        found = []
        kind = type(payload)
        if kind.carries is not GemmLowering.carries:
            found += [f"it overrides carries but not {method}" for method in ("declare_carried", "load_first")
                      if getattr(kind, method) is getattr(GemmLowering, method)]
        if not isinstance(payload.register_a, bool):
            found.append(f"register_a is {payload.register_a!r}, not a bool")
        if payload.register_a_of is not None and not payload.register_a:
            found.append(f"register_a_of names {payload.register_a_of!r} but register_a is False")
        return found


#: The contract each op's payloads must keep, checked at registration.
CONTRACTS: dict[str, type] = {"gemm": GemmLowering}


@dataclass
class Registry:
    impls: dict[str, list[Impl]] = field(default_factory=dict)

    def register(self, op: str, name: str, *, min_sm: int = 80, max_sm: int = 999, priority: int = 0,
                 predicates: dict[str, Predicate] | None = None):
        def add(payload):
            contract = CONTRACTS.get(op)
            problems = contract.violations(payload) if contract is not None else []
            if problems:
                raise TypeError(f"{op} implementation {name!r} does not keep the {contract.__name__} contract "
                                f"(tilejit/target.py): {'; '.join(problems)}")
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

    def get(self, op: str, name: str) -> Impl:
        """The implementation of ``op`` registered as ``name`` (a lowering chosen by an earlier pass)."""
        for impl in self.impls.get(op, []):
            if impl.name == name:
                return impl
        raise KeyError(f"no {op} implementation named {name!r}")

    def select(self, op_name: str, op: Any, target: Target, loc: Any = None, source_line: str | None = None,
               only: str | None = None) -> Impl:
        """The first registered implementation (highest priority) whose predicates hold; ``only`` restricts the
        choice to the one of that name (a pinned lowering)."""
        table = self.impls.get(op_name, [])
        if only is not None and not any(i.name == only for i in table):
            raise DispatchError(
                f"no {op_name} lowering is named {only!r}", candidates=[(i.name, "registered") for i in table],
                filename=getattr(loc, "filename", None), lineno=getattr(loc, "lineno", None),
                col=getattr(loc, "col", None), source_line=source_line,
                hint="pin one of the registered names above (or unset the pin)")
        rejected = []
        for impl in (i for i in table if only is None or i.name == only):
            why = impl.rejection(op, target)
            if why is None:
                return impl
            rejected.append((impl.name, why))
        if only is not None:
            raise DispatchError(
                f"the pinned {op_name} lowering {only!r} does not fit on {target.arch}", candidates=rejected,
                filename=getattr(loc, "filename", None), lineno=getattr(loc, "lineno", None),
                col=getattr(loc, "col", None), source_line=source_line,
                hint=f"unset the pin (TILEJIT_{op_name.upper()}_LOWERING) or change the tile shape, dtypes, "
                     "num_warps or arch")
        raise DispatchError(
            f"no lowering of {op_name} fits on {target.arch}" + ("" if rejected else ": none is registered"),
            candidates=rejected,
            filename=getattr(loc, "filename", None), lineno=getattr(loc, "lineno", None),
            col=getattr(loc, "col", None), source_line=source_line,
            hint="change the tile shape, dtypes or num_warps so that one candidate's predicates hold")


REGISTRY = Registry()


@dataclass(frozen=True)
class CopyQuery:
    """What a ``copy`` lowering's predicates look at: the shared load, its tensor's specialization (a
    ``frontend.spec.TensorSpec`` or None) and whether a pipelined loop prefetches it."""
    op: Any
    spec: Any
    pipelined: bool

    @property
    def tile_dims(self) -> list[int]:
        return [d for d in range(self.op.operands[0].type.rank) if d not in self.op.attrs.dropped]
