"""The README's first example is examples/first_kernel.py, and it runs on a machine without a GPU."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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
