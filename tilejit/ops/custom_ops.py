"""What the PyTorch operators of ``tilejit.ops`` share: their namespace, launch configs passed through an
operator's schema, and ``Operator``, which registers one and gives plain eager calls a road around its dispatch.

A custom operator's arguments are tensors, scalars and lists of them, never dicts, so a kernel's config (its tile
constexprs and launch options, ``dict(BM=128, BN=64, num_warps=8)``) crosses the operator boundary as a list of
ints (``encode_config``) in the fixed order of ``CONFIG_KEYS``, -1 standing for a key the config leaves out, and is
rebuilt on the other side (``decode_config``) with exactly the keys it had: the launch inside the operator is the
one the caller asked for.
"""
from __future__ import annotations

import itertools
from typing import Any

import torch

from tilejit.errors import ArgumentValueError
from tilejit.target import LaunchOptions

#: The tile constexprs of the ops' kernels, then every launch option.
CONFIG_KEYS: tuple[str, ...] = ("BM", "BN", "STAGES") + LaunchOptions.names()
_ABSENT = -1
_TILES = frozenset(("BM", "BN", "STAGES"))
_FLAGS = frozenset(name for name, value in LaunchOptions().as_dict().items() if type(value) is bool)

_copies = itertools.count(1)
_SM_COUNTS: dict[int, int] = {}  # CUDA device index -> SMs (a device property read costs microseconds a call)


def namespace(module_name: str, installed_name: str) -> str:
    """The operator namespace of a module of ``tilejit.ops``: ``tilejit`` for the installed module
    (``module_name == installed_name``); a fresh one for a copy loaded from its file under another name (the tests
    load copies so that their kernels' launch caches are their own), whose operators must not collide."""
    return "tilejit" if module_name == installed_name else f"tilejit_copy{next(_copies)}"


def sm_count(device: torch.device) -> int:
    """The SM count of a CUDA ``device``, read once per device (the ops' launches ask on every call)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    count = _SM_COUNTS.get(index)
    if count is None:
        count = _SM_COUNTS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return count


def encode_config(config: dict[str, Any], what: str) -> list[int]:
    """``config`` as ints in ``CONFIG_KEYS`` order (-1: absent). ``what`` names the config in the error for a key
    the kernels do not take."""
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise ArgumentValueError(f"{what}: unknown config key(s) {unknown}; the keys are {list(CONFIG_KEYS)}")
    for name, value in config.items():
        if isinstance(value, bool) != (name in _FLAGS) or not isinstance(value, int) or value < 0:
            kind = "True or False" if name in _FLAGS else "a non-negative int"
            raise ArgumentValueError(f"{what}: config key {name!r} must be {kind}, got {value!r}")
        if name in _TILES and value < 1:  # (a 0 tile divided by zero, or failed inside the kernel's source)
            raise ArgumentValueError(f"{what}: config key {name!r} must be a positive int, got {value!r}")
    return [int(config[name]) if name in config else _ABSENT for name in CONFIG_KEYS]


def decode_config(values: list[int]) -> dict[str, Any]:
    """The config ``encode_config`` encoded."""
    return {name: bool(v) if name in _FLAGS else v for name, v in zip(CONFIG_KEYS, values) if v != _ABSENT}


class Operator:
    """One function of ``tilejit.ops`` as a PyTorch operator ``name`` (``op``: what ``torch.compile``, export,
    dispatch modes and tensor subclasses see) that a plain eager call reaches by a shorter road.

    The operator's dispatch (schema parsing, the redispatch through autograd, aliasing checks) costs tens of
    microseconds of host time a call, which an op whose kernels run in tens of microseconds cannot afford. So a call
    with plain tensors, outside compilation, with no dispatch mode or functorch transform active, runs the same
    ``impl``, ``setup_context`` and ``backward`` through an ``autograd.Function`` when a gradient is recorded, and
    ``impl`` itself otherwise: the same kernels, results and saved tensors, without the dispatcher. Every other call
    goes through ``op``. Ops that mutate an argument always go through ``op`` (it bumps the version counters
    autograd checks).

    ``materialize_grads=False``: ``backward`` takes None for an output nobody used (no zero tensors are made for
    it); the operator's own autograd passes zeros there instead, which such a backward must also take."""

    def __init__(self, name: str, impl, *, fake=None, mutates_args=(), backward=None, setup_context=None,
                 materialize_grads: bool = True):
        self.op = torch.library.custom_op(name, mutates_args=mutates_args)(impl)
        if fake is not None:  # (an operator that returns nothing has one already)
            self.op.register_fake(fake)
        self.impl = impl
        self._function = None
        self._direct = not mutates_args
        if backward is not None:
            self.op.register_autograd(backward, setup_context=setup_context)
            self._function = _autograd_function(name, impl, setup_context, backward, materialize_grads)

    def __call__(self, *args):
        if not self._direct or not _plain_eager(args):
            return self.op(*args)
        if torch.is_grad_enabled() and _any_requires_grad(args):
            if self._function is None:
                return self.op(*args)  # no gradient formula: the operator says so
            return self._function.apply(*args)
        return self.impl(*args)


def _plain_eager(args) -> bool:
    """Whether a call is plain eager PyTorch: not traced, no mode or transform active, plain tensors with data."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() \
            or torch._C._are_functorch_transforms_active():
        return False
    for a in args:
        if isinstance(a, torch.Tensor):
            if not _plain_tensor(a):
                return False
        elif type(a) is list or type(a) is tuple:
            if not all(_plain_tensor(item) for item in a if isinstance(item, torch.Tensor)):
                return False
    return True


def _plain_tensor(t: torch.Tensor) -> bool:
    """A tensor with data of its own (meta tensors take the operator's shape function)."""
    return (type(t) is torch.Tensor or type(t) is torch.nn.Parameter) and not t.is_meta


def _any_requires_grad(args) -> bool:
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.requires_grad:
                return True
        elif type(a) is list or type(a) is tuple:
            if any(isinstance(item, torch.Tensor) and item.requires_grad for item in a):
                return True
    return False


def _autograd_function(name: str, impl, setup_context, backward, materialize_grads: bool):
    """An ``autograd.Function`` running ``impl`` forward (``setup_context`` saving what ``backward`` reads), as the
    operator's registered autograd does."""

    def forward(ctx, *args):
        output = impl(*args)
        ctx.set_materialize_grads(materialize_grads)
        setup_context(ctx, args, output)
        return output

    def run_backward(ctx, *grads):
        return backward(ctx, *grads)

    return type(f"Eager_{name.replace('::', '_')}", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(run_backward)})
