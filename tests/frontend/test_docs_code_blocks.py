"""The docs' complete examples run as written on a machine without a GPU (TILEJIT_INTERPRET=1, CPU tensors)."""
from __future__ import annotations

import re
import runpy

import pytest

import tilejit

BLOCKS = re.findall(r"```python\n(.*?)```", open(tilejit.docs(), encoding="utf-8").read(), re.S)
# complete programs: they import tilejit; the other python blocks are fragments of a kernel's body
PROGRAMS = [block for block in BLOCKS if block.startswith("import torch, tilejit")]


def test_the_first_kernel_and_the_triton_example_are_programs():
    assert len(PROGRAMS) >= 2


@pytest.mark.parametrize("block", PROGRAMS, ids=lambda b: b.splitlines()[3][:40])
def test_program_runs_on_cpu(block, monkeypatch, tmp_path):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    path = tmp_path / "docs_example.py"  # kernels read their source back from a file
    path.write_text(block)
    runpy.run_path(str(path), run_name="docs_example")
