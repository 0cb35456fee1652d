"""``@tilejit.heuristics({...})``: constexprs computed from the launch arguments, as Triton's ``triton.heuristics``.

    @tilejit.autotune(configs=[tilejit.Config({"BK": 32}), tilejit.Config({"BK": 64})], key=["K"])
    @tilejit.heuristics({"EVEN_K": lambda args: args["K"] % args["BK"] == 0})
    @tilejit.kernel
    def matmul(A, B, C, K, BK: T.constexpr, EVEN_K: T.constexpr): ...

Each function receives a dict of every argument by name (positional, keyword, launch options such as
``num_warps``, and the config values an autotuner above passes) plus the values computed by the heuristics
listed before it, and returns the value of its (constexpr) parameter. The wrapper sits between
``@tilejit.autotune`` and ``@tilejit.kernel`` (or on a kernel alone); passing a computed parameter at the launch
is an error.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

from .errors import UsageTypeError, UsageValueError, call_user_function, did_you_mean, entry_point
from .runtime.jit import launch_without_grid

_HEURISTIC_TAKES = ("a heuristic takes one argument, the dict of the launch's arguments by name, and returns its "
                    "parameter's value: {'EVEN_K': lambda args: args['K'] % args['BK'] == 0}")


def heuristics(values: Mapping[str, Callable[[dict[str, Any]], Any]]) -> Callable[[Any], "Heuristics"]:
    """Decorator: ``@tilejit.heuristics({"NAME": lambda args: ...})`` above ``@tilejit.kernel``."""
    if not isinstance(values, Mapping):
        raise UsageTypeError(f"tilejit.heuristics takes a dict of parameter name -> function(args) -> value, got "
                             f"{type(values).__name__} {values!r}; {_HEURISTIC_TAKES}")
    for name, fn in values.items():
        if not isinstance(name, str) or not callable(fn):
            raise UsageTypeError(f"tilejit.heuristics takes a dict of parameter name -> function(args) -> value: its "
                                 f"entry {name!r} maps to {type(fn).__name__} {fn!r}; {_HEURISTIC_TAKES}")

    def decorator(kernel: Any) -> Heuristics:
        return Heuristics(kernel, dict(values))

    return decorator


def check_wrapped_kernel(kernel: Any, decorator: str) -> None:
    """Refuse what ``decorator`` (``@tilejit.autotune(...)``, ``@tilejit.heuristics(...)``) cannot wrap: anything but a
    ``@tilejit.kernel`` or a wrapper of one."""
    if hasattr(kernel, "arg_names") and hasattr(kernel, "fn") and hasattr(kernel, "__getitem__"):
        return
    what = (f"the plain function {kernel.__name__!r}" if inspect.isfunction(kernel)
            else f"{type(kernel).__name__} {kernel!r}")
    raise UsageTypeError(f"{decorator} wraps a @tilejit.kernel, got {what}: put @tilejit.kernel directly on the "
                         f"function, below it:\n    {decorator}\n    @tilejit.kernel\n    def name(...): ...")


def parameter_defaults(kernel: Any) -> dict[str, Any]:
    """The default values of the parameters of ``kernel``'s function (none when its signature cannot be read): what
    a wrapper's callbacks (heuristics, prune functions) and an autotune key see of a parameter a launch leaves out."""
    try:
        signature = inspect.signature(kernel.fn)
    except (TypeError, ValueError):
        return {}
    return {name: p.default for name, p in signature.parameters.items() if p.default is not inspect.Parameter.empty}


class Heuristics:
    """Wraps a kernel (or another wrapper); fills the computed parameters, then launches or compiles it."""

    def __init__(self, kernel: Any, values: dict[str, Callable[[dict[str, Any]], Any]]) -> None:
        check_wrapped_kernel(kernel, "@tilejit.heuristics({...})")
        self.kernel = kernel
        self.fn = kernel.fn
        self.__name__ = kernel.__name__
        self.arg_names = list(kernel.arg_names)
        unknown = [n for n in values if n not in self.arg_names]
        if unknown:
            raise UsageValueError(f"heuristics of {self.__name__!r} name {unknown}, which are not parameters "
                                  f"({', '.join(self.arg_names)}){did_you_mean(unknown[0], self.arg_names)}")
        self.values = values
        # what a heuristic sees of a parameter the launch leaves out: its default
        self._defaults = {n: v for n, v in parameter_defaults(kernel).items() if n not in values}

    def fill(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` with every computed parameter added."""
        given = [n for n in self.values if n in kwargs or n in self.arg_names[:len(args)]]
        if given:
            raise UsageTypeError(f"{self.__name__}: {', '.join(given)} are computed by tilejit.heuristics; do not "
                                 "pass them")
        named = {**dict(zip(self.arg_names, args)), **kwargs}
        for name, default in self._defaults.items():
            named.setdefault(name, default)
        out = dict(kwargs)
        for name, fn in self.values.items():
            out[name] = named[name] = call_user_function(fn, f"the heuristic computing {name!r}", _HEURISTIC_TAKES,
                                                         named)
        return out

    # -- the kernel interface, so decorators compose -------------------------------------------------------------

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        @entry_point
        def launch(*args: Any, **kwargs: Any) -> None:
            self.kernel[grid](*args, **self.fill(args, kwargs))

        return launch

    @entry_point
    def compile(self, *args: Any, arch: str | None = None, stop_after: str | None = None, **kwargs: Any) -> Any:
        return self.kernel.compile(*args, arch=arch, stop_after=stop_after, **self.fill(args, kwargs))

    @entry_point
    def ir(self, *args: Any, **kwargs: Any) -> str:
        return self.kernel.ir(*args, **self.fill(args, kwargs))

    def source_hash(self) -> str:
        return self.kernel.source_hash()

    def __getattr__(self, name: str) -> Any:
        kernel = self.__dict__.get("kernel")
        if kernel is None:
            raise AttributeError(name)
        return getattr(kernel, name)

    def __repr__(self) -> str:
        return f"<tilejit.heuristics of {self.__name__}: {', '.join(self.values)}>"

    @entry_point
    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise launch_without_grid(self.__name__)
