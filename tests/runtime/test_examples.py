"""The README's first example is examples/first_kernel.py, and it runs on a machine without a GPU; so do the
examples that call ``tilejit.ops`` (through the interpreter, at small sizes), each checking its own result."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "first_kernel.py"


def test_readme_first_example_is_the_example_file():
    readme = (REPO / "README.md").read_text()
    first_block = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    source = EXAMPLE.read_text()
    assert source.endswith(first_block), "README's first example and examples/first_kernel.py differ"


def test_first_example_runs_through_the_interpreter_and_checks_its_result(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO), "TILEJIT_CACHE_DIR": str(tmp_path)}
    env.pop("TILEJIT_INTERPRET", None)  # the example chooses the interpreter itself when there is no GPU
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert re.fullmatch(r"C = A @ B on cpu \(200x77 @ 77x300, bfloat16\): max abs error \d\.\d+(e-\d+)?", line), line
    assert float(line.rsplit(" ", 1)[1]) < 0.5


# script -> the pattern of its lines; every error printed is checked by the script against float64 itself
OPS_EXAMPLES = {
    "decode_attention.py": r"decode_attention eager: B=\d+ Hq=\d+ Hkv=\d+ D=\d+ page=\d+ lengths \d+\.\.\d+: "
                           r"max \|err\| = (?P<err>\S+) on CPU \(interpreter\)",
    "attention_varlen.py": r"attention_varlen causal, lengths \[[\d, ]+\], H=\d+ Hkv=\d+ D=\d+: max \|err\| = "
                           r"(?P<err>\S+), dq/dk/dv relative error (?P<grad>\S+) on CPU \(interpreter\)",
    "fp8_matmul.py": r"fp8_blockscaled_matmul \d+x\d+ @ \d+x\d+ on CPU \(interpreter\): relative error (?P<err>\S+) "
                     r"against the dequantized float64 product, (?P<quant>\S+) against the unquantized one "
                     r"\(bf16 matmul: \S+\)",
}


@pytest.mark.parametrize("script", sorted(OPS_EXAMPLES))
def test_ops_example_runs_through_the_interpreter_and_checks_its_result(script, tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TILEJIT_CACHE_DIR": str(tmp_path)}
    env.pop("TILEJIT_INTERPRET", None)  # each example chooses the interpreter itself when there is no GPU
    env.pop("PYTHONPATH", None)         # and finds the repository's package from its own location
    done = subprocess.run([sys.executable, str(REPO / "examples" / script)], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    match = re.fullmatch(OPS_EXAMPLES[script], line)
    assert match, line
    assert all(float(value) < 2e-2 for name, value in match.groupdict().items() if name != "quant"), line
    if "quant" in match.groupdict():  # e4m3 keeps 3 mantissa bits: quantizing costs a few percent, not nothing
        assert 1e-2 < float(match["quant"]) < 1e-1, line
