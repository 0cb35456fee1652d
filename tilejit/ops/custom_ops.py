"""What the PyTorch operators of ``tilejit.ops`` share: their namespace, and launch configs passed through an
operator's schema.

A custom operator's arguments are tensors, scalars and lists of them, never dicts, so a kernel's config (its tile
constexprs and launch options, ``dict(BM=128, BN=64, num_warps=8)``) crosses the operator boundary as a list of
ints (``encode_config``) in the fixed order of ``CONFIG_KEYS``, -1 standing for a key the config leaves out, and is
rebuilt on the other side (``decode_config``) with exactly the keys it had: the launch inside the operator is the
one the caller asked for.
"""
from __future__ import annotations

import itertools
from typing import Any

from tilejit.target import LaunchOptions

#: The tile constexprs of the ops' kernels, then every launch option.
CONFIG_KEYS: tuple[str, ...] = ("BM", "BN", "STAGES") + LaunchOptions.names()
_ABSENT = -1
_FLAGS = frozenset(name for name, value in LaunchOptions().as_dict().items() if type(value) is bool)

_copies = itertools.count(1)


def namespace(module_name: str, installed_name: str) -> str:
    """The operator namespace of a module of ``tilejit.ops``: ``tilejit`` for the installed module
    (``module_name == installed_name``); a fresh one for a copy loaded from its file under another name (the tests
    load copies so that their kernels' launch caches are their own), whose operators must not collide."""
    return "tilejit" if module_name == installed_name else f"tilejit_copy{next(_copies)}"


def encode_config(config: dict[str, Any], what: str) -> list[int]:
    """``config`` as ints in ``CONFIG_KEYS`` order (-1: absent). ``what`` names the config in the error for a key
    the kernels do not take."""
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"{what}: unknown config key(s) {unknown}; the keys are {list(CONFIG_KEYS)}")
    for name, value in config.items():
        if isinstance(value, bool) != (name in _FLAGS) or not isinstance(value, int) or value < 0:
            kind = "True or False" if name in _FLAGS else "a non-negative int"
            raise ValueError(f"{what}: config key {name!r} must be {kind}, got {value!r}")
    return [int(config[name]) if name in config else _ABSENT for name in CONFIG_KEYS]


def decode_config(values: list[int]) -> dict[str, Any]:
    """The config ``encode_config`` encoded."""
    return {name: bool(v) if name in _FLAGS else v for name, v in zip(CONFIG_KEYS, values) if v != _ABSENT}
