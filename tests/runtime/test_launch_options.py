"""Launch options are declared once, as the fields of ``tilejit.target.LaunchOptions``: every consumer (validation,
the compile key, the compiled meta, ``Config``'s keywords and records, the kernel-parameter shadowing rule, the
autotune space's sm_90a-only test) reads the fields. CPU only.

Each test here goes through the declared fields rather than a list of names, so a new option is covered by
adding its field; a variant class with one field more shows the machinery follows the fields; and a source scan
fails if a hand-written list of option names comes back into the package.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit import Config
from tilejit.compiler import Specialization
from tilejit.errors import UsageTypeError, UsageValueError
from tilejit.target import Arch, LaunchOptions, OptionSpec, Target, launch_option, one_of

pytestmark = pytest.mark.usefixtures("fresh_compile_cache")

NAMES = LaunchOptions.names()
PACKAGE = Path(tilejit.__file__).parent


def _default(name: str):
    return LaunchOptions.__dataclass_fields__[name].default


def _set_value(name: str):
    """A valid value of option ``name`` other than its default, found through its declared check."""
    default, check = _default(name), LaunchOptions.spec(name).check
    candidates = [not default] if type(default) is bool else [default + i for i in range(1, 32)]
    return next(v for v in candidates if check.holds(v))


def _key_options(options: LaunchOptions) -> list:
    return Specialization("k", None, "source", (), (), options).key_material("target")["options"]


def test_every_field_is_a_declared_option():
    assert NAMES == tuple(f.name for f in fields(LaunchOptions))
    for f in fields(LaunchOptions):
        spec = LaunchOptions.spec(f.name)
        assert isinstance(spec, OptionSpec) and spec.doc and spec.check.holds(f.default), f.name
        assert spec.implies is None or spec.implies in NAMES, f.name
    assert LaunchOptions().as_dict() == {f.name: f.default for f in fields(LaunchOptions)}


@pytest.mark.parametrize("name", NAMES)
def test_each_option_is_checked_by_its_declaration(name):
    spec = LaunchOptions.spec(name)
    for bad in ("yes", None, 1.5):
        with pytest.raises(UsageValueError, match=f"^{name} must be {re.escape(spec.check.expected)}, got "):
            LaunchOptions(**{name: bad})
        with pytest.raises(UsageValueError, match=f"^Config: {name} must be "):
            Config({}, **{name: bad})
    with pytest.raises(TypeError):
        Target.of("sm_90a", **{name + "_typo": _set_value(name)})


@pytest.mark.parametrize("name", NAMES)
def test_each_option_is_a_config_keyword_and_attribute_and_is_recorded(name):
    value = _set_value(name)
    config = Config({"BM": 64}, **{name: value})
    assert getattr(config, name) == value and getattr(Config({"BM": 64}), name) == _default(name)
    assert config.all_kwargs()[name] == value and config.to_json()[name] == value
    assert f"{name}={value}" in config.identity and f", {name}={value!r}" in repr(config)
    record = config.to_json()
    assert Config(record.pop("kwargs"), **record) == config
    assert config != Config({"BM": 64}) and Config({"BM": 64}, **{name: _default(name)}) == Config({"BM": 64})
    with pytest.raises(ValueError, match=f"pass {name} as a keyword of Config"):
        Config({name: value})


@pytest.mark.parametrize("name", NAMES)
def test_each_option_enters_the_compile_key_only_as_declared(name):
    value = _set_value(name)
    base, changed = _key_options(LaunchOptions()), _key_options(LaunchOptions(**{name: value}))
    assert changed != base
    assert _key_options(LaunchOptions(**{name: _default(name)})) == base
    assert Target.of("sm_90a", **{name: value}).options == LaunchOptions(**{name: value})
    assert getattr(Target.of("sm_90a", **{name: value}), name) == value or name == "persistent"


def test_the_compile_key_of_the_original_options_is_unchanged():
    """Keys made before the options were declared as fields keep hitting: the same tokens in the same order."""
    assert _key_options(LaunchOptions()) == [4, 3]
    every = LaunchOptions(num_warps=8, num_stages=4, split_k=2, warp_specialize=True, persistent=True,
                          pingpong=True, cluster=2, stream_k=True)
    assert _key_options(every) == [8, 4, 2, "warp_specialize", "persistent", "pingpong", "cluster2", "stream_k"]
    assert Config({"BM": 64}, 8, 4, split_k=2).identity == "BM=64, num_warps=8, num_stages=4, split_k=2"


@pytest.mark.parametrize("name", NAMES)
def test_a_kernel_parameter_may_shadow_every_option_but_the_reserved(name):
    namespace: dict = {}
    exec(f"def k(x, {name}):\n    pass", namespace)
    if LaunchOptions.spec(name).reserved:
        with pytest.raises(UsageTypeError, match=f"parameter '{name}' clashes with a launch option"):
            tilejit.kernel(namespace["k"])
        return
    kernel = tilejit.kernel(namespace["k"])
    with pytest.raises(TypeError, match="launch options: ") as info:
        kernel.bind((1, 2), {"bogus": 1})
    listed = str(info.value).split("launch options: ")[1].rstrip(")").split(", ")
    assert listed == [n for n in NAMES if n != name]


def test_implied_options_and_the_grid_walk_follow_the_declarations():
    implied_by = {n: LaunchOptions.spec(n).implies for n in NAMES if LaunchOptions.spec(n).implies}
    assert implied_by["pingpong"] == implied_by["stream_k"] == "persistent"
    for name in NAMES:
        options = LaunchOptions(**{name: _set_value(name)})
        walks = name == "persistent" or implied_by.get(name) == "persistent"
        assert options.walks_grid == walks == Target(Arch("sm_90a"), options).persistent, name
        assert options.in_effect(name) and (name not in implied_by or options.in_effect(implied_by[name]))
        assert options.sm90a_only == LaunchOptions.spec(name).sm90a_only


@dataclass(frozen=True)
class _WithOneMore(LaunchOptions):
    """The declared options and one more, as the next option would be added: one field and its check."""
    ring_split: int = launch_option(1, one_of((1, 3), "a test option"), "an option that does not exist",
                                    implies="persistent")


def test_an_added_field_is_an_option_everywhere_the_class_is_read():
    assert _WithOneMore.names() == (*NAMES, "ring_split")
    with pytest.raises(UsageValueError, match=r"^ring_split must be one of \(1, 3\) \(a test option\), got 2$"):
        _WithOneMore(ring_split=2)
    off, on = _WithOneMore(), _WithOneMore(num_warps=8, ring_split=3)
    assert off.key_tokens() == LaunchOptions().key_tokens() and off.listed() == LaunchOptions().listed()
    assert on.key_tokens() == [8, 3, "ring_split3"]
    assert on.listed() == {"num_warps": 8, "num_stages": 3, "ring_split": 3}
    assert on.as_dict() == {**LaunchOptions(num_warps=8).as_dict(), "ring_split": 3}
    assert on.walks_grid and not off.walks_grid and not on.sm90a_only
    target = Target(Arch("sm_90a"), on)
    assert target.ring_split == 3 and target.persistent and target.threads == 256


@tilejit.kernel
def _double(X, Y, BLOCK: T.constexpr):
    i = T.program_id(0) * BLOCK
    Y[i:i + BLOCK] = X[i:i + BLOCK] * 2.0


def test_the_compiled_meta_records_every_option():
    x = torch.empty(256, device="meta")
    options = {"num_warps": 2, "num_stages": 1}
    compiled = _double.compile(x, x, BLOCK=128, arch="sm_80", **options)
    assert {name: compiled.meta[name] for name in NAMES} == LaunchOptions(**options).as_dict()


def _option_lists(tree: ast.AST):
    """Where ``tree`` lists launch options by hand: a tuple, list or set literal or a parameter list naming two or
    more, or a dict literal keyed by three or more (a table of two, like split_k.py's hints for the two options
    that cut the K loop, or the compiled meta's facts ``cluster`` and ``stream_k``, is about those options, not
    a list of all of them)."""
    names = set(NAMES)
    for node in ast.walk(tree):
        least = 2
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items, least = [k for k in node.keys if k is not None], 3
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            params = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
            if len(names.intersection(params)) >= 2:
                yield node.lineno, sorted(names.intersection(params))
            continue
        else:
            continue
        named = [i.value for i in items if isinstance(i, ast.Constant) and i.value in names]
        if len(named) >= least:
            yield node.lineno, named


def test_no_module_lists_the_options_by_hand():
    """Only ``target.py`` declares the options: a list of them elsewhere in the package (``_option_lists``) is a
    second declaration that the next option would have to be added to."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "target.py" and path.parent == PACKAGE:
            continue
        for lineno, named in _option_lists(ast.parse(path.read_text(), str(path))):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{lineno}: {named}")
    assert found == []


def test_the_scan_finds_a_hand_written_list():
    source = ("SHADOW = frozenset({'split_k', 'pingpong'})\n"
              "def config(kwargs, num_warps=4, num_stages=3):\n    pass\n"
              "META = {'num_warps': 4, 'num_stages': 3, 'split_k': 1}\n"
              "HINTS = {'split_k': 'off', 'stream_k': 'off'}\n")
    assert sorted(line for line, _ in _option_lists(ast.parse(source))) == [1, 2, 4]
