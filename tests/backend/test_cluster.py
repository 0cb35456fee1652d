"""2-CTA thread-block clusters along x with TMA multicast (the ``cluster=2`` launch option), on CPU: the two
programs of a pair load a ring tile whose window they share once, into both (each issuing every other 128-byte
panel), and each releases a slot to both producers. Which tiles (``passes/warp_specialize.multicast_loads``): a window
whose values do not depend on ``T.program_id(0)`` is shared statically (the DESIGN matmul's B, a 3-D grid's A);
one that does is compared at run time with the other program's, recomputed by the producer; one that depends on
what the producer cannot recompute is loaded by each program, and a kernel with no shared tile compiles as without
the option. Then the option's checks, its cache key and Config, and the launch structures (cuLaunchKernelEx's
CUlaunchConfig, the compiled launcher's ``xcluster``, the Python launcher's cluster path) without a GPU."""
from __future__ import annotations

import ctypes
import re
from types import SimpleNamespace

import pytest
import torch

import tilejit
import tilejit.language as T
from kernels import bmm_grid3, matmul_staged as mm
from tilejit.autotuner import Config
from tilejit.backend_cuda.headers import expand_includes, include_directive
from tilejit.errors import TilejitError, UsageValueError
from tilejit.ir import OpKind
from tilejit.passes.warp_specialize import multicast_loads
from tilejit.target import LaunchOptions, Target
from test_warp_specialize import _args, _compile, _meta, _section  # the same compile helpers and shapes

pytestmark = pytest.mark.usefixtures("fresh_compile_cache")

F16 = torch.float16


def _loads(code: str, st, tensor: str) -> list[str]:
    """The TMA load statements in ``code`` reading ``tensor`` (through its tensor map parameter), stripped."""
    param = f"&tj_tmap{[m['tensor'] for m in st.tensor_maps].index(tensor)},"
    return [line.strip() for line in code.splitlines() if "tj_tma_load" in line and param in line]


def _loop(fn):
    return next(o for o in fn.body.ops if o.kind is OpKind.FOR)


def _listed(st) -> list[tuple[str, list[str]]]:
    """``multicast_loads`` of the kernel's top-level loop as (tensor, names of the compared values)."""
    return [(o.operands[0].name, [v.name for v in compared]) for o, compared in multicast_loads(st.fn, _loop(st.fn))]


def _grouped():
    from benchmarks.kernels import matmul

    return matmul.kernel


# -- the DESIGN matmul: B shared by the pair at every launch ---------------------------------------------------

def test_design_matmul_structure():
    """2-D grid, program_id(0) along M, 128x256x64 tiles, 8 warps, 4 stages: B's four panels are multicast
    whenever the kernel runs in a cluster (no comparison), alternating between the two programs; A, whose window
    depends on program_id(0), is multicast only where its row block compares equal with the other program's
    (recomputed from ``blockIdx.x ^ 1``; never, for this kernel, but the pass does not prove it). The math warps
    release every slot to both programs, the empty barriers count both programs' warps, and the barriers are set
    up, and the ring given back, at cluster barriers."""
    st = _compile(mm, *_args(), cluster=2)
    cuda = st.cuda
    assert st.fn.attrs["cluster"] == 2 and "producer_warpgroup = true" in st.final_ir  # cluster implies ws
    assert "__launch_bounds__(384, 1)" in cuda and "__cluster_dims__" not in cuda  # shaped at launch, not here
    head = cuda[cuda.index("__global__"):]
    assert "const unsigned tj_ncta = tj_cluster_ctas(), tj_crank = tj_cluster_rank();" in head
    producer = _section(head, "if (tid >= 256)")
    b = _loads(producer, st, "B")
    assert len(b) == 8  # four panels, each: plain outside a cluster, multicast by one program of a pair
    for p in range(4):
        assert b[2 * p].startswith("if (!(tj_ncta > 1)) tj_tma_load_2d(")
        assert b[2 * p + 1].startswith(f"else if (tj_crank == {p % 2}) tj_tma_load_2d_mc(")
        assert b[2 * p + 1].endswith("(unsigned short)3);  // into both programs")
    a = _loads(producer, st, "A")
    assert len(a) == 2 and re.match(r"if \(!\((tj_mc\d+)\)\) tj_tma_load_2d\(", a[0])
    flag = re.match(r"if \(!\((tj_mc\d+)\)\)", a[0]).group(1)
    assert a[1].startswith("else if (tj_crank == 0) tj_tma_load_2d_mc(")  # one panel: program 0 issues it
    # A's flag: its row block here and in the other program of the pair, computed before the producer's loop
    compare = _section(producer, "if (tj_ncta > 1)")
    assert "(blockIdx.x ^ 1u)" in compare and re.search(rf"{flag} = tj_mine0 == v\d+_m0;", compare)
    assert producer.index(compare) < producer.index("for (int64_t tj_piv")
    assert "tj_mine1" not in producer  # B compares nothing
    assert "tj_mbar_wait(" in producer and "tj_mbar_arrive" not in producer
    after = head[head.index(producer) + len(producer):]
    loop = _section(after, "for (int64_t")
    # every release by the math warps goes to both programs' barriers
    assert "tj_mbar_arrive(" not in after
    assert "if ((tid & 31) == 0) tj_mbar_arrive_pair(" in loop and ", tj_ncta, tj_crank);" in loop
    assert "tj_tma_load" not in after  # the math warps never load the ring
    # the empty barriers count the warps of both programs; both programs' barriers are set up before either uses
    # them: the cluster barrier comes after the block's and before the producer splits off
    setup = head[:head.index(producer)]
    init = setup.index("tj_mbar_init(tj_smem_u32 + 32 + 8 * s, 8 * tj_ncta)")
    assert init < setup.index("__syncthreads();") < setup.index("if (tj_ncta > 1) tj_cluster_sync_init();")
    # the other program's last arrivals on this one's barriers are in before they are invalidated
    rest = after[after.index(loop) + len(loop):]
    assert rest.index("if (tj_ncta > 1) tj_cluster_sync();") < rest.index("tj_mbar_inval(")
    assert include_directive("cluster_ring") in cuda and "mapa.shared::cluster.u32" in expand_includes(cuda)
    assert include_directive("tma_multicast") in cuda and "tj_tma_load_2d_mc(" in cuda
    # without the option none of it
    plain = _compile(mm, *_args(), warp_specialize=True).cuda
    assert "tj_ncta" not in plain and "_mc(" not in plain and "tj_cluster" not in plain


def test_design_matmul_cubin():
    """The cubin: meta says cluster 2, no spills, the same threads as without the option; its SASS (when a
    disassembler is installed) holds the multicast TMA load."""
    from tilejit.backend_cuda.sass import disassemble

    compiled = _compile(mm, *_args(), stop_after=None, cluster=2)
    assert compiled.meta["cluster"] == 2 and compiled.meta["spills"] == 0, compiled.meta
    assert compiled.threads == 384 and not compiled.meta["wgmma_serialized"]
    sass = disassemble(compiled.asm["cubin"])
    if sass is None:
        pytest.skip("cuobjdump/nvdisasm is not installed (pip install -e '.[sass]')")
    assert "UTMALDG.2D.MULTICAST" in sass


# -- persistent and pingpong: the pair walks neighbouring programs ---------------------------------------------

def test_persistent_structure_and_even_program_count():
    """A persistent pair walks programs p and p ^ 1 side by side: the program count is even (the SM count rounded
    down), the other program's windows come from ``tj_prog ^ 1`` in the producer's walk, the ring stays across
    programs and the cluster barrier comes once, after the walk."""
    from tilejit import compiler

    st = _compile(mm, *_args(), persistent=True, cluster=2)
    assert st.fn.attrs["cluster"] == 2 and st.fn.attrs["persistent"] == 132
    head = st.cuda[st.cuda.index("__global__"):]
    assert head.index("if (tj_first >= 132) return;") < head.index("tj_cluster_sync_init();")
    producer = _section(head, "if (tid >= 256)")
    walk = _section(producer, "for (long long tj_prog = tj_first; tj_prog < tj_nprogs; tj_prog += 132)")
    assert walk.count("tj_tma_load_2d_mc(") == 1 + 4  # A (compared) and B's four panels
    assert "const long long tj_other = tj_prog ^ 1;" in walk and "blockIdx" not in walk
    guards = [line.split(" tj_tma")[0] for line in _loads(walk, st, "B")]
    assert guards == ["if (!(tj_ncta > 1))", "else if (tj_crank == 0)",
                      "if (!(tj_ncta > 1))", "else if (tj_crank == 1)"] * 2
    after = head[head.index(producer) + len(producer):]
    consumer = _section(after, "for (long long tj_prog = tj_first; tj_prog < tj_nprogs; tj_prog += 132)")
    assert "tj_mbar_arrive_pair(" in consumer and "tj_mbar_arrive(" not in consumer
    assert "tj_cluster_sync" not in consumer and "tj_mbar_inval" not in head
    rest = after[after.index(consumer) + len(consumer):]
    # the last TMA store's wait for its reads, deferred to the walk's end (each store waits for the one before)
    assert rest.strip().startswith("if (tid == 0) tj_bulk_wait_read0();")
    assert rest.index("tj_bulk_wait_read0();") < rest.index("if (tj_ncta > 1) tj_cluster_sync();")
    assert consumer.count("tj_bulk_wait_read0();") == 1  # the store's first wait: its buffers are free again
    # an odd SM count: one SM stays idle so that no pair is split; without clusters every SM runs a program
    for cluster, programs in ((2, 132), (1, 133)):
        call = mm.bind(_args(), {"BM": 128, "BN": 256, "BK": 64, "num_warps": 8, "num_stages": 4,
                                 "persistent": True, "cluster": cluster})
        target = Target.of("sm_90a", num_warps=8, num_stages=4, persistent=True, sm_count=133,
                           cluster=cluster)
        stages = compiler.run_stages(call.spec, target, "cuda")
        assert stages.fn.attrs["persistent"] == programs
        assert f"if (tj_first >= {programs}) return;" in stages.cuda


def test_pingpong_structure():
    """Pingpong with clusters (128x128, 4 warps per group): two groups, the empty barriers count one group's
    warps in both programs, the multicast loads in the producer's walk, both groups release to both programs,
    the cluster barrier after the groups' walk; the cubin keeps two groups and no spills."""
    kw = dict(pingpong=True, cluster=2, BN=128, num_warps=4)
    st = _compile(mm, *_args(), **kw)
    assert st.fn.attrs["groups"] == 2 and st.fn.attrs["persistent"] == 132 and st.fn.attrs["cluster"] == 2
    head = st.cuda[st.cuda.index("__global__"):]
    assert "if (tj_first >= 132) return;" in head
    # one thread of the block sets the barriers up; a slot is read by one group: 4 warps in each program release it
    assert "if (threadIdx.x == 0) { for (int s = 0; s < 4; ++s) tj_mbar_init(tj_smem_u32 + 32 + 8 * s, " \
           "4 * tj_ncta); }" in head
    producer = _section(head, "if (tid >= 256)")
    walk = _section(producer, "for (long long tj_prog = tj_first; tj_prog < tj_nprogs; tj_prog += 132)")
    assert walk.count("tj_tma_load_2d_mc(") == 1 + 2 and "tj_prog ^ 1" in walk  # B: 64 x 128, two panels
    b = _loads(walk, st, "B")
    assert [s.split(" tj_tma")[0] for s in b] == ["if (!(tj_ncta > 1))", "else if (tj_crank == 0)",
                                                   "if (!(tj_ncta > 1))", "else if (tj_crank == 1)"]
    after = head[head.index(producer) + len(producer):]
    groups = _section(after, "for (long long tj_prog = tj_first + (long long)tj_group * 132; tj_prog < tj_nprogs; "
                             "tj_prog += 264)")
    assert "tj_mbar_arrive(" not in groups
    assert "tj_mbar_arrive_pair(tj_smem_u32 + 32 + 8 * ((tj_it - 1) % 4), tj_ncta, tj_crank);" in groups
    rest = after[after.index(groups) + len(groups):]
    assert "if (tj_ncta > 1) tj_cluster_sync();" in rest and "tj_cluster_sync" not in groups
    compiled = _compile(mm, *_args(), stop_after=None, **kw)
    assert compiled.meta["groups"] == 2 and compiled.meta["cluster"] == 2 and compiled.threads == 384
    assert compiled.meta["spills"] == 0, compiled.meta


# -- windows compared at run time, and a 3-D grid -------------------------------------------------------------

@pytest.mark.parametrize("persistent", [False, True])
def test_grouped_order_compares_both_windows_at_run_time(persistent):
    """The benchmark kernel's grouped order (1-D grid): A's row block and B's column block both depend on the
    program id, so each is multicast only where it equals the other program's: ``blockIdx.x ^ 1`` computed in
    the producer, or the walk's ``tj_prog ^ 1`` in a persistent kernel. Every load is under its flag."""
    kw = {"persistent": True} if persistent else {}
    st = _compile(_grouped(), *(_meta(2048, 2048) for _ in range(3)), cluster=2, **kw)
    assert st.fn.attrs["cluster"] == 2
    assert _listed(st) == [("A", ["m0"]), ("B", ["n0"])]
    cuda = st.cuda
    producer = _section(cuda[cuda.index("__global__"):], "if (tid >= 256)")
    assert "tj_mine0" in producer and "tj_mine1" in producer
    other = "const long long tj_other = tj_prog ^ 1;"
    if persistent:
        assert other in producer and "blockIdx.x ^ 1u" not in cuda
    else:
        assert other not in producer and "(int32_t)(blockIdx.x ^ 1u)" in producer
    compare = _section(producer, "if (tj_ncta > 1)")
    assert re.search(r"tj_mc\d+ = tj_mine0 == v\d+_m0;", compare) and re.search(r"tj_mc\d+ = tj_mine1 == v\d+_n0;",
                                                                                compare)
    guards = [s for s in producer.splitlines() if "tj_tma_load_2d(" in s]
    assert len(guards) == 1 + 4 and all(re.match(r"\s*if \(!\(tj_mc\d+\)\) tj_tma_load_2d\(", s) for s in guards)
    assert "if (!(tj_ncta > 1))" not in producer  # nothing is shared statically
    assert producer.count("tj_tma_load_2d_mc(") == 1 + 4


def test_3d_grid_shares_a():
    """``bmm_grid3`` (grid: N tiles, M tiles, batch; program_id(0) along N): A's window (batch, row block, k)
    is the pair's at every launch; B's (its reversed column block) is compared at run time."""
    args = _meta(3, 1000, 264), _meta(3, 264, 520), _meta(3, 1000, 520)
    st = _compile(bmm_grid3, *args, cluster=2, BN=128, num_warps=4)
    assert st.fn.attrs["cluster"] == 2
    assert _listed(st) == [("A", []), ("B", ["n0"])]
    producer = _section(st.cuda[st.cuda.index("__global__"):], "if (tid >= 128)")
    a, b = _loads(producer, st, "A"), _loads(producer, st, "B")
    assert len(a) == 2 and a[0].startswith("if (!(tj_ncta > 1)) tj_tma_load_3d(")
    assert a[1].startswith("else if (tj_crank == 0) tj_tma_load_3d_mc(")
    assert len(b) == 4 and all(re.match(r"(else )?if \(!?\(?tj_(mc\d+|crank)", s) for s in b)
    assert not any("tj_ncta" in s for s in b)


# -- which loads: multicast_loads ------------------------------------------------------------------------------

@tilejit.kernel
def mm_branch(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """Both windows depend on program_id(0) through a value out of an ``if``."""
    K = A.shape[1]
    pid = T.program_id(0)
    if pid % 2 == 0:
        t = pid
    else:
        t = pid + 0
    m0 = t * BM
    n0 = (t % 3) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def mm_reduced(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """Both windows depend on program_id(0) through a reduction of a register tile: the loop is still warp-
    specialized (the prelude runs on the producer too), but the producer cannot recompute the other program's."""
    K = A.shape[1]
    t = T.min(T.arange(0, 16) + T.program_id(0), 0)
    m0 = t * BM
    n0 = (t % 3) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


def test_multicast_loads_of_the_design_matmul():
    """B: alike in both programs (nothing compared); A: its row block compared. Neither depends on whether the
    option is given (the pass reads the IR only)."""
    for kw in ({"cluster": 2}, {"warp_specialize": True}):
        st = _compile(mm, *_args(), stop_after="passes", **kw)
        assert _listed(st) == [("A", ["m0"]), ("B", [])]
        (_, compared), _ = multicast_loads(st.fn, _loop(st.fn))
        assert compared[0].owner.kind is OpKind.BINARY  # the product program_id(0) * BM, not program_id itself


@pytest.mark.parametrize("kernel,specialized", [(mm_branch, True), (mm_reduced, True)])
def test_windows_the_producer_cannot_recompute_are_not_listed(kernel, specialized):
    """A window depending on program_id(0) through a region's result or a tile computation: not listed, and a
    kernel with no listed load compiles as without the option (warp-specialized where it qualifies: the ``if``
    of scalar math before ``mm_branch``'s loop runs on the producer too, but is not recomputed for the other
    program of a pair)."""
    st = _compile(kernel, *_args(), cluster=2)
    assert _listed(st) == []
    assert "cluster" not in st.fn.attrs
    assert bool(_loop(st.fn).attrs.producer_warpgroup) is specialized
    assert "_mc(" not in st.cuda and "tj_ncta" not in st.cuda and "tj_mbar_arrive_pair" not in st.cuda


def test_kernels_without_a_specialized_loop_compile_without_clusters():
    """sm_80 (no TMA ring), and an sm_90a loop whose A is read by cp.async (rows not 16-byte aligned): the option
    means nothing there; the cubin's meta says cluster 1."""
    compiled = _compile(mm, *_args(), arch="sm_80", BK=32, stop_after=None, cluster=2)
    assert compiled.meta["cluster"] == 1 and compiled.threads == 256
    assert "tj_ncta" not in compiled.asm["cuda"]
    args = _meta(1000, 1001), _meta(1001, 768), _meta(1000, 768)
    st = _compile(mm, *args, cluster=2)
    assert [m["tensor"] for m in st.tensor_maps] == ["B", "C"]  # A: cp.async
    assert "cluster" not in st.fn.attrs and "producer_warpgroup" not in st.final_ir and "tj_ncta" not in st.cuda
    compiled = _compile(mm, *args, stop_after=None, cluster=2)
    assert compiled.meta["cluster"] == 1


# -- the option: checks, cache key, Config --------------------------------------------------------------------

@pytest.mark.parametrize("bad", [3, True, 0, 2.0])
def test_bad_cluster_values_are_refused(bad):
    """LaunchOptions, a compile (the kernel named) and Config refuse anything but the ints 1 and 2."""
    with pytest.raises(UsageValueError, match=r"cluster must be one of \(1, 2\)"):
        LaunchOptions(cluster=bad)
    message = r"kernel matmul_staged: cluster must be one of \(1, 2\).*got " + re.escape(repr(bad))
    with pytest.raises(UsageValueError, match=message):
        mm.compile(*_args(), BM=128, BN=128, BK=64, cluster=bad, arch="sm_90a", stop_after="cuda")
    with pytest.raises(ValueError, match=r"Config: cluster must be one of \(1, 2\)"):
        Config({"BM": 128}, cluster=bad)


def test_interpreter_takes_the_option(monkeypatch):
    """The interpreter runs a cluster=2 launch as any other and checks the option like a compile."""
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    torch.manual_seed(0)
    a, b = torch.randn(100, 70, dtype=F16), torch.randn(70, 90, dtype=F16)
    c = torch.full((100, 90), float("nan"), dtype=F16)
    _grouped()[(2 * 2,)](a, b, c, BM=64, BN=64, BK=32, num_warps=4, cluster=2, persistent=True)
    assert (c.double() - a.double() @ b.double()).abs().max().item() < 0.05
    with pytest.raises(TilejitError, match="cluster must be one of"):
        _grouped()[(4,)](a, b, c, BM=64, BN=64, BK=32, cluster=3)


def test_cache_key_and_config():
    """cluster=2 is part of the key (cluster=1 leaves the key material as it was before the option existed) and of
    a Config's identity, launch keywords and JSON."""
    from tilejit.compiler import cache_key

    meta = {"BM": 128, "BN": 256, "BK": 64, "num_warps": 8}
    on = mm.bind(_args(), {**meta, "cluster": 2}).spec
    off = mm.bind(_args(), meta).spec
    assert on.key_material("t")["options"] == [8, 3, "cluster2"]
    assert off.key_material("t")["options"] == [8, 3]
    assert on.key("t") != off.key("t")
    assert cache_key(on, Target.of("sm_90a", num_warps=8, cluster=2)) != cache_key(off, Target.of("sm_90a", num_warps=8))
    ws = mm.bind(_args(), {**meta, "warp_specialize": True}).spec  # cluster implies it, but is not it
    assert cache_key(on, Target.of("sm_90a", num_warps=8, cluster=2)) != cache_key(ws, Target.of("sm_90a", num_warps=8, warp_specialize=True))

    c2, c1 = Config({"BM": 128}, num_warps=8, cluster=2), Config({"BM": 128}, num_warps=8)
    assert c2.all_kwargs() == {"BM": 128, "num_warps": 8, "num_stages": 3, "cluster": 2}
    assert "cluster" not in c1.all_kwargs() and c2.launch_kwargs["cluster"] == 2
    assert c2.identity.endswith("cluster=2") and "cluster" not in c1.identity and c1 != c2
    assert repr(c2).endswith(", cluster=2)") and "cluster" not in repr(c1)
    assert c2.to_json()["cluster"] == 2 and "cluster" not in c1.to_json()
    assert Config({"BM": 128}, cluster=1) == Config({"BM": 128})


# -- launching: cuLaunchKernelEx's structures and both launchers -----------------------------------------------

def test_launch_structures_match_cuda_h():
    """CUlaunchAttribute: id, 4 bytes of padding, a 64-byte value union (72 bytes). CUlaunchConfig on x86-64:
    gridDimX..blockDimZ and sharedMemBytes (seven unsigned ints), hStream, attrs, numAttrs (56 bytes)."""
    from tilejit.runtime import libcuda

    assert ctypes.sizeof(libcuda.LaunchAttribute) == 72 and libcuda.LaunchAttribute.value.offset == 8
    cfg = libcuda.LaunchConfig
    assert (cfg.grid.offset, cfg.block.offset, cfg.shared_bytes.offset) == (0, 12, 24)
    assert (cfg.stream.offset, cfg.attrs.offset, cfg.num_attrs.offset, ctypes.sizeof(cfg)) == (32, 40, 48, 56)
    config = libcuda.cluster_launch_config((384, 1, 1), 1000, (2, 1, 1))
    assert list(config.block) == [384, 1, 1] and config.shared_bytes == 1000 and config.num_attrs == 1
    attr = config.attrs[0]
    assert attr.id == libcuda.LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION == 4
    assert list(attr.value[0:3]) == [2, 1, 1] and not any(attr.value[3:])


def test_python_launcher_launches_even_grids_in_clusters(monkeypatch):
    """A launcher for a cluster=2 kernel: a grid whose x extent is even goes to cuLaunchKernelEx with the
    cluster shape, an odd one to cuLaunchKernel."""
    from tilejit.runtime import driver, libcuda

    launched = []

    def launch_ex(config, function, params, extra):
        cfg = libcuda.LaunchConfig.from_address(config)
        attr = cfg.attrs[0]
        launched.append(("ex", tuple(cfg.grid), tuple(cfg.block), cfg.shared_bytes, cfg.stream, function,
                         cfg.num_attrs, attr.id, tuple(attr.value[0:3])))
        return 0

    def launch(function, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        launched.append(("plain", (gx, gy, gz), (bx, by, bz), smem, stream, function))
        return 0

    fakes = {"cuLaunchKernel": launch, "cuLaunchKernelEx": launch_ex}
    monkeypatch.setattr(libcuda, "function", lambda name: fakes[name])
    loaded = SimpleNamespace(name="tj_mm", function=0x1234, device_index=0,
                             attributes=SimpleNamespace(max_threads_per_block=1024),
                             reserve_dynamic_smem=lambda nbytes: None)
    launcher = driver.make_launcher(loaded, ["i32"], (384, 1, 1), 1000, cluster_x=2)
    launcher((8, 3, 1), 0x50, [1])
    launcher((7, 3, 1), 0x50, [1])
    launcher((2, 1, 1), 0x60, [1])
    assert launched == [("ex", (8, 3, 1), (384, 1, 1), 1000, 0x50, 0x1234, 1, 4, (2, 1, 1)),
                        ("plain", (7, 3, 1), (384, 1, 1), 1000, 0x50, 0x1234),
                        ("ex", (2, 1, 1), (384, 1, 1), 1000, 0x60, 0x1234, 1, 4, (2, 1, 1))]
    launched.clear()
    driver.make_launcher(loaded, ["i32"], (384, 1, 1), 1000)((8, 3, 1), 0, [1])
    assert [x[0] for x in launched] == ["plain"]  # without the option: never clusters


def test_native_entry_takes_xcluster(tmp_path_factory, monkeypatch):
    """The compiled launcher's Entry takes an optional xcluster after zscale: 1 to 8."""
    from tilejit.runtime import native

    try:
        native.compiler()
    except native.NativeBuildError as missing:
        pytest.skip(f"cannot build the native launcher here: {missing}")
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path_factory.mktemp("native-cache")))
    mod = native._load_or_build()
    kinds = bytes([native.KIND_CODES["ptr"]])
    assert mod.Entry(1, (384, 1, 1), 0, kinds, 0, None, print, 1, 2) is not None
    assert mod.Entry(1, (384, 1, 1), 0, kinds, 0, None, print, 1, 8) is not None
    for bad in (0, 9):
        with pytest.raises(ValueError, match="xcluster must be 1 to 8"):
            mod.Entry(1, (384, 1, 1), 0, kinds, 0, None, print, 1, bad)


@pytest.mark.parametrize("mode", [{}, {"persistent": True}])
def test_bounds_that_depend_on_program_id_0_turn_clusters_off(mode):
    """A row block summing its own prefix of K (the loop's bound from program_id(0)): a pair would run the loop a
    different number of times, and every slot's "empty" barrier counts both programs' warps (a producer would wait
    forever), so no tile is listed and the kernel compiles without clusters."""
    from test_warp_specialize import mm_prefix

    st = _compile(mm_prefix, *_args(), cluster=2, **mode)
    assert _listed(st) == []
    assert "cluster" not in st.fn.attrs
    assert "tj_ncta" not in st.cuda and "tj_mbar_arrive_pair" not in st.cuda


def test_persistent_needs_a_prelude_one_thread_can_repeat():
    """The producer's one thread repeats what precedes the loop per program in a persistent walk: a reduction
    there (shuffles and block barriers) keeps the kernel warp-specialized, not persistent."""
    st = _compile(mm_reduced, *_args(), persistent=True)
    assert _loop(st.fn).attrs.producer_warpgroup
    assert "persistent" not in st.fn.attrs
    producer = _section(st.cuda, "if (tid == 256)")
    assert "__syncthreads" not in producer and "bar.sync" not in producer
