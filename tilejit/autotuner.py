"""``@tilejit.autotune``: pick the fastest of several launch configs per problem key, and remember it on disk.

Stacked on ``@tilejit.kernel``. On the first launch for a new key (the values of the ``key`` arguments plus the
dtypes of the tensor arguments) the autotuner prunes the config list, compiles the surviving configs in
parallel, times them one by one with ``tilejit.testing.do_bench`` and launches the fastest. The choice is kept in
memory and in ``<cache dir>/autotune/<kernel>-<source hash>.json``, with the time of every config, so:

- a second process reuses the stored choice without compiling or timing anything;
- a config is known by its content (constexpr values, num_warps, num_stages), not its position in the list, so
  adding configs times only the new ones and compares them with the stored times of the old ones;
- editing the kernel (or any of tilejit's own source) changes the source hash and therefore the file.

A config that fails to compile or launch is skipped, its reason logged on the "tilejit.autotune" logger and
stored, so later processes do not try it again (unless the record then times none of the configs being tuned:
they are all tried again); when every config fails an ``AutotuneError`` lists each with its error, and nothing is
stored. A
config whose kernel spills registers is refused the same way when a config that does not spill is there to time;
the registers and spill bytes of each compiled config are in ``Autotuner.stats``.

The first config is used, with nothing compiled, timed or stored, when there is only one or when
``TILEJIT_AUTOTUNE=0``.

Under ``TILEJIT_INTERPRET=1`` nothing needs NVRTC or a GPU: the compile step is skipped (the interpreter builds
each config's IR on its first run, so a config the frontend rejects fails at its launch, and is skipped like any
failing config), and configs are timed on the interpreter, by default with a wall-clock median instead of CUDA
events. Those times rank configs for the interpreter only, so the key carries "interpreter": such a choice is
stored apart from, and never stands in for, a choice made on a GPU.

Compiling the configs does not count toward a kernel's "specialized 8 times" warning (``Kernel.tuning``).

Under ``torch.distributed`` (initialized, or a ``process_group`` passed) the ranks tuning the same key make one
choice: they pool what each already knows, split the configs none has timed between them, time their share,
pool the timings (``all_gather_object``, on gloo or NCCL) and all take the same best. Ranks whose keys differ
(another GPU model: the key names the device) tune apart, in the same collective calls. So every rank must tune
the same sequence of keys, as the ranks of one job running one model do.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import datetime
import logging
import math
import numbers
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from tilejit import knobs
from tilejit.cache.kernel_cache import remote_cache
from tilejit.cache.layout import current_layout
from tilejit.cache.locks import CacheLockTimeout
from tilejit.cache.records import AutotuneRecordFile, record_problem
from tilejit.errors import (TilejitError, UsageTypeError, UsageValueError, call_user_function, describe_function,
                            did_you_mean, entry_point, raised_in_user_code, user_call_site)
from tilejit.launch_heuristics import check_wrapped_kernel, parameter_defaults
from tilejit.runtime.jit import call_grid_function, launch_without_grid
from tilejit.target import LaunchOptions

__all__ = ["AutotuneError", "Autotuner", "AutotuneStats", "Config", "autotune"]

logger = logging.getLogger("tilejit.autotune")

_LAUNCH_OPTIONS = LaunchOptions.names()


class AutotuneError(TilejitError):
    """Every candidate config failed; ``failures`` holds ``(config, reason)`` for each."""

    def __init__(self, kernel_name: str, key: str, failures: Sequence[tuple["Config", str]]) -> None:
        self.kernel_name = kernel_name
        self.key = key
        self.failures = list(failures)
        listing = "\n".join(f"  {config}\n    {_indent(reason, 4)}" for config, reason in self.failures)
        first = ""
        if self.failures:  # the cause in the first line, where a long listing cannot bury it
            config, reason = self.failures[0]
            first = f"; the first config ({config}): {reason.splitlines()[0] if reason else reason}"
            if len(self.failures) > 1:
                first += " (each config and its error below)"
        super().__init__(
            f"autotuning {kernel_name!r} for key ({key}): all {len(self.failures)} configs failed{first}\n{listing}"
        )


class Config:
    """Constexpr values plus launch options for one autotuning candidate: ``Config(kwargs, num_warps=8,
    num_stages=4, split_k=2)``. Every option of ``tilejit.target.LaunchOptions`` is a keyword (the reserved ones,
    ``num_warps`` and ``num_stages``, may also come by position) and an attribute: ``config.split_k``.

    ``pre_hook``, if given, is called with the dict of named arguments before every launch with this config
    (timed or not); it is not part of the config's identity.
    """

    def __init__(self, kwargs: Mapping[str, Any], *positional: Any,
                 pre_hook: Callable[[dict[str, Any]], None] | None = None, **options: Any) -> None:
        if not isinstance(kwargs, Mapping):
            hint = (" (a dict, not a string: Config({'BLOCK': 16}), not Config('BLOCK=16'))"
                    if isinstance(kwargs, str) else
                    " (Config({}) for a config of launch options only)" if kwargs is None else "")
            raise UsageTypeError(f"Config takes a dict of constexpr values first, e.g. Config({{'BLOCK': 16}}, "
                                 f"num_warps=4); got {type(kwargs).__name__} {kwargs!r}{hint}")
        bad = [name for name in kwargs if not isinstance(name, str) or not name.isidentifier()]
        if bad:
            raise UsageTypeError(f"Config's dict maps parameter names to values: {bad[0]!r} is not a parameter "
                                 f"name, in Config({dict(kwargs)!r})")
        if pre_hook is not None and not callable(pre_hook):
            raise UsageTypeError(f"Config's pre_hook must be a function, got {type(pre_hook).__name__} "
                                 f"{pre_hook!r}; {_PRE_HOOK_TAKES}")
        for option in _LAUNCH_OPTIONS:
            if option in kwargs:
                raise UsageValueError(f"Config: pass {option} as a keyword of Config, not inside its kwargs dict")
        reserved = LaunchOptions.reserved_names()
        if len(positional) > len(reserved):
            raise UsageTypeError(f"Config takes {', '.join(reserved)} by position, then keywords only: got "
                                 f"{len(positional)} positional launch options")
        for name, value in zip(reserved, positional):
            if name in options:
                raise UsageTypeError(f"Config got {name} both by position and by keyword")
            options[name] = value
        for name in options:
            if name not in _LAUNCH_OPTIONS:
                raise UsageTypeError(f"Config got an unexpected keyword argument {name!r}"
                                     f"{did_you_mean(name, [*_LAUNCH_OPTIONS, 'pre_hook'])}; its launch options: "
                                     f"{', '.join(_LAUNCH_OPTIONS)}")
        try:
            self.options = LaunchOptions(**options)
        except ValueError as e:
            raise UsageValueError(f"Config: {e}") from None
        self.kwargs = dict(kwargs)
        for name, value in self.options.as_dict().items():  # config.num_warps, config.split_k ...
            setattr(self, name, value)
        self.pre_hook = pre_hook
        self.launch_kwargs = self.all_kwargs()  # built once: the launch fast path passes it on every call

    def all_kwargs(self) -> dict[str, Any]:
        """The meta arguments a launch with this config passes: constexprs, then the launch options as
        ``LaunchOptions.listed`` gives them (num_warps and num_stages always, the others when set)."""
        return {**self.kwargs, **self.options.listed()}

    @property
    def identity(self) -> str:
        """Canonical text of the content (sorted constexprs, then launch options): the key of stored timings. An
        option left at its default is left out unless reserved, so records stored before it existed keep their
        keys."""
        parts = [f"{name}={value!r}" for name, value in sorted(self.kwargs.items())]
        parts += [f"{name}={value}" for name, value in self.options.listed().items()]
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "kwargs": {name: _jsonable(value) for name, value in sorted(self.kwargs.items())},
            **self.options.listed(),
        }

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self.identity == other.identity

    def __hash__(self) -> int:
        return hash(self.identity)

    def __str__(self) -> str:
        return self.identity

    def __repr__(self) -> str:
        options = "".join(f", {name}={value!r}" for name, value in self.options.listed().items())
        return f"Config({self.kwargs!r}{options})"


class _TunedLaunch:
    """What ``tuner[grid]`` returns: the tuner and the grid, called with the kernel's arguments."""

    __slots__ = ("tuner", "grid")

    def __init__(self, tuner: "Autotuner", grid: Any) -> None:
        self.tuner, self.grid = tuner, grid

    @entry_point  # the user's call: an error shows their line, not tilejit's frames
    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.tuner._launch_call(self.grid, args, kwargs)


@dataclass
class AutotuneStats:
    """What the last tuning did, for tests and for users wondering where the time went."""

    compiled: list[str] = field(default_factory=list)  # config identities compiled
    timed: list[str] = field(default_factory=list)  # config identities timed
    failed: list[str] = field(default_factory=list)  # config identities that failed (this run)
    # per config compiled this run: registers per thread and spill bytes (ptxas -v), None where not reported
    registers: dict[str, int | None] = field(default_factory=dict)
    spills: dict[str, int | None] = field(default_factory=dict)
    compile_thread_ids: set[int] = field(default_factory=set)  # distinct worker threads that compiled
    from_disk: bool = False  # the choice came from the persisted record
    retimed: list[str] = field(default_factory=list)  # the finalists timed again in turns (``_time_finalists``)
    compile_s: float = 0.0  # wall time of compiling this rank's configs
    bench_s: float = 0.0  # wall time of timing them (finalists included)


def autotune(
    configs: Sequence[Config],
    key: Sequence[str],
    prune_configs_by: Mapping[str, Any] | None = None,
    reset_to_zero: Sequence[str] | None = None,
    restore_value: Sequence[str] | None = None,
    *,
    bench_fn: Callable[[Callable[[], None]], float] | None = None,
    process_group: Any = None,
) -> Callable[[Any], "Autotuner"]:
    """Decorator: ``@tilejit.autotune(configs=[...], key=[...])`` above ``@tilejit.kernel``.

    - ``key``: names of arguments whose values select a tuning (typically the problem sizes). The dtypes of all
      tensor arguments are always part of the key.
    - ``prune_configs_by``: optional dict with ``"early_config_prune"`` (``f(configs, named_args, **kwargs)
      -> configs``), ``"perf_model"`` (``f(**named_args, **kwargs, **config.all_kwargs()) -> estimated ms``)
      and ``"top_k"`` (how many of the best-estimated configs to time; a float <= 1 is a fraction).
    - ``reset_to_zero``: tensor arguments zeroed before every timed run and after the tuning (outputs accumulated
      with atomics: the launch that tuned adds to zeros, as Triton's does).
    - ``restore_value``: tensor arguments saved before tuning and restored after every timed run (in-place
      updates).
    - ``bench_fn``: ``f(run) -> ms``; defaults to ``tilejit.testing.do_bench``. Pass
      ``tilejit.testing.do_bench_cudagraph`` for launch-bound kernels.
    - ``process_group``: the ``torch.distributed`` group whose ranks tune together (default: the whole job when
      ``torch.distributed`` is initialized with more than one rank).
    """

    def decorator(kernel: Any) -> Autotuner:
        return Autotuner(
            kernel,
            configs,
            key,
            prune_configs_by=prune_configs_by,
            reset_to_zero=reset_to_zero,
            restore_value=restore_value,
            bench_fn=bench_fn,
            process_group=process_group,
        )

    return decorator


class Autotuner:
    """Wraps a kernel; ``tuner[grid](*args, **kwargs)`` launches it with the best config for these arguments."""

    def __init__(
        self,
        kernel: Any,
        configs: Sequence[Config],
        key: Sequence[str],
        prune_configs_by: Mapping[str, Any] | None = None,
        reset_to_zero: Sequence[str] | None = None,
        restore_value: Sequence[str] | None = None,
        *,
        bench_fn: Callable[[Callable[[], None]], float] | None = None,
        process_group: Any = None,
    ) -> None:
        check_wrapped_kernel(kernel, "@tilejit.autotune(...)")
        self.kernel = kernel
        self.process_group = process_group
        self.fn = kernel.fn
        self.__name__ = kernel.__name__
        self.arg_names = list(kernel.arg_names)
        self.configs = _check_configs(configs, self.__name__) if configs else [Config({})]
        self.key = _names_list(key, "key", self.__name__, "key=['N'] (key=[] tunes once per set of tensor dtypes)")
        self.reset_to_zero = _names_list(reset_to_zero or (), "reset_to_zero", self.__name__, "reset_to_zero=['C']")
        self.restore_value = _names_list(restore_value or (), "restore_value", self.__name__, "restore_value=['C']")
        for role, names in (("key", self.key), ("reset_to_zero", self.reset_to_zero),
                            ("restore_value", self.restore_value)):
            unknown = [name for name in names if name not in self.arg_names]
            if unknown:
                raise UsageValueError(
                    f"autotune({role}=...) of {self.__name__!r} names {unknown}, which are not parameters "
                    f"({', '.join(self.arg_names)}){did_you_mean(unknown[0], self.arg_names)}"
                )
        if prune_configs_by is not None and not isinstance(prune_configs_by, Mapping):
            raise UsageTypeError(f"autotune(prune_configs_by=...) of {self.__name__!r} takes a dict with the entries "
                                 f"early_config_prune, perf_model and top_k, got {type(prune_configs_by).__name__}")
        prune = dict(prune_configs_by or {})
        extra = set(prune) - {"perf_model", "top_k", "early_config_prune"}
        if extra:
            raise UsageValueError(f"prune_configs_by: unknown entries {sorted(extra, key=str)} "
                                  f"(expected perf_model, top_k, early_config_prune)"
                                  f"{did_you_mean(str(sorted(extra, key=str)[0]), _PRUNE_ENTRIES)}")
        for entry in ("perf_model", "early_config_prune"):
            if prune.get(entry) is not None and not callable(prune[entry]):
                raise UsageTypeError(f"prune_configs_by's {entry} of {self.__name__!r} must be a function, got "
                                     f"{type(prune[entry]).__name__} {prune[entry]!r}; "
                                     f"{_PERF_MODEL_TAKES if entry == 'perf_model' else _EARLY_PRUNE_TAKES}")
        self.perf_model: Callable[..., float] | None = prune.get("perf_model")
        self.top_k: int | float | None = _check_top_k(prune.get("top_k"), self.perf_model, self.__name__)
        self.early_config_prune: Callable[..., Sequence[Config]] | None = prune.get("early_config_prune")
        self._bench_fn = bench_fn
        self.best_config: Config | None = None
        self.stats = AutotuneStats()
        self._chosen: dict[str, Config] = {}
        # Launch fast path: a cheap tuple of what the key string depends on -> chosen config.
        self._fast_choice: dict[tuple, Config] = {}
        self._bound: dict[tuple, _TunedLaunch] = {}  # grid -> its bound launch (tuner[grid])
        # The compiled launcher's tuned dispatch (runtime/_launch.c's Tuned), once the kernel has its Dispatcher.
        self._native: Any = None
        self._tuned_names = {n for c in self.configs for n in c.kwargs} | set(_LAUNCH_OPTIONS)
        # parameters left out of a launch take their defaults (a key argument, what the prune functions see)
        self._arg_defaults = {name: value for name, value in parameter_defaults(kernel).items()
                              if name not in self._tuned_names}
        self._lock = threading.Lock()

    # -- the kernel interface, passed through so decorators compose --------------------------------------------

    def source_hash(self) -> str:
        return self.kernel.source_hash()

    @entry_point
    def compile(self, *args: Any, **kwargs: Any) -> Any:
        return self.kernel.compile(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Anything else the kernel offers (ir, asm, ...) is reachable through the tuner.
        kernel = self.__dict__.get("kernel")
        if kernel is None:
            raise AttributeError(name)
        return getattr(kernel, name)

    def __repr__(self) -> str:
        return f"<tilejit.Autotuner of {self.__name__} with {len(self.configs)} configs, key={self.key}>"

    @entry_point
    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise launch_without_grid(self.__name__)

    # -- launching ----------------------------------------------------------------------------------------------

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        native = self._native
        if native is not None:
            return native.bind(grid)  # the compiled launcher's tuned dispatch (runtime/_launch.c)
        if type(grid) is tuple:  # the common case: one bound launch per grid, made once
            bound = self._bound.get(grid)
            if bound is None:
                if len(self._bound) >= 4096:  # grids that keep changing: do not hold on to every one
                    self._bound.clear()
                bound = self._bound[grid] = _TunedLaunch(self, grid)
            return bound
        return _TunedLaunch(self, grid)

    def _launch_call(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Config:
        """``tuner[grid](*args, **kwargs)`` in Python: a remembered choice launches at once; otherwise tune (or
        read the stored choice) first. Returns the config launched."""
        fast = self._fast_key(args, kwargs)
        config = self._fast_choice.get(fast) if fast is not None else None
        if config is None:
            config = self._run(grid, args, kwargs, fast)
        else:
            self.best_config = config
            self._launch(config, grid, args, kwargs)
        if self._native is None:
            self._attach_native()
        return config

    def _attach_native(self) -> None:
        """Move later launches to the compiled launcher's tuned dispatch (``_launch.c``'s Tuned) once the kernel
        has made its Dispatcher (at its first GPU launch, when the launcher is built): there a launch signs the
        call's tuning key (the kernel's call signature, the key arguments by value, the environment variables the
        choice depends on), finds the chosen compiled kernel and launches it, with no Python frame. A miss comes
        back to ``_native_miss``. Only for a plain ``@tilejit.kernel`` underneath, whose launch is the Dispatcher's."""
        from tilejit.runtime import native
        from tilejit.runtime.jit import Kernel

        kernel = self.kernel
        if type(kernel) is not Kernel or kernel._dispatcher is None:
            return
        module = native.ready()
        if module is None:
            return
        exact = bytes(name in self.key for name in kernel.arg_names)
        self._native = module.Tuned(
            dispatcher=kernel._dispatcher, exact=exact, env_names=NATIVE_KEY_VARIABLES,
            slow=entry_point(self._native_miss), fallback=entry_point(self._launch_call),
            grid_fn=entry_point(self._native_grid), owner=self)

    def _native_miss(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]):
        """A miss of the tuned dispatch: launch through the Python path (tuning if the key is new) and hand back
        what to remember: the chosen config's launch keywords and the config; None for a config with a pre_hook,
        which must run before every launch (those launches keep taking this path)."""
        config = self._launch_call(grid, args, kwargs)
        return None if config.pre_hook is not None else (config.launch_kwargs, config)

    def _native_grid(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None,
                     launch_kwargs: dict[str, Any]) -> Any:
        """The grid a grid function gives for a remembered choice: it sees the named arguments and the config's
        meta arguments, as ``_launch`` passes them."""
        meta = self._named_args(args, kwargs or {})
        meta.update(launch_kwargs)
        return call_grid_function(grid, meta)

    def _fast_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple | None:
        """What the tuning key depends on (key arguments' values, tensor dtypes and devices), cheaply;
        None when a tuned parameter is passed (the slow path raises about it).

        Every launch of a tuned kernel computes it, so it reads the environment knobs raw (parsing them
        cost more than the rest of the key) and tests tensors by type first."""
        if kwargs and any(name in self._tuned_names for name in kwargs):
            return None
        environ = os.environ
        if environ.get("TILEJIT_AUTOTUNE") is not None and not knobs.autotune_enabled():
            return None
        key: list[Any] = []
        tensor_type = _tensor_type()
        for value in (*args, *kwargs.values()) if kwargs else args:
            if type(value) is tensor_type or _is_tensor(value):
                key += (value.dtype, value.shape, value.get_device())
            elif isinstance(value, (int, float, bool, str)) or value is None:
                key.append(value)
            else:
                return None
        if kwargs:
            key.append(tuple(kwargs))
        # an interpreter choice never stands in for a GPU one, nor one of another pinned lowering (the raw text:
        # equal meanings may key apart)
        key.append(environ.get("TILEJIT_INTERPRET"))
        key += [environ.get(name) for name in knobs.CODEGEN_PIN_VARIABLES]
        return tuple(key)

    def _run(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any], fast: tuple | None = None) -> Config:
        tuned = [name for name in kwargs if name in _LAUNCH_OPTIONS or any(name in c.kwargs for c in self.configs)]
        if tuned:
            raise UsageTypeError(
                f"{self.__name__}: {', '.join(sorted(tuned))} are chosen by the autotuner; do not pass them "
                f"to the launch"
            )
        named = self._named_args(args, kwargs)
        with user_call_site():  # warnings of tuning (compiles on other threads included) name the launch line
            config = self._choose(grid, args, kwargs, named)
            self.best_config = config
            self._launch(config, grid, args, kwargs, named)
        if fast is not None:
            self._fast_choice[fast] = config
        return config

    def _named_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if len(args) > len(self.arg_names):
            raise UsageTypeError(f"{self.__name__} takes {len(self.arg_names)} arguments; {len(args)} were given")
        named = {**dict(zip(self.arg_names, args)), **kwargs}
        for name, default in self._arg_defaults.items():  # (after the given ones: the key's order is kept)
            if name not in named:
                named[name] = default
        return named

    def _launch(self, config: Config, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                named: dict[str, Any] | None = None) -> None:
        """Launch with ``config``: its pre_hook and a callable grid see the named arguments and the config's meta
        arguments. Every launch of a tuned kernel comes here, so the dicts are built only when something reads
        them (``named``, when the caller has it)."""
        if config.pre_hook is not None or callable(grid):
            meta = dict(named) if named is not None else self._named_args(args, kwargs)
            meta.update(config.launch_kwargs)
            if config.pre_hook is not None:  # its own copy: what it changes does not reach the grid
                call_user_function(config.pre_hook, "the Config's pre_hook", _PRE_HOOK_TAKES, dict(meta))
            if callable(grid):
                grid = call_grid_function(grid, meta)
        self.kernel[grid](*args, **kwargs, **config.launch_kwargs)

    # -- choosing -----------------------------------------------------------------------------------------------

    def _choose(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any], named: dict[str, Any]) -> Config:
        if len(self.configs) == 1:
            return self.configs[0]
        if not knobs.autotune_enabled():
            return self.configs[0]
        key = self._key_string(named)
        chosen = self._chosen.get(key)
        if chosen is not None:
            return chosen
        with self._lock:
            chosen = self._chosen.get(key)
            if chosen is None:
                chosen = self._tune(key, grid, args, kwargs, named)
                self._chosen[key] = chosen
        return chosen

    def _key_string(self, named: dict[str, Any]) -> str:
        parts = []
        for name in self.key:
            if name not in named:
                raise UsageTypeError(f"{self.__name__}: autotune key argument {name!r} was not passed")
            parts.append(f"{name}={_key_value(named[name])}")
        dtypes = [f"{name}:{value.dtype}" for name, value in named.items() if _is_tensor(value)]
        if dtypes:
            parts.append("dtypes=" + ",".join(dtypes))
        device = _device_name(named.values())
        if device:
            parts.append(f"device={device}")
        if knobs.interpret():
            parts.append("interpreter")
        pins = knobs.codegen_pins()
        if pins:  # timings under a pinned lowering are not timings of the default one
            parts.append("codegen=" + pins[1:])
        return "; ".join(parts)

    def prune_configs(self, named: dict[str, Any], kwargs: dict[str, Any]) -> list[Config]:
        """The configs worth timing for these arguments: early_config_prune, then perf_model's top_k."""
        configs = list(self.configs)
        if self.early_config_prune is not None:
            pruned = call_user_function(self.early_config_prune, "prune_configs_by's early_config_prune",
                                        _EARLY_PRUNE_TAKES, configs, named, **kwargs)
            configs = _check_pruned(pruned, self.early_config_prune, self.__name__)
            if not configs:
                raise AutotuneError(self.__name__, self._key_string(named),
                                    [(c, "removed by early_config_prune") for c in self.configs])
        if self.perf_model is not None and self.top_k is not None:
            top_k = self.top_k
            if isinstance(top_k, float):  # a fraction (checked: in (0, 1])
                top_k = max(1, int(len(configs) * top_k))
            if len(configs) > top_k:
                estimates = {c: _check_estimate(call_user_function(self.perf_model, "prune_configs_by's perf_model",
                                                                   _PERF_MODEL_TAKES, **{**named, **c.all_kwargs()}),
                                                self.perf_model, c, self.__name__) for c in configs}
                configs = sorted(configs, key=estimates.__getitem__)[: int(top_k)]
        return configs

    def _tune(self, key: str, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              named: dict[str, Any]) -> Config:
        self.stats = stats = AutotuneStats()
        errors: dict[str, BaseException] = {}  # config identity -> what it raised in this run
        candidates = self.prune_configs(named, kwargs)
        store = AutotuneRecordFile(current_layout(), self.__name__, self.source_hash())
        previous = store.load().get(key)
        fetched = False
        if previous is None:  # not tuned here: perhaps on another machine with the same device
            previous = self._remote_record(key)
            fetched = previous is not None
        previous = previous or {}
        timings: dict[str, float] = dict(previous.get("timings_ms", {}))
        failures: dict[str, str] = dict(previous.get("failures", {}))
        if not any(c.identity in timings for c in candidates):
            # The record times none of these configs (the ones it timed were pruned or removed since): it is no
            # choice, and the failures it remembers may have passed (memory another process held): retry them.
            for c in candidates:
                failures.pop(c.identity, None)

        todo = [c for c in candidates if c.identity not in timings and c.identity not in failures]
        known = (dict(timings), dict(failures))
        group = self._rank_group()
        untimed = len(todo)
        if group is not None:
            # Every rank tuning this key then knows what any of them knew, and times its share of the rest.
            todo, untimed = _split_among_ranks(group, key, candidates, timings, failures)
        stats.from_disk = not untimed
        if todo:
            logger.info("tuning %s for %s: %d configs to time (%d known)", self.__name__, key, len(todo),
                        len(candidates) - len(todo))
            interpret = knobs.interpret()
            steps = len(todo) if interpret else 2 * len(todo)
            with _progress(total=steps, desc=f"autotune {self.__name__}") as bar, _tuning(self.kernel):
                # The interpreter compiles nothing: each config's IR is built on its first (timed) run.
                start = time.perf_counter()
                compiled = todo if interpret else self._compile_all(todo, args, kwargs, failures, stats, bar,
                                                                    timed_before=bool(timings), errors=errors)
                stats.compile_s = time.perf_counter() - start
                self._time_all(compiled, grid, args, kwargs, named, timings, failures, stats, bar, errors)
                stats.bench_s = time.perf_counter() - start - stats.compile_s
        if group is not None:
            _pool_among_ranks(group, key, timings, failures)  # the same timings on every rank: the same choice

        ranked = [c for c in candidates if c.identity in timings]
        if not ranked:
            # this run's first exception (the first listed may have failed in an earlier process: its text only)
            cause = next((errors[c.identity] for c in candidates if c.identity in errors), None)
            raise AutotuneError(self.__name__, key, [(c, failures[c.identity]) for c in candidates]) from cause
        best = min(ranked, key=lambda c: timings[c.identity])
        logger.info("%s for %s: chose %s (%.4f ms)", self.__name__, key, best, timings[best.identity])
        if (timings, failures) != known:
            record = {
                "kernel": self.__name__,
                "key": key,
                "config": best.to_json(),
                "timings_ms": timings,
                "failures": failures,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            }
            _save(store, key, record)
            shared = remote_cache()
            if shared is not None:
                from tilejit.cache.remote import record_name

                shared.put_record(record_name(self.__name__, self.source_hash(), key), record)
        elif fetched:
            _save(store, key, previous)  # another machine's choice, kept here too
        return best

    def _rank_group(self) -> Any:
        """The ``torch.distributed`` group whose ranks tune together, or None: the group passed, else the default
        group when ``torch.distributed`` is initialized; None too when it has one rank."""
        group = self.process_group
        if group is None:
            try:
                import torch.distributed as dist
            except ImportError:
                return None
            if not (dist.is_available() and dist.is_initialized()):
                return None
            group = dist.group.WORLD
        import torch.distributed as dist

        return group if dist.get_world_size(group) > 1 else None

    def _remote_record(self, key: str) -> dict[str, Any] | None:
        """The remote cache's record for ``key`` (tuned on another machine with the same device), checked."""
        shared = remote_cache()
        if shared is None:
            return None
        from tilejit.cache.remote import record_name

        name = record_name(self.__name__, self.source_hash(), key)
        record = shared.get_record(name)
        if record is None:
            return None
        problem = "it is for another key" if record.get("key") != key else record_problem(record)
        if problem is not None:
            shared.refuse(name, problem)
            return None
        return record

    def _compile_all(self, configs: list[Config], args: tuple[Any, ...], kwargs: dict[str, Any],
                     failures: dict[str, str], stats: AutotuneStats, bar: Any,
                     timed_before: bool = False, errors: dict[str, BaseException] | None = None) -> list[Config]:
        """Compile every config in parallel; return those to time, in their original order.

        A config whose kernel spills registers to local memory (ptxas) is refused when one that does not spill is
        there to time (compiled now, or ``timed_before``): spilled main loops are rarely the fastest and cost a
        timing run each. When every config spills, they are all timed."""

        def compile_one(config: Config) -> dict:
            stats.compile_thread_ids.add(threading.get_ident())
            return getattr(self.kernel.compile(*args, **kwargs, **config.all_kwargs()), "meta", None) or {}

        with _compile_executor(min(knobs.compile_workers(), len(configs))) as pool:
            # each compile in a copy of this context: its warnings name the user's launch line (user_call_site)
            futures = {pool.submit(contextvars.copy_context().run, compile_one, config): config for config in configs}
            for future in concurrent.futures.as_completed(futures):
                bar.update(1)
        compiled, spilling = [], []
        for future, config in futures.items():
            stats.compiled.append(config.identity)
            error = future.exception()
            if error is not None:
                self._record_failure(config, "compile", error, failures, stats, errors)
                continue
            meta = future.result()
            stats.registers[config.identity] = meta.get("registers")
            stats.spills[config.identity] = meta.get("spills")
            (spilling if meta.get("spills") else compiled).append(config)
        if spilling and (compiled or timed_before):
            for config in spilling:
                reason = (f"refused: spills {stats.spills[config.identity]} bytes to local memory "
                          f"({stats.registers[config.identity]} registers); configs that do not spill are timed")
                failures[config.identity] = reason
                stats.failed.append(config.identity)
                logger.info("%s: skipping config %s: %s", self.__name__, config, reason)
            spilling = []
        keep = {c.identity for c in compiled + spilling}
        return [c for c in configs if c.identity in keep]

    def _time_all(self, configs: list[Config], grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                  named: dict[str, Any], timings: dict[str, float], failures: dict[str, str],
                  stats: AutotuneStats, bar: Any, errors: dict[str, BaseException] | None = None) -> None:
        saved = {name: named[name].clone() for name in self.restore_value if _is_tensor(named[name])}
        bench = self._bench_fn or _default_bench
        runs: dict[str, Callable[[], None]] = {}
        for config in configs:

            def run(config: Config = config) -> None:
                for name in self.reset_to_zero:
                    named[name].zero_()
                self._launch(config, grid, args, kwargs, named)
                for name, original in saved.items():
                    named[name].copy_(original)

            try:
                ms = float(bench(run))
            except Exception as error:  # noqa: BLE001 - any launch failure disqualifies only this config
                if raised_in_user_code(error):  # a grid function's or pre_hook's mistake: the user's, every config's
                    raise
                self._record_failure(config, "launch", error, failures, stats, errors)
                # A failed launch may leave a restore_value argument half-written.
                for name, original in saved.items():
                    named[name].copy_(original)
            else:
                timings[config.identity] = ms
                runs[config.identity] = run
                stats.timed.append(config.identity)
                logger.debug("%s %s: %.4f ms", self.__name__, config, ms)
            bar.update(1)
        if not (knobs.interpret() and self._bench_fn is None):  # (interpreter wall-clock times: a rough pick)
            self._time_finalists(configs, runs, bench, timings, stats)
        for name in self.reset_to_zero:  # the launch that follows starts from zero too, as after no tuning
            named[name].zero_()

    def _time_finalists(self, configs: list[Config], runs: dict[str, Callable[[], None]],
                        bench: Callable[[Callable[[], None]], float], timings: dict[str, float],
                        stats: AutotuneStats) -> None:
        """Time the configs that came within ``FINALIST_MARGIN`` of the best (at most ``FINALISTS``) again, in
        ``FINAL_ROUNDS`` turns of a rotating order, each keeping its best time.

        The first pass times the configs one after another, so a GPU whose clock sags as it heats under the
        tuning times the last ones slowest. Measured on an H100: the same 4096^3 fp16 tuning chose the persistent
        256x128 tile (723 TFLOP/s) on a cool GPU and the plain 128x256 (634) right after a minute of other work,
        the persistent configs coming last in the space. A kernel's time can be inflated by the clock, not
        deflated, hence the best of its turns."""
        timed = sorted((c for c in configs if c.identity in runs), key=lambda c: timings[c.identity])
        if len(timed) < 2:
            return
        limit = timings[timed[0].identity] * (1 + FINALIST_MARGIN)
        finalists = [c for c in timed[:FINALISTS] if timings[c.identity] <= limit]
        if len(finalists) < 2:
            return
        for turn in range(FINAL_ROUNDS):
            shift = turn % len(finalists)
            for config in finalists[shift:] + finalists[:shift]:
                try:
                    ms = float(bench(runs[config.identity]))
                except Exception:  # noqa: BLE001 - it ran in the first pass: keep that time
                    continue
                timings[config.identity] = min(timings[config.identity], ms)
        stats.retimed = [c.identity for c in finalists]
        logger.debug("%s finalists: %s", self.__name__,
                     ", ".join(f"{c} {timings[c.identity]:.4f} ms" for c in finalists))

    def _record_failure(self, config: Config, stage: str, error: BaseException, failures: dict[str, str],
                        stats: AutotuneStats, errors: dict[str, BaseException] | None = None) -> None:
        reason = f"{stage} failed: {type(error).__name__}: {error}"
        if errors is not None:  # the exception itself, for the cause of an AutotuneError when every config fails
            errors.setdefault(config.identity, error)
        failures[config.identity] = reason
        stats.failed.append(config.identity)
        logger.info("%s: skipping config %s: %s", self.__name__, config, reason)

#: The first pass's configs within this fraction of its best are timed again in turns (``_time_finalists``), at
#: most ``FINALISTS`` of them, ``FINAL_ROUNDS`` times each.
FINALIST_MARGIN = 0.15
FINALISTS = 4
FINAL_ROUNDS = 3


#: The environment variables a tuned choice depends on beside the arguments (``_key_string``: the interpreter's
#: choices and those of a pinned lowering are kept apart; TILEJIT_AUTOTUNE=0 takes the first config): the compiled
#: launcher's tuned dispatch signs their text.
NATIVE_KEY_VARIABLES = ("TILEJIT_AUTOTUNE", "TILEJIT_INTERPRET", *knobs.CODEGEN_PIN_VARIABLES)

_PRE_HOOK_TAKES = "a pre_hook takes one argument, the dict of the launch's arguments by name: pre_hook=lambda args: ..."
_EARLY_PRUNE_TAKES = ("early_config_prune takes the list of configs, the dict of the launch's arguments by name and "
                      "the launch's keywords: def prune(configs, named_args, **kwargs): return [...]")
_PERF_MODEL_TAKES = ("perf_model takes the launch's arguments, keywords and the config's values by name and returns "
                     "an estimate in ms: def perf_model(**kwargs): ...")
_PRUNE_ENTRIES = ("early_config_prune", "perf_model", "top_k")


def _check_configs(configs: Any, name: str) -> list[Config]:
    """``configs`` as a list, each a :class:`Config`."""
    if isinstance(configs, (Config, Mapping, str)) or not isinstance(configs, Iterable):
        raise UsageTypeError(f"autotune(configs=...) of {name!r} takes a list of tilejit.Config, got "
                             f"{type(configs).__name__} {configs!r}")
    configs = list(configs)
    for i, config in enumerate(configs):
        if not isinstance(config, Config):
            hint = (f": wrap its dict, tilejit.Config({dict(config)!r}), launch options as keywords "
                    f"(tilejit.Config({{...}}, num_warps=4))" if isinstance(config, Mapping) else "")
            raise UsageTypeError(f"autotune(configs=...) of {name!r}: item {i} is a {type(config).__name__}, not a "
                                 f"tilejit.Config{hint}")
    return configs


def _names_list(names: Any, role: str, name: str, example: str) -> list[str]:
    """``names`` (a parameter name or a list of them) as a list of str."""
    if isinstance(names, str):
        return [names]
    if names is None or not isinstance(names, Iterable) or isinstance(names, Mapping):
        raise UsageTypeError(f"autotune({role}=...) of {name!r} takes a list of parameter names, e.g. {example}; got "
                             f"{type(names).__name__} {names!r}")
    names = list(names)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise UsageTypeError(f"autotune({role}=...) of {name!r} takes parameter names (str), e.g. {example}; got "
                             f"{type(bad[0]).__name__} {bad[0]!r} in {names!r}")
    return names


def _check_top_k(top_k: Any, perf_model: Any, name: str) -> int | float | None:
    """prune_configs_by's top_k: how many configs perf_model keeps, a count (an int of at least 1) or a fraction
    of the configs (a float in (0, 1])."""
    if top_k is None:
        return None
    what = (f"prune_configs_by's top_k of {name!r} is {top_k!r}; it takes how many of the best-estimated configs "
            "to time: an int of at least 1, or a fraction of the configs, a float in (0, 1] (0.5 keeps half)")
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Real):
        raise UsageTypeError(what)
    if isinstance(top_k, numbers.Integral):
        if top_k < 1:
            raise UsageValueError(what)
        top_k = int(top_k)
    elif not 0.0 < float(top_k) <= 1.0:
        raise UsageValueError(what)
    else:
        top_k = float(top_k)
    if perf_model is None:
        raise UsageValueError(f"prune_configs_by of {name!r} has a top_k but no perf_model, which estimates the "
                              f"configs top_k keeps the best of; {_PERF_MODEL_TAKES}")
    return top_k


def _check_pruned(pruned: Any, fn: Callable[..., Any], name: str) -> list[Config]:
    """What early_config_prune returned, as a list of configs; a usage error naming it when it is not one."""
    where = f"prune_configs_by's early_config_prune ({describe_function(fn)}) of {name!r}"
    if pruned is None or isinstance(pruned, (Config, Mapping, str)) or not isinstance(pruned, Iterable):
        raise UsageTypeError(f"{where} returned {type(pruned).__name__} {pruned!r}; it must return the list of "
                             f"configs to keep (tilejit.Config objects, a subset of those it is given)"
                             f"{_missing_return(pruned)}")
    pruned = list(pruned)
    for i, config in enumerate(pruned):
        if not isinstance(config, Config):
            raise UsageTypeError(f"{where} returned a list whose item {i} is a {type(config).__name__} "
                                 f"({config!r}); it must return tilejit.Config objects (those it is given, or "
                                 f"tilejit.Config({{...}}, num_warps=...))")
    return pruned


def _check_estimate(estimate: Any, fn: Callable[..., Any], config: Config, name: str) -> float:
    """What perf_model returned for ``config``, as a float; a usage error naming it when it is not a number."""
    try:
        ms = math.nan if isinstance(estimate, (bool, str, bytes)) else float(estimate)  # (a 1-element tensor too)
    except (TypeError, ValueError, RuntimeError):
        ms = math.nan
    if math.isnan(ms):
        raise UsageTypeError(f"prune_configs_by's perf_model ({describe_function(fn)}) of {name!r} returned "
                             f"{type(estimate).__name__} {estimate!r} for config {config}; it must return the "
                             f"config's estimated time in ms, a number (lower is better){_missing_return(estimate)}")
    return ms


def _missing_return(value: Any) -> str:
    return " (a missing return statement?)" if value is None else ""


def _tuning(kernel: Any) -> Any:
    """``kernel.tuning()`` (compiles inside it do not count as respecializations), for kernels that offer it."""
    tuning = getattr(kernel, "tuning", None)
    return tuning() if tuning is not None else contextlib.nullcontext()


def _compile_executor(workers: int) -> concurrent.futures.Executor:
    """Where configs compile. Threads suffice because NVRTC releases the GIL while compiling; swap in a
    ProcessPoolExecutor here if a compile step ever holds it."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="tilejit-compile")


def _default_bench(run: Callable[[], None]) -> float:
    if knobs.interpret():
        return _wall_clock_bench(run)
    from tilejit.testing import do_bench

    return float(do_bench(run))


def _wall_clock_bench(run: Callable[[], None], repeats: int = 3) -> float:
    """Median wall-clock ms of ``repeats`` runs after one warm-up run (which builds the IR): for the
    interpreter, where there are no CUDA events to time with."""
    import time

    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def _save(store: AutotuneRecordFile, key: str, record: dict[str, Any]) -> None:
    try:
        store.save(key, record)
    except (OSError, CacheLockTimeout) as error:
        logger.warning("cannot write autotune record %s: %s (the choice is kept in memory only)", store.path, error)


def _split_among_ranks(group: Any, key: str, candidates: list[Config], timings: dict[str, float],
                       failures: dict[str, str]) -> tuple[list[Config], int]:
    """Pool what the ranks tuning ``key`` know (into ``timings`` and ``failures``, the same on each of them), and
    return this rank's share of the configs none has timed, and how many those are in all. A collective call:
    every rank of ``group`` makes it, whatever its key."""
    import torch.distributed as dist

    peers = _pool_among_ranks(group, key, timings, failures)
    untimed = [c for c in candidates if c.identity not in timings and c.identity not in failures]
    return untimed[peers.index(dist.get_rank(group))::len(peers)], len(untimed)


def _pool_among_ranks(group: Any, key: str, timings: dict[str, float], failures: dict[str, str]) -> list[int]:
    """Replace ``timings`` and ``failures`` by the union of those of every rank of ``group`` tuning ``key``, the
    lowest rank's entry winning where two differ, a timing winning over a failure (so the result is the same on
    all of them); returns those ranks. A collective call."""
    import torch.distributed as dist

    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, {"key": key, "timings": dict(timings), "failures": dict(failures)}, group=group)
    peers = [rank for rank, report in enumerate(everyone) if report["key"] == key]
    pooled_timings: dict[str, float] = {}
    pooled_failures: dict[str, str] = {}
    for rank in peers:
        for identity, ms in everyone[rank]["timings"].items():
            pooled_timings.setdefault(identity, float(ms))
        for identity, reason in everyone[rank]["failures"].items():
            pooled_failures.setdefault(identity, str(reason))
    timings.clear()
    timings.update(pooled_timings)
    failures.clear()
    failures.update({identity: reason for identity, reason in pooled_failures.items() if identity not in timings})
    return peers


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def __enter__(self) -> "_NoProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _progress(total: int, desc: str) -> Any:
    """A tqdm bar on an interactive terminal; silent otherwise (CI logs, pipes) or without tqdm."""
    if not sys.stderr.isatty():
        return _NoProgress()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoProgress()
    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False)


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "dtype") and hasattr(value, "data_ptr")


def _device_name(values: Iterable[Any]) -> str | None:
    """The GPU model of the first CUDA tensor argument: a choice tuned on one GPU is not reused on another."""
    for value in values:
        device = getattr(value, "device", None) if _is_tensor(value) else None
        if device is not None and getattr(device, "type", None) == "cuda":
            import torch

            return torch.cuda.get_device_name(device)
    return None


def _tensor_type() -> type | None:
    """torch.Tensor when torch is loaded (a launch with tensors means it is), else None; never imports it, so
    ``tilejit.autotune`` stays importable without torch. An exact type test against it is cheaper than
    _is_tensor's two hasattr calls per argument."""
    return getattr(sys.modules.get("torch"), "Tensor", None)


def _key_value(value: Any) -> str:
    if _is_tensor(value):
        return f"{value.dtype}{tuple(value.shape)}"
    return repr(value)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _indent(text: str, spaces: int) -> str:
    return text.replace("\n", "\n" + " " * spaces)
