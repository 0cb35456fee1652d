"""Every ```python block of the language docs is a complete program that runs as written on a machine without a
GPU (TILEJIT_INTERPRET=1, CPU tensors) and checks its own result; each runs in a process of its own, so blocks
share no state (a ``torch_op`` registers a global name), compiling into the test's private kernel cache."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import tilejit

BLOCKS = re.findall(r"```python\n(.*?)```", open(tilejit.docs(), encoding="utf-8").read(), re.S)


def _name(block: str) -> str:
    """The first kernel, helper or op the block defines, to name its test."""
    found = re.search(r"^def (\w+)", block, re.M)
    return found.group(1) if found else block.splitlines()[0][:30]


def test_the_docs_have_python_blocks():
    assert len(BLOCKS) >= 20


@pytest.mark.parametrize("block", BLOCKS, ids=_name)
def test_block_is_a_program_that_checks_itself(block, tmp_path):
    assert block.startswith("import torch, tilejit\nimport tilejit.language as T\n")
    assert "assert " in block.split("@tilejit.kernel")[-1]  # it checks what its launch computed
    path = tmp_path / "docs_example.py"  # kernels read their source back from a file
    path.write_text(block)
    env = dict(os.environ, TILEJIT_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    run = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
