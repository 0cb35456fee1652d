"""Compilation as a staged object: one :func:`compile` from a :class:`Specialization` and a target to a cubin.

    call = kernel.bind(args, kwargs)                     # runtime: the launch's arguments, matched
    compiled = compile(call.spec, Target.of("sm_90a", num_warps=8))
    stages = compile(call.spec, target, stop_after="cuda")  # stop early: stages.ir, stages.final_ir, stages.cuda

The stages, in order (``STAGES``); each reads what the one before made and fills its own field of
:class:`Stages`:

======== ===================================================================== ==================================
ir       frontend: the kernel's AST -> tile IR of this specialization, verified  ``frontend.visitor``
passes   the target's pass list, the IR verified after each pass              ``backend_cuda.stages``
cuda     CUDA C++ emission (self-contained, with its prelude)                 ``backend_cuda.emitter``
ptx      NVRTC, keeping the PTX (run when asked for, or ``TILEJIT_KEEP_PTX``) ``backend_cuda.nvrtc``
cubin    NVRTC -> cubin for exactly the target's arch                         ``backend_cuda.nvrtc``
======== ===================================================================== ==================================

A full compile (no ``stop_after``) goes through the disk cache (``tilejit.cache``): the key is a sha256 of
:meth:`Specialization.key_material` plus the target; a hit runs no stage at all, a miss runs the ``ir`` stage
before any cache lock is taken (so a user's error surfaces at once, and a ``frontend.spec.NeedsShape`` reaches
the runtime, which adds the extent to the specialization and compiles again), then the rest under the lock.

This module sits above the frontend, the passes and the backends, and below the runtime: it knows nothing of
processes, devices or launches. ``kernel.ir``, ``kernel.compile``, the launch path, the autotuner and the tests
all compile through it.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import knobs
from .errors import UsageValueError, warn_user
from .cache import CacheEntry, CacheError, KernelCache, default_cache
from .frontend.source import ParsedSource, referenced_globals
from .frontend.spec import ArgSpec, ScalarSpec, TensorListSpec, TensorSpec, spec_json
from .target import LaunchOptions, Target
from .version import __version__

if TYPE_CHECKING:  # the IR loads with the frontend, on a compile's first miss: `import tilejit` skips it
    from .ir import Function

STAGES: tuple[str, ...] = ("ir", "passes", "cuda", "ptx", "cubin")


# -- what a compile depends on --------------------------------------------------------------------------------


@functools.cache
def compiler_fingerprint() -> str:
    """sha256 of tilejit's own source files (the Python modules and the CUDA headers the generated code includes),
    read once per process (at the first compile, not at import).

    Part of every kernel's source hash, so editing the compiler or a device helper (not only bumping
    ``__version__``) makes old cache entries and autotune records unreachable instead of silently reusing code an
    older compiler made.
    """
    return package_digest(Path(__file__).resolve().parent)


def package_digest(root: Path) -> str:
    """sha256 over every ``*.py`` and ``*.cuh`` under ``root``: relative path and contents, in sorted path order.

    Plain ``os`` calls rather than pathlib: this runs on the way to a fresh process's first launch, where
    pathlib's per-file objects cost ~5 ms of the ~15 ms budget (H200 host).
    """
    files = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        rel_dir = os.path.relpath(directory, root).replace(os.sep, "/")
        for name in names:
            if name.endswith((".py", ".cuh")):
                files.append((name if rel_dir == "." else f"{rel_dir}/{name}", os.path.join(directory, name)))
    h = hashlib.sha256()
    for rel, path in sorted(files):
        with open(path, "rb") as f:
            h.update(rel.encode() + b"\0")
            h.update(f.read() + b"\0")
    return h.hexdigest()


def source_hash(kernel_text: str, helpers: list[tuple[str, str]]) -> str:
    """sha256 of a kernel's source, every ``@tilejit.func`` helper it calls ((name, source) pairs), the tilejit
    version and the compiler's own source (:func:`compiler_fingerprint`)."""
    h = hashlib.sha256(__version__.encode())
    h.update(compiler_fingerprint().encode())
    h.update(kernel_text.encode())
    for name, text in sorted(helpers):
        h.update(name.encode())
        h.update(text.encode())
    return h.hexdigest()


@dataclass(frozen=True)
class Specialization:
    """Everything one compile depends on, fixed: the kernel's source, the compile-time globals it reads, every
    parameter's spec (dtype, rank, strides, alignment, constexpr value ...) and the launch options.

    Made by ``Kernel.bind``; equal specializations (with the same target) compile to the same cubin.
    """
    name: str
    parsed: ParsedSource
    source_hash: str
    constants: tuple[tuple[str, Any], ...]   # compile-time globals the kernel and its helpers read
    args: tuple[tuple[str, ArgSpec], ...]   # every parameter, in order
    options: LaunchOptions
    # the launch options the launch gave by name (``Kernel.bind``); None: all of them (the launch model leaves a
    # specialization made otherwise alone)
    given: frozenset | None = None

    @property
    def specs(self) -> dict[str, ArgSpec]:
        return dict(self.args)

    @property
    def symbol(self) -> str:
        """The kernel's entry point in the cubin."""
        from .backend_cuda.emitter import kernel_symbol

        return kernel_symbol(self.name)

    def with_arg(self, name: str, spec: ArgSpec) -> "Specialization":
        return replace(self, args=tuple((n, spec if n == name else s) for n, s in self.args))

    def key_material(self, target: str) -> dict[str, Any]:
        return {
            "kernel": self.name,
            "source": self.source_hash,
            "globals": dict(self.constants),
            "args": [[name, spec_json(spec)] for name, spec in self.args],
            "options": self.options.key_tokens(),
            "target": target,
        }

    def key(self, target: str) -> str:
        """sha256 of the key material for ``target`` (``target_text(...)``, or "ir" for the frontend alone)."""
        material = json.dumps(self.key_material(target), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(material.encode()).hexdigest()

    def signature(self) -> str:
        """One line for people: ``A:float16[2d], n:int64, BM=128``."""
        parts = []
        for name, spec in self.args:
            js = spec_json(spec)
            if js[0] == "tensor":
                parts.append(f"{name}:{js[1]}[{js[2]}d]")
            elif js[0] == "tensor_list":
                parts.append(f"{name}:list of {js[1]}[{js[2]}d]")
            elif js[0] == "scalar":
                parts.append(f"{name}:{js[1]}")
            else:
                parts.append(f"{name}={js[1]}")
        return ", ".join(parts)

    def value_layout(self) -> dict[str, list[int]]:
        """Where each tensor argument's pointer, sizes and strides sit in the packed launch values:
        name -> [start, rank] (constexprs take no slot, scalars one, tensors 1 + 2 x rank, tensor lists two:
        their device table's address and their length)."""
        layout, at = {}, 0
        for name, spec in self.args:
            if isinstance(spec, TensorSpec):
                layout[name] = [at, spec.rank]
                at += 1 + 2 * spec.rank
            elif isinstance(spec, ScalarSpec):
                at += 1
            elif isinstance(spec, TensorListSpec):
                at += 2
        return layout


def target_text(target: Target, given: frozenset | None = None) -> str:
    """The target as it enters the cache key: arch and NVRTC version (a new NVRTC may make other code), the options
    left to the launch model (``LaunchOptions.left_to_model``; ``given``: the options the launch gave, None for all) and a
    persistent kernel's SM count."""
    from .backend_cuda.nvrtc import nvrtc_version

    major, minor = nvrtc_version()
    left = LaunchOptions.left_to_model(given)
    walks = target.persistent or target.may_walk_grid(given)
    return (f"cuda:{target.arch.name}:nvrtc{major}.{minor}" + knobs.codegen_pins()
            + (f":model={'+'.join(left)}" if left else "") + (f":sms={target.sm_count}" if walks else ""))


def cache_key(spec: Specialization, target: Target) -> str:
    return spec.key(target_text(target, spec.given))


# -- the stages ------------------------------------------------------------------------------------------------


@dataclass
class Stages:
    """What the stages of one compile have made so far; a stage's field is None until it has run."""
    spec: Specialization
    target: Target | None
    fn: Function | None = None          # the IR, changed in place by the passes
    ir: str | None = None               # printed IR after the frontend (``ir``)
    written: list[str] | None = None    # the tensor parameters the kernel writes (its outputs), from the frontend IR
    final_ir: str | None = None         # printed IR after the passes (``passes``)
    cuda: str | None = None
    param_kinds: list[str] | None = None
    shared_bytes: int | None = None
    tensor_maps: list[dict] | None = None
    register_grant: int | None = None   # registers per math thread setmaxnreg grants (None: no producer split)
    stream_k_slot_bytes: int = 0        # a stream-K program's share of the partial-sum workspace (lower_split_k)
    stream_k_flags: int = 0             # and its flags
    launch_choice: Any = None           # what the launch model chose for the options left to it (launch_model.Choice)
    unmodelled_target: Any = None       # the target before the model chose (a pass rerun chooses from it again)
    explicit_stages: int = 0            # the deepest ring a T.range(stages=) of the kernel asks for
    ptx: str | None = None
    cubin: bytes | None = None
    nvrtc_log: str = ""
    done: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _ir_stage(st: Stages) -> None:
    from .errors import LimitError
    from .frontend.limits import MAX_TILE_ELEMENTS, oversized_tile
    from .frontend.visitor import build_function, check_constructs
    from .ir import print_function, verify
    from .passes.cleanup import cleanup

    parsed = st.spec.parsed
    if not parsed.constructs_checked:
        check_constructs(parsed)
        parsed.constructs_checked = True
    fn = build_function(parsed, st.spec.specs, referenced_globals(parsed.fn))
    cleanup(fn)
    oversized = oversized_tile(fn)  # after cleanup: a product tile folded into a gemm is gone
    if oversized is not None:
        shape = oversized.result.type.shape
        raise LimitError.at(oversized.loc, f"a tile of {'x'.join(map(str, shape))} = {oversized.result.type.numel:,} "
                            f"elements; a tile may hold at most {MAX_TILE_ELEMENTS:,}",
                            hint="use smaller block sizes (the constexpr tile sizes)")
    verify(fn)
    st.fn, st.ir, st.written = fn, print_function(fn), list(fn.writers())


def _passes_stage(st: Stages) -> None:
    from .backend_cuda.stages import run_passes
    from .ir import OpKind, print_function

    st.explicit_stages = max([op.attrs.stages or 0 for op in st.fn.walk() if op.kind is OpKind.FOR] + [0])
    # (the options the launch left unsaid, chosen from the target as the launch gave it: when the passes run
    # again for a shallower ring, the choice is made again from that target, not from the one it made)
    if st.unmodelled_target is None:
        st.unmodelled_target = st.target
    from .passes import launch_model

    target, choice = launch_model.resolve(st.fn, st.unmodelled_target, st.spec.given)
    if choice is not None:
        st.target, st.launch_choice = target, choice
    run_passes(st.fn, st.target)
    st.final_ir = print_function(st.fn)


def _cuda_stage(st: Stages) -> None:
    from .backend_cuda.stages import emit_cuda

    out = emit_cuda(st.fn, st.target, st.spec.symbol)
    limit = st.target.arch.max_shared_bytes
    asked, asked_bytes = _deepest_ring(st.fn), out.shared_bytes
    refit: dict = {}
    while out.shared_bytes > limit and _deepest_ring(st.fn) > 1:
        # Too deep a ring for this target's shared memory: pipeline one stage less (from a fresh frontend IR,
        # since the passes changed the old one) until it fits or nothing is pipelined any more. A pingpong
        # kernel's second group of math warps (its own epilogue buffers) goes before the pipeline does: it then
        # runs as a persistent kernel, at the depth asked.
        cap = _deepest_ring(st.fn) - 1
        if cap < 2 and st.fn.attrs.get("groups", 1) > 1:
            refit = {"one_group": True}
        else:
            refit["max_stages"] = cap
        _ir_stage(st)
        st.fn.attrs.update(refit)
        _passes_stage(st)
        out = emit_cuda(st.fn, st.target, st.spec.symbol)
    if refit.get("one_group") and out.shared_bytes <= limit:
        warn_user(f"tilejit: kernel {st.spec.name}: pingpong's two groups of math warps and their epilogue buffers "
                  f"leave no room in {st.target.arch}'s shared memory ({limit:,} bytes a block) for a pipelined "
                  "ring; compiled as persistent=True, one group (use smaller tiles for pingpong)")
    if out.shared_bytes > limit:
        raise _shared_memory_error(st, out, limit)
    compiled = _deepest_ring(st.fn)
    chosen = st.launch_choice is not None and "num_stages" in st.launch_choice.values
    if compiled < asked and (not chosen or st.explicit_stages > compiled):  # (a depth the model chose: no warning)
        warn_user(f"tilejit: kernel {st.spec.name}: a pipeline of {asked} stages needs {asked_bytes:,} bytes of "
                  f"shared memory, more than {st.target.arch} allows per block ({limit:,}); compiled with "
                  f"{compiled} stages (ask for fewer stages or smaller tiles to silence this)")
    st.cuda, st.param_kinds, st.shared_bytes, st.tensor_maps = (out.source, out.param_kinds, out.shared_bytes,
                                                                 out.tensor_maps)
    st.stream_k_slot_bytes, st.stream_k_flags = out.stream_k_slot_bytes, out.stream_k_flags
    st.register_grant = out.register_grant


def _deepest_ring(fn: Function) -> int:
    """The most ring slots any load is prefetched through (1 when nothing is pipelined)."""
    from .ir import OpKind

    return max([op.attrs.pipeline for op in fn.walk() if op.kind is OpKind.LOAD] + [1])


def _shared_memory_error(st: Stages, out, limit: int):
    """A located error naming every shared tile and its bytes. It points at the op that needs the scratch buffer
    (a reduction, a layout conversion) when that buffer is the largest need, else at the kernel's ``def`` line."""
    from .errors import SharedMemoryError

    needs = []
    for value, nbytes in sorted(out.shared_tiles, key=lambda t: -t[1]):
        t = value.type
        where = f" ({value.owner.loc})" if getattr(value.owner, "loc", None) else ""
        needs.append(f"{'x'.join(map(str, t.shape))} {t.dtype.name} tile: {nbytes:,} B{where}")
    scratch_loc = getattr(out.scratch_op, "loc", None)
    at_scratch = scratch_loc is not None and out.scratch_bytes >= max([n for _, n in out.shared_tiles] + [0])
    if out.scratch_bytes:
        what = _SCRATCH_USERS.get(out.scratch_op.kind.mnemonic, "op") if at_scratch else ""
        needs.append(f"scratch for layout conversions and reductions: {out.scratch_bytes:,} B" +
                     (f" (for this {what})" if at_scratch else ""))
    message = (f"kernel {st.spec.name} needs {out.shared_bytes:,} bytes of shared memory even without pipelining; "
               f"{st.target.arch} allows {limit:,} per block")
    if at_scratch:
        return SharedMemoryError.at(scratch_loc, message, needs=needs, hint=(
            f"give this {what} a smaller tile (the constexpr block sizes): it goes through a shared scratch buffer "
            "the size of its tile"))
    return SharedMemoryError(message, needs, **_at_kernel_def(st),
                             hint="use smaller tiles (the constexpr block sizes), or fewer or smaller operands in "
                                  "shared memory")


# What the ops that take the scratch buffer are called in a SharedMemoryError, by mnemonic.
_SCRATCH_USERS = {"reduce": "reduction", "cumsum": "cumsum", "convert_layout": "layout conversion",
                  "broadcast": "broadcast", "atomic": "atomic"}


def _at_kernel_def(st: Stages) -> dict:
    """Where an error about the whole kernel (a resource it needs) points: its ``def`` line."""
    parsed = st.spec.parsed
    node = parsed.tree
    return dict(filename=parsed.filename, lineno=node.lineno, col=node.col_offset + parsed.col_offset,
                source_line=parsed.source_line(node.lineno))


def _ptx_stage(st: Stages) -> None:
    _nvrtc(st, keep_ptx=True)


def _cubin_stage(st: Stages) -> None:
    if st.cubin is None:  # the ptx stage, when it ran, made the cubin too
        _nvrtc(st, keep_ptx=False)


def _nvrtc(st: Stages, keep_ptx: bool) -> None:
    from .backend_cuda.stages import ptxas_resources, register_shortage, run_nvrtc
    from .errors import BackendCompileError

    try:
        result = run_nvrtc(st.cuda, st.target, st.spec.symbol, keep_ptx, cache_key(st.spec, st.target))
    except BackendCompileError as error:
        shortage = register_shortage(error.log)
        if shortage is None:
            raise
        raise _register_error(st, *shortage) from None
    spills = ptxas_resources(result.log)[1]
    if spills and st.register_grant is not None:
        result = _regrant(st, result, keep_ptx)
    st.cubin, st.ptx, st.nvrtc_log = result.cubin, result.ptx, result.log
    registers, spills = ptxas_resources(result.log)
    if spills and spills >= SPILL_WARNING_BYTES:
        warn_user(f"tilejit: kernel {st.spec.name}: ptxas spilled {spills:,} bytes a thread to local memory "
                  f"({registers} registers each, {st.target.arch.name}): its threads hold more values than registers, "
                  "and every spilled one goes through memory; more warps (num_warps) or smaller tiles spread them "
                  "over more threads")


#: The spill (bytes a thread, as ptxas reports it) from which a compile warns: a few hundred bytes happen in tuned
#: kernels at little cost (the block-scaled loop's 304 before its register grant was lowered); kilobytes mean the
#: tiles do not fit the threads (128x256 float32 accumulators on 4 warps spill 25,776 bytes on sm_80).
SPILL_WARNING_BYTES = 1024


def _regrant(st: Stages, result, keep_ptx: bool):
    """ptxas spilled a warp-specialized kernel under the registers ``setmaxnreg`` grants its math threads by
    default (the most the producer warpgroup leaves). How much it spills there does not fall steadily with the
    grant: the 128x256 block-scaled loop spills 304 bytes a thread at 232 registers, 88 at 224, none at 216 and 24
    at 208 (NVRTC 13.0). So the kernel is compiled again under a few lower grants (``lower_grants``), stopping at
    the first that spills nothing; the compile that spilled least is kept, the default on a tie, and one whose wgmma
    ptxas serialized only where the default's were too. Sets ``st.cuda`` and ``st.register_grant`` to the kept
    compile's and returns its result."""
    from .backend_cuda.stages import emit_cuda, lower_grants, ptxas_resources, run_nvrtc, wgmma_serialized
    from .errors import BackendCompileError

    def cost(log: str) -> tuple[bool, int]:
        return wgmma_serialized(log), ptxas_resources(log)[1] or 0

    best = (cost(result.log), st.cuda, st.register_grant, result)
    for grant in lower_grants(st.register_grant):
        out = emit_cuda(st.fn, st.target, st.spec.symbol, register_grant=grant)
        try:
            tried = run_nvrtc(out.source, st.target, st.spec.symbol, keep_ptx, cache_key(st.spec, st.target))
        except BackendCompileError:  # (an instruction that needs more registers than the grant leaves)
            continue
        tried_cost = cost(tried.log)
        if tried_cost < best[0]:
            best = (tried_cost, out.source, grant, tried)
        if tried_cost == (False, 0):
            break
    _, st.cuda, st.register_grant, result = best
    return result


def _register_error(st: Stages, have: int, need: int):
    """ptxas found an instruction (a wide MMA's accumulators) needing ``need`` registers per thread where the
    block's thread count leaves ``have``: the config is too big for its warps, located at the kernel's ``def``."""
    from .errors import RegisterError

    threads = _threads(st)
    groups = st.fn.attrs.get("groups", 1)
    why = (f"{threads} threads per block ({groups} groups of {st.target.num_warps} warps for pingpong, and the "
           "producer warpgroup)" if groups > 1 else f"{threads} threads per block")
    return RegisterError(
        f"kernel {st.spec.name} needs {need} registers per thread for one instruction; {why} leave each thread "
        f"{have} (a block has 65,536)", **_at_kernel_def(st),
        hint="use smaller tiles (the constexpr block sizes) or fewer warps" + (", or drop pingpong" if groups > 1
                                                                               else ""))


_STAGE_FNS = {"ir": _ir_stage, "passes": _passes_stage, "cuda": _cuda_stage, "ptx": _ptx_stage,
              "cubin": _cubin_stage}


def run_stages(spec: Specialization, target: Target | None, stop_after: str = "cubin",
               resume: Stages | None = None) -> Stages:
    """Run the stages up to and including ``stop_after`` (continuing ``resume``, whose stages are done).

    The ``ptx`` stage runs when it is the last one asked for or when ``TILEJIT_KEEP_PTX`` is set; otherwise the
    ``cubin`` stage makes the cubin without keeping PTX.
    """
    if stop_after not in STAGES:
        raise UsageValueError(f"stop_after must be one of {', '.join(STAGES)}; got {stop_after!r}")
    if target is None and stop_after != "ir":
        raise UsageValueError(f"stages after 'ir' need a target (stop_after={stop_after!r})")
    st = resume if resume is not None else Stages(spec, target)
    st.target = target
    start = time.perf_counter()
    for name in STAGES[:STAGES.index(stop_after) + 1]:
        if name in st.done:
            continue
        if name == "ptx" and stop_after != "ptx" and not knobs.keep_ptx():
            continue
        _STAGE_FNS[name](st)
        st.done.append(name)
    st.seconds += time.perf_counter() - start
    return st


# -- compiled kernels and the cache ---------------------------------------------------------------------------


class Asm:
    """The artifacts of a compiled kernel: ``ir``, ``cuda``, ``ptx``, ``cubin`` and (when a disassembler is
    found) ``sass``; read from the cache entry on first access."""

    _FILES = {"ir": "kernel.ir", "cuda": "kernel.cu", "ptx": "kernel.ptx", "cubin": "kernel.cubin",
              "sass": "kernel.sass"}

    def __init__(self, entry: CacheEntry) -> None:
        self._entry = entry
        self._values: dict[str, Any] = {}

    def keys(self) -> list[str]:
        return ["ir", "cuda", "ptx", "cubin", "sass"]

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __getitem__(self, key: str) -> Any:
        if key not in self._FILES:
            raise KeyError(key)
        if key not in self._values:
            self._values[key] = self._read(key)
        if self._values[key] is None:
            raise KeyError(f"{key} is not available for this kernel")
        return self._values[key]

    def _read(self, key: str) -> Any:
        name = self._FILES[key]
        try:
            data = self._entry.read(name)
        except FileNotFoundError:  # not kept (PTX without TILEJIT_KEEP_PTX) or not made (SASS)
            data = None
        except OSError as e:  # checked when the entry loaded: changed on disk since
            raise CacheError(f"kernel {self._entry.meta.get('kernel')!r}: its cached {name} changed on disk after "
                             f"the entry was loaded ({e}); a new process compiles the entry again, or "
                             f"`tilejit cache clear` removes it") from None
        if key == "sass" and data is None:
            from .backend_cuda.sass import disassemble

            return disassemble(self._entry.read("kernel.cubin"))
        if data is None:
            return None
        return data if key == "cubin" else data.decode()


class CompiledKernel:
    """One specialization compiled for one arch: its cache entry and the facts a launch needs.

    ``launchers`` (device index -> launcher) is filled by the runtime when the kernel is first launched there.
    ``origin`` says where this process found it: "memory", "disk", "remote" (another machine compiled it) or
    "compiled" (here); ``from_disk`` is True unless it was compiled here.
    """

    def __init__(self, entry: CacheEntry, origin: str) -> None:
        self.entry = entry
        self.key = entry.key
        self.meta = entry.meta
        self.name = self.meta["kernel_symbol"]
        self.arch = self.meta["arch"]
        self.param_kinds = list(self.meta["param_kinds"])
        # the parameters the kernel writes (None for an entry that does not record them: the frontend tells)
        self.written: tuple[str, ...] | None = tuple(self.meta["written"]) if "written" in self.meta else None
        self.shared_bytes = int(self.meta["shared_bytes"])
        self.threads = int(self.meta["threads"])
        self.origin = origin
        self.from_disk = origin != "compiled"
        self.asm = Asm(entry)
        self.launchers: dict[int, Any] = {}

    def __repr__(self) -> str:
        return f"<CompiledKernel {self.meta.get('kernel')} {self.arch} key={self.key[:12]}>"


def check_meta(meta: dict) -> None:
    """Raise ValueError unless ``meta`` has every field a CompiledKernel and its launch read, each of its type
    (the cache discards an entry that fails, and it is compiled again)."""
    def need(name: str, ok) -> None:
        if name not in meta or not ok(meta[name]):
            raise ValueError(f"meta.json: bad or missing {name!r}: {meta.get(name)!r}")

    def count(v) -> bool:
        return type(v) is int and 0 <= v < 1 << 31

    need("kernel", lambda v: isinstance(v, str))
    need("kernel_symbol", lambda v: isinstance(v, str) and v.isidentifier())
    need("arch", lambda v: isinstance(v, str) and v.startswith("sm_"))
    need("threads", lambda v: count(v) and v > 0)
    need("shared_bytes", count)
    need("param_kinds", lambda v: isinstance(v, list) and all(isinstance(k, str) for k in v))
    need("tensor_maps", lambda v: v is None or (isinstance(v, list) and all(isinstance(m, dict) for m in v)))
    need("value_layout", lambda v: isinstance(v, dict) and all(
        isinstance(n, str) and isinstance(p, list) and len(p) == 2 and all(count(i) for i in p)
        for n, p in v.items()))
    if "written" in meta:
        need("written", lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v))
    for name in ("stream_k", "stream_k_slot_bytes", "stream_k_flags"):  # (absent from entries before stream-K)
        if name in meta:
            need(name, count)
    if meta.get("stream_k") and not (meta.get("stream_k_slot_bytes") and meta.get("stream_k_flags")):
        raise ValueError("meta.json: a stream-K kernel without its workspace size ('stream_k_slot_bytes', "
                         "'stream_k_flags')")


def _versions() -> dict[str, str]:
    from .backend_cuda.nvrtc import nvrtc_version

    major, minor = nvrtc_version()
    return {"tilejit": __version__, "nvrtc": f"{major}.{minor}", "python": platform.python_version()}


def _entry_files(st: Stages) -> tuple[dict, dict]:
    """The cache entry of a finished compile: its files and its meta.json."""
    from .backend_cuda.stages import ptxas_resources, wgmma_serialized

    spec, target = st.spec, st.target
    files = {"kernel.cubin": st.cubin, "kernel.cu": st.cuda, "kernel.ir": st.final_ir}
    if st.ptx:
        files["kernel.ptx"] = st.ptx
    registers, spills = ptxas_resources(st.nvrtc_log)
    meta = {
        "kernel": spec.name, "kernel_symbol": spec.symbol,
        "signature": spec.signature(), "arch": target.arch.name, "threads": _threads(st),
        "shared_bytes": st.shared_bytes, "param_kinds": st.param_kinds,
        "registers": registers, "spills": spills, "register_grant": st.register_grant,
        "wgmma_serialized": wgmma_serialized(st.nvrtc_log),
        "compile_seconds": round(st.seconds, 4), "versions": _versions(),
        "binary": "kernel.cubin", "tensor_maps": st.tensor_maps, "value_layout": spec.value_layout(),
        # every launch option as asked; then what the compile made of them: the producer warpgroup's threads
        # (0: no loop warp-specialized), the programs a persistent walk launches (0: one per grid cell), the math
        # groups (2 under pingpong), the clustered programs (1 where the kernel multicasts nothing) and
        # stream-K's program count (0: off). An option an arch does not take is asked but not made.
        **target.options.as_dict(),
        "producer_threads": int(st.fn.attrs.get("producer_threads", 0)),
        "walk_programs": int(st.fn.attrs.get("persistent") or 0),
        "groups": st.fn.attrs.get("groups", 1), "cluster": st.fn.attrs.get("cluster", 1),
        "stream_k": st.fn.attrs.get("stream_k", 0), "stream_k_slot_bytes": st.stream_k_slot_bytes,
        "stream_k_flags": st.stream_k_flags, "written": st.written,
    }
    if st.launch_choice is not None:  # the options the launch left to the model, as it chose them
        meta["launch_model"] = dict(st.launch_choice.values)
    return files, meta


def _threads(st: Stages) -> int:
    """Threads per block: the launch's warps (twice over for ``pingpong``), and a warp-specialized loop's producer
    warpgroup."""
    from .passes.warp_specialize import launched_threads

    return launched_threads(st.fn, st.target)


def compile(spec: Specialization, target: Target | None, *, stop_after: str | None = None,
            cache: KernelCache | None = None) -> "CompiledKernel | Stages":
    """Compile ``spec`` for ``target``.

    With ``stop_after`` (one of :data:`STAGES` but ``cubin``) the stages run up to it, bypassing the cache, and
    the :class:`Stages` come back. Otherwise the cubin comes from the cache (memory, disk, then the remote when
    one is configured) or is built and stored there (one process builds a key at a time), and a
    :class:`CompiledKernel` comes back, its ``origin`` saying which.
    """
    if stop_after is not None and stop_after != "cubin":
        return run_stages(spec, target, stop_after)
    if target is None:
        raise UsageValueError("a compile to a cubin needs a target")
    cache = cache or default_cache()
    key = cache_key(spec, target)
    if not knobs.always_compile():
        found = cache.lookup(key, check_meta)
        if found is not None:
            return CompiledKernel(*found)
    frontend = run_stages(spec, target, "ir")  # user errors (and needed extents) before any lock is taken

    def build() -> tuple[dict, dict]:
        return _entry_files(run_stages(spec, target, "cubin", resume=frontend))

    return CompiledKernel(*cache.get_or_compile(key, build, check_meta))
