"""tilejit.ops.decode_attention on the GPU: against the float64 reference over ragged lengths (0, 1, page ends,
the capacity), page sizes 1/16/64/256 and no block table, GQA 1/4/8, head dims 64 and 128, bf16 and fp16,
windows, softcaps, an fp8 cache with scales, split and unsplit; outputs NaN-poisoned and NaN in every cache slot
no key is read from; CUDA-graph capture and replay equal to eager calls (new lengths and cache contents between
replays: the lengths are read on the device); torch.compile(fullgraph=True)."""
from __future__ import annotations


import pytest
import torch
import tilejit.ops.paged_decode as decode

pytestmark = pytest.mark.gpu

NAN = float("nan")


def _inputs(lens, heads, kv_heads, dim, page_size, dtype=torch.bfloat16, seed=0, capacity=None):
    """q and a cache holding NaN in every slot past a length (and in spare pages); fp8 caches are float8_e4m3fn
    with q in bf16."""
    gen = torch.Generator().manual_seed(seed)
    capacity = capacity or max(lens) + 3
    q_dtype = torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype
    q = torch.randn(len(lens), heads, dim, generator=gen).to("cuda", q_dtype)
    k = torch.randn(len(lens), capacity, kv_heads, dim, generator=gen).cuda()
    v = torch.randn(len(lens), capacity, kv_heads, dim, generator=gen).cuda()
    for b, n in enumerate(lens):
        k[b, n:] = NAN
        v[b, n:] = NAN
    k, v = k.to(dtype), v.to(dtype)
    lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
    if page_size is None:
        return q, k, v, lens_t, None
    kp, vp, table = decode.paged_cache(k, v, page_size, spare_pages=5, generator=gen, fill=NAN)
    return q, kp, vp, lens_t, table


def _check(out, want, tol=2e-2):
    assert not torch.isnan(out).any(), "some outputs are NaN: never written, or a poisoned slot was read"
    torch.testing.assert_close(out.double().cpu(), want, rtol=tol, atol=tol)


LENS = [4099, 1, 0, 1024, 777, 2048, 63, 3000]


# (page size, heads, kv heads, head dim, dtype): every page size at GQA 8:1, then GQA 1 and 4, D=64, fp16
SHAPES = [(page, 32, 4, 128, torch.bfloat16) for page in (None, 1, 16, 64, 256)] + [
    (16, 8, 8, 64, torch.bfloat16), (64, 16, 4, 128, torch.float16), (None, 8, 8, 128, torch.float16),
    (1, 16, 4, 64, torch.float16), (256, 64, 8, 128, torch.bfloat16)]


@pytest.mark.parametrize("page, heads, kv_heads, dim, dtype", SHAPES,
                         ids=[f"p{p}-h{h}-kv{kv}-d{d}-{str(t)[6:]}" for p, h, kv, d, t in SHAPES])
def test_matches_float64(page, heads, kv_heads, dim, dtype):
    q, k, v, lens, table = _inputs(LENS, heads, kv_heads, dim, page, dtype, seed=heads + dim)
    want = decode.reference(q, k, v, lens, table)
    _check(decode.decode_attention(q, k, v, lens, table), want)
    for splits in (1, 8):
        out = torch.full_like(q, NAN)
        decode.decode_attention_forward(q, k, v, lens, table, out=out, num_splits=splits)
        _check(out, want)


@pytest.mark.parametrize("page", [None, 16, 64])
@pytest.mark.parametrize("window, softcap", [((255, 0), None), ((1000, -1), 30.0), ((0, 0), None), (None, 5.0),
                                             ((4096, 4096), 2.0)])
def test_window_and_softcap(page, window, softcap):
    """Keys before the window poisoned: a read of one, even masked, would make the output NaN."""
    q, k, v, lens, table = _inputs(LENS, 32, 4, 128, page, seed=7)
    want = decode.reference(q, k, v, lens, table, window=window, softcap=softcap)
    left = window[0] if window else -1
    if left >= 0:
        for b, n in enumerate(lens.tolist()):
            keys = torch.arange(0, max(n - 1 - left, 0))
            if page is None:
                k[b, keys] = NAN
                v[b, keys] = NAN
            else:
                pages = table[b].long()[keys // page]
                k[pages, keys % page] = NAN
                v[pages, keys % page] = NAN
    for splits in (None, 1, 4):
        out = torch.full_like(q, NAN)
        decode.decode_attention_forward(q, k, v, lens, table, window=window, softcap=softcap, out=out,
                                        num_splits=splits)
        _check(out, want)


@pytest.mark.parametrize("page", [None, 16, 64])
def test_fp8_cache(page):
    q, k, v, lens, table = _inputs(LENS, 32, 4, 128, page, torch.float8_e4m3fn, seed=9)
    k_scale = torch.tensor([0.5], device="cuda")
    for scales in (dict(k_scale=k_scale, v_scale=2.0), dict(k_scale=0.25, v_scale=torch.tensor(1.5).cuda())):
        want = decode.reference(q, k, v, lens, table, **scales)
        _check(decode.decode_attention(q, k, v, lens, table, **scales), want, tol=3e-2)


@pytest.mark.parametrize("page, batch", [(16, 2), (64, 48), (None, 3)])
def test_cuda_graph_replay_equals_eager(page, batch):
    """Captured after a warm-up call, replayed with new queries, cache contents and lengths written into the
    captured tensors: each replay equals an eager call on the same inputs (few sequences split, many do not)."""
    gen = torch.Generator().manual_seed(batch)
    lens = torch.randint(1, 2000, (batch,), generator=gen).tolist()
    q, k, v, lens_t, table = _inputs(lens, 32, 4, 128, page, seed=batch, capacity=2048)
    k.nan_to_num_(0.0)
    v.nan_to_num_(0.0)
    decode.decode_attention(q, k, v, lens_t, table, window=(1500, 0), softcap=40.0)  # warm-up: compile, workspace
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = decode.decode_attention(q, k, v, lens_t, table, window=(1500, 0), softcap=40.0)
    for step in range(3):
        q.copy_(torch.randn(q.shape, generator=gen).to(q))
        k.copy_(torch.randn(k.shape, generator=gen).to(k))
        v.copy_(torch.randn(v.shape, generator=gen).to(v))
        lens_t.copy_(torch.randint(0, 2048, (batch,), generator=gen, dtype=torch.int32).to(lens_t))
        graph.replay()
        eager = decode.decode_attention(q, k, v, lens_t, table, window=(1500, 0), softcap=40.0)
        torch.cuda.synchronize()
        assert torch.equal(captured, eager), f"replay {step} differs from the eager call"
        _check(captured, decode.reference(q, k, v, lens_t, table, window=(1500, 0), softcap=40.0))


def test_torch_compile_fullgraph():
    q, k, v, lens, table = _inputs([300, 17, 4000], 32, 4, 128, 16, seed=11)

    def step(q, k, v, lens, table):
        return decode.decode_attention(q, k, v, lens, table).float().softmax(-1)

    compiled = torch.compile(step, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, lens, table), step(q, k, v, lens, table))


# 16-key blocks (pages of 16 and 48) in the warps they plan (1; 2 at D=256) and the probe's other warp counts
SIXTEEN_KEY_CASES = [(16, 128, None), (48, 128, None), (16, 256, None), (16, 128, 2), (16, 128, 4), (48, 64, 2),
                     (None, 128, 1)]


@pytest.mark.parametrize("page, dim, warps", SIXTEEN_KEY_CASES,
                         ids=[f"p{p}-d{d}-w{w}" for p, d, w in SIXTEEN_KEY_CASES])
def test_sixteen_key_blocks_in_every_warp_count(page, dim, warps):
    """A block of 16 keys (the page caps it, or BN=16 on a contiguous cache) split and unsplit, against float64:
    one warp holds the whole score tile, two share it, four fall back to scalar products; all must agree."""
    q, k, v, lens, table = _inputs(LENS, 32, 4, dim, page, seed=dim + (warps or 0))
    want = decode.reference(q, k, v, lens, table, softcap=20.0)
    config = dict(BN=16) if page is None else {}
    if warps is not None:
        config["num_warps"] = warps
    for splits in (None, 1, 8):
        out = torch.full_like(q, NAN)
        decode.decode_attention_forward(q, k, v, lens, table, softcap=20.0, out=out, num_splits=splits, **config)
        _check(out, want)


@pytest.mark.parametrize("page, batch", [(16, 32), (16, 160), (64, 24), (None, 40)])
def test_chosen_ring_depth_and_splits(page, batch):
    """The default launch's ring depth and split count come from the loaded kernel's occupancy
    (``choose_pipeline``): recorded once per shape, a depth of ``STAGE_CHOICES``, and the output right; every other
    depth, given, is right too."""
    gen = torch.Generator().manual_seed(batch)
    lens = torch.randint(0, 4096, (batch,), generator=gen).tolist()
    lens[0] = 4096
    q, k, v, lens_t, table = _inputs(lens, 64, 8, 128, page, seed=batch, capacity=4096)
    want = decode.reference(q, k, v, lens_t, table)
    decode._PIPELINES.clear()
    out = torch.full_like(q, NAN)
    decode.decode_attention_forward(q, k, v, lens_t, table, out=out)
    _check(out, want)
    assert len(decode._PIPELINES) == 1
    stages, splits = next(iter(decode._PIPELINES.values()))
    assert stages in decode.STAGE_CHOICES and splits >= 1 and splits & (splits - 1) == 0
    for depth in decode.STAGE_CHOICES:
        out = torch.full_like(q, NAN)
        decode.decode_attention_forward(q, k, v, lens_t, table, out=out, STAGES=depth)
        _check(out, want)
