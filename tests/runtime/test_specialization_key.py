"""The specialization key: every component that should recompile changes it, nothing else does. CPU only.

The key is observed where the runtime uses it: ``kernel.compile(...)`` asks the process's kernel cache for
``get_or_compile(key, ...)``. A recording stand-in for that cache captures the key and compiles nothing, so
the derivation under test is the real one (``bind`` -> specs -> key material -> arch and NVRTC version).

What the implementation promises about source text (and these tests pin down): the key hashes the kernel's
own source lines (decorators included) and those of every ``@tilejit.func`` it calls, verbatim. So editing a
comment or the whitespace *inside* the kernel recompiles; code added elsewhere in the file (which moves the
kernel to other line numbers) and the file's path do not.
"""
from __future__ import annotations

import importlib.util
import itertools
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit.backend_cuda import nvrtc
from tilejit import compiler
from tilejit.runtime import jit, launch
from tilejit.cache import CacheEntry

REPO = Path(__file__).resolve().parents[2]


@tilejit.func
def affine(x, s):
    return x * s + 1.0


@tilejit.kernel
def scale(X, Y, s, n, BLOCK: T.constexpr):
    i = T.program_id(0) * BLOCK
    Y[i:i + BLOCK] = affine(X[i:i + BLOCK].to(T.float32), s) + n


@tilejit.kernel
def matmul(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    M, K = A.shape
    N = B.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, stages=3):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def extent(X, Y, BLOCK: T.constexpr):
    """Reads only X's extent, so X may have any rank."""
    i = T.program_id(0) * BLOCK
    Y[i:i + BLOCK] = T.full((BLOCK,), 1.0, T.float32) * X.shape[0]


class KeyRecorder:
    """Stands in for the kernel cache: records each key asked for and compiles nothing."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def lookup(self, key, validate=None):
        return None  # nothing is on disk: every compile asks get_or_compile

    def read_extents(self, source_hash):
        return {}

    def write_extents(self, source_hash, kernel_name, extents):
        pass

    def get_or_compile(self, key, compile_fn, validate=None):
        self.keys.append(key)
        meta = {"key": key, "kernel": "stub", "kernel_symbol": "tj_stub", "arch": "sm_80", "param_kinds": [],
                "shared_bytes": 0, "threads": 128, "binary": "kernel.cubin"}
        return CacheEntry(key, None, meta, {"kernel.cubin": b""}), "compiled"


@pytest.fixture
def recorder(monkeypatch):
    rec = KeyRecorder()
    monkeypatch.setattr(jit, "default_cache", lambda: rec)
    return rec


def key_of(kernel, *args, arch: str = "sm_80", **meta) -> str:
    """The disk-cache key ``kernel.compile(*args, arch=arch, **meta)`` uses (a fresh Kernel each time, so
    no in-memory state of an earlier call can mask a difference)."""
    return tilejit.kernel(kernel.fn).compile(*args, arch=arch, **meta).key


def vec(n: int = 1024, dtype=torch.float32, device: str = "meta") -> torch.Tensor:
    return torch.empty(n, dtype=dtype, device=device)


def scale_key(X=None, Y=None, s=0.5, n=3, **meta) -> str:
    meta.setdefault("BLOCK", 128)
    return key_of(scale, vec() if X is None else X, vec() if Y is None else Y, s, n, **meta)


# ---- stability --------------------------------------------------------------------------------------------

def test_key_is_a_sha256_and_repeats(recorder):
    first, second = scale_key(), scale_key()
    assert first == second and len(first) == 64 and int(first, 16) >= 0
    assert recorder.keys == [first, second]


_KEY_IN_CHILD = """
import sys, torch
sys.path[:0] = {tests!r}
from tilejit.runtime import jit
import test_specialization_key as t
jit.default_cache = lambda: t.KeyRecorder()
a = torch.empty(256, 512, dtype=torch.float16, device="meta")
b = torch.empty(512, 128, dtype=torch.float16, device="meta")
print(t.key_of(t.matmul, a, b, b, BM=128, BN=128, BK=32, num_warps=4, arch="sm_90a"))
print(t.scale_key(n=16, num_stages=2))
"""


def test_key_is_the_same_in_fresh_processes_with_different_hash_seeds(recorder):
    # A key that depended on set/dict order, id() or the process would miss the disk cache in every new run.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    code = _KEY_IN_CHILD.format(tests=[str(REPO / "tests" / "runtime"), str(REPO / "tests")])
    outs = []
    for seed in ("1", "2"):
        done = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONHASHSEED": seed},
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        outs.append(done.stdout.split())
    a = torch.empty(256, 512, dtype=torch.float16, device="meta")
    b = torch.empty(512, 128, dtype=torch.float16, device="meta")
    here = [key_of(matmul, a, b, b, BM=128, BN=128, BK=32, num_warps=4, arch="sm_90a"),
            scale_key(n=16, num_stages=2)]
    assert outs[0] == outs[1] == here


# ---- each component changes the key ----------------------------------------------------------------------

def _misaligned(n: int = 1024, dtype=torch.float32) -> torch.Tensor:
    t = torch.empty(n + 1, dtype=dtype)[1:]
    assert t.data_ptr() % 16 != 0
    return t


@pytest.mark.parametrize("change", [
    pytest.param(dict(X=vec(dtype=torch.float16)), id="tensor-dtype"),
    pytest.param(dict(Y=vec(dtype=torch.bfloat16)), id="output-dtype"),
    pytest.param(dict(X=vec(2048)[::2]), id="unit-stride-dims"),
    pytest.param(dict(n=1), id="int-equals-one"),
    pytest.param(dict(n=16), id="int-divisible-by-16"),
    pytest.param(dict(BLOCK=256), id="constexpr-value"),
    pytest.param(dict(num_warps=8), id="num_warps"),
    pytest.param(dict(num_stages=2), id="num_stages"),
    pytest.param(dict(arch="sm_90a"), id="arch"),
])
def test_each_specialization_component_changes_the_key(recorder, change):
    assert scale_key(**change) != scale_key()


def test_16_byte_alignment_changes_the_key(recorder):
    aligned = torch.empty(1024)
    assert aligned.data_ptr() % 16 == 0
    assert scale_key(X=_misaligned()) != scale_key(X=aligned)
    assert scale_key(Y=_misaligned()) != scale_key(Y=aligned)


def test_rank_changes_the_key(recorder):
    keys = {key_of(extent, torch.empty(*[4] * rank, device="meta"), vec(), BLOCK=128) for rank in (1, 2, 3)}
    assert len(keys) == 3


def test_operand_major_changes_the_matmul_key(recorder):
    a = torch.empty(256, 256, dtype=torch.float16, device="meta")
    bt = torch.empty(256, 256, dtype=torch.float16, device="meta").t()  # column-major B
    meta = dict(BM=128, BN=128, BK=32)
    assert key_of(matmul, a, bt, a, **meta) != key_of(matmul, a, a, a, **meta)


def test_nvrtc_version_changes_the_key(recorder, monkeypatch):
    before = scale_key()
    major, minor = nvrtc.nvrtc_version()
    monkeypatch.setattr(nvrtc, "nvrtc_version", lambda: (major, minor + 1))
    assert scale_key() != before


def test_tilejit_version_changes_the_key(recorder, monkeypatch):
    before = scale_key()
    monkeypatch.setattr(compiler, "__version__", compiler.__version__ + ".post1")
    assert scale_key() != before


# ---- what does not change the key -------------------------------------------------------------------------

def test_tensor_sizes_and_addresses_do_not_change_the_key(recorder):
    base = scale_key(X=torch.empty(1024), Y=torch.empty(1024))
    assert scale_key(X=torch.empty(4096), Y=torch.empty(77)) == base
    assert scale_key(X=torch.empty(2048)[::2].contiguous(), Y=torch.empty(1024)[16:]) == base
    a, b = (torch.empty(m, k, dtype=torch.float16, device="meta") for m, k in ((512, 512), (512, 512)))
    a2, b2, c2 = (torch.empty(m, k, dtype=torch.float16, device="meta") for m, k in ((300, 1000), (1000, 72),
                                                                                    (300, 72)))
    meta = dict(BM=128, BN=128, BK=32)
    assert key_of(matmul, a, b, a, **meta) == key_of(matmul, a2, b2, c2, **meta)


@pytest.mark.parametrize("same", [(3, 5), (7, -9), (16, 32), (48, -16), (17, 33)], ids=str)
def test_int_values_with_the_same_properties_share_a_key(recorder, same):
    assert scale_key(n=same[0]) == scale_key(n=same[1])


def test_float_values_share_a_key(recorder):
    assert scale_key(s=0.5) == scale_key(s=-3.0) == scale_key(s=1.0)


def test_explicit_default_launch_options_share_the_default_key(recorder, monkeypatch):
    """With the launch model off; with it on, a launch that leaves its pipeline unsaid is told apart (the model
    may choose other values: passes/launch_model.py), and one that gives num_stages is not."""
    defaults = jit.LAUNCH_OPTIONS
    assert scale_key(**defaults) != scale_key()
    assert scale_key(**defaults) == scale_key(num_stages=defaults["num_stages"])
    monkeypatch.setenv("TILEJIT_LAUNCH_MODEL", "0")
    assert scale_key(**defaults) == scale_key()


# ---- source text ------------------------------------------------------------------------------------------

KERNEL_FILE = '''
import tilejit
import tilejit.language as T

OFFSET = {offset}


@tilejit.func
def affine(x, s):
    return x * s + {helper_const}


{padding}@tilejit.kernel
def scale(X, Y, s, n, BLOCK: T.constexpr):
    i = T.program_id(0) * BLOCK{comment}
    Y[i:i + BLOCK] = affine(X[i:i + BLOCK].to(T.float32), s) + {body_const}
'''
BASE = dict(offset="1.0", helper_const="1.0", padding="", comment="", body_const="n")


def _load(tmp_path: Path, name: str, **changes) -> tilejit.Kernel:
    path = tmp_path / name / "kernels.py"
    path.parent.mkdir(parents=True)
    path.write_text(KERNEL_FILE.format(**{**BASE, **changes}))
    spec = importlib.util.spec_from_file_location(f"tj_keytest_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.scale


def _file_key(tmp_path: Path, name: str, **changes) -> str:
    return key_of(_load(tmp_path, name, **changes), vec(), vec(), 0.5, 3, BLOCK=128)


@pytest.mark.parametrize("change", [
    pytest.param(dict(body_const="n * 2"), id="kernel-body"),
    pytest.param(dict(helper_const="2.0"), id="helper-body"),
    pytest.param(dict(comment="  # a comment inside the kernel"), id="comment-inside-kernel"),
])
def test_source_changes_recompile(recorder, tmp_path, change):
    assert _file_key(tmp_path, "changed", **change) != _file_key(tmp_path, "base")


def test_a_global_constant_the_kernel_reads_is_part_of_the_key(recorder, tmp_path):
    one = _file_key(tmp_path, "one", body_const="n + OFFSET", offset="1.0")
    two = _file_key(tmp_path, "two", body_const="n + OFFSET", offset="2.0")
    assert one != two


def test_changes_outside_the_kernel_do_not_recompile(recorder, tmp_path):
    base = _file_key(tmp_path, "base")
    # Lines added above move the kernel; an unread global changes; the file lives in another directory.
    assert _file_key(tmp_path, "moved", padding="# a comment\n\n\nUNUSED = 3\n\n\n") == base
    assert _file_key(tmp_path, "unread_global", offset="5.0") == base


# ---- the respecialization warning -------------------------------------------------------------------------

def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tilejit" and r.levelno == logging.WARNING]


def _names(message: str, *names: str) -> dict[str, bool]:
    return {n: re.search(rf"\b{n}\b", message) is not None for n in names}


def test_eighth_specialization_warns_once_naming_the_constexpr(recorder, caplog):
    caplog.set_level(logging.WARNING, logger="tilejit")
    kernel = tilejit.kernel(scale.fn)
    for k in range(7):
        kernel.compile(vec(), vec(), 0.5, 3, BLOCK=2 ** (k + 4), arch="sm_80")
    assert _warnings(caplog) == []
    for k in range(11, 15):  # the 8th, then three more
        kernel.compile(vec(), vec(), 0.5, 3, BLOCK=2 ** k, arch="sm_80")
    messages = _warnings(caplog)
    assert len(messages) == 1, messages
    assert "scale" in messages[0]
    assert _names(messages[0], "BLOCK", "X", "Y", "s", "n") == \
        {"BLOCK": True, "X": False, "Y": False, "s": False, "n": False}


def test_repeating_a_specialization_does_not_count(recorder, caplog):
    caplog.set_level(logging.WARNING, logger="tilejit")
    kernel = tilejit.kernel(scale.fn)
    for _ in range(3):
        for block in (16, 32, 64, 128, 256, 512, 1024):
            kernel.compile(vec(), vec(), 0.5, 3, BLOCK=block, arch="sm_80")
            kernel.compile(vec(), vec(), 0.5, 3, BLOCK=block, arch="sm_90a")  # another arch is no respecialization
    assert _warnings(caplog) == []


def test_specialization_warning_names_a_varying_tensor_argument(recorder, caplog):
    caplog.set_level(logging.WARNING, logger="tilejit")
    kernel = tilejit.kernel(scale.fn)
    dtypes = [torch.float32, torch.float16, torch.bfloat16]
    # Only X varies: 3 dtypes x (aligned, misaligned) + 2 strided = 8 specializations.
    xs = [torch.empty(1024, dtype=d) for d in dtypes] + [_misaligned(dtype=d) for d in dtypes] + \
         [torch.empty(2048, dtype=d)[::2] for d in dtypes[:2]]
    for x in xs:
        kernel.compile(x, vec(), 0.5, 3, BLOCK=128, arch="sm_80")
    messages = _warnings(caplog)
    assert len(messages) == 1, messages
    assert _names(messages[0], "X", "Y", "BLOCK", "n") == {"X": True, "Y": False, "BLOCK": False, "n": False}


def test_specialization_warning_names_a_varying_int_argument(recorder, caplog):
    caplog.set_level(logging.WARNING, logger="tilejit")
    kernel = tilejit.kernel(scale.fn)
    # n's properties take only 3 values (== 1, divisible by 16, neither): vary X's dtype too to reach 8.
    for n in (1, 16, 3):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            kernel.compile(vec(dtype=dtype), vec(), 0.5, n, BLOCK=128, arch="sm_80")
    messages = _warnings(caplog)
    assert len(messages) == 1, messages
    assert _names(messages[0], "n", "X", "Y", "BLOCK") == {"n": True, "X": True, "Y": False, "BLOCK": False}


def test_specialization_warning_for_varying_launch_options(recorder, caplog):
    caplog.set_level(logging.WARNING, logger="tilejit")
    kernel = tilejit.kernel(scale.fn)
    for stages in range(1, 9):
        kernel.compile(vec(), vec(), 0.5, 3, BLOCK=128, num_stages=stages, arch="sm_80")
    messages = _warnings(caplog)
    assert len(messages) == 1, messages
    assert _names(messages[0], "num_stages", "num_warps", "X", "Y", "BLOCK", "n") == \
        {"num_stages": True, "num_warps": False, "X": False, "Y": False, "BLOCK": False, "n": False}
    assert "autotune" in messages[0]  # the hint fits launch options, not the constexpr advice


def test_specialization_warning_names_num_warps_and_a_constexpr_varying_together(recorder, caplog):
    caplog.set_level(logging.WARNING, logger="tilejit")
    kernel = tilejit.kernel(scale.fn)
    for warps, block in itertools.product((1, 2, 4, 8), (64, 128)):
        kernel.compile(vec(), vec(), 0.5, 3, BLOCK=block, num_warps=warps, arch="sm_80")
    messages = _warnings(caplog)
    assert len(messages) == 1, messages
    assert _names(messages[0], "num_warps", "BLOCK", "num_stages", "X") == \
        {"num_warps": True, "BLOCK": True, "num_stages": False, "X": False}


def test_autotuning_its_own_configs_does_not_count_as_respecialization(recorder, caplog, monkeypatch, tmp_path):
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TILEJIT_ARCH", "sm_80")  # kernel.compile without arch= and without a GPU
    caplog.set_level(logging.WARNING, logger="tilejit")
    kernel = tilejit.kernel(scale.fn)
    configs = [tilejit.Config({"BLOCK": block}, num_warps=warps) for block in (64, 128, 256) for warps in (2, 4, 8)]
    tuner = tilejit.autotune(configs, key=["n"], bench_fn=lambda run: 1.0)(kernel)
    args = (vec(), vec(), 0.5, 3)
    chosen = tuner._choose((1,), args, {}, tuner._named_args(args, {}))
    assert chosen == configs[0] and len(tuner.stats.compiled) == 9 and recorder.keys  # all 9 compiled
    assert _warnings(caplog) == []
    # The same nine compiles outside the autotuner are the accident the warning is for.
    for config in configs:
        kernel.compile(vec(), vec(), 0.5, 3, **config.all_kwargs(), arch="sm_90a")
    assert len(_warnings(caplog)) == 1


# ---- the compiler's own source ----------------------------------------------------------------------------

def test_compiler_source_is_part_of_the_key(recorder, monkeypatch):
    before = scale_key()
    monkeypatch.setattr(compiler, "compiler_fingerprint", lambda: "0" * 64)
    assert scale_key() != before


def test_package_digest_changes_with_any_source_file(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "b.py").write_text("y = 2\n")
    (package / "notes.txt").write_text("not source")
    first = compiler.package_digest(package)
    assert compiler.package_digest(package) == first
    (package / "notes.txt").write_text("still not source")
    assert compiler.package_digest(package) == first
    (package / "sub" / "b.py").write_text("y = 3\n")
    assert compiler.package_digest(package) != first
    (package / "sub" / "b.py").write_text("y = 2\n")
    (package / "sub" / "c.py").write_text("")
    assert compiler.package_digest(package) != first


def test_compiler_fingerprint_covers_tilejit_and_is_not_computed_on_import():
    code = ("import json, tilejit\nfrom tilejit import compiler\nbefore = compiler.compiler_fingerprint.cache_info().currsize\n"
            "print(json.dumps([before, compiler.compiler_fingerprint(), compiler.package_digest(__import__('pathlib').Path("
            "tilejit.__file__).parent)]))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    computed_at_import, fingerprint, digest = json.loads(done.stdout)
    assert computed_at_import == 0
    assert fingerprint == digest and len(fingerprint) == 64


# ---- the launch fast path's signature (Kernel._fast_args) --------------------------------------------------

@tilejit.kernel
def _scaled(X, Y, n, alpha=1.0, BLOCK: T.constexpr = 64):
    i = T.program_id(0) * BLOCK
    Y[i:i + BLOCK] = X[i:i + BLOCK] * alpha + n


def test_fast_signature_takes_run_time_arguments_by_keyword_or_default():
    x, y = torch.ones(10), torch.zeros(10)
    positional = _scaled._fast_args((x, y, 3, 1.0), {"BLOCK": 64})
    by_keyword = _scaled._fast_args((x,), {"Y": y, "n": 3, "BLOCK": 64})
    defaulted = _scaled._fast_args((x, y, 3), {"BLOCK": 64})
    assert positional is not None and by_keyword is not None and defaulted is not None
    # Values always follow parameter order; the signature also records how many came by position.
    assert positional[1] == by_keyword[1] == defaulted[1] == [x.data_ptr(), 10, 1, y.data_ptr(), 10, 1, 3, 1.0]
    assert by_keyword[0][1:] == positional[0][1:] and by_keyword[0][0] == 1
    assert _scaled._fast_args((x, y, 3), {"BLOCK": 64, "alpha": 2.0})[1][-1] == 2.0
    assert _scaled._fast_args((x, y, 16), {})[0] != _scaled._fast_args((x, y, 3), {})[0]  # n % 16 is in the key


@pytest.mark.parametrize("args, kwargs", [
    ((torch.ones(4),), {"n": 3}),                              # Y missing: the slow path raises
    ((torch.ones(4), torch.ones(4), 3), {"n": 4}),             # n twice
    ((torch.ones(4), torch.ones(4), 3), {"BLOK": 64}),         # unknown keyword
    ((torch.ones(4), torch.ones(4), [3]), {}),                 # not a kernel argument type
])
def test_calls_the_fast_signature_cannot_describe_go_to_the_slow_path(args, kwargs):
    assert _scaled._fast_args(args, kwargs) is None


def test_tma_stride_rule_refuses_unit_strides_outside_the_last_dim():
    """A contiguous (M, 1) tensor has strides (1, 1): cuTensorMapEncodeTiled refuses the first one (not a multiple
    of 16 bytes), so the spec must not promise TMA-able strides; the last dim's unit stride is fine."""
    import torch

    from tilejit.runtime.jit import _tensor_spec

    def spec(t):
        return _tensor_spec("x", t, ())

    assert not spec(torch.empty(64, 1, dtype=torch.float16, device="meta")).strides16
    assert spec(torch.empty(64, 8, dtype=torch.float16, device="meta")).strides16
    assert not spec(torch.empty(8, 64, dtype=torch.float16, device="meta").t()).strides16  # strides (1, 64)
    assert not spec(torch.empty(64, 7, dtype=torch.float16, device="meta")).strides16      # 14-byte rows
    assert spec(torch.empty(5, 3, 8, dtype=torch.float32, device="meta")).strides16


@tilejit.kernel
def cast_to(X, Y, OUT: T.constexpr, BLOCK: T.constexpr):
    Y[0:BLOCK] = X[0:BLOCK].to(OUT)


def test_a_torch_dtype_constexpr_is_the_tilejit_dtype(recorder):
    # OUT=torch.float16 is OUT=T.float16: the same kernel, not a refusal to read ("got dtype")
    x, y = vec(), vec(dtype=torch.float16)
    assert key_of(cast_to, x, y, OUT=torch.float16, BLOCK=64) == key_of(cast_to, x, y, OUT=T.float16, BLOCK=64)
    assert key_of(cast_to, x, y, OUT=torch.bfloat16, BLOCK=64) != key_of(cast_to, x, y, OUT=T.float16, BLOCK=64)
    with pytest.raises(tilejit.TilejitError, match="constexpr argument 'OUT': torch.complex64 has no tilejit dtype"):
        key_of(cast_to, x, y, OUT=torch.complex64, BLOCK=64)
