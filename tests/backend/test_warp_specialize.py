"""Warp-specialized wgmma main loops (``T.range(..., warp_specialize=True)`` or the ``warp_specialize`` launch
option): a producer warpgroup launched beyond ``num_warps`` issues the TMA loads, the math warps wait only for
loaded slots, registers move by setmaxnreg, and after the split the block-wide barriers count the math warps
alone. Loops that cannot take it keep the plain form under the launch option and are refused, located, when
the loop asks for it."""
from __future__ import annotations

import re

import pytest
import torch

import tilejit
import tilejit.language as T
from _lowering import braced_block
from kernels import matmul_any
from tilejit.autotuner import Config
from tilejit.backend_cuda import lower_specialized
from tilejit.errors import CompilationError, TilejitError

F16 = torch.float16


def _meta(*shape, dtype=F16):
    return torch.empty(*shape, dtype=dtype, device="meta")


@tilejit.kernel
def mm(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr, WS: T.constexpr = None):
    M, K = A.shape
    N = B.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, warp_specialize=WS):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def mm_bias_first(A, B, bias, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr, WS: T.constexpr = None):
    """The accumulator starts from a loaded bias: a load before the loop, which the producer must not run."""
    M, K = A.shape
    N = B.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32) + bias[n0:n0 + BN][None, :].to(T.float32)
    for k0 in T.range(0, K, BK, warp_specialize=WS):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def mm_tile_bound(A, B, Ks, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr, WS: T.constexpr = None):
    """The loop's bound is the sum of a loaded tile: a value the producer (scalars only) cannot compute."""
    N = B.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    k_end = T.sum(Ks[0:2], 0)
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, k_end, BK, warp_specialize=WS):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def mm_batched(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr, WS: T.constexpr = None):
    """One loop per batch entry, nested in an outer loop: not at the kernel's top level."""
    M, K = A.shape
    N = B.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    for rep in range(2):
        acc = T.zeros((BM, BN), T.float32)
        for k0 in T.range(0, K, BK, warp_specialize=WS):
            acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
        C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def mm_found_rows(A, B, Starts, G, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr, WS: T.constexpr = None,
                  BIAS: T.constexpr = False):
    """The program's rows found by a scalar search over a table of group starts before the loop (as a grouped
    GEMM's programs find their group): a loop of scalar math and scalar reads. ``BIAS``: the accumulator starts
    from a loaded row of C, which the producer must not run."""
    K = A.shape[1]
    n0 = T.program_id(1) * BN
    m0 = 0
    for g in range(G):
        if T.program_id(0) * BM >= Starts[g]:
            m0 = Starts[g] + (T.program_id(0) * BM - Starts[g]) // BM * BM
    acc = T.zeros((BM, BN), T.float32)
    if BIAS:
        acc += C[0, n0:n0 + BN][None, :].to(T.float32)
    for k0 in T.range(0, K, BK, warp_specialize=WS):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def mm_summed_bound(A, B, Ks, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr, WS: T.constexpr = None):
    """The loop's bound summed over a loop whose body reduces a loaded tile: not scalar math."""
    N = B.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    k_end = 0
    for i in range(2):
        k_end += T.sum(Ks[2 * i:2 * i + 2], 0)
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, k_end, BK, warp_specialize=WS):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


def _args(m=1000, n=768, k=512):
    return _meta(m, k), _meta(k, n), _meta(m, n)


def _compile(kernel, *args, arch="sm_90a", stop_after="cuda", **kw):
    kw.setdefault("BM", 128)
    kw.setdefault("BN", 256)
    kw.setdefault("BK", 64)
    kw.setdefault("num_warps", 8)
    kw.setdefault("num_stages", 4)
    return kernel.compile(*args, arch=arch, stop_after=stop_after, **kw)


def _section(cuda: str, start: str) -> str:
    """The braced block opened by the first line containing ``start``."""
    return braced_block(cuda, cuda.index(start))


@pytest.mark.parametrize("how", ["loop", "launch"])
def test_structure(how):
    kw = {"WS": True} if how == "loop" else {"warp_specialize": True}
    st = _compile(mm, *_args(), **kw)
    cuda = st.cuda
    assert "producer_warpgroup = true" in st.final_ir
    assert "__launch_bounds__(384, 1)" in cuda
    producer = _section(cuda, "if (tid >= 256)")
    # the producer gives registers back, one thread issues every TMA load, each slot after the math released it
    assert producer.index("tj_setmaxnreg_dec<40>()") < producer.index("if (tid == 256)")
    assert "tj_mbar_wait(" in producer and "tj_mbar_expect_tx(" in producer
    assert producer.count("tj_tma_load_2d(") == 1 + 4  # A: one 128-byte panel; B: four
    assert re.search(r"return;", producer)
    after = cuda[cuda.index(producer) + len(producer):]
    assert after.lstrip().startswith("tj_setmaxnreg_inc<232>();")
    loop = _section(after, "for (int64_t")
    # the math warps never issue TMA nor wait on "empty" slots; they arrive on them, once per warp
    assert "tj_tma_load" not in loop and "tj_mbar_expect_tx" not in loop
    assert "tj_mbar_arrive(" in loop and "wgmma.wait_group.sync.aligned 1;" in loop
    # after the split, block-wide barriers count the 256 math threads alone
    assert "__syncthreads" not in after
    assert 'bar.sync 1, 256;' in after
    before = cuda[:cuda.index(producer)]
    assert "__syncthreads();" in before  # the barrier setup still waits for every thread
    assert "tj_tma_load" not in before.split("__global__")[1]  # no prologue prefetch by the math warps


def test_producer_splits_off_first_when_something_before_the_loop_needs_memory():
    """A bias loaded before the loop: the producer leaves at the kernel's start with only the scalars its loads
    need (program ids, sizes); the math warps load the bias behind the math warps' named barrier."""
    bias = _meta(768)
    st = _compile(mm_bias_first, *_args()[:2], bias, _args()[2], WS=True)
    assert "producer_warpgroup = true" in st.final_ir
    cuda = st.cuda
    body = cuda[cuda.index(") {", cuda.index("__global__")):]  # after the parameters
    producer = _section(body, "if (tid >= 256)")
    assert "blockIdx.y" in producer and "tj_tma_load_2d(" in producer
    assert "v2_bias" not in producer  # the bias is the math warps' business
    before, after = body[:body.index(producer)], body[body.index(producer) + len(producer):]
    assert "v2_bias" not in before and "v2_bias" in after
    assert "__syncthreads" not in after and "bar.sync 1, 256;" in after
    assert st.fn.attrs.get("producer_first") and not st.fn.attrs.get("persistent")


def test_a_scalar_search_before_the_loop_runs_on_the_producer_too():
    """A loop (with an ``if``) of scalar math and scalar reads before the main loop: every warp runs it before the
    producer splits off (specialized), or the producer's walk and the math warps' each run it per program
    (persistent); a loop that reduces a loaded tile still cannot be specialized."""
    starts, groups = _meta(4, dtype=torch.int32), 4
    search = re.compile(r"for \(int64_t v\d+_g = ")
    st = _compile(mm_found_rows, *_args()[:2], starts, groups, _args()[2], WS=True)
    assert "producer_warpgroup = true" in st.final_ir and not st.fn.attrs.get("producer_first")
    cuda = st.cuda[st.cuda.index("__global__"):]
    split = cuda.index("if (tid >= 256)")
    assert len(search.findall(cuda)) == 1 and search.search(cuda[:split])
    st = _compile(mm_found_rows, *_args()[:2], starts, groups, _args()[2], persistent=True)
    assert st.fn.attrs.get("persistent") == 132
    cuda = st.cuda[st.cuda.index("__global__"):]
    producer = _section(cuda, "if (tid >= 256)")
    assert len(search.findall(cuda)) == 2 and search.search(producer)  # the producer's walk, and the math warps'
    assert "v2_Starts" in producer and "tj_tma_load_2d(" in producer
    # a load before the loop: the producer leaves first, with the search its loads' rows need
    st = _compile(mm_found_rows, *_args()[:2], starts, groups, _args()[2], WS=True, BIAS=True)
    assert st.fn.attrs.get("producer_first")
    cuda = st.cuda[st.cuda.index("__global__"):]
    producer = _section(cuda, "if (tid >= 256)")
    assert len(search.findall(cuda)) == 2 and search.search(producer) and "v4_C" not in producer
    ks = _meta(4, dtype=torch.int32)
    st = _compile(mm_summed_bound, *_args()[:2], ks, _args()[2], warp_specialize=True)
    assert "producer_warpgroup" not in st.final_ir
    with pytest.raises(CompilationError, match="cannot be warp-specialized"):
        _compile(mm_summed_bound, *_args()[:2], ks, _args()[2], WS=True)


def test_attention_main_loop_is_warp_specialized():
    """Attention's key/value loop (softmax between its gemms, not left in flight): the producer fills the ring
    from the kernel's start; the math warps wait for each slot, release it at the end of their iteration (one
    arrival per warp), and never meet at a block barrier inside the loop. The masked loop after it stays plain."""
    from tilejit.ops import fused_attention as attention

    q = torch.empty(2, 4, 4096, 128, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(2, 2, 4096, 128, dtype=torch.bfloat16, device="meta")
    lens = torch.empty(2, dtype=torch.int32, device="meta")
    for causal in (False, True):
        compiled = attention.attn_fwd.compile(q, kv, kv, q, q, lens, 0.125, 4, GROUP=2, BM=128, BN=64, D=128,
                                              CAUSAL=causal, VARLEN=False, num_warps=8, arch="sm_90a",
                                              warp_specialize=True)
        cuda = compiled.asm["cuda"]
        assert compiled.meta["threads"] == 384 and compiled.meta["spills"] == 0
        body = cuda[cuda.index("__global__"):]
        producer = _section(body, "if (tid >= 256)")
        assert producer.count("tj_tma_load_4d(") == 4 and "wgmma" not in producer
        assert "stage v0_Q window" not in producer and "stage v0_Q window" in body  # Q: the math warps' load
        after = body[body.index(producer) + len(producer):]
        loop = _section(after, "for (int64_t")
        assert "tj_tma_load" not in loop and "bar.sync" not in loop and "__syncthreads" not in loop
        assert loop.count("tj_mbar_arrive(") == 1 and "(tj_it % 2)" in loop
        rest = after[after.index(loop) + len(loop):]
        assert "tj_tma_load_4d(" in rest  # the masked loop's own ring, filled by thread 0
    # the specialized loop's ring is given back after it: the masked loop's ring reuses the memory, so 128 x 128
    # tiles keep both rings 2 deep (they did not fit together, and both fell to one stage, not pipelined)
    compiled = attention.attn_fwd.compile(q, kv, kv, q, q, lens, 0.125, 4, GROUP=2, BM=128, BN=128, D=128,
                                          CAUSAL=True, VARLEN=False, num_warps=8, arch="sm_90a",
                                          warp_specialize=True)
    assert compiled.meta["threads"] == 384 and compiled.asm["ir"].count("kind = pipelined, stages = 2") == 2
    assert "tj_mbar_inval" in compiled.asm["cuda"]


def test_cubin_reports_the_producer_threads():
    compiled = _compile(mm, *_args(), stop_after=None, warp_specialize=True)
    assert compiled.threads == 384 and compiled.meta["threads"] == 384
    plain = _compile(mm, *_args(), stop_after=None)
    assert plain.threads == 256
    assert compiled.meta["spills"] == 0, compiled.meta


@pytest.mark.parametrize("arch, options, made", [
    ("sm_90a", dict(warp_specialize=True, num_stages=3), (128, 0, 1)),
    ("sm_90a", dict(persistent=True, num_stages=3), (128, 132, 1)),
    ("sm_90a", dict(num_stages=3), (0, 0, 1)),
    ("sm_80", dict(warp_specialize=True, BK=32), (0, 0, 1)),
    ("sm_80", dict(persistent=True, BK=32), (0, 0, 1)),
    ("sm_80", dict(pingpong=True, BK=32), (0, 0, 1)),
    ("sm_100a", dict(persistent=True), (0, 0, 1))])
def test_meta_says_what_the_compile_made_of_the_options_asked(arch, options, made):
    """An option the arch does not take is recorded as asked, and what was made says it was not."""
    compiled = _compile(mm, *_args(), stop_after=None, arch=arch, **options)
    meta = compiled.meta
    assert (meta["producer_threads"], meta["walk_programs"], meta["groups"]) == made, meta
    asked = [name for name in ("warp_specialize", "persistent", "pingpong") if options.get(name)]
    assert all(meta[name] for name in asked)
    assert compiled.threads == 256 + made[0]


@pytest.mark.parametrize("warps,bm,bn", [(4, 128, 128), (8, 128, 256), (8, 256, 128), (4, 64, 256)])
def test_register_split(warps, bm, bn):
    compiled = _compile(mm, *_args(), stop_after=None, BM=bm, BN=bn, num_warps=warps, warp_specialize=True)
    regs = lower_specialized.consumer_registers(32 * warps, 128)
    assert regs % 8 == 0 and 24 <= regs <= 256
    assert 32 * warps * regs + 128 * 40 <= 65536
    assert f"tj_setmaxnreg_inc<{regs}>" in compiled.asm["cuda"]
    assert compiled.meta["spills"] == 0, compiled.meta


def test_launch_option_passes_over_loops_that_do_not_qualify():
    ks = _meta(2, dtype=torch.int32)
    st = _compile(mm_tile_bound, *_args()[:2], ks, _args()[2], warp_specialize=True)
    assert "producer_warpgroup" not in st.final_ir and "tj_setmaxnreg" not in st.cuda
    st = _compile(mm_batched, *_args(), warp_specialize=True)
    assert "producer_warpgroup" not in st.final_ir
    # other archs: the option is about Hopper's ring, and means nothing there
    st = _compile(mm, *_args(), arch="sm_80", BK=32, warp_specialize=True)
    assert "tj_setmaxnreg" not in st.cuda and "__launch_bounds__(256)" in st.cuda
    st = _compile(mm, *_args(), arch="sm_100a", warp_specialize=True)
    assert "tj_setmaxnreg" not in st.cuda


def test_loop_that_asks_and_cannot_is_refused_with_its_location():
    ks = _meta(2, dtype=torch.int32)
    with pytest.raises(CompilationError) as info:
        _compile(mm_tile_bound, *_args()[:2], ks, _args()[2], WS=True)
    text = str(info.value)
    assert "cannot be warp-specialized" in text and "depend on 'load'" in text and "test_warp_specialize.py" in text
    assert "^" in text  # the caret under the loop
    with pytest.raises(CompilationError, match="nested in another loop"):
        _compile(mm_batched, *_args(), WS=True)
    with pytest.raises(CompilationError, match="split-K"):
        _compile(mm, *_args(), WS=True, split_k=2)


def test_a_refusal_names_the_load_or_gemm_at_fault():
    a, b, c = _args()
    with pytest.raises(CompilationError) as info:  # B given as w.T: a column-major window, no TMA
        _compile(mm, a, _meta(768, 512).T, c, WS=True)
    text = str(info.value)
    assert "its load of B (" in text and "is copied by cp_async, not TMA" in text and "w.T" in text, text
    with pytest.raises(CompilationError, match=r"its gemm \(.*\) is lowered to mma_sync_m16n8k16, not wgmma"):
        _compile(mm, a, b, c, WS=True, BM=32, BN=64, num_warps=4)


def test_loop_option_false_overrides_the_launch_option():
    st = _compile(mm, *_args(), WS=False, warp_specialize=True)
    assert "producer_warpgroup" not in st.final_ir


@pytest.mark.parametrize("dtype,bk,acc,out", [(torch.float8_e4m3fn, 128, T.float32, torch.float32),
                                              (torch.int8, 128, T.int32, torch.int32),
                                              (torch.float32, 32, T.float32, torch.float32)])
def test_other_dtypes(dtype, bk, acc, out):
    a, b, c = _meta(1000, 1024, dtype=dtype), _meta(900, 1024, dtype=dtype), _meta(1000, 900, dtype=out)
    compiled = matmul_any.compile(a, b, c, BM=128, BN=128, BK=bk, TA=False, TB=True, ACC=acc, num_warps=8,
                                  warp_specialize=True, arch="sm_90a")
    assert compiled.threads == 384 and compiled.meta["spills"] == 0


def test_bad_keyword_values_are_located():
    @tilejit.kernel
    def bad(A, B: T.constexpr):
        for i in T.range(0, 4, warp_specialize=B):
            A[i] = 1.0

    with pytest.raises(CompilationError, match="warp_specialize must be a compile-time True or False"):
        bad.compile(_meta(8, dtype=torch.float32), 3, arch="sm_90a", stop_after="ir")

    @tilejit.kernel
    def static(A):
        for i in T.static_range(0, 4, warp_specialize=True):
            A[i] = 1.0

    with pytest.raises(CompilationError, match="unexpected keyword 'warp_specialize'"):
        static.compile(_meta(8, dtype=torch.float32), arch="sm_90a", stop_after="ir")


def test_launch_option_validation_and_config():
    with pytest.raises(TilejitError, match="warp_specialize must be True or False"):
        mm.compile(*_args(), BM=128, BN=128, BK=64, warp_specialize=1, arch="sm_90a", stop_after="ir")
    on = Config({"BM": 128}, num_warps=8, warp_specialize=True)
    off = Config({"BM": 128}, num_warps=8)
    assert on != off and "warp_specialize=True" in on.identity and "warp_specialize" not in off.identity
    assert on.launch_kwargs["warp_specialize"] is True and "warp_specialize" not in off.launch_kwargs
    assert "warp_specialize=True" in repr(on) and on.to_json()["warp_specialize"] is True


def test_cache_key_differs():
    from tilejit.compiler import cache_key
    from tilejit.target import Target

    call_on = mm.bind(_args(), {"BM": 128, "BN": 256, "BK": 64, "warp_specialize": True})
    call_off = mm.bind(_args(), {"BM": 128, "BN": 256, "BK": 64})
    on = cache_key(call_on.spec, Target.of("sm_90a", warp_specialize=True))
    off = cache_key(call_off.spec, Target.of("sm_90a"))
    assert on != off


@pytest.mark.parametrize("elem", [1, 2, 4])
def test_every_default_warp_specialized_config_compiles_without_spills(elem):
    """The autotune space's warp-specialized configs on the benchmarks' grouped-order kernels, for sm_90a: the
    matmul for 16-bit operands; for fp8 and tf32, the kernels taking B given N x K (K-major, as wgmma wants it)."""
    from benchmarks import kernels
    from tilejit.configs import matmul_configs, promotion_fits

    n = 2048
    configs = [c for c in matmul_configs(elem_bytes=elem) if c.options.sm90a_only]
    assert configs
    for config in configs:
        extra = {}
        if elem == 1:
            e4m3 = torch.float8_e4m3fn
            args = (_meta(n, n, dtype=e4m3), _meta(n, n, dtype=e4m3), _meta(n, dtype=torch.float32),
                    _meta(n, dtype=torch.float32), _meta(n, n, dtype=torch.bfloat16))
            kernel = kernels.scaled_mm.kernel
            # the precise (default) fp8 product's temporaries do not fit every config: the tuner drops those
            extra = {} if promotion_fits(config) else {"PRECISION": "fast"}
        elif elem == 4:  # tf32 wgmma takes K-major operands only
            args = (_meta(n, n, dtype=torch.float32), _meta(n, n, dtype=torch.float32), _meta(n, n, dtype=torch.float32))
            kernel = kernels.tf32_mm_nt.kernel
        else:
            args = (_meta(n, n), _meta(n, n), _meta(n, n))
            kernel = kernels.matmul.kernel
        compiled = kernel.compile(*args, **config.all_kwargs(), **extra, arch="sm_90a")
        assert compiled.threads == (2 if config.pingpong else 1) * 32 * config.num_warps + 128, config
        assert compiled.meta["spills"] == 0, (config, compiled.meta)
        assert compiled.meta["groups"] == (2 if config.pingpong else 1), config
        assert compiled.meta["stream_k"] == (132 if config.stream_k else 0), config


# -- persistent kernels ------------------------------------------------------------------------------------------

def test_persistent_structure():
    st = _compile(mm, *_args(), persistent=True, BN=128)
    cuda = st.cuda
    assert "producer_warpgroup = true" in st.final_ir  # persistent implies warp specialization
    head = cuda[cuda.index("__global__"):]
    # programs past one per SM leave at once; the ring's barriers are set up once, before any walk
    assert head.index("if (tj_first >= 132) return;") < head.index("tj_mbar_init(")
    assert head.count("tj_mbar_init(") == 2 and "tj_mbar_inval" not in head
    producer = _section(head, "if (tid >= 256)")
    walk = _section(producer, "for (long long tj_prog = tj_first; tj_prog < tj_nprogs; tj_prog += 132)")
    assert "tj_tma_load_2d(" in walk and "const int32_t tj_pid0 = " in walk
    after = head[head.index(producer) + len(producer):]
    assert after.index("int tj_it = 0;") < after.index("for (long long tj_prog")
    consumer = _section(after, "for (long long tj_prog")
    assert "tj_tma_load" not in consumer and "tj_mbar_arrive(" in consumer
    assert "blockIdx" not in consumer  # T.program_id reads the program being run
    assert consumer.rstrip("}").rstrip().endswith('asm volatile("bar.sync 1, 256;" ::: "memory");  '
                                                  "// this program's shared memory (the epilogue's) is free for "
                                                  "the next one")


def test_persistent_program_count_and_cache_key():
    from tilejit.compiler import cache_key
    from tilejit.target import Target

    st = mm.compile(*_args(), BM=128, BN=128, BK=64, num_warps=8, persistent=True, arch="sm_90a", stop_after="cuda")
    assert "tj_prog += 132" in st.cuda  # no GPU here: an H100 SXM's SM count
    call = mm.bind(_args(), {"BM": 128, "BN": 128, "BK": 64, "persistent": True})
    keys = {cache_key(call.spec, Target.of("sm_90a", persistent=True, sm_count=sms)) for sms in (0, 114, 132)}
    assert len(keys) == 3
    from tilejit import compiler

    stages = compiler.run_stages(call.spec, Target.of("sm_90a", persistent=True, sm_count=114), "passes")
    assert stages.fn.attrs["persistent"] == 114


def test_persistent_passes_over_kernels_without_a_specialized_loop():
    bias = _meta(768)
    # a load before the loop: the loop is still specialized (producer first), but the kernel is not persistent
    st = _compile(mm_bias_first, *_args()[:2], bias, _args()[2], persistent=True)
    assert "tj_first" not in st.cuda and "producer_warpgroup = true" in st.final_ir
    ks = _meta(2, dtype=torch.int32)
    st = _compile(mm_tile_bound, *_args()[:2], ks, _args()[2], persistent=True)
    assert "tj_first" not in st.cuda and "producer_warpgroup" not in st.final_ir
    st = _compile(mm, *_args(), WS=False, persistent=True)
    assert "tj_first" not in st.cuda
    st = _compile(mm, *_args(), arch="sm_80", BK=32, persistent=True)
    assert "tj_first" not in st.cuda


@pytest.mark.parametrize("bm,bn,warps", [(128, 256, 8), (256, 128, 8), (128, 128, 4)])
def test_persistent_compiles_without_spills(bm, bn, warps):
    from benchmarks.kernels import matmul

    a, b, c = _meta(4096, 4096), _meta(4096, 4096), _meta(4096, 4096)
    compiled = matmul.kernel.compile(a, b, c, BM=bm, BN=bn, BK=64, num_warps=warps, num_stages=4, persistent=True,
                                     arch="sm_90a")
    assert "tj_first" in compiled.asm["cuda"]
    assert compiled.meta["spills"] == 0 and compiled.shared_bytes <= 232448, compiled.meta


def test_interpreter_runs_kernels_launched_with_the_options(monkeypatch):
    """The options change how a GPU runs the kernel, never what it computes: the interpreter takes them as is."""
    from benchmarks.kernels import matmul

    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    torch.manual_seed(0)
    a, b = torch.randn(100, 70, dtype=F16), torch.randn(70, 90, dtype=F16)
    c = torch.full((100, 90), float("nan"), dtype=F16)
    matmul.kernel[(2 * 2,)](a, b, c, BM=64, BN=64, BK=32, num_warps=4, warp_specialize=True, persistent=True)
    assert (c.double() - a.double() @ b.double()).abs().max().item() < 0.05
    c.fill_(float("nan"))
    matmul.kernel[(2 * 2,)](a, b, c, BM=64, BN=64, BK=32, num_warps=4, pingpong=True)
    assert (c.double() - a.double() @ b.double()).abs().max().item() < 0.05
    with pytest.raises(TilejitError, match="persistent must be True or False"):
        matmul.kernel[(4,)](a, b, c, BM=64, BN=64, BK=32, persistent=1)


# -- pingpong: two groups of math warps taking the walk's programs in turn --------------------------------------

def test_pingpong_structure():
    st = _compile(mm, *_args(), pingpong=True, BN=128, num_warps=4)
    cuda = st.cuda
    assert st.fn.attrs["groups"] == 2 and st.fn.attrs["persistent"] == 132  # pingpong implies persistent
    assert "__launch_bounds__(384, 1)" in cuda  # two groups of 4 warps and the producer warpgroup
    head = cuda[cuda.index("__global__"):]
    # tid counts within a group, read through a shuffle (warp-uniform for the compiler); the producer's stays
    assert "const int tj_group = __shfl_sync(0xffffffffu, (int)threadIdx.x < 256 ? (int)threadIdx.x / 128 : 0, 0);" \
        in head
    assert "const int tid = (int)threadIdx.x - tj_group * 128;" in head
    # the ring's barriers are set up by one thread of the block, not one per group
    assert head.count("if (threadIdx.x == 0) { for (int s = 0; s < 4; ++s) tj_mbar_init(") == 2
    assert "tj_mbar_init(tj_smem_u32 + 32 + 8 * s, 4)" in head  # a slot is read by one group: 4 warps release it
    producer = _section(head, "if (tid >= 256)")
    assert "for (long long tj_prog = tj_first; tj_prog < tj_nprogs; tj_prog += 132)" in producer
    assert "tj_setmaxnreg_inc<232>()" in head  # (65536 - 128 * 40) / 256
    after = head[head.index(producer) + len(producer):]
    walk = _section(after, "for (long long tj_prog = tj_first + (long long)tj_group * 132; tj_prog < tj_nprogs; "
                           "tj_prog += 264)")
    # first the other group's slots are counted, from its program's own bounds
    skip = _section(walk, "if (tj_prog - 132 >= tj_first)")
    assert "const long long tj_prog = tj_other;" in skip and "tj_it += (int)(" in skip
    assert walk.index(skip) < walk.index("const int tj_it0 = tj_it;")
    # a group's main loop waits for its turn and hands the turn on after its last slot wait, before its epilogue
    turn = walk.index('if (tj_prog != tj_first) asm volatile("bar.sync %0, 256;" :: "r"(3 + tj_group)')
    loop = walk.index("tj_mbar_wait(")
    handoff = walk.index('if (tj_prog + 132 < tj_nprogs) asm volatile("bar.arrive %0, 256;" :: "r"(3 + (tj_group + 1) % 2)')
    store = walk.index("tj_tma_store_2d(")
    assert turn < loop < handoff < store
    # each program releases its own slots only: not the one before its first, and its last after the loop
    assert "if (tj_it > tj_it0) {" in walk and "tj_mbar_arrive(tj_smem_u32 + 32 + 8 * ((tj_it - 1) % 4));" in walk
    assert "if (tj_it > 0)" not in walk
    # block barriers are the group's named barrier; the epilogue's shared memory is the group's own
    assert 'asm volatile("bar.sync %0, 128;" :: "r"(1 + tj_group) : "memory");' in walk
    assert "__syncthreads" not in walk and 'bar.sync 1, ' not in walk
    assert "tj_gsm_u32 + " in walk
    assert re.search(r"unsigned char\* const tj_gsm = tj_smem \+ \d+ \+ tj_group \* \d+;", head)


def test_pingpong_shared_memory_and_registers():
    """Each group's epilogue staging is its own (twice the persistent kernel's), no spills, the meta says so."""
    from benchmarks.kernels import matmul

    a, b, c = _meta(4096, 4096), _meta(4096, 4096), _meta(4096, 4096)
    kw = dict(BM=128, BN=128, BK=64, num_warps=4, num_stages=4, arch="sm_90a")
    persistent = matmul.kernel.compile(a, b, c, persistent=True, **kw)
    pingpong = matmul.kernel.compile(a, b, c, pingpong=True, **kw)
    staging = 2 * 128 * 64 * 2  # two 128-byte panel buffers of 128 rows
    assert pingpong.shared_bytes - persistent.shared_bytes == staging
    assert pingpong.meta["groups"] == 2 and persistent.meta["groups"] == 1
    assert pingpong.threads == 384 and persistent.threads == 256
    assert pingpong.meta["spills"] == 0 and not pingpong.meta["wgmma_serialized"]
    assert pingpong.key != persistent.key


@tilejit.kernel
def matmul_residual(A, B, R, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, A.shape[1], BK):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc + R[m0:m0 + BM, n0:n0 + BN]


def test_pingpong_that_leaves_no_room_for_a_ring_runs_as_persistent_and_says_so():
    # Two groups' float32 epilogues at 128x128 on 8 warps leave no room beside even a 2-deep ring: the second
    # group goes (one producer warpgroup + 8 math warps, the 4-deep TMA ring persistent gets), not the pipeline
    # (which had left a 1-stage cp.async loop, no producer, and no word of it).
    a, r = _meta(256, 256), torch.empty(256, 256, device="meta")
    kw = dict(BM=128, BN=128, BK=64, num_warps=8, arch="sm_90a")
    persistent = matmul_residual.compile(a, a, r, r, persistent=True, **kw)
    with pytest.warns(RuntimeWarning, match="pingpong's two groups .* compiled as persistent=True, one group"):
        pingpong = matmul_residual.compile(a, a, r, r, pingpong=True, **kw)
    for k in (persistent, pingpong):
        assert k.threads == 384 and k.meta["groups"] == 1, k.meta
        assert "pipeline = 4, copy = tma_bulk_tensor" in k.asm["ir"]
    assert pingpong.shared_bytes == persistent.shared_bytes


def test_pingpong_cache_key_and_option_check():
    from tilejit.compiler import cache_key
    from tilejit.target import Target

    call = mm.bind(_args(), {"BM": 128, "BN": 128, "BK": 64, "num_warps": 4})
    pp = mm.bind(_args(), {"BM": 128, "BN": 128, "BK": 64, "num_warps": 4, "pingpong": True})
    target = Target.of("sm_90a", persistent=True, sm_count=132)
    assert cache_key(call.spec, target) != cache_key(pp.spec, Target.of("sm_90a", persistent=True, sm_count=132,
                                                                         pingpong=True))
    with pytest.raises(TilejitError, match="pingpong must be True or False"):
        mm.compile(*_args(), BM=128, BN=128, BK=64, pingpong="yes", arch="sm_90a", stop_after="cuda")
    with pytest.raises(ValueError, match="pingpong must be True or False"):
        Config({"BM": 128}, pingpong=1)
    assert "pingpong=True" in Config({"BM": 128}, pingpong=True).identity


def test_pingpong_passes_over_kernels_that_cannot_be_persistent():
    """Like persistent: a load before the loop, a loop that is not specialized, another arch: a plain kernel."""
    bias = _meta(768)
    st = _compile(mm_bias_first, *_args()[:2], bias, _args()[2], pingpong=True, num_warps=4, BN=128)
    assert "groups" not in st.fn.attrs and "tj_group" not in st.cuda
    st = _compile(mm, *_args(), WS=False, pingpong=True, num_warps=4, BN=128)
    assert "groups" not in st.fn.attrs and "tj_group" not in st.cuda
    st = _compile(mm, *_args(), arch="sm_80", BK=32, pingpong=True, num_warps=4, BN=128)
    assert "tj_group" not in st.cuda


@tilejit.kernel
def mm_prefix(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """Each row block sums its own prefix of K: the loop's bound depends on the program."""
    M, K = A.shape
    N = B.shape[1]
    pm = T.program_id(0) // T.cdiv(N, BN)
    n0 = (T.program_id(0) % T.cdiv(N, BN)) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, min(K, (pm % 5) * 3 * BK), BK):
        acc += A[pm * BM:pm * BM + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[pm * BM:pm * BM + BM, n0:n0 + BN] = acc.to(C.dtype)


def test_pingpong_counts_the_other_groups_slots_from_their_own_bounds():
    st = _compile(mm_prefix, *_args(), pingpong=True, num_warps=4, BN=128)
    walk = st.cuda[st.cuda.index("for (long long tj_prog = tj_first + (long long)tj_group"):]
    skip = _section(walk, "if (tj_prog - 132 >= tj_first)")
    # the other program's ids, then its bound (program_id math and the min), then its trip count
    assert skip.index("const int32_t tj_pid0 = (int32_t)(tj_prog % gridDim.x);") < skip.index("tj_imin") \
        < skip.index("tj_it += ")


def test_register_shortage_is_a_located_user_error():
    """A config whose accumulator cannot fit the registers its thread count leaves (two groups of 8 warps on a
    128x256 tile) is a RegisterError at the kernel's def, not an NVRTC failure reported as a tilejit bug."""
    from benchmarks import kernels

    f32 = [_meta(4096, 4096, dtype=torch.float32) for _ in range(3)]
    with pytest.raises(tilejit.RegisterError) as info:
        kernels.tf32_mm_nt.kernel.compile(*f32, BM=128, BN=256, BK=32, num_warps=8, num_stages=4, pingpong=True,
                                          arch="sm_90a")
    text = str(info.value)
    assert "kernels.py:" in text and "640 threads per block" in text and "leave each thread 96" in text
    assert "drop pingpong" in text and "tilejit bug" not in text
