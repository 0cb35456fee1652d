"""The registers a warp-specialized kernel's math threads take (``setmaxnreg.inc``): the default grant where ptxas
spills nothing under it, else the first of a few lower grants that spills nothing, else the one that spilled
least (``compiler._regrant``); recorded in the kernel's meta and its CUDA. ptxas's spills are faked here by
grant (its real answers change with NVRTC's version); the block-scaled 128x256 tile that needs a lower grant
under NVRTC 13 is compiled in tests/backend/test_fp8_blockscaled.py."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit.backend_cuda import stages


def _fresh_kernel():
    """A new kernel object each call, so that no earlier compile answers from its memory."""
    @tilejit.kernel
    def specialized_matmul(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
        M, K = A.shape
        m0 = T.program_id(0) * BM
        n0 = T.program_id(1) * BN
        acc = T.zeros((BM, BN), T.float32)
        for k0 in T.range(0, K, BK, stages=3):
            acc = T.gemm(A[m0:m0 + BM, k0:k0 + BK], B[k0:k0 + BK, n0:n0 + BN], acc)
        C[m0:m0 + BM, n0:n0 + BN] = acc
    return specialized_matmul


def _meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _compile(**options):
    return _fresh_kernel().compile(_meta(1000, 4096), _meta(4096, 512), _meta(1000, 512, dtype=torch.float32),
                                   BM=128, BN=128, BK=64, num_warps=8, arch="sm_90a", **options)


@pytest.fixture
def fake_spills(monkeypatch, tmp_path):
    """Make ptxas report spills by the grant in the source: ``table[grant]`` bytes (0 where absent); the grants
    compiled are recorded in order. A cache of its own, so that nothing compiled before answers."""
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))
    table: dict[int, int] = {}  # grant -> spill bytes; a negative entry: none, but the wgmma serialized
    compiled: list[int | None] = []
    real = stages.run_nvrtc

    def run_nvrtc(source, *args, **kwargs):
        result = real(source, *args, **kwargs)
        found = re.search(r"tj_setmaxnreg_inc<(\d+)>", source)
        grant = int(found.group(1)) if found else None
        compiled.append(grant)
        spilled = table.get(grant, 0)
        log = re.sub(r"\d+ bytes spill stores, \d+ bytes spill loads",
                     f"{max(spilled, 0)} bytes spill stores, {max(spilled, 0)} bytes spill loads", result.log)
        if spilled < 0:
            log += ("\nptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are "
                    "serialized due to non wgmma instructions reading accumulator registers")
        return dataclasses.replace(result, log=log)

    monkeypatch.setattr(stages, "run_nvrtc", run_nvrtc)
    return table, compiled


def test_lower_grants_step_by_eight_and_stop_at_what_the_block_has_without_a_split():
    assert stages.lower_grants(232) == [224, 216, 208]
    assert stages.lower_grants(176) == [168]
    assert stages.lower_grants(152) == []  # three math warpgroups: below what they have without setmaxnreg


def test_a_kernel_that_does_not_spill_keeps_the_default_grant(fake_spills):
    table, compiled = fake_spills
    kernel = _compile(warp_specialize=True)
    assert compiled == [232]
    assert kernel.meta["register_grant"] == 232 and kernel.meta["spills"] == 0
    assert "tj_setmaxnreg_inc<232>();" in kernel.asm["cuda"]


def test_the_first_grant_that_spills_nothing_is_kept(fake_spills):
    table, compiled = fake_spills
    table.update({232: 304, 224: 88})
    kernel = _compile(warp_specialize=True)
    assert compiled == [232, 224, 216]
    assert kernel.meta["register_grant"] == 216 and kernel.meta["spills"] == 0
    cuda = kernel.asm["cuda"]
    assert "tj_setmaxnreg_inc<216>();" in cuda and "tj_setmaxnreg_inc<232>" not in cuda


def test_where_every_grant_spills_the_least_spilling_is_kept_and_the_default_on_a_tie(fake_spills):
    table, compiled = fake_spills
    table.update({232: 64, 224: 100, 216: 48, 208: 48})
    kernel = _compile(persistent=True)
    assert compiled == [232, 224, 216, 208]
    assert kernel.meta["register_grant"] == 216 and kernel.meta["spills"] == 96  # (stores + loads)
    table.update({232: 48, 224: 48, 216: 48, 208: 48})
    kernel = _compile(warp_specialize=True)
    assert kernel.meta["register_grant"] == 232


def test_kernels_without_a_producer_split_are_compiled_once(fake_spills):
    table, compiled = fake_spills
    table[None] = 200
    kernel = _compile()
    assert compiled == [None]
    assert kernel.meta["register_grant"] is None and kernel.meta["spills"] == 400


def test_a_grant_whose_wgmma_ptxas_serializes_is_not_taken_for_fewer_spills(fake_spills):
    table, compiled = fake_spills
    table.update({232: 40, 224: -1, 216: -1, 208: -1})
    kernel = _compile(warp_specialize=True)
    assert compiled == [232, 224, 216, 208]
    assert kernel.meta["register_grant"] == 232 and kernel.meta["spills"] == 80
    assert not kernel.meta["wgmma_serialized"]
