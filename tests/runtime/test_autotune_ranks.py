"""One autotune choice per job: ranks of a ``torch.distributed`` job (gloo on CPU, spawned by the test) split the
configs, pool their timings and all take the same best, even when each rank alone would choose otherwise."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

BMS = [16, 32, 64, 128, 256, 512, 1024, 2048]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_times(rank: int) -> dict[int, float]:
    """Timings as rank ``rank`` measures them: its own config (BMS[rank]) fastest, so alone each rank would
    choose a different one."""
    return {bm: 0.5 if i == rank else 1.0 + i for i, bm in enumerate(BMS)}


def _rank_main(rank: int, world: int, port: int, out_dir: str, shared_cache: bool) -> None:
    cache = Path(out_dir) / ("cache" if shared_cache else f"cache-{rank}")
    os.environ["TILEJIT_CACHE_DIR"] = str(cache)
    os.environ.pop("TILEJIT_REMOTE_CACHE", None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        from tilejit.autotuner import Autotuner

        from test_autotune import FakeBench, FakeKernel, configs_for, launch

        report = {}
        kernel = FakeKernel("ranks")
        bench = FakeBench(kernel, rank_times(rank))
        tuner = Autotuner(kernel, configs_for(*BMS), key=["M"], bench_fn=bench)
        launch(tuner, m=1024)  # every rank: the same key
        report["same_key"] = {"best": tuner.best_config.kwargs["BM"], "timed": sorted(set(bench.timed))}
        bench.timed.clear()
        launch(tuner, m=2048 if rank % 2 == 0 else 4096)  # two keys at once: even ranks and odd ranks
        report["two_keys"] = {"best": tuner.best_config.kwargs["BM"], "timed": sorted(set(bench.timed))}
        bench.timed.clear()
        launch(tuner, m=1024)  # known now: no collective, nothing timed
        report["again"] = {"best": tuner.best_config.kwargs["BM"], "timed": bench.timed}
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def run_ranks(tmp_path: Path, world: int, shared_cache: bool) -> list[dict]:
    mp.spawn(_rank_main, args=(world, free_port(), str(tmp_path), shared_cache), nprocs=world, join=True)
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(world)]


@pytest.mark.parametrize("world, shared_cache", [(2, False), (4, True)])
def test_ranks_split_the_configs_and_all_take_the_same_best(tmp_path, world, shared_cache):
    reports = run_ranks(tmp_path, world, shared_cache)
    same_key = [r["same_key"] for r in reports]
    # Each config timed on exactly one rank; rank r's share is every world-th config from r.
    assert [r["timed"] for r in same_key] == [sorted(BMS[rank::world]) for rank in range(world)]
    # Rank r alone would choose BMS[r]; pooled, the first of the equally fast ones wins everywhere.
    assert {r["best"] for r in same_key} == {BMS[0]}
    two_keys = [r["two_keys"] for r in reports]
    for parity in (0, 1):
        peers = list(range(parity, world, 2))
        if len(peers) == 1:  # a key tuned by one rank alone: it times everything and chooses its own best
            assert two_keys[peers[0]]["timed"] == sorted(BMS) and two_keys[peers[0]]["best"] == BMS[parity]
            continue
        shares = [set(two_keys[rank]["timed"]) for rank in peers]
        assert set().union(*shares) == set(BMS) and sum(map(len, shares)) == len(BMS)
        assert len({two_keys[rank]["best"] for rank in peers}) == 1
    assert all(r["again"] == {"best": BMS[0], "timed": []} for r in reports)


def test_without_torch_distributed_nothing_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "cache"))
    assert not dist.is_initialized()
    from tilejit.autotuner import Autotuner

    from test_autotune import FakeBench, FakeKernel, configs_for, launch

    kernel = FakeKernel("alone")
    bench = FakeBench(kernel, rank_times(3))
    tuner = Autotuner(kernel, configs_for(*BMS), key=["M"], bench_fn=bench)
    launch(tuner)
    assert tuner._rank_group() is None and tuner.best_config.kwargs["BM"] == BMS[3]
    assert sorted(bench.timed) == sorted(BMS)


def _interpreted_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    """A real kernel on the interpreter: rank-dependent timing order, one choice, correct results."""
    os.environ["TILEJIT_CACHE_DIR"] = str(Path(out_dir) / f"cache-{rank}")
    os.environ["TILEJIT_INTERPRET"] = "1"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        import tilejit
        import tilejit.language as T

        calls = []

        def bench(run) -> float:  # each rank finds the configs it times in the opposite order fastest
            run()
            calls.append(1)
            return float(len(calls)) if rank % 2 == 0 else 10.0 - len(calls)

        @tilejit.autotune(configs=[tilejit.Config({"BLOCK": b}) for b in (32, 64, 128, 256)], key=["n"],
                          bench_fn=bench)
        @tilejit.kernel
        def twice(X, Y, n, BLOCK: T.constexpr):
            i = T.program_id(0) * BLOCK
            Y[i:i + BLOCK] = X[i:i + BLOCK] * 2.0

        x = torch.arange(256, dtype=torch.float32)
        y = torch.zeros_like(x)
        twice[lambda meta: (256 // meta["BLOCK"],)](x, y, 256)
        report = {"best": twice.best_config.kwargs["BLOCK"], "timed": sorted(twice.stats.timed),
                  "correct": bool(torch.equal(y, 2 * x))}
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def test_a_real_kernel_on_the_interpreter_gets_one_choice(tmp_path):
    world = 2
    mp.spawn(_interpreted_rank, args=(world, free_port(), str(tmp_path)), nprocs=world, join=True)
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(world)]
    assert len({r["best"] for r in reports}) == 1 and all(r["correct"] for r in reports)
    shares = [set(r["timed"]) for r in reports]
    assert [len(share) for share in shares] == [2, 2] and not shares[0] & shares[1]
