"""The dispatch registry: which gemm lowering each arch and tile shape gets, and why others are rejected."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit.target import REGISTRY, GemmLowering, Registry, Target


@tilejit.kernel
def matmul(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]  # ERR
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


def meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _impl(arch, bk, warps, dtype=torch.float16, bm=128, bn=128, tmp_cache=None):
    compiled = matmul.compile(meta(256, 256, dtype=dtype), meta(256, 256, dtype=dtype), meta(256, 256, dtype=dtype),
                              BM=bm, BN=bn, BK=bk, num_warps=warps, arch=arch)
    import re

    return re.search(r"impl = (\w+)", compiled.asm["ir"]).group(1)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))


def test_sm90a_takes_wgmma_when_the_tile_fits():
    assert _impl("sm_90a", 64, 4) == "wgmma_m64nNk16"
    assert _impl("sm_90a", 64, 8, bn=256) == "wgmma_m64nNk16"


def test_sm90a_takes_wgmma_when_k_is_a_64_byte_row():
    assert _impl("sm_90a", 32, 4) == "wgmma_m64nNk16"  # the 64-byte swizzle (tests/backend/test_wgmma_swizzle.py)


def test_sm80_never_takes_wgmma():
    assert _impl("sm_80", 64, 4) == "mma_sync_m16n8k16"


def test_fp32_operands_take_tf32_tensor_cores_by_default():
    assert _impl("sm_80", 32, 4, dtype=torch.float32) == "mma_sync_m16n8k8_tf32"
    # B N-major: wgmma reads tf32 K-major only from shared memory, so B is read into registers as the transposed
    # product's A (lower_wgmma_mn)
    assert _impl("sm_90a", 32, 4, dtype=torch.float32) == "wgmma_mn_m64nNk8_tf32"


def test_wgmma_kernel_uses_hgmma_and_descriptors():
    compiled = matmul.compile(meta(256, 256), meta(256, 256), meta(256, 256), BM=128, BN=128, BK=64,
                              num_warps=4, arch="sm_90a")
    cuda = compiled.asm["cuda"]
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in cuda
    assert "tj_wgmma_desc(" in cuda and "wgmma.wait_group.sync.aligned 0" in cuda
    # the proxy fence (a helper of tilejit/support.cuh) is called, and reaches the PTX
    assert "tj_fence_proxy_async();" in cuda and "fence.proxy.async.shared::cta" in compiled.asm["ptx"]


def test_rejections_are_listed_by_name():
    class FakeOp:
        pass

    target = Target.of("sm_80", num_warps=4, num_stages=3)
    reasons = {impl.name: impl.rejection(None, target) for impl in REGISTRY.candidates("gemm")
               if impl.name == "wgmma_m64nNk16"}
    assert reasons["wgmma_m64nNk16"].startswith("arch sm_80 outside sm_90")


class _Unused(GemmLowering):
    """A gemm lowering that keeps the contract and is never selected."""

    def acc_layout(self, op, target):
        raise AssertionError("not selected")

    def emit(self, em, op):
        raise AssertionError("not selected")


def test_dispatch_error_lists_every_candidate_with_its_reason():
    from tilejit.errors import DispatchError
    from tilejit.target import Registry

    registry = Registry()
    registry.register("gemm", "only_f16", priority=1, predicates={"operands are f16": lambda op, t: False})(_Unused())
    registry.register("gemm", "only_sm100", min_sm=100, priority=2)(_Unused())
    with pytest.raises(DispatchError) as info:
        registry.select("gemm", None, Target.of("sm_90a", num_warps=4, num_stages=3))
    text = str(info.value)
    assert "only_f16" in text and "operands are f16" in text
    assert "only_sm100" in text and "outside sm_100" in text


def test_every_registered_gemm_lowering_keeps_the_contract():
    impls = REGISTRY.candidates("gemm")
    assert len(impls) >= 10
    for impl in impls:
        assert GemmLowering.violations(impl.payload) == [], impl.name
    register_a = {i.name for i in impls if i.payload.register_a}
    assert {"mma_sync_rs_m16n8k16", "wgmma_rs_m64nNk16"} <= register_a
    assert REGISTRY.get("gemm", "mma_sync_rs_m16n8k16").payload.register_a_of == "mma_sync_m16n8k16"


def test_registration_refuses_a_gemm_payload_that_breaks_the_contract():
    class Carrying(_Unused):
        def carries(self, op):
            return True

    class NoEmit(GemmLowering):
        def acc_layout(self, op, target):
            return None

    class PinnedWithoutRegisterA(_Unused):
        register_a_of = "mma_sync_m16n8k16"

    registry = Registry()
    cases = {"not a GemmLowering": (object(), "object is not a GemmLowering"),
             "a class, not an instance": (_Unused, "ABCMeta is not a GemmLowering"),
             "carries without its loads": (Carrying(), "overrides carries but not declare_carried; it overrides "
                                                      "carries but not load_first"),
             "register_a_of without register_a": (PinnedWithoutRegisterA(), "register_a is False")}
    for name, (payload, why) in cases.items():
        with pytest.raises(TypeError, match="gemm implementation .* does not keep the GemmLowering contract") as info:
            registry.register("gemm", name)(payload)
        assert why in str(info.value)
    with pytest.raises(TypeError, match="abstract"):
        NoEmit()  # a required method missing: the class cannot even be instantiated
    assert registry.candidates("gemm") == []
    registry.register("copy", "anything")(object())  # ops without a contract take any payload


def test_k_multiple_of_8_but_not_16_takes_m16n8k8():
    assert _impl("sm_80", 24, 4) == "mma_sync_m16n8k8"
    assert _impl("sm_90a", 8, 4) == "mma_sync_m16n8k8"
