"""The C launcher (tilejit/runtime/_launch.c) built with AddressSanitizer and UndefinedBehaviorSanitizer, driven
on CPU through its launch hook in a child process (an ASan library needs the ASan runtime preloaded into the
interpreter). Any sanitizer report makes the child fail: use-after-free, out-of-bounds, signed overflow, an
out-of-range float -> int cast. Skipped, with the reason, where the compiler has no sanitizers.
"""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tilejit.runtime import native

SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g", "-O1"]

# Runs in the child: loads the sanitized library directly (no tilejit, no torch) and exercises every entry point,
# the paths the issue found unsafe included. Kind codes as native.KIND_CODES numbers them.
CHILD = r'''
import gc, importlib.machinery, importlib.util, math, struct, sys
path = sys.argv[1]
loader = importlib.machinery.ExtensionFileLoader("tilejit.runtime._launch", path)
mod = importlib.util.module_from_spec(importlib.util.spec_from_file_location("tilejit.runtime._launch", path,
                                                                             loader=loader))
loader.exec_module(mod)
PTR, I64, I32, F32, TMAP = 0, 1, 2, 3, 4
C, R, S = "constexpr", "runtime", "shaped"

class T:
    def __init__(self, shape, ptr=0x7f0000001000):
        self.shape, self._ptr, self.dtype, self.requires_grad = tuple(shape), ptr, "f16", False
        st, acc = [], 1
        for n in reversed(self.shape):
            st.insert(0, acc); acc *= n
        self._st = tuple(st)
    def stride(self): return self._st
    def data_ptr(self): return self._ptr
    def get_device(self): return 0

launches, python_launches, fallbacks = [], [], []
mod.set_launch_hook(lambda *a: launches.append(a))

def make(kinds, names):
    entry = mod.Entry(0xABCD, (128, 1, 1), 0, bytes(kinds), 0, None, lambda *a: python_launches.append(a))
    def slow(grid, args, kwargs):
        return entry
    d = mod.Dispatcher(roles=[R] * len(names), role_constexpr=C, role_shaped=S, fast_kwargs={"BLOCK"},
                       tensor_type=T, stream_getter=lambda i: 0, slow=slow,
                       fallback=lambda *a: fallbacks.append(a), grid_fn=lambda g, a, k: g(k) if callable(g) else None,
                       names=tuple(names), runtime_index={n: i for i, n in enumerate(names)}, defaults={})
    return d

# the ordinary path: a miss, hits, a callable grid, a keyword
d1 = make([PTR, I64, I64, I32], "Xn")
x = T((33,))
for _ in range(3):
    d1.bind((2,))(x, 7)
    d1.bind(lambda meta: (3, 2))(x, 7)
    d1.bind((1, 1, 1))(x, n=7)
assert len(launches) >= 6, launches

# values that do not fit their parameters go to the Python launcher: no undefined cast
d2 = make([PTR, I64, I64, I64, F32, I32], "Xabc")
for a, b, c in [(1, 1.0, 1), (5, 2.5, 17), (1e300, 1.0, 3), (float("nan"), 1.0, 3), (float("inf"), 1.0, 3),
                (-9.3e18, 1.0, 3), (2.0 ** 63, 1.0, 3), (3, 1e300, 3), (3, 1.0, 2 ** 31 + 5), (2 ** 62, 1.0, 3),
                (-(2 ** 63), -1e-300, -(2 ** 31)), (2 ** 64, 1.0, 3), (True, False, 3)]:
    d2.bind((1,))(x, a, b, c)
    d2.bind((1,))(x, a, b, c)
assert python_launches, "no value went to the Python launcher"

# a Dispatcher made by __new__ without __init__ raises instead of crashing, and is never re-initialised
bare = mod.Dispatcher.__new__(mod.Dispatcher)
for call in (lambda: bare.bind((1,))(x, 7), lambda: bare.signature(x, 7),
             lambda: mod.time_driver_launches(bare, 1, 0, (x, 7))):
    try:
        call()
    except TypeError:
        pass
    else:
        raise AssertionError("uninitialised Dispatcher accepted")
try:
    d1.__init__(roles=[R], role_constexpr=C, role_shaped=S, fast_kwargs=set(), tensor_type=T,
                stream_getter=lambda i: 0, slow=None, fallback=None, grid_fn=None, names=("X",),
                runtime_index={}, defaults={})
except TypeError:
    pass
else:
    raise AssertionError("Dispatcher re-initialised")

# a grid function that runs the collector and drops everything it can while the entry is in use
def churn(meta):
    gc.collect()
    return (1,)
for _ in range(5):
    d1.bind(churn)(x, 7)

# an uninitialised Entry from the slow path, and parameter lists too long for the launcher
def bad_slow(grid, args, kwargs):
    return mod.Entry.__new__(mod.Entry)
d3 = mod.Dispatcher(roles=[R, R], role_constexpr=C, role_shaped=S, fast_kwargs=set(), tensor_type=T,
                    stream_getter=lambda i: 0, slow=bad_slow, fallback=lambda *a: None, grid_fn=lambda *a: None,
                    names=("X", "n"), runtime_index={"X": 0, "n": 1}, defaults={})
try:
    d3.bind((1,))(x, 3)
except TypeError:
    pass
else:
    raise AssertionError("uninitialised Entry accepted")
for kinds in (bytes([TMAP]) * 40000, bytes([I64]) * 5000, bytes([I32]) * (1 << 20)):
    try:
        mod.Entry(1, (1, 1, 1), 0, kinds, 0, lambda v: [], lambda *a: None)
    except ValueError:
        pass
    else:
        raise AssertionError("oversized parameter list accepted")
e = mod.Entry(1, (1, 1, 1), 0, bytes([I64]), 0, None, lambda *a: None)
try:
    e.__init__(1, (1, 1, 1), 0, bytes([I64]), 0, None, lambda *a: None)
except TypeError:
    pass
else:
    raise AssertionError("Entry re-initialised")
print("ok", len(launches), len(python_launches), len(fallbacks))
'''


def _sanitizer_runtime() -> tuple[list[str], str] | str:
    """(compiler command, path of libasan to preload), or why there is none."""
    try:
        cc = native.compiler()
    except native.NativeBuildError as error:
        return str(error)
    include = sysconfig.get_paths().get("include")
    if not include or not (Path(include) / "Python.h").is_file():
        return f"no Python.h in {include}"
    probe = subprocess.run([*cc, "-print-file-name=libasan.so"], capture_output=True, text=True)
    libasan = probe.stdout.strip()
    if probe.returncode != 0 or not os.path.isabs(libasan) or not os.path.exists(libasan):
        return f"{cc[0]} names no libasan.so to preload ({libasan or probe.stderr.strip()})"
    return cc, libasan


_RUNTIME = _sanitizer_runtime()


@pytest.mark.skipif(isinstance(_RUNTIME, str), reason=f"no sanitizer runtime: {_RUNTIME}")
def test_the_launcher_is_clean_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    cc, libasan = _RUNTIME
    library = tmp_path / f"launch{native._ext_suffix()}"
    include = sysconfig.get_paths()["include"]
    built = subprocess.run([*cc, *SANITIZE, "-shared", "-fPIC", "-std=gnu11", "-I", include, str(native.SOURCE),
                            "-o", str(library), "-ldl"], capture_output=True, text=True, timeout=300)
    if built.returncode != 0 and "sanitize" in built.stderr:
        pytest.skip(f"{cc[0]} cannot build with {SANITIZE[0]}: {built.stderr.strip()[-300:]}")
    assert built.returncode == 0, built.stderr
    env = {**os.environ, "LD_PRELOAD": libasan,
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=66",  # CPython's own allocations "leak"
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=67"}
    child = subprocess.run([sys.executable, "-c", CHILD, str(library)], capture_output=True, text=True, env=env,
                           timeout=300)
    report = child.stdout + child.stderr
    assert child.returncode == 0, report[-4000:]
    assert "runtime error" not in report and "AddressSanitizer" not in report, report[-4000:]
    assert child.stdout.startswith("ok"), report[-4000:]
