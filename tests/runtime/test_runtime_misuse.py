"""A user's mistake at the runtime's doors (the grid, the arguments, autotune, heuristics, the environment knobs) is a
typed tilejit error that names what to fix, raised when the mistake is made, never an internal error from deep inside;
and what the user passes is not misread (a NumPy scalar is its value, a key argument left out is its default)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit import knobs
from tilejit.autotuner import AutotuneError, Config, autotune
from tilejit.errors import ArgumentError, InternalError, UsageTypeError, UsageValueError
from tilejit.runtime.jit import _exact_constant


@pytest.fixture(autouse=True)
def _interpret(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TILEJIT_AUTOTUNE", raising=False)


@tilejit.kernel
def add_one(X, Y, N, BLOCK: T.constexpr):
    i = T.program_id(0) * BLOCK
    Y[i:i + BLOCK] = X[i:i + BLOCK] + 1.0


@tilejit.kernel
def add_flagged(X, Y, N, BLOCK: T.constexpr, FLAG: T.constexpr):
    i = T.program_id(0) * BLOCK
    if FLAG:
        Y[i:i + BLOCK] = X[i:i + BLOCK] + 1.0
    else:
        Y[i:i + BLOCK] = X[i:i + BLOCK] - 1.0


@tilejit.kernel
def add_defaulted(X, Y, N=32, BLOCK: T.constexpr = 16):
    i = T.program_id(0) * BLOCK
    Y[i:i + BLOCK] = X[i:i + BLOCK] + 1.0


def vectors(n=32):
    return torch.randn(n), torch.full((n,), float("nan"))


def two_configs():
    return [Config({"BLOCK": 16}), Config({"BLOCK": 32})]


def by_block(meta):
    return (32 // meta["BLOCK"],)


def assert_typed(error: BaseException, *names: str) -> None:
    assert not isinstance(error, InternalError) and "tilejit bug" not in str(error), error
    for name in names:
        assert name in str(error), (name, str(error))


# -- the grid -------------------------------------------------------------------------------------------------

def test_grid_entry_tensor_of_several_elements_is_refused_naming_the_entry():
    x, y = vectors()
    with pytest.raises(ArgumentError) as info:
        add_one[(torch.tensor([2, 3]),)](x, y, 32, BLOCK=16)
    assert_typed(info.value, "grid entry 0", "2 elements", "tuple of 1 to 3 ints")
    with pytest.raises(ArgumentError) as info:
        add_one[(2, np.array([1, 1]))](x, y, 32, BLOCK=16)
    assert_typed(info.value, "grid entry 1", "ndarray")


def test_grid_entry_of_one_element_tensor_is_its_value():
    x, y = vectors()
    add_one[(torch.tensor(2),)](x, y, 32, BLOCK=16)
    torch.testing.assert_close(y, x + 1.0)


# -- tensor arguments -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_tensor_argument_is_refused_naming_the_parameter(layout):
    x, y = vectors()
    sparse = x.to_sparse() if layout == "coo" else x.reshape(4, 8).to_sparse_csr()
    with pytest.raises(ArgumentError) as info:
        add_one[(2,)](sparse, y, 32, BLOCK=16)
    assert_typed(info.value, "argument 'X'", "sparse", "dense strided tensors", "X.to_dense()")


# -- NumPy scalars --------------------------------------------------------------------------------------------

def test_numpy_scalars_are_taken_as_their_python_values():
    x, y = vectors()
    add_flagged[(2,)](x, y, np.int64(32), BLOCK=np.int64(16), FLAG=np.bool_(True))
    torch.testing.assert_close(y, x + 1.0)
    add_flagged[(2,)](x, y, 32, BLOCK=16, FLAG=np.bool_(False))
    torch.testing.assert_close(y, x - 1.0)
    # the same specialization as the Python values: one kernel for both
    as_numpy = add_flagged.bind((x, y, np.int64(32)), {"BLOCK": np.int64(16), "FLAG": np.bool_(True)})
    as_python = add_flagged.bind((x, y, 32), {"BLOCK": 16, "FLAG": True})
    assert as_numpy.spec.key("ir") == as_python.spec.key("ir")
    assert type(as_numpy.values["FLAG"]) is bool and type(as_numpy.values["N"]) is int


def test_numpy_float_constexprs_sign_the_fast_path_by_their_bits():
    # 0.0 and -0.0 are two kernels: a NumPy -0.0 must not match a launch remembered for 0.0
    assert _exact_constant(np.float64(-0.0)) != _exact_constant(np.float64(0.0))
    assert _exact_constant(np.float32(-0.0)) != _exact_constant(np.float32(0.0))
    assert _exact_constant(np.bool_(True)) != _exact_constant(np.bool_(False))


# -- autotune: callbacks --------------------------------------------------------------------------------------

def tuned(**options):
    return autotune(configs=options.pop("configs", two_configs()), key=options.pop("key", ["N"]), **options)(add_one)


def test_perf_model_returning_none_is_named():
    tuner = tuned(prune_configs_by={"perf_model": lambda **kwargs: None, "top_k": 1})
    x, y = vectors()
    with pytest.raises(UsageTypeError) as info:
        tuner[by_block](x, y, 32)
    assert_typed(info.value, "perf_model", "returned NoneType None", "estimated time in ms", "missing return")


def test_perf_model_sees_launch_keywords_once():
    seen = []
    tuner = tuned(prune_configs_by={"perf_model": lambda **kwargs: seen.append(kwargs) or kwargs["BLOCK"],
                                    "top_k": 1})
    x, y = vectors()
    tuner[by_block](x, y, N=32)
    assert tuner.best_config.kwargs == {"BLOCK": 16} and seen[0]["N"] == 32
    torch.testing.assert_close(y, x + 1.0)


@pytest.mark.parametrize("returned, what", [(None, "returned NoneType None"),
                                            ([{"BLOCK": 16}], "item 0 is a dict")])
def test_early_config_prune_returning_no_configs_is_named(returned, what):
    tuner = tuned(prune_configs_by={"early_config_prune": lambda configs, named, **kwargs: returned})
    x, y = vectors()
    with pytest.raises(UsageTypeError) as info:
        tuner[by_block](x, y, 32)
    assert_typed(info.value, "early_config_prune", what, "Config")


@pytest.mark.parametrize("top_k, error", [("1", UsageTypeError), (True, UsageTypeError), (-1, UsageValueError),
                                          (0, UsageValueError), (0.0, UsageValueError), (1.5, UsageValueError)])
def test_top_k_is_checked_when_decorating(top_k, error):
    with pytest.raises(error) as info:
        tuned(prune_configs_by={"perf_model": lambda **kwargs: 1.0, "top_k": top_k})
    assert_typed(info.value, "top_k", repr(top_k), "an int of at least 1", "(0, 1]")


def test_top_k_without_perf_model_is_refused():
    with pytest.raises(UsageValueError) as info:
        tuned(prune_configs_by={"top_k": 1})
    assert_typed(info.value, "top_k", "no perf_model")


@pytest.mark.parametrize("top_k, timed", [(1, 1), (0.5, 2), (1.0, 4)])
def test_valid_top_k_keeps_that_many_configs(top_k, timed):
    configs = [Config({"BLOCK": b}) for b in (4, 8, 16, 32)]
    tuner = tuned(configs=configs, prune_configs_by={"perf_model": lambda **kwargs: kwargs["BLOCK"], "top_k": top_k},
                  bench_fn=lambda run: run() or 1.0)
    x, y = vectors()
    tuner[by_block](x, y, 32)
    assert len(tuner.stats.timed) == timed


# -- autotune and heuristics: decorating ----------------------------------------------------------------------

def test_autotune_configs_must_be_configs():
    with pytest.raises(UsageTypeError) as info:
        tuned(configs=[{"BLOCK": 16}])
    assert_typed(info.value, "item 0 is a dict", "tilejit.Config({'BLOCK': 16})")
    with pytest.raises(UsageTypeError) as info:
        tuned(configs=Config({"BLOCK": 16}))
    assert_typed(info.value, "a list of tilejit.Config")


@pytest.mark.parametrize("key", [None, 3, ["N", 2]])
def test_autotune_key_must_be_parameter_names(key):
    with pytest.raises(UsageTypeError) as info:
        tuned(key=key)
    assert_typed(info.value, "autotune(key=...)", "parameter names", "key=['N']")


def test_autotune_reset_to_zero_takes_one_name_as_a_string():
    tuner = tuned(reset_to_zero="Y")
    assert tuner.reset_to_zero == ["Y"]


def test_autotune_and_heuristics_refuse_a_plain_function():
    def plain(X, N, BLOCK):
        pass

    with pytest.raises(UsageTypeError) as info:
        autotune(configs=two_configs(), key=["N"])(plain)
    assert_typed(info.value, "@tilejit.autotune(...) wraps a @tilejit.kernel", "'plain'", "@tilejit.kernel")
    with pytest.raises(UsageTypeError) as info:
        tilejit.heuristics({"BLOCK": lambda args: 16})(plain)
    assert_typed(info.value, "@tilejit.heuristics({...}) wraps a @tilejit.kernel", "'plain'")


def test_kernel_refuses_what_is_not_a_function():
    with pytest.raises(UsageTypeError) as info:
        tilejit.kernel(tuned())
    assert_typed(info.value, "@tilejit.kernel takes a Python function", "below @tilejit.autotune")
    with pytest.raises(UsageTypeError) as info:
        tilejit.kernel(add_one)
    assert_typed(info.value, "already a kernel")


def test_heuristics_take_a_dict_of_functions():
    with pytest.raises(UsageTypeError) as info:
        tilejit.heuristics({"BLOCK": 16})
    assert_typed(info.value, "'BLOCK'", "int 16", "function")


@pytest.mark.parametrize("kwargs, hint", [(None, "Config({})"), ("BLOCK=16", "not a string"),
                                          ({1: 16}, "not a parameter name")])
def test_config_takes_a_dict_of_names(kwargs, hint):
    with pytest.raises(UsageTypeError) as info:
        Config(kwargs)
    assert_typed(info.value, "Config", hint)


def test_config_pre_hook_must_be_callable():
    with pytest.raises(UsageTypeError) as info:
        Config({"BLOCK": 16}, pre_hook=3)
    assert_typed(info.value, "pre_hook", "function")


def test_prune_configs_by_unknown_entry_is_a_usage_error():
    with pytest.raises(UsageValueError) as info:
        tuned(prune_configs_by={"topk": 1})
    assert_typed(info.value, "unknown entries ['topk']", "did you mean 'top_k'")


# -- autotune: launching --------------------------------------------------------------------------------------

def test_autotune_key_left_at_its_default_takes_the_default():
    seen = []
    tuner = autotune(configs=two_configs(), key=["N"],
                     prune_configs_by={"early_config_prune": lambda configs, named, **kwargs:
                                       seen.append(named["N"]) or configs})(add_defaulted)
    x, y = vectors()
    tuner[by_block](x, y)
    torch.testing.assert_close(y, x + 1.0)
    assert seen == [32]


def test_heuristics_see_a_default_left_out():
    kernel = tilejit.heuristics({"BLOCK": lambda args: args["N"] // 2})(add_defaulted)
    x, y = vectors()
    kernel[(2,)](x, y)
    torch.testing.assert_close(y, x + 1.0)


@pytest.mark.parametrize("wrap", ["autotune", "heuristics"])
def test_wrapped_kernel_called_without_a_grid_says_so(wrap):
    kernel = tuned() if wrap == "autotune" else tilejit.heuristics({"BLOCK": lambda args: 16})(add_one)
    x, y = vectors()
    with pytest.raises(ArgumentError) as info:
        kernel(x, y, 32)
    assert_typed(info.value, "launch a kernel with a grid", "add_one[grid](...)")


@tilejit.kernel
def needs_block_64(X, Y, N, BLOCK: T.constexpr):
    assert BLOCK == 64, "BLOCK must be 64"
    i = T.program_id(0) * BLOCK
    Y[i:i + BLOCK] = X[i:i + BLOCK] + 1.0


def test_all_configs_failing_names_the_first_failure_and_chains_it():
    tuner = autotune(configs=two_configs(), key=["N"])(needs_block_64)
    x, y = vectors()
    with pytest.raises(AutotuneError) as info:
        tuner[(1,)](x, y, 32)
    headline = str(info.value).splitlines()[0]
    assert "all 2 configs failed" in headline
    assert "the first config (BLOCK=16, num_warps=4, num_stages=3)" in headline
    assert "TypeCheckError" in headline and "BLOCK must be 64" in headline
    assert isinstance(info.value.__cause__, tilejit.TypeCheckError)


# -- environment knobs ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("variable, value, knob, accepts", [
    ("TILEJIT_LOCK_TIMEOUT", "abc", knobs.lock_timeout_s, "number of seconds"),
    ("TILEJIT_LOCK_TIMEOUT", "-1", knobs.lock_timeout_s, "number of seconds"),
    ("TILEJIT_LOCK_TIMEOUT", "nan", knobs.lock_timeout_s, "number of seconds"),
    ("TILEJIT_COMPILE_WORKERS", "abc", knobs.compile_workers, "whole number"),
    ("TILEJIT_COMPILE_WORKERS", "0", knobs.compile_workers, "whole number"),
    ("TILEJIT_INTERPRET", "maybe", knobs.interpret, "0/false/no/off"),
    ("TILEJIT_AUTOTUNE", "sometimes", knobs.autotune_enabled, "1/true/yes/on"),
    ("TILEJIT_NATIVE_LAUNCH", "2", knobs.native_launch, "1/true/yes/on"),
    ("TILEJIT_TRACEBACK", "verbose", knobs.full_traceback, "full"),
])
def test_knob_with_a_value_it_does_not_take_is_named(monkeypatch, variable, value, knob, accepts):
    monkeypatch.setenv(variable, value)
    with pytest.raises(UsageValueError) as info:
        knob()
    assert_typed(info.value, variable, repr(value), accepts)


@pytest.mark.parametrize("value, on", [("1", True), ("TRUE", True), (" Yes ", True), ("on", True), ("0", False),
                                       ("False", False), ("NO", False), ("off", False), ("", False)])
def test_boolean_knobs_take_the_usual_spellings(monkeypatch, value, on):
    monkeypatch.setenv("TILEJIT_DUMP_IR", value)
    assert knobs.dump_ir() is on


def test_number_knobs_take_numbers(monkeypatch):
    monkeypatch.setenv("TILEJIT_LOCK_TIMEOUT", " 2.5 ")
    monkeypatch.setenv("TILEJIT_COMPILE_WORKERS", "3")
    assert knobs.lock_timeout_s() == 2.5 and knobs.compile_workers() == 3
    monkeypatch.setenv("TILEJIT_LOCK_TIMEOUT", "inf")
    assert knobs.lock_timeout_s() == float("inf")


def test_launch_under_a_misspelt_interpret_knob_names_it(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "maybe")
    x, y = vectors()
    with pytest.raises(UsageValueError) as info:
        add_one[(2,)](x, y, 32, BLOCK=16)
    assert_typed(info.value, "TILEJIT_INTERPRET='maybe'")
