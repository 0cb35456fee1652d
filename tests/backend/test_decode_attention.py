"""tilejit.ops.decode_attention (attention of one query token over a paged KV cache): the interpreter against a
float64 reference over ragged lengths, page sizes 1/16/24/64 and no block table, GQA 1/4/8, split and unsplit,
windows, softcaps and an fp8 cache; outputs NaN-poisoned and every cache slot no key is read from poisoned too;
the arguments checked; the split count from shapes only and the workspace kept; the kernels compiling with NVRTC
for sm_80, sm_90a and sm_100a; and the PyTorch operator (fake kernel, opcheck, torch.compile(fullgraph))."""
from __future__ import annotations

import math
import warnings

import pytest
import torch

import tilejit
from tilejit.backend_cuda.nvrtc import nvrtc_supports
import tilejit.ops.paged_decode as decode

NAN = float("nan")


@pytest.fixture
def interpret(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))


def _inputs(lens, heads, kv_heads, dim, seed, page_size=None, capacity=None, dtype=torch.float16):
    """q, the cache (paged with NaN in every slot past a length and in spare pages, or contiguous with NaN past
    the lengths) and the lengths."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(lens)
    capacity = capacity or max(lens) + 5
    q = torch.randn(batch, heads, dim, generator=gen).to(torch.float16 if dtype == "fp8" else dtype)
    k = torch.randn(batch, capacity, kv_heads, dim, generator=gen)
    v = torch.randn(batch, capacity, kv_heads, dim, generator=gen)
    for b, n in enumerate(lens):
        k[b, n:] = NAN
        v[b, n:] = NAN
    cache_dtype = torch.float8_e4m3fn if dtype == "fp8" else q.dtype
    k, v = k.to(cache_dtype), v.to(cache_dtype)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    if page_size is None:
        return q, k, v, lens_t, None
    kp, vp, table = decode.paged_cache(k, v, page_size, spare_pages=3, generator=gen, fill=NAN)
    return q, kp, vp, lens_t, table


def _close(got, want, tol=2e-2):
    assert not torch.isnan(got).any(), "some outputs are NaN: never written, or a poisoned slot was read"
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


# (lengths, page size (None: no block table), heads, kv heads, splits, window, softcap): lengths of 0, 1, at a
# page's end and at the capacity; gather (1, 24) and slice (16, 64) pages; a window narrower than a block; runs
# of several four-page groups, a split starting inside one
CASES = [
    ([70, 13, 0], 16, 4, 1, 1, None, None),
    ([70, 13, 64], 16, 4, 1, 4, None, None),
    ([33, 1, 50], 1, 8, 2, 2, None, None),
    ([150, 64, 7], 64, 8, 1, 4, None, 5.0),
    ([100, 37], 24, 2, 2, 2, (20, 0), None),
    ([90, 5], None, 4, 4, 1, (40, -1), 3.0),
    ([90, 0, 31], None, 16, 2, 4, None, None),
    ([129, 12], 64, 4, 1, None, (8, 8), 2.0),
    ([300, 170, 1], 16, 8, 2, 2, None, None),
    ([520, 200], 64, 4, 1, 2, (300, 0), None),
]


@pytest.mark.parametrize("lens, page, heads, kv_heads, splits, window, softcap", CASES,
                         ids=[f"p{c[1]}-g{c[2] // c[3]}-s{c[4]}-w{c[5]}-c{c[6]}" for c in CASES])
def test_matches_float64(interpret, lens, page, heads, kv_heads, splits, window, softcap):
    q, k, v, lens_t, table = _inputs(lens, heads, kv_heads, 32, seed=len(lens) + heads, page_size=page)
    out = torch.full_like(q, NAN)
    decode.decode_attention_forward(q, k, v, lens_t, table, window=window, softcap=softcap, out=out,
                                    num_splits=splits, BN=16)
    want = decode.reference(q, k, v, lens_t, table, window=window, softcap=softcap)
    _close(out, want)
    for b, n in enumerate(lens):
        if n == 0:
            assert torch.equal(out[b], torch.zeros_like(out[b]))


def test_reference_is_sdpa_on_the_gathered_keys():
    """The module's reference against SDPA in float64 on each sequence's keys, gathered from the pages."""
    q, k, v, lens, table = _inputs([40, 17], 8, 2, 16, seed=5, page_size=16)
    want = decode.reference(q, k, v, lens, table)
    for b, n in enumerate(lens.tolist()):
        slots = [(int(table[b, j // 16]), j % 16) for j in range(n)]
        keys = torch.stack([k[p, s] for p, s in slots]).double().repeat_interleave(4, 1).transpose(0, 1)
        vals = torch.stack([v[p, s] for p, s in slots]).double().repeat_interleave(4, 1).transpose(0, 1)
        sdpa = torch.nn.functional.scaled_dot_product_attention(q[b].double()[:, None], keys, vals)
        torch.testing.assert_close(want[b], sdpa[:, 0], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("page", [None, 16])
def test_fp8_cache_with_scales(interpret, page):
    """An e4m3 cache with a float k_scale and a tensor v_scale (and the reverse), against the widened cache."""
    q, k, v, lens, table = _inputs([45, 20], 4, 2, 32, seed=7, page_size=page, dtype="fp8")
    for k_scale, v_scale in ((0.5, torch.tensor([3.0])), (torch.tensor(0.25), 2.0)):
        out = decode.decode_attention(q, k, v, lens, table, k_scale=k_scale, v_scale=v_scale)
        _close(out, decode.reference(q, k, v, lens, table, k_scale=k_scale, v_scale=v_scale), tol=3e-2)


def test_window_reads_no_key_before_it(interpret):
    """Keys before the window poisoned with NaN: the output is finite and right (a block of them read, even
    masked, would give NaN through 0 * NaN), split or not."""
    q, k, v, lens, table = _inputs([200, 90], 4, 2, 32, seed=9, page_size=16)
    want = decode.reference(q, k, v, lens, table, window=(30, 0))
    for b, n in enumerate(lens.tolist()):
        for j in range(n - 31):
            k[table[b, j // 16], j % 16] = NAN
            v[table[b, j // 16], j % 16] = NAN
    for splits in (1, 2):
        _close(decode.decode_attention_forward(q, k, v, lens, table, window=(30, 0), num_splits=splits, BN=16),
               want)


def test_operator_default_path(interpret):
    """``decode_attention`` with its defaults (block sizes from the page size, split count from the shapes)."""
    q, k, v, lens, table = _inputs([300, 4, 129], 8, 1, 64, seed=11, page_size=64, dtype=torch.bfloat16)
    _close(decode.decode_attention(q, k, v, lens, table), decode.reference(q, k, v, lens, table))


# ----------------------------------------------------------------------------------------------- planning

def test_split_count_comes_from_shapes():
    """Enough programs for every SM, a power of two, bounded by the blocks the capacity can hold."""
    assert decode.num_splits(1, 8, 131072, 64, 132) == 64
    assert decode.num_splits(16, 8, 131072, 64, 132) == 4
    assert decode.num_splits(64, 8, 131072, 64, 132) == 1
    assert decode.num_splits(1, 8, 512, 64, 132) == 2
    assert decode.num_splits(4, 8, 4096, 64, 132, programs_per_sm=8) == 16
    assert decode.num_splits(1, 1, 10 ** 7, 64, 10 ** 4) == decode.MAX_SPLITS
    assert decode.block_size(None, 64) == (64, False)
    assert decode.block_size(16, 64) == (16, False) and decode.block_size(48, 64) == (16, False)
    assert decode.block_size(256, 64) == (64, False)
    assert decode.block_size(1, 64) == (64, True) and decode.block_size(24, 64) == (64, True)
    assert decode.programs_per_sm(gather=False) == 2 and decode.programs_per_sm(gather=True) == 8
    # batch 32, 8 KV heads, pages of 16 keys (blocks of 16): 2 splits, 512 programs on 132 SMs
    assert decode.num_splits(32, 8, 4096, 16, 132, decode.programs_per_sm(gather=False)) == 2
    assert decode.default_config(128, page_size=16)["STAGES"] == 4 and decode.default_config(128)["STAGES"] == 3


def test_no_host_read_of_lengths_and_one_workspace_per_shape(interpret, monkeypatch):
    """The lengths are never read on the host (their .tolist/.item/.cpu raise) and a second call of a shape
    reuses the first's workspace."""
    q, k, v, lens, table = _inputs([60, 10], 4, 1, 32, seed=13, page_size=16)
    want = decode.reference(q, k, v, lens, table)

    class DeviceOnly(torch.Tensor):
        def tolist(self):
            raise AssertionError("cache_seqlens read on the host")
        item = cpu = tolist

    seen = []
    real = decode._workspace
    monkeypatch.setattr(decode, "_workspace", lambda *a: seen.append(real(*a)) or seen[-1])
    lens_dev = lens.as_subclass(DeviceOnly)
    for _ in range(2):
        _close(decode.decode_attention_forward(q, k, v, lens_dev, table, num_splits=2, BN=16), want)
    assert len(seen) == 2 and all(a is b for a, b in zip(seen[0], seen[1]))


def test_chosen_pipeline_names_what_the_launch_runs(interpret):
    """``chosen_pipeline``: the planned split count and default depth on the CPU, and given values kept."""
    q, k, v, lens, table = _inputs([300, 3, 100, 0], 16, 2, 64, seed=19)
    config, _, splits = decode.plan(q, k)
    assert decode.chosen_pipeline(q, k, v, lens) == (config["STAGES"], splits)
    assert decode.chosen_pipeline(q, k, v, lens, num_splits=4, STAGES=2) == (2, 4)
    with pytest.raises(ValueError, match="num_splits must be a power of two"):
        decode.chosen_pipeline(q, k, v, lens, num_splits=3)


def test_combine_warps_grow_with_the_partials():
    """One warp a head for 2 splits of D = 128 (the H200's fastest), 4 for 8 or more, never more than 4."""
    assert [decode.combine_warps(s, 128) for s in (2, 4, 8, 64)] == [1, 2, 4, 4]
    assert decode.combine_warps(2, 64) == 1 and decode.combine_warps(4, 256) == 4


# ----------------------------------------------------------------------------------------------- errors

def _meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


GOOD = dict(q=(2, 8, 64), cache=(10, 16, 2, 64), lens=(2,), table=(2, 4))


@pytest.mark.parametrize("change, error, match", [
    (dict(q=_meta(2, 8, 1, 64)), ValueError, "q must be"),
    (dict(q=_meta(2, 8, 64, dtype=torch.int32)), TypeError, "float16, bfloat16 or float32"),
    (dict(k_cache=_meta(10, 16, 2, 64, dtype=torch.bfloat16)), TypeError, "k_cache must have q's dtype"),
    (dict(k_cache=_meta(10, 16, 3, 64), v_cache=_meta(10, 16, 3, 64)), ValueError, "not a multiple"),
    (dict(k_cache=_meta(10, 16, 2, 32), v_cache=_meta(10, 16, 2, 32)), ValueError, "head_dim is 32"),
    (dict(v_cache=_meta(10, 8, 2, 64)), ValueError, "must match"),
    (dict(k_cache=_meta(10, 16, 64)), ValueError, "k_cache must be"),
    (dict(cache_seqlens=_meta(2, dtype=torch.int64)), TypeError, "cache_seqlens must be int32"),
    (dict(cache_seqlens=_meta(3, dtype=torch.int32)), ValueError, r"cache_seqlens must be \(2,\)"),
    (dict(block_table=_meta(2, 4, dtype=torch.int64)), TypeError, "block_table must be int32"),
    (dict(block_table=_meta(3, 4, dtype=torch.int32)), ValueError, "block_table must be"),
    (dict(block_table=[[0]]), TypeError, "block_table must be a torch.Tensor"),
    (dict(block_table=None), ValueError, "without a block_table"),
    (dict(q=None), TypeError, "q must be a torch.Tensor"),
    (dict(cache_seqlens=torch.zeros(2, dtype=torch.int32)), ValueError, "one device"),
    (dict(window=(3,)), ValueError, "window must be"),
    (dict(softcap=-1.0), ValueError, "softcap must be"),
    (dict(k_scale=2.0), ValueError, "not fp8"),
    (dict(sm_scale="0.1"), TypeError, "sm_scale"),
])
def test_bad_arguments_are_typed_errors(change, error, match):
    args = dict(q=_meta(*GOOD["q"]), k_cache=_meta(*GOOD["cache"]), v_cache=_meta(*GOOD["cache"]),
                cache_seqlens=_meta(*GOOD["lens"], dtype=torch.int32),
                block_table=_meta(*GOOD["table"], dtype=torch.int32))
    args.update(change)
    with pytest.raises(error, match=match):
        decode.decode_attention(**args)


def test_fp8_scale_errors():
    cache = _meta(10, 16, 2, 64, dtype=torch.float8_e4m3fn)
    args = (_meta(2, 8, 64), cache, cache, _meta(2, dtype=torch.int32), _meta(2, 4, dtype=torch.int32))
    with pytest.raises(TypeError, match="float32 tensor of one element"):
        decode.decode_attention(*args, k_scale=_meta(2, dtype=torch.float32))
    with pytest.raises(TypeError, match="finite float"):
        decode.decode_attention(*args, v_scale=math.inf)
    with pytest.raises(ValueError, match="num_splits must be a power of two"):
        decode.decode_attention_forward(*args, num_splits=3)
    with pytest.raises(ValueError, match="unknown config key"):
        decode.decode_attention_forward(*args, BQ=3)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.delenv("TILEJIT_INTERPRET", raising=False)
    q, k, v, lens, table = _inputs([5], 2, 1, 16, seed=1, page_size=16)
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        decode.decode_attention(q, k, v, lens, table)


# ----------------------------------------------------------------------------------------------- compiling

ARCHS = [a for a in ("sm_80", "sm_90a", "sm_100a") if nvrtc_supports(a)]


# every cache form on sm_90a; the forms that differ most (pages with window and softcap, gathered rows) elsewhere
COMPILE_CASES = [(arch, form) for arch in ARCHS for form in ("paged64-window-softcap", "paged16", "gather1",
                                                              "contiguous") if arch == "sm_90a" or form in
                 ("paged64-window-softcap", "gather1")]


@pytest.mark.parametrize("arch, form", COMPILE_CASES, ids=[f"{f}-{a}" for a, f in COMPILE_CASES])
def test_kernels_compile(fresh_compile_cache, arch, form):
    """decode_fwd in the default config (D=128, GQA 8:1, bf16, split 4) for each cache form, and
    decode_combine, to cubins within the arch's shared memory."""
    batch, heads, kv_heads, dim = 4, 32, 4, 128
    page = {"paged64-window-softcap": 64, "paged16": 16, "gather1": 1, "contiguous": None}[form]
    config = decode.default_config(dim, page_size=page)
    bn, gather = decode.block_size(page, config.pop("BN"))
    if page is None:
        k = _meta(batch, 4000, kv_heads, dim, dtype=torch.bfloat16)
    elif gather:
        k = _meta(3000 * page, kv_heads, dim, dtype=torch.bfloat16)
    else:
        k = _meta(3000, page, kv_heads, dim, dtype=torch.bfloat16)
    q = _meta(batch, heads, dim, dtype=torch.bfloat16)
    ints = _meta(batch, 64, dtype=torch.int32)
    part, lse = _meta(batch, heads, 4, dim, dtype=torch.float32), _meta(batch, heads, 4, dtype=torch.float32)
    extra = dict(WINDOW_LEFT=100, SOFTCAP=30.0) if "window" in form else {}
    compiled = [decode.decode_fwd.compile(
        q, k, k, ints[:, 0], ints, q, part, lse, ints[:, 0], ints[:, 0], 0.1, 1.0, 1.0, GROUP=8, BM=16, BN=bn,
        D=dim, PAGE=page or 1, PAGED=page is not None, GATHER=gather, SPLIT=True, arch=arch, **extra, **config)]
    compiled.append(decode.decode_combine.compile(part, lse, q, NSPLIT=4, D=dim, arch=arch,
                                                  num_warps=decode.combine_warps(4, dim)))
    for c in compiled:
        assert c.asm["cubin"][:4] == b"\x7fELF"
        assert 0 < c.shared_bytes <= tilejit.target.Arch.parse(arch).max_shared_bytes
    assert "tj.gemm" in compiled[0].asm["ir"]
    if extra:
        assert "tj_tanh" in compiled[0].asm["cuda"]


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "sm_100a"])
def test_fp8_kernel_compiles(fresh_compile_cache, arch):
    dim = 128
    q = _meta(2, 16, dim, dtype=torch.bfloat16)
    k = _meta(100, 64, 2, dim, dtype=torch.float8_e4m3fn)
    ints = _meta(2, 8, dtype=torch.int32)
    scale = _meta(1, dtype=torch.float32)
    config = decode.default_config(dim, fp8=True, page_size=64)
    bn, _ = decode.block_size(64, config.pop("BN"))
    compiled = decode.decode_fwd.compile(q, k, k, ints[:, 0], ints, q, q, q, scale, scale, 0.1, 1.0, 1.0, GROUP=8,
                                         BM=16, BN=bn, D=dim, PAGE=64, PAGED=True, GATHER=False, SPLIT=False,
                                         WIDEN=True, K_SCALE_TENSOR=True, V_SCALE_TENSOR=True, arch=arch, **config)
    assert compiled.asm["cubin"][:4] == b"\x7fELF"


# ----------------------------------------------------------------------------------------------- the operator

def _op_args(q, k, v, lens, table):
    return (q, k, v, lens, table, 0.2, 20, 4.0, 1.0, None, 1.0, None, [])


def test_operator_is_registered_with_a_fake_kernel():
    q = _meta(3, 8, 64, dtype=torch.bfloat16)
    cache = _meta(20, 16, 2, 64, dtype=torch.bfloat16)
    out = torch.ops.tilejit.decode_attention(*_op_args(q, cache, cache, _meta(3, dtype=torch.int32),
                                                       _meta(3, 4, dtype=torch.int32)))
    assert out.shape == q.shape and out.dtype == q.dtype and out.device.type == "meta"


def test_opcheck(interpret):
    q, k, v, lens, table = _inputs([20, 9], 4, 2, 16, seed=17, page_size=16)
    k, v = k.nan_to_num(), v.nan_to_num()  # opcheck compares runs bitwise, NaN != NaN aside
    torch.library.opcheck(torch.ops.tilejit.decode_attention.default, _op_args(q, k, v, lens, table))


def test_torch_compile_fullgraph(interpret):
    """A function calling decode_attention compiles with fullgraph=True and agrees with the eager call."""
    q, k, v, lens, table = _inputs([20, 9], 4, 2, 16, seed=19, page_size=16)

    def step(q, k, v, lens, table):
        return decode.decode_attention(q, k, v, lens, table, window=(12, 0), softcap=5.0).relu()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v, lens, table), step(q, k, v, lens, table))


def test_meta_tensors_give_the_output_shape():
    """What shape propagation (torch.compile's fake tensors) sees from the wrapper."""
    q = _meta(3, 8, 64, dtype=torch.bfloat16)
    cache = _meta(20, 16, 2, 64, dtype=torch.bfloat16)
    out = decode.decode_attention(q, cache, cache, _meta(3, dtype=torch.int32), _meta(3, 4, dtype=torch.int32))
    assert out.shape == q.shape and out.device.type == "meta"


@pytest.mark.parametrize("page", [None, 16])
def test_float32_cache(interpret, page):
    """A float32 q and cache (what a model kept in float32 decodes with) against float64: tf32 products."""
    q, k, v, lens, table = _inputs([37, 0, 21], 8, 2, 32, seed=11, page_size=page, dtype=torch.float32)
    out = torch.full_like(q, NAN)
    decode.decode_attention_forward(q, k, v, lens, table, out=out, num_splits=2, BN=16)
    _close(out, decode.reference(q, k, v, lens, table), tol=5e-3)


@pytest.mark.parametrize("page", [None, 16])
def test_float32_default_config_fits_without_a_cut(fresh_compile_cache, page):
    """float32's default blocks hold half the keys, so their ring fits sm_90a's shared memory as asked."""
    batch, heads, kv_heads, dim = 4, 32, 4, 128
    config = decode.default_config(dim, page_size=page, fp32=True)
    bn, gather = decode.block_size(page, config.pop("BN"))
    k = _meta(batch, 4000, kv_heads, dim, dtype=torch.float32) if page is None else \
        _meta(3000, page, kv_heads, dim, dtype=torch.float32)
    q = _meta(batch, heads, dim, dtype=torch.float32)
    ints = _meta(batch, 64, dtype=torch.int32)
    part, lse = _meta(batch, heads, 4, dim, dtype=torch.float32), _meta(batch, heads, 4, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = decode.decode_fwd.compile(
            q, k, k, ints[:, 0], ints, q, part, lse, ints[:, 0], ints[:, 0], 0.1, 1.0, 1.0, GROUP=8, BM=16, BN=bn,
            D=dim, PAGE=page or 1, PAGED=page is not None, GATHER=gather, SPLIT=True, arch="sm_90a", **config)
    assert compiled.asm["cubin"][:4] == b"\x7fELF"


# (page size, head dim, cache dtype): pages that cap the block at 16 keys, and blocks of 32 and more
TENSOR_CORE_FORMS = [(16, 128, torch.bfloat16), (48, 128, torch.bfloat16), (16, 256, torch.bfloat16),
                     (16, 128, torch.float8_e4m3fn), (16, 128, torch.float32), (64, 128, torch.bfloat16),
                     (None, 128, torch.bfloat16), (None, 256, torch.float16)]


@pytest.mark.parametrize("page, dim, dtype", TENSOR_CORE_FORMS,
                         ids=[f"p{p}-d{d}-{str(t)[6:]}" for p, d, t in TENSOR_CORE_FORMS])
def test_default_plan_puts_both_products_on_tensor_cores(page, dim, dtype):
    """The planned warps split the (16 x BN) score tile into m16n8 atoms, so neither product of the pipelined loop
    falls back to scalar multiply-adds from shared memory (what 4 warps on a 16-key block did)."""
    batch, heads, kv_heads = 4, 32, 4
    q_dtype = torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype
    q = _meta(batch, heads, dim, dtype=q_dtype)
    if page is None:
        k, table = _meta(batch, 4096, kv_heads, dim, dtype=dtype), None
    else:
        k, table = _meta(batch * 4096 // page, page, kv_heads, dim, dtype=dtype), _meta(batch, 4096 // page,
                                                                                      dtype=torch.int32)
    config, gather, splits = decode.plan(q, k, table)
    config = dict(config)
    bn = config.pop("BN")
    assert not gather and (bn >= 32) == (config["num_warps"] == 4)
    ints = _meta(batch, 64, dtype=torch.int32)
    part = _meta(batch, heads, splits, dim, dtype=torch.float32)
    lse = _meta(batch, heads, splits, dtype=torch.float32)
    source = decode.decode_fwd.compile(
        q, k, k, ints[:, 0], table if table is not None else ints, q, part, lse, ints[:, 0], ints[:, 0], 0.1, 1.0,
        1.0, GROUP=8, BM=16, BN=bn, D=dim, PAGE=page or 1, PAGED=page is not None, GATHER=False, SPLIT=splits > 1,
        WIDEN=dtype == torch.float8_e4m3fn, arch="sm_90a", stop_after="cuda", **config).cuda
    # (an fp8 cache is loaded into registers to be widened: only shared-memory loads are prefetched)
    assert ("software pipeline" in source) == (dtype != torch.float8_e4m3fn)
    assert "scalar FMAs" not in source
    assert source.count("gemm 16x") >= 6  # q k^T and p v of the head, pipelined and tail loops


def test_warps_follow_a_given_block_size():
    """A BN given without num_warps gets the warps its block fits; given warps are kept (the probe's variants)."""
    q = _meta(2, 16, 128, dtype=torch.bfloat16)
    cache = _meta(8, 4096, 2, 128, dtype=torch.bfloat16)
    assert decode.plan(q, cache)[0]["num_warps"] == 4
    assert decode.plan(q, cache, config=dict(BN=16))[0]["num_warps"] == 1
    assert decode.plan(q, cache, config=dict(BN=16, num_warps=4))[0]["num_warps"] == 4
    assert decode.block_warps(16, 256) == 2 and decode.block_warps(32, 128) == 4


# ----------------------------------------------------------------------------------------------- residency

#: blocks an H200 SM held of decode_fwd per ring depth (occupancy API on the compiled kernels, pages of 16 keys:
#: 1 warp, 255 registers; of 64 keys: 4 warps), from ``scripts/probes/decode_variants.py --grid``
H200_RESIDENT = {16: {2: 8, 3: 7, 4: 5, 6: 4}.get, 64: {2: 2, 3: 2, 4: 1, 6: 1}.get}


@pytest.mark.parametrize("page, batch, want", [
    (16, 32, (3, 2)),    # 512 one-warp programs in one wave of 7 a SM: 93 KiB in flight (4 stages: 3.72 TB/s)
    (16, 64, (3, 1)),
    (16, 128, (2, 1)),   # 1,024 programs: 3 stages would leave a second wave of 100 (3.38 against 4.11 TB/s)
    (16, 8, (3, 8)),
    (64, 32, (2, 1)),    # 256 four-warp programs, 2 a SM: one wave
    (64, 16, (3, 1)),
])
def test_pipeline_fills_whole_waves_with_enough_in_flight(page, batch, want):
    """The measured H200 choices (context 32k, 8 KV heads, D = 128, 132 SMs)."""
    bn, warps = (16, 1) if page == 16 else (64, 4)
    assert decode.most_splits(32768, bn) == min(decode.MAX_SPLITS, 32768 // (bn * decode.MIN_BLOCKS_PER_SPLIT))
    assert decode.choose_pipeline(batch * 8, decode.most_splits(32768, bn), 132, 2 * bn * 128 * 2, warps, H200_RESIDENT[page]) == want


def test_pipeline_keeps_what_the_launch_gives():
    """A given ring depth or split count is kept; the other is chosen around it; a ring an SM cannot hold is never
    chosen."""
    resident = H200_RESIDENT[16]
    assert decode.choose_pipeline(256, 64, 132, 8192, 1, resident, stages=4) == (4, 2)
    assert decode.choose_pipeline(256, 64, 132, 8192, 1, resident, splits=4) == (2, 4)
    assert decode.choose_pipeline(256, 64, 132, 8192, 1, resident, stages=6, splits=8) == (6, 8)
    assert decode.choose_pipeline(256, 64, 132, 8192, 1, {2: 0, 3: 0, 4: 5, 6: 0}.get) == (4, 2)
    assert decode.choose_pipeline(256, 64, 132, 8192, 1, lambda depth: 0) == (2, 1)  # nothing fits: as given
    # a short cache (most_splits 1) keeps one split whatever the grid
    assert decode.choose_pipeline(8, 1, 132, 8192, 1, resident)[1] == 1


@pytest.mark.parametrize("page, dtype, dim", [(16, torch.bfloat16, 128), (None, torch.float16, 64),
                                              (64, torch.float32, 128)])
def test_a_stage_costs_its_blocks_bytes_of_shared_memory(fresh_compile_cache, page, dtype, dim):
    """``_residency_plan`` counts the shared memory of other ring depths from one compiled kernel: each stage adds
    BN keys and BN values of the cache's dtype, nothing else."""
    batch, heads, kv_heads = 4, 32, 4
    q = _meta(batch, heads, dim, dtype=dtype)
    if page is None:
        k, table = _meta(batch, 4096, kv_heads, dim, dtype=dtype), None
    else:
        k, table = _meta(batch * 256, page, kv_heads, dim, dtype=dtype), _meta(batch, 256, dtype=torch.int32)
    config, _, _ = decode.plan(q, k, table)
    bn = config["BN"]
    sizes = {}
    for stages in (2, 3):
        _, args, keywords, _ = decode._fwd_call(q, k, k, _meta(batch, dtype=torch.int32), table, q, 0.1, -1, 0.0,
                                                (1.0, None, 1.0, None), {"STAGES": stages}, 2)
        sizes[stages] = decode.decode_fwd.compile(*args, arch="sm_90a", **keywords).shared_bytes
    assert sizes[3] - sizes[2] == 2 * bn * dim * dtype.itemsize
