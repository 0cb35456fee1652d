"""``@tilejit.kernel``: binding launch arguments, specializing, and dispatching to a backend.

A :class:`Kernel` turns ``kernel[grid](*args, **meta)`` into a specialization (dtypes, ranks, strides,
constexpr values, launch options), builds the IR of that specialization once, and runs it either through
the interpreter (``TILEJIT_INTERPRET=1``) or compiled on the GPU.
"""
from __future__ import annotations

import contextlib
import inspect
import struct
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .. import compiler
from .. import dtypes as D
from .. import knobs
from ..errors import (ArgumentError, ArgumentValueError, UsageTypeError, UsageValueError, call_user_function,
                      close_matches, docs_link, entry_point, user_call_site)
from .. import language as lang
from ..cache import default_cache
from ..compiler import CompiledKernel, Specialization
from ..frontend.source import (JITFunction, ParsedSource, check_signature, parse_function, referenced_globals,
                               referenced_helpers)
from ..frontend.spec import ArgSpec, ConstexprSpec, NeedsShape, ScalarSpec, TensorListSpec, TensorSpec
from ..target import LaunchOptions, Target
from ..version import __version__  # noqa: F401  (re-exported as tilejit.__version__)
from . import native
from .launch import launcher_for, pack_values, resolve_arch
from .tensor_lists import TABLES, capturing, is_tensor_list, tensor_list_spec

LAUNCH_OPTIONS = LaunchOptions().as_dict()  # every launch option, by name, with its default
# Roles of parameters on the launch fast path: folded at compile time, passed at run time, or a tensor
# whose extents are compile-time constants (its shape is then part of the call signature).
_CONSTEXPR, _RUNTIME, _SHAPED = "constexpr", "runtime", "shaped"
_BY_KEYWORD = "<by keyword>"  # a constexpr position after the positional arguments, in a fast-path signature
_PLAIN_PARAMETER = inspect.Parameter.POSITIONAL_OR_KEYWORD


@dataclass
class BoundCall:
    """One launch's arguments, matched to parameters, with the specialization they imply."""
    values: dict[str, Any]          # parameter name -> argument (constexprs included)
    spec: Specialization

    @property
    def specs(self) -> dict[str, ArgSpec]:
        return self.spec.specs

    @property
    def options(self) -> LaunchOptions:
        return self.spec.options


def _is_constexpr_annotation(annotation: Any) -> bool:
    if annotation is lang.constexpr or isinstance(annotation, lang.constexpr):
        return True
    return isinstance(annotation, str) and annotation.split(".")[-1] == "constexpr"


def _not_dense(name: str, t) -> ArgumentError | None:
    """The error for a tensor argument that is not a dense strided tensor (sparse, nested, MKL-DNN ...): such a
    tensor has no single data pointer and strides for a kernel to read. None for a dense one."""
    layout = t.layout
    if layout == _strided() and not t.is_nested:
        return None
    if t.is_nested:
        what, fix = "a nested tensor", f"{name}.to_padded_tensor(0) (or one launch per item)"
    elif "sparse" in str(layout):
        what, fix = f"a sparse tensor ({layout})", f"{name}.to_dense()"
    else:
        what, fix = f"a tensor of layout {layout}", f"{name}.to_dense()"
    return ArgumentError(f"argument '{name}' is {what}; kernels take dense strided tensors: pass {fix}")


def _strided():
    import torch

    return torch.strided


def _tensor_spec(name: str, t, shape_dims: Sequence[int]) -> TensorSpec:
    not_dense = _not_dense(name, t)
    if not_dense is not None:
        raise not_dense
    try:
        dtype = D.from_torch(t.dtype)
    except TypeError as e:
        raise ArgumentError(f"argument '{name}': {e}") from None
    if t.dim() == 0:
        raise ArgumentValueError(f"argument '{name}' is a 0-d tensor; pass a Python number or a 1-element 1-d tensor")
    unit = tuple(d for d in range(t.dim()) if t.stride(d) == 1)
    aligned = t.device.type == "meta" or t.data_ptr() % 16 == 0
    # A known extent past this tensor's rank is skipped: the frontend reports the rank mismatch, located.
    extents = tuple((d, int(t.shape[d])) for d in sorted(shape_dims) if d < t.dim())
    # TMA's rule for the tensor maps of bulk copies: every stride but the last dim's is a positive multiple of
    # 16 bytes, the last may be 1 (and a tensor map cannot describe an empty tensor). A unit stride elsewhere (an
    # (M, 1) tensor has strides (1, 1)) is not one: cuTensorMapEncodeTiled refuses it.
    last = t.dim() - 1
    strides16 = t.numel() > 0 and all((d == last and st == 1) or (st > 0 and st * t.element_size() % 16 == 0)
                                      for d, st in enumerate(t.stride()))
    return TensorSpec(dtype, t.dim(), unit, aligned, strides16=strides16, shape_constants=extents)


def _scalar_spec(name: str, v: Any) -> ScalarSpec:
    if isinstance(v, bool):
        return ScalarSpec(D.bool_)
    if isinstance(v, int):
        if not -2**63 <= v < 2**63:
            raise ArgumentValueError(f"argument '{name}' = {v} does not fit in 64 bits")
        return ScalarSpec(D.int64, v == 1, v % 16 == 0)
    if isinstance(v, float):
        return ScalarSpec(D.float32)
    raise ArgumentError(f"argument '{name}' has type {type(v).__name__}; kernels take torch tensors, "
                         f"ints, floats and bools (mark compile-time parameters with T.constexpr){_numpy_hint(v)}")


def _numpy_hint(v: Any) -> str:
    """What to pass instead of a NumPy array or scalar ("" for other values)."""
    if type(v).__module__ != "numpy":
        return ""
    if hasattr(v, "shape") and getattr(v, "ndim", 0) > 0:
        return ("; a NumPy array is not a tensor: pass torch.from_numpy(a) (on the GPU: torch.from_numpy(a).cuda(); "
                "under TILEJIT_INTERPRET=1 the CPU tensor itself)")
    return "; a NumPy scalar is not a Python number: pass v.item()"


class Kernel:
    """What ``@tilejit.kernel`` returns. ``kernel[grid](*args, **meta)`` launches it."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self.signature = inspect.signature(fn)
        self.arg_names = list(self.signature.parameters)
        self.constexpr_names = {n for n, p in self.signature.parameters.items()
                                if _is_constexpr_annotation(p.annotation)}
        for name in self.arg_names:
            if name in LaunchOptions.reserved_names():
                raise UsageTypeError(f"kernel {self.__name__}: parameter '{name}' clashes with a launch option")
        # The launch options of this kernel: a parameter named like an option added after kernels were written
        # with such parameters (``split_k`` ..., not a reserved one) takes that keyword for itself.
        self._options = {k: v for k, v in LAUNCH_OPTIONS.items() if k not in self.arg_names}
        self._parsed: ParsedSource | None = None
        self._constructs_checked = False
        self._source_hash: str | None = None
        self._shape_dims: dict[str, set[int]] = {}   # tensor extents the kernel needs at compile time
        self._stored_shape_dims: dict[str, set[int]] | None = None  # as last read from / written to the cache
        self._plain_signature = all(p.kind is _PLAIN_PARAMETER for p in self.signature.parameters.values())
        self._ir_cache: dict[str, Any] = {}
        self._lock = threading.RLock()
        self._compiled: dict[str, Any] = {}          # key -> CompiledKernel
        self._fast: dict[tuple, Any] = {}            # cheap call signature -> Launcher
        self._dispatcher: Any = None                  # the compiled launcher's table, after the first GPU launch
        self._native_off = False                      # TILEJIT_NATIVE_LAUNCH=0 at this kernel's first GPU launch
        runtime = [i for i, n in enumerate(self.arg_names) if n not in self.constexpr_names]
        self._min_positional = runtime[-1] + 1 if runtime else 0
        self._fast_kwargs = set(self.constexpr_names) | set(self._options)
        self._runtime_index = {n: i for i, n in enumerate(self.arg_names) if n not in self.constexpr_names}
        self._runtime_defaults = {n: p.default for n, p in self.signature.parameters.items()
                                  if n not in self.constexpr_names and p.default is not inspect.Parameter.empty}
        self._roles = [_CONSTEXPR if n in self.constexpr_names else _RUNTIME for n in self.arg_names]
        self._defaults = {**self._options, **{n: p.default for n, p in self.signature.parameters.items()
                                               if p.default is not inspect.Parameter.empty}}
        self._specializations: dict[str, Any] = {}   # for the specialization-count warning
        self._quiet = 0                              # > 0 while an autotuner compiles its own configs

    # -- source --------------------------------------------------------------------------------
    @property
    def parsed(self) -> ParsedSource:
        """The kernel's source and AST, its parameter list checked (a located error for ``*args`` ...)."""
        if self._parsed is None:
            parsed = parse_function(self.fn)
            check_signature(parsed)
            self._parsed = parsed
        return self._parsed

    def source_hash(self) -> str:
        """sha256 of the kernel's source, every helper it calls, the tilejit version and the compiler's own
        source (``compiler_fingerprint``)."""
        if self._source_hash is None:
            helpers = [(h.__name__, h.parsed.text) for h in referenced_helpers(self.fn)]
            self._source_hash = compiler.source_hash(self.parsed.text, helpers)
        return self._source_hash

    def _global_constants(self) -> dict[str, Any]:
        """Compile-time globals the kernel reads: part of the key so changing one recompiles."""
        out = {}
        fns = [self.fn] + [h.fn for h in referenced_helpers(self.fn)]
        for fn in fns:
            for name, obj in referenced_globals(fn).items():
                if isinstance(obj, lang.constexpr):
                    obj = obj.value
                if isinstance(obj, (bool, int, float, str)):
                    out[f"{fn.__name__}.{name}"] = obj
                elif isinstance(obj, D.DType):
                    out[f"{fn.__name__}.{name}"] = obj.name
        return out

    # -- binding -----------------------------------------------------------------------------
    def _launch_options_of(self, call: BoundCall) -> dict[str, Any]:
        """The launch options of ``call`` that this kernel takes (those no parameter shadows), by name: what a grid
        callable sees beside the arguments, as on the fast path."""
        return {name: getattr(call.options, name) for name in self._options}

    def _signature_text(self) -> str:
        return f"{self.__name__}{self.signature}"

    def bind(self, args: Sequence[Any], kwargs: dict[str, Any]) -> BoundCall:
        if not self._plain_signature:
            self.parsed  # raises the located error for *args, **kwargs ..., before binding
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in self._options}
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            known = [*self.arg_names, *self._options]
            unknown = [k for k in kwargs if k not in self.arg_names]
            close = "".join(f" ('{k}' is not a parameter: did you mean {' or '.join(map(repr, matches))}?)"
                            for k in unknown if (matches := close_matches(k, known)))
            raise ArgumentError(f"{e}{close} (kernel signature: {self._signature_text()}; launch options: "
                                f"{', '.join(self._options)})") from None
        bound.apply_defaults()
        values = dict(bound.arguments)
        try:
            opts = LaunchOptions(**{**LAUNCH_OPTIONS, **options})
        except ValueError as e:
            raise ArgumentValueError(f"kernel {self.__name__}: {e}") from None
        specs: dict[str, ArgSpec] = {}
        for name, value in values.items():
            if name in self.constexpr_names:
                if isinstance(value, lang.constexpr):
                    value = values[name] = value.value
                value = values[name] = _python_value(value)
                if _is_torch_dtype(value):  # torch.float16 means T.float16 (one kernel for both)
                    try:
                        value = values[name] = D.from_torch(value)
                    except TypeError:
                        supported = ", ".join(f"T.{d.name}" for d in D.ALL_DTYPES)
                        raise ArgumentError(f"constexpr argument '{name}': {value} has no tilejit dtype (there are "
                                            f"{supported})") from None
                if not isinstance(value, (bool, int, float, str, D.DType, type(None), tuple)):
                    raise ArgumentError(f"constexpr argument '{name}' must be an int, float, bool, str, dtype or "
                                        f"tuple, got {type(value).__name__}{_constexpr_hint(name, value)}")
                specs[name] = ConstexprSpec(value)
            elif _is_tensor(value):
                specs[name] = _tensor_spec(name, value, self._shape_dims.get(name, ()))
            elif is_tensor_list(value):
                for i, item in enumerate(value):
                    not_dense = _not_dense(f"{name}[{i}]", item) if _is_tensor(item) else None
                    if not_dense is not None:
                        raise not_dense
                specs[name] = tensor_list_spec(name, value, _torch_tensor())
            else:
                value = values[name] = _python_value(value)
                specs[name] = _scalar_spec(name, value)
        spec = Specialization(self.__name__, self.parsed, self.source_hash(),
                              tuple(sorted(self._global_constants().items())), tuple(specs.items()), opts,
                              # (an option a parameter shadows is not this kernel's: fixed, as if given)
                              given=frozenset(options).union(set(LAUNCH_OPTIONS).difference(self._options)))
        return BoundCall(values, spec)

    def key_material(self, call: BoundCall, target: str) -> dict[str, Any]:
        return call.spec.key_material(target)

    # -- IR ----------------------------------------------------------------------------------
    def build_ir(self, call: BoundCall):
        """The frontend IR of this call's specialization (the compiler's ``ir`` stage, kept per kernel); adds
        compile-time extents on demand."""
        while True:
            key = call.spec.key("ir")
            with self._lock:
                cached = self._ir_cache.get(key)
            if cached is not None:
                return cached
            try:
                fn = compiler.compile(call.spec, None, stop_after="ir").fn
            except NeedsShape as need:
                self._add_needed_extent(need, call)
                continue
            with self._lock:
                self._ir_cache[key] = fn
            return fn

    def _add_needed_extent(self, need: NeedsShape, call: BoundCall) -> None:
        if need.dim in self._shape_dims.get(need.param, ()):
            raise need
        self._need_extent(need.param, need.dim)
        self.respecialize_extents(call)

    def _need_extent(self, param: str, dim: int) -> None:
        """From now on, extent ``dim`` of tensor ``param`` is a compile-time constant (part of the key)."""
        self._roles[self.arg_names.index(param)] = _SHAPED
        self._shape_dims.setdefault(param, set()).add(dim)

    def respecialize_extents(self, call: BoundCall) -> None:
        """Bring the tensor specs of ``call`` up to date with the extents known to be compile-time constants."""
        for name, dims in list(self._shape_dims.items()):  # another thread may be adding one
            dims = set(dims)
            spec = call.specs.get(name)
            if isinstance(spec, TensorSpec) and {d for d, _ in spec.shape_constants} != dims:
                call.spec = call.spec.with_arg(name, _tensor_spec(name, call.values[name], dims))

    def use_stored_extents(self, stored: dict[str, list[int]]) -> None:
        """Adopt the compile-time extents an earlier process recorded for this source (the cache's
        ``read_extents``), so a disk hit needs no frontend run to learn them. Only a hint: a key that includes
        the extents can only match an entry compiled with them, so an out-of-date record costs a miss, never a
        wrong kernel."""
        adopted: dict[str, set[int]] = {}
        for param, dims in stored.items():
            if param in self.arg_names and param not in self.constexpr_names:
                for dim in dims:
                    if isinstance(dim, int) and dim >= 0:
                        self._need_extent(param, dim)
                        adopted.setdefault(param, set()).add(dim)
        self._stored_shape_dims = adopted

    @entry_point
    def ir(self, *args: Any, **kwargs: Any) -> str:
        """The printed IR of the specialization these arguments select (tensors may be on ``meta``)."""
        from ..ir import print_function

        return print_function(self.build_ir(self.bind(args, kwargs)))

    # -- compiling -----------------------------------------------------------------------------
    def compile_call(self, call: BoundCall, arch: Any = None, device_index: int | None = None,
                     stop_after: str | None = None):
        """Compile ``call``'s specialization (through the memory and disk caches) for ``arch``, else
        ``TILEJIT_ARCH``, else the GPU's arch; with ``stop_after`` the compiler's stages up to that one.

        Which tensor extents are compile-time constants (part of the key) is recorded per kernel source in the
        cache, so a fresh process computes the key of a disk hit from the arguments alone, without the frontend.
        On a miss the frontend runs first (user errors surface before any lock); an extent it finds it needs
        is added to the specialization and the compile starts again.
        """
        with user_call_site():  # its warnings name the user's launch or compile line, from any thread
            return self._compile_call(call, arch, device_index, stop_after)

    def _compile_call(self, call: BoundCall, arch: Any, device_index: int | None, stop_after: str | None):
        options = call.options
        target = Target(resolve_arch(arch, device_index), options)
        if options.walks_grid or target.may_walk_grid(call.spec.given):  # one program per SM
            target = Target(target.arch, options, sm_count=_sm_count(device_index))
        if stop_after is not None and stop_after != "cubin":
            self.build_ir(call)  # the extents the frontend needs, found as a real compile would
            return compiler.compile(call.spec, target, stop_after=stop_after)
        cache = default_cache()
        if self._stored_shape_dims is None:
            self.use_stored_extents(cache.read_extents(self.source_hash()))
        while True:
            self.respecialize_extents(call)
            key = compiler.cache_key(call.spec, target)
            compiled = self._compiled.get(key)
            if compiled is not None:
                return compiled
            try:
                compiled = compiler.compile(call.spec, target, cache=cache)
            except NeedsShape as need:
                self._add_needed_extent(need, call)
                continue
            break
        if self._shape_dims != self._stored_shape_dims:
            cache.write_extents(self.source_hash(), self.__name__, self._shape_dims)
            self._stored_shape_dims = {p: set(d) for p, d in self._shape_dims.items()}
        self._compiled[key] = compiled
        self._note_specialization(call)
        return compiled

    # -- launching -----------------------------------------------------------------------------
    def __getitem__(self, grid: Any) -> Callable[..., None]:
        dispatcher = self._dispatcher
        if dispatcher is not None:
            return dispatcher.bind(grid)  # the compiled launcher (runtime/_launch.c)

        @entry_point
        def launch(*args: Any, **kwargs: Any) -> None:
            self._python_launch(grid, args, kwargs)
        return launch

    def _python_launch(self, grid: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """The launch path in Python: the reference for ``_launch.c`` and its fallback for calls it cannot sign."""
        fast = self._fast_args(args, kwargs)
        if fast is not None:
            # Fast entries hold GPU launchers only; CPU tensors (interpreter) never match one.
            launcher = self._fast.get(fast[0])
            if launcher is not None:
                grid3 = self._fast_grid(grid, args, kwargs)
                if grid3 is not None:
                    values = fast[1]
                    if _LIST in fast[0]:
                        values = _with_tables(values, fast[2])
                    launcher(grid3, _raw_stream(fast[2]), values)
                    if self._dispatcher is None and not self._native_off and native.ready() is not None:
                        # the compiled launcher finished building in the background
                        self._dispatcher = self._make_dispatcher()
                    return
        self.run(grid, args, kwargs, fast)

    # -- the fast path: a dict hit on a cheap signature, then one cuLaunchKernel -------------------
    def _fast_args(self, args: Sequence[Any], kwargs: dict[str, Any]):
        """(signature, packed parameter values, device index) of a call, or None when it needs the slow path.

        The signature holds everything the specialization key depends on (a superset: full strides
        rather than the unit-stride pattern), except global constants, read when a specialization is
        first compiled. Run-time parameters may come by position, by keyword or from their defaults;
        values follow parameter order either way. Tensors on different devices take the slow path, which
        rejects them.
        """
        given = len(args)
        if given < self._min_positional:
            args = self._fill_runtime(args, kwargs)
            if args is None:
                return None
        sig: list[Any] = [given]
        values: list[Any] = []
        device = None
        tensor_type = _torch_tensor()
        for role, a in zip(self._roles, args):
            if role is _CONSTEXPR:
                cls = a.__class__  # by type and value: C=2, C=2.0 and C=True are three kernels
                sig.append((cls, a) if cls is int or cls is bool or cls is str else _exact_constant(a))
            elif isinstance(a, tensor_type):
                try:
                    strides = a.stride()
                    ptr = a.data_ptr()
                except RuntimeError:  # no strides or no storage (sparse, nested): the slow path says what it takes
                    return None
                where = a.get_device()
                if device is None:
                    device = where
                elif where != device:
                    return None
                # empty: no tensor map; requires_grad: the slow path refuses an output that requires grad
                sig += (a.dtype, strides, ptr & 15 == 0, 0 in a.shape, a.requires_grad)
                if role is _SHAPED:
                    sig.append(a.shape)
                values.append(ptr)
                values += a.shape
                values += strides
            elif type(a) is int:
                sig.append(a == 1 or (a & 15 == 0 and 16))
                values.append(a)
            elif type(a) is float:
                sig.append(1.5)
                values.append(a)
            elif type(a) is list or type(a) is tuple:  # a tensor list: its table's address is found on a hit
                signed = _list_signature(a, tensor_type) if a and role is not _SHAPED else None
                if signed is None:
                    return None
                where = signed[-1]
                if device is None:
                    device = where
                elif where != device:
                    return None
                sig.append(_LIST)
                sig.append(signed)
                values.append(a)
                values.append(len(a))
            elif type(a) is bool:
                sig.append(a is True and 2 or 3)
                values.append(int(a))
            else:
                return None
        if device is None:
            return None
        sig.append(device)
        if kwargs:
            runtime_index = self._runtime_index
            for k, v in kwargs.items():
                at = runtime_index.get(k)
                if at is not None:
                    if at < given:
                        return None  # also given by position: the slow path raises
                    continue  # signed in its place above
                if k not in self._fast_kwargs:
                    return None
                sig.append(k)
                cls = v.__class__
                sig.append((cls, v) if cls is int or cls is bool or cls is str else _exact_constant(v))
        key = tuple(sig)
        try:
            hash(key)
        except TypeError:  # an unhashable constexpr (a list): the slow path explains what it takes
            return None
        return key, values, device

    def _fill_runtime(self, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any] | None:
        """``args`` extended to the last run-time parameter with keyword arguments and defaults (constexpr
        positions hold a marker: their values are signed with the keywords); None when one is missing."""
        filled = list(args)
        for name, role in zip(self.arg_names[len(args):self._min_positional], self._roles[len(args):]):
            if role is _CONSTEXPR:
                filled.append(_BY_KEYWORD)
            elif name in kwargs:
                filled.append(kwargs[name])
            elif name in self._runtime_defaults:
                filled.append(self._runtime_defaults[name])
            else:
                return None
        return filled

    def _fast_grid(self, grid: Any, args: Sequence[Any], kwargs: dict[str, Any]):
        if callable(grid):
            grid = call_grid_function(grid, {**self._defaults, **dict(zip(self.arg_names, args)), **kwargs})
        if type(grid) is not tuple:
            return None
        n = len(grid)
        if n == 3 and type(grid[0]) is int and type(grid[1]) is int and type(grid[2]) is int \
                and grid[0] > 0 and grid[1] > 0 and grid[2] > 0:
            return grid
        if n < 3 and all(type(g) is int and g > 0 for g in grid):
            if n == 2:
                return (grid[0], grid[1], 1)
            if n == 1:
                return (grid[0], 1, 1)
        return None

    @entry_point
    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise launch_without_grid(self.__name__)

    def run(self, grid: Any, args: Sequence[Any], kwargs: dict[str, Any], fast: Any = None):
        """The slow path: bind, specialize, compile if needed, launch, and remember the launcher for the
        fast path under the call's cheap signature. Returns the launcher (None in the interpreter, and for a call
        the fast paths must not remember: see ``_check_outputs``)."""
        call = self.bind(args, dict(kwargs))
        grid3 = resolve_grid(grid, {**call.values, **self._launch_options_of(call)}, self.__name__)
        tensors = {n: v for n, v in call.values.items() if _is_tensor(v)}
        # a tensor list's items share a device (checked when binding): its first stands for it
        tensors.update({f"{n}[0]": v[0] for n, v in call.values.items() if isinstance(call.specs[n], TensorListSpec)})
        devices = {str(t.device) for t in tensors.values()}
        if len(devices) > 1:
            listing = ", ".join(f"{n} on {t.device}" for n, t in tensors.items())
            raise ArgumentValueError(f"kernel {self.__name__}: tensor arguments are on different devices ({listing})")
        if knobs.interpret():
            from ..interpreter import interpret

            interpret(self.build_ir(call), grid3, call.values)
            return None
        for n, t in tensors.items():
            if t.device.type != "cuda":
                raise ArgumentValueError(f"kernel {self.__name__}: argument '{n}' is on {t.device}; move it to a CUDA "
                                      "device, or set TILEJIT_INTERPRET=1 to run on CPU tensors")
        device_index = next(iter(tensors.values())).device.index if tensors else None
        if device_index is None:
            import torch

            device_index = torch.cuda.current_device()
        compiled = self.compile_call(call, None, device_index)
        remember = self._check_outputs(call, compiled)
        launcher = launcher_for(compiled, device_index)
        launcher(grid3, _raw_stream(device_index), pack_values(call))
        if not remember:
            return None
        if fast is not None:
            fast = self._fast_args(args, kwargs)  # extents discovered while compiling change the signature
            if fast is not None:
                self._fast[fast[0]] = launcher
        if self._dispatcher is None and tensors and not self._native_off:
            self._dispatcher = self._make_dispatcher()
        return launcher

    def _check_outputs(self, call: BoundCall, compiled: Any) -> bool:
        """Raise ArgumentValueError naming an output (a tensor the kernel writes) whose elements share memory or
        that requires grad while autograd records, as the interpreter refuses it. Returns whether the fast paths
        may remember this call: not when an output has a stride-0 dimension or requires grad, since their
        signatures hold neither extents nor autograd's mode, so such calls come back here every time."""
        from ..interpreter import output_problems

        written = compiled.written if compiled.written is not None else tuple(self.build_ir(call).writers())
        for _, label, problem in output_problems(written, call.values):
            raise ArgumentValueError(f"kernel {self.__name__}: output '{label}' {problem}")
        for name in written:
            value = call.values.get(name)
            for t in (value,) if _is_tensor(value) else value or ():
                if t.requires_grad or 0 in t.stride():
                    return False
        return True

    def _make_dispatcher(self):
        """The compiled launcher's per-kernel table, or None while it is being built (it starts building at the
        first GPU launch, so importing tilejit or running the interpreter never builds it) or when it cannot be."""
        if not knobs.native_launch():
            self._native_off = True
            return None
        module = native.load_async()
        if module is None:
            return None
        import torch

        return module.Dispatcher(
            roles=self._roles, role_constexpr=_CONSTEXPR, role_shaped=_SHAPED, fast_kwargs=self._fast_kwargs,
            tensor_type=torch.Tensor, stream_getter=torch._C._cuda_getCurrentRawStream, slow=self._native_slow,
            fallback=entry_point(self._python_launch), grid_fn=self._fast_grid, names=tuple(self.arg_names),
            runtime_index=self._runtime_index, defaults=self._runtime_defaults)

    @entry_point  # called by the compiled launcher: the outermost frame of tilejit's on a miss
    def _native_slow(self, grid: Any, args: Sequence[Any], kwargs: dict[str, Any]):
        """A miss of the compiled launcher: launch through the slow path and hand back what to remember."""
        launcher = self.run(grid, args, kwargs)
        return None if launcher is None else launcher.native_entry()

    @entry_point
    def compile(self, *args: Any, arch: str | None = None, stop_after: str | None = None, **kwargs: Any):
        """Compile (or fetch from the cache) without launching; works with no GPU given ``arch``.

        Returns the :class:`~tilejit.compiler.CompiledKernel`; with ``stop_after`` ("ir", "passes", "cuda" or
        "ptx") the compiler stops after that stage and returns its :class:`~tilejit.compiler.Stages`
        (``.ir``, ``.final_ir``, ``.cuda``, ``.ptx``), bypassing the cache."""
        return self.compile_call(self.bind(args, dict(kwargs)), arch, stop_after=stop_after)

    @contextlib.contextmanager
    def tuning(self):
        """Within this block, new specializations do not count toward the respecialization warning: an
        autotuner compiling its own configs is not the user's kernel being respecialized by accident."""
        with self._lock:
            self._quiet += 1
        try:
            yield self
        finally:
            with self._lock:
                self._quiet -= 1

    def _note_specialization(self, call: BoundCall) -> None:
        """Warn once when a kernel keeps being respecialized, naming the arguments or launch options that vary."""
        import logging

        if self._quiet:
            return
        described = {**{name: repr(spec) for name, spec in call.specs.items()}, **self._launch_options_of(call)}
        self._specializations[call.spec.key("ir")] = described
        if len(self._specializations) != 8:
            return
        seen: dict[str, set] = {}
        for values in self._specializations.values():
            for name, value in values.items():
                seen.setdefault(name, set()).add(value)
        varying = [n for n, s in seen.items() if len(s) > 1] or ["the compile-time globals it reads"]
        if set(varying) <= set(LAUNCH_OPTIONS):
            hint = "keep to a few values, or let @tilejit.autotune choose them"
        else:
            hint = "pass values that vary as plain ints instead of T.constexpr, or round them"
        logging.getLogger("tilejit").warning(
            "kernel %s has been specialized 8 times; %s keep%s changing (each value compiles a new kernel; %s)",
            self.__name__, ", ".join(varying), "s" if len(varying) == 1 else "", hint)

    def __repr__(self) -> str:
        return f"<tilejit.kernel {self.__name__}>"


_LIST = object()  # marks a tensor list in a fast-path signature


def _exact_constant(value: Any) -> tuple:
    """A compile-time value as a signature item that equals another only for the same types and bits: floats by
    their bit pattern (``0.0`` and ``-0.0`` are two kernels, a NaN matches itself), tuples item by item with each
    item's type (``(2,)``, ``(2.0,)`` and ``(True,)`` are three), as the cache key and the compiled launcher see them."""
    cls = value.__class__
    if cls is float:
        return (float, _FLOAT_BITS.pack(value))
    if cls is tuple:
        return (tuple, tuple(_exact_constant(item) for item in value))
    if cls.__module__ == "numpy":  # a NumPy scalar (the slow path takes it as its Python value): by that value's bits
        plain = _python_value(value)
        if plain is not value:
            return (cls, _exact_constant(plain))
    return (cls, value)


def _python_value(value: Any) -> Any:
    """The Python bool, int or float a NumPy scalar (or 0-d array) of that kind holds, and the items of a tuple
    likewise; other values as they are. A launch takes ``np.int64(16)`` as it takes ``16``: the same
    specialization, the same kernel."""
    cls = value.__class__
    if cls is tuple:
        items = tuple(_python_value(item) for item in value)
        return items if any(a is not b for a, b in zip(items, value)) else value
    if cls.__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        item = value.item()
        if isinstance(item, (bool, int, float)):
            return item
    return value


_FLOAT_BITS = struct.Struct("<d")


def _list_signature(items: Sequence[Any], tensor_type: type):
    """What the specialization of a tensor list depends on (dtype, rank, the dims unit-stride in every item) and
    what the slow path checks of a written one (an item with a stride-0 dimension, one that requires grad), followed
    by the items' device; None when the list is not one the fast path can sign (not all tensors of
    one dtype, rank and device: the slow path says what is wrong)."""
    first = items[0]
    if not isinstance(first, tensor_type):
        return None
    dtype, device, rank = first.dtype, first.get_device(), first.dim()
    if rank == 0:
        return None
    unit = (1 << rank) - 1  # bit d: stride d is 1 in every item
    shared = grad = False
    for t in items:
        if not isinstance(t, tensor_type) or t.dtype is not dtype or t.get_device() != device:
            return None
        try:
            st = t.stride()
        except RuntimeError:  # no strides (a sparse CSR tensor ...): the slow path says what it takes
            return None
        if len(st) != rank:
            return None
        for d, x in enumerate(st):
            if x != 1:
                unit &= ~(1 << d)
                shared |= x == 0
        grad |= t.requires_grad
    # an item with a stride-0 dimension or one that requires grad: the slow path checks a written list's items
    # (and never remembers a call writing such items), so these bits keep them from matching a remembered call
    return dtype, rank, unit, shared, grad, device


def _with_tables(values: list[Any], device: int) -> list[Any]:
    """``values`` with each tensor list replaced by its device table's address."""
    now = capturing()
    return [TABLES.address(v, device, now) if type(v) is list or type(v) is tuple else v for v in values]


def _is_torch_dtype(value: Any) -> bool:
    return type(value).__name__ == "dtype" and type(value).__module__ == "torch"


def _constexpr_hint(name: str, value: Any) -> str:
    """What to pass instead of ``value`` for the constexpr ``name``."""
    if _is_tensor(value):
        what = f"{name}=t.item()" if value.numel() == 1 else "a Python number"
        return (f": a constexpr is a compile-time value (each value compiles a kernel): pass {what}, or drop "
                f"T.constexpr from '{name}' to pass the tensor at run time ({docs_link('constexprs')})")
    if isinstance(value, list):
        return f": pass a tuple, (a, b) instead of [a, b] ({docs_link('constexprs')})"
    return f" ({docs_link('constexprs')})"


def _torch_tensor():
    import torch

    return torch.Tensor


def _is_tensor(v: Any) -> bool:
    return isinstance(v, _torch_tensor())


def _raw_stream(device: int) -> int:
    """torch's current stream on ``device`` as a CUstream int, without building a Stream object."""
    global _raw_stream
    import torch

    _raw_stream = torch._C._cuda_getCurrentRawStream  # bind once: later calls skip this frame
    return _raw_stream(device)


GRID_FUNCTION_TAKES = ("a grid function takes one argument, the dict of the launch's arguments and constexprs by name: "
                       "lambda meta: (tilejit.cdiv(N, meta['BLOCK']),)")


def call_grid_function(grid: Callable[[dict[str, Any]], Any], meta: dict[str, Any]) -> Any:
    """The grid a user's grid function returns for ``meta``; its mistakes are the user's."""
    return call_user_function(grid, "the grid function", GRID_FUNCTION_TAKES, meta)


def resolve_grid(grid: Any, meta: dict[str, Any], name: str) -> tuple[int, int, int]:
    if callable(grid):
        grid = call_grid_function(grid, meta)
    if isinstance(grid, int):
        grid = (grid,)
    if not isinstance(grid, (tuple, list)) or not 1 <= len(grid) <= 3:
        raise ArgumentValueError(f"kernel {name}: grid must be a tuple of 1 to 3 ints (or a callable returning one), "
                              f"got {grid!r}")
    dims = []
    for i, g in enumerate(grid):
        if hasattr(g, "item") and not isinstance(g, int):  # a 1-element tensor or NumPy scalar stands for its value
            g = _grid_item(g, i, name)
        if isinstance(g, bool) or not isinstance(g, int):
            hint = (" (n / BLOCK is a float: use tilejit.cdiv(n, BLOCK) to cover n, or n // BLOCK)"
                    if isinstance(g, float) else "")
            raise ArgumentError(f"kernel {name}: grid entries must be ints, got {g!r}{hint}")
        if g <= 0:
            raise ArgumentValueError(f"kernel {name}: grid {tuple(grid)} has a dimension <= 0; nothing would run")
        dims.append(g)
    if dims[0] >= 2**31 or any(d >= 65536 for d in dims[1:]):
        raise ArgumentValueError(f"kernel {name}: grid {tuple(dims)} exceeds CUDA's limits (2^31-1, 65535, 65535)")
    while len(dims) < 3:
        dims.append(1)
    return tuple(dims)


def _grid_item(g: Any, index: int, name: str) -> Any:
    """The value of grid entry ``index`` that is a tensor or NumPy value (``.item()``): one element only."""
    size = getattr(g, "numel", None)
    size = size() if callable(size) else getattr(g, "size", 1)
    if size != 1:
        shape = tuple(getattr(g, "shape", ()))
        raise ArgumentError(f"kernel {name}: grid entry {index} is a {type(g).__name__} of shape {shape} ({size} "
                            "elements); a grid entry is one int, the number of programs along its axis: pass a tuple "
                            "of 1 to 3 ints, e.g. (tilejit.cdiv(N, BLOCK),)")
    return g.item()


def launch_without_grid(name: str) -> ArgumentError:
    """The error for a kernel (or a wrapper of one: autotune, heuristics) called without a grid."""
    return ArgumentError(f"launch a kernel with a grid: {name}[grid](...), e.g. {name}[(tilejit.cdiv(M, BM),)](...)")


def kernel(fn: Callable | None = None) -> Kernel:
    """Decorator: compile ``fn`` as a tilejit kernel, launched with ``kernel[grid](*args, **meta)``.

    The language is described in docs/language.md (``tilejit.docs()`` gives the path of the copy installed with
    the package) and in the docstrings of ``tilejit.language``.
    """
    if fn is None:
        return kernel  # type: ignore[return-value]
    if not inspect.isfunction(fn):
        raise UsageTypeError(f"@tilejit.kernel takes a Python function (def name(...): ...), got {_describe(fn)}"
                             f"{_decorator_order_hint(fn)}")
    return Kernel(fn)


def _describe(obj: Any) -> str:
    return repr(obj) if hasattr(obj, "arg_names") else f"{type(obj).__name__} {obj!r}"


def _decorator_order_hint(obj: Any) -> str:
    """How to stack tilejit's decorators when ``obj`` (given to ``@tilejit.kernel``) is already a kernel or a
    wrapper of one ("" otherwise)."""
    if isinstance(obj, Kernel):
        return ": it is already a kernel (apply @tilejit.kernel once)"
    if hasattr(obj, "arg_names") and hasattr(obj, "kernel"):
        return ("; @tilejit.kernel goes directly on the function, below @tilejit.autotune and @tilejit.heuristics:"
                "\n    @tilejit.autotune(...)\n    @tilejit.kernel\n    def name(...): ...")
    return ""


def func(fn: Callable) -> JITFunction:
    """Decorator: a helper that kernels may call; it is inlined where it is called."""
    return JITFunction(fn)


def _sm_count(device_index: int | None) -> int:
    """The SM count of the GPU a persistent kernel is compiled for; 0 without one (the compiler's default then)."""
    import torch

    if not torch.cuda.is_available():
        return 0
    index = torch.cuda.current_device() if device_index is None else device_index
    return int(torch.cuda.get_device_properties(index).multi_processor_count)
