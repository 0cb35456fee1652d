"""The launch model (tilejit/passes/launch_model.py): what it chooses for the README matmul and the obvious
attention forward on sm_80 / sm_90a / sm_100a, that it chooses only what the launch left unsaid, the cache key's
record of it, the knob that turns it off, and no shrink warning for a depth it chose."""
from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch

import tilejit
from benchmarks.kernels import attention_one_loop, matmul
from tilejit import compiler
from tilejit.target import LaunchOptions
from tilejit.passes.launch_model import LoopShape, blocks_per_sm, choose, loop_shape
from tilejit.target import Arch, Target

ARCHS = ("sm_80", "sm_90a", "sm_100a")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32, "fp8": torch.float8_e4m3fn}
OLD = {"num_stages": 3, "warp_specialize": False, "persistent": False}


def _matmul(dtype, bm, bn, bk16, warps, arch, **options):
    """The README matmul (benchmarks.kernels.matmul) compiled through the passes; ``bk16``: BK for 16-bit operands
    (scaled to the same bytes for tf32 and fp8)."""
    a = torch.empty(4096, 4096, dtype=dtype, device="meta")
    c = torch.empty(4096, 4096, dtype=torch.float16, device="meta")
    bk = bk16 * 2 // dtype.itemsize
    return matmul.kernel.compile(a, a, c, BM=bm, BN=bn, BK=bk, num_warps=warps, arch=arch, stop_after="passes",
                                 **options)


def _attention(d, bm, bn, warps, arch, causal=False, stop_after="passes", **options):
    q = torch.empty(4, 16, 4096, d, dtype=torch.bfloat16, device="meta")
    return attention_one_loop.compile(q, q, q, q, 0.125, BM=bm, BN=bn, D=d, CAUSAL=causal, num_warps=warps, arch=arch,
                                 stop_after=stop_after, **options)


# (BM, BN, BK for 16-bit operands, warps) -> what sm_90a gets; sm_80 and sm_100a keep the fixed defaults
MATMUL_SM90 = {
    (128, 128, 64, 4): OLD,  # 96 KiB a block at 3 stages: two blocks per SM, which a producer would cost
    (64, 128, 64, 4): OLD,
    (128, 256, 64, 8): {"num_stages": 4, "warp_specialize": True, "persistent": False},  # one block per SM
    (256, 128, 64, 8): {"num_stages": 4, "warp_specialize": True, "persistent": False},
    (128, 128, 128, 8): {"num_stages": 3, "warp_specialize": True, "persistent": True},  # 64 KiB stages
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tile", MATMUL_SM90, ids=lambda t: "{}x{}x{}w{}".format(*t))
def test_readme_matmul(tile, arch, dtype):
    st = _matmul(DTYPES[dtype], *tile, arch)
    expected = dict(MATMUL_SM90[tile] if arch == "sm_90a" else OLD)
    if arch == "sm_80" and tile[2] == 128:
        expected["num_stages"] = 2  # 3 stages of 64 KiB are over sm_80's 163 KiB
    if dtype == "fp8" and expected["persistent"]:  # B stored K x N: an 8-bit operand through a transposing copy
        expected = dict(OLD)
    assert st.launch_choice.values == expected, st.launch_choice.why
    assert st.target.options.as_dict().items() >= expected.items()  # the passes ran with the choice
    assert ("producer_warpgroup = true" in st.final_ir) == expected["warp_specialize"]
    assert ("persistent" in st.fn.attrs) == expected["persistent"]


# (D, BM, BN, warps) -> what sm_90a gets
ATTENTION_SM90 = {
    (128, 128, 128, 8): {"num_stages": 3, "warp_specialize": True, "persistent": False},  # 224 KiB: one block
    (128, 128, 64, 8): {"num_stages": 4, "warp_specialize": True, "persistent": False},
    (128, 64, 64, 4): OLD,
    (64, 128, 128, 8): OLD,  # 112 KiB: up to two blocks per SM
    (64, 64, 128, 4): {"num_stages": 2, "warp_specialize": False, "persistent": False},  # 3 blocks per SM, not 2
    (64, 64, 64, 4): {"num_stages": 2, "warp_specialize": False, "persistent": False},  # 5, not 4
    (64, 128, 64, 8): OLD,  # registers hold two blocks at either depth
}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tile", ATTENTION_SM90, ids=lambda t: "d{}-{}x{}w{}".format(*t))
def test_attention_forward(tile, arch, causal):
    d, bm, bn, warps = tile
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a ring cut to fit is the model's: no warning
        st = _attention(d, bm, bn, warps, arch, causal, stop_after="cuda")
    expected = dict(ATTENTION_SM90[tile] if arch == "sm_90a" else OLD)
    if arch == "sm_80" and (d, bm, bn) == (128, 128, 128):
        expected["num_stages"] = 2  # 3 stages of K and V beside Q are over sm_80's 163 KiB
    assert st.launch_choice.values == expected, st.launch_choice.why
    assert ("producer_warpgroup = true" in st.final_ir) == expected["warp_specialize"]
    if expected["warp_specialize"]:
        assert "defer_mma = true" in st.final_ir  # the deferred p @ v needs the 3-deep ring


def test_loop_shape_of_the_readme_matmul():
    from tilejit.compiler import run_stages

    a = torch.empty(4096, 4096, dtype=torch.float16, device="meta")
    spec = matmul.kernel.bind((a, a, a), dict(BM=128, BN=256, BK=64, num_warps=8)).spec
    shape = loop_shape(run_stages(spec, None, "ir").fn)
    assert shape == LoopShape(stage_bytes=(128 * 64 + 64 * 256) * 2, other_shared_bytes=0,
                              accumulator_bits=128 * 256 * 32, tile=(128, 256), plain_matmul=True,
                              explicit_stages=None)


def test_loop_shape_of_the_attention_forward():
    from tilejit.compiler import run_stages

    q = torch.empty(2, 2, 256, 128, dtype=torch.bfloat16, device="meta")
    spec = attention_one_loop.bind((q, q, q, q, 0.5), dict(BM=128, BN=64, D=128, CAUSAL=True, num_warps=8)).spec
    shape = loop_shape(run_stages(spec, None, "ir").fn)
    assert shape.stage_bytes == 2 * 64 * 128 * 2 and shape.other_shared_bytes == 128 * 128 * 2  # K, V; Q once
    # carried acc, m_i, l_i, and the scores s beside them (p @ v accumulates into acc * alpha in place)
    assert shape.accumulator_bits == (128 * 128 + 2 * 128 + 128 * 64) * 32
    assert not shape.plain_matmul and shape.tile == (128, 64)


def test_blocks_per_sm():
    hopper, ampere = Arch("sm_90a"), Arch("sm_80")
    assert blocks_per_sm(96 * 1024, 128, 128, hopper) == 2  # 228 KiB // 97 KiB
    assert blocks_per_sm(144 * 1024, 256, 128, hopper) == 1
    assert blocks_per_sm(48 * 1024, 128, 128, hopper) == 4  # registers: 65536 // (128 * 128)
    assert blocks_per_sm(48 * 1024, 256, 128, hopper) == 2
    assert blocks_per_sm(96 * 1024, 128, 64, ampere) == 1  # 164 KiB // 97 KiB
    assert blocks_per_sm(1024, 1024, 16, hopper) == 2  # threads: 2048 // 1024


def test_choose_is_pure_and_keeps_what_was_given():
    shape = LoopShape(48 * 1024, 0, 128 * 256 * 32, (128, 256), True, None)
    hopper = Arch("sm_90a")
    first = choose(shape, hopper, 8)
    assert first == choose(shape, hopper, 8) and first.values == {"num_stages": 4, "warp_specialize": True,
                                                                 "persistent": False}
    assert choose(shape, hopper, 8, ("num_stages", "persistent")).values == {"num_stages": 4, "persistent": False}
    assert choose(shape, hopper, 8, specialized=True).values["num_stages"] == 4
    assert choose(shape, hopper, 8, cut_k=True).values["warp_specialize"] is False
    assert choose(shape, hopper, 6).values["warp_specialize"] is False  # not whole warpgroups
    assert choose(None, hopper, 8).values == OLD
    # a loop's own T.range(stages=2): too shallow to warp-specialize, and its depth stays
    own = choose(LoopShape(48 * 1024, 0, 128 * 256 * 32, (128, 256), True, 2), hopper, 8)
    assert own.values == OLD
    # an accumulator that leaves no headroom under setmaxnreg's 232 registers on 8 warps
    assert choose(LoopShape(48 * 1024, 0, 200 * 256 * 32, (128, 256), True, None), hopper, 8).values[
        "warp_specialize"] is False


def test_given_options_decide():
    a = torch.empty(4096, 4096, dtype=torch.float16, device="meta")
    # num_stages given (as every autotune Config gives it): the launch decides the whole pipeline
    st = _matmul(torch.float16, 128, 256, 64, 8, "sm_90a", num_stages=3)
    assert st.launch_choice is None and "producer_warpgroup" not in st.final_ir
    # warp_specialize=False given: the model picks the depth only, and no persistence
    st = _matmul(torch.float16, 128, 128, 128, 8, "sm_90a", warp_specialize=False)
    assert st.launch_choice.values == {"num_stages": 3, "persistent": False}
    assert "producer_warpgroup" not in st.final_ir
    # warp_specialize=True given: one block per SM anyway, so the ring deepens where it fits; and 128x128 tiles
    # go persistent
    st = _matmul(torch.float16, 128, 128, 64, 4, "sm_90a", warp_specialize=True)
    assert st.launch_choice.values == {"num_stages": 4, "persistent": True}
    st = _matmul(torch.float16, 128, 256, 64, 8, "sm_90a", warp_specialize=True)
    assert st.launch_choice.values == {"num_stages": 4, "persistent": False}
    # an autotune config: every option given
    config = tilejit.Config({"BM": 128, "BN": 256, "BK": 64}, num_warps=8, num_stages=3)
    spec = matmul.kernel.bind((a, a, a), dict(config.all_kwargs())).spec
    assert LaunchOptions.left_to_model(spec.given) == ()
    # a specialization made without a launch (given None): every option given
    assert LaunchOptions.left_to_model(None) == ()


def test_cache_key_names_what_the_model_chooses(monkeypatch):
    a = torch.empty(4096, 4096, dtype=torch.float16, device="meta")
    hopper = Arch("sm_90a")
    unsaid = matmul.kernel.bind((a, a, a), dict(BM=128, BN=128, BK=64, num_warps=4)).spec
    given = matmul.kernel.bind((a, a, a), dict(BM=128, BN=128, BK=64, num_warps=4, num_stages=3)).spec
    text = compiler.target_text(Target(hopper, unsaid.options, sm_count=132), unsaid.given)
    assert ":model=num_stages+warp_specialize+persistent" in text and ":sms=132" in text
    # explicit options: the key of today, equal to one made without a launch
    explicit = Target(hopper, given.options)
    assert compiler.target_text(explicit, given.given) == compiler.target_text(Target.of("sm_90a", num_warps=4))
    assert compiler.cache_key(given, explicit) == compiler.cache_key(replace(given, given=None), explicit)
    assert compiler.cache_key(given, explicit) != compiler.cache_key(unsaid, explicit)
    assert given.options.key_tokens() == unsaid.options.key_tokens() == [4, 3]
    monkeypatch.setenv("TILEJIT_LAUNCH_MODEL", "0")
    assert compiler.cache_key(given, explicit) == compiler.cache_key(unsaid, explicit)


def test_knob_off_gives_the_fixed_defaults_and_their_warning(monkeypatch):
    monkeypatch.setenv("TILEJIT_LAUNCH_MODEL", "0")
    with pytest.warns(RuntimeWarning, match="a pipeline of 3 stages needs"):
        st = _attention(128, 128, 128, 8, "sm_80", stop_after="cuda")
    assert st.launch_choice is None
    st = _matmul(torch.float16, 128, 256, 64, 8, "sm_90a")
    assert st.launch_choice is None and "producer_warpgroup" not in st.final_ir


def test_an_explicit_depth_cut_to_fit_still_warns():
    a = torch.empty(4096, 4096, dtype=torch.float32, device="meta")
    with pytest.warns(RuntimeWarning, match="a pipeline of 6 stages needs"):
        matmul.kernel.compile(a, a, a, BM=128, BN=256, BK=64, num_warps=8, num_stages=6, arch="sm_90a",
                              stop_after="cuda")


@pytest.mark.parametrize("dtype", ["tf32", "fp8"])
def test_a_ring_cut_to_fit_keeps_the_models_choice(dtype, monkeypatch):
    """When the emitted kernel needs more shared memory than the model's estimate (the transposing copy of an
    MN-major 8-bit operand) the passes run again for a shallower ring; the model then chooses again from the
    launch's own options, not from the target it had already chosen (which read as a launch that
    warp-specializes, and dropped the warp specialization)."""
    monkeypatch.setenv("TILEJIT_ALWAYS_COMPILE", "1")
    dt = DTYPES[dtype]
    a = torch.empty(1000, 520, dtype=dt, device="meta")
    b = torch.empty(520, 904, dtype=dt, device="meta")
    c = torch.empty(1000, 904, dtype=torch.float32, device="meta")
    kw = dict(BM=256, BN=128, BK=64 * 2 // dt.itemsize, num_warps=8)
    compiled = matmul.kernel.compile(a, b, c, arch="sm_90a", **kw)
    frontend = compiler.run_stages(matmul.kernel.bind((a, b, c), dict(kw)).spec, None, "ir").fn
    expected = choose(loop_shape(frontend), Arch.parse("sm_90a"), 8).values
    assert expected["warp_specialize"] and compiled.meta["launch_model"] == expected
    if dtype == "tf32":  # (fp8's loop with its transposing copy does not qualify for the producer warpgroup)
        assert "setmaxnreg" in compiled.asm["cuda"]


def test_no_persistence_where_an_8_bit_operand_goes_through_a_transposing_copy():
    """128x128 fp8 tiles of the README matmul (B stored K x N, copied K-major for wgmma) keep the fixed defaults
    (measured 0.64-0.70x persistent, 0.77-0.79x warp-specialized); the same loop shape with K-major operands is
    made persistent."""
    a = torch.empty(4096, 4096, dtype=torch.float8_e4m3fn, device="meta")
    c = torch.empty(4096, 4096, dtype=torch.float16, device="meta")
    call = matmul.kernel.bind((a, a, c), dict(BM=128, BN=128, BK=256, num_warps=8))
    shape = loop_shape(compiler.run_stages(call.spec, None, "ir").fn)
    assert shape.copied_8bit
    sm90 = Arch.parse("sm_90a")
    assert choose(shape, sm90, 8).values == OLD
    assert choose(replace(shape, copied_8bit=False), sm90, 8).values["persistent"] is True
