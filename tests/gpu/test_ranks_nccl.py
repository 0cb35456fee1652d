"""One autotune choice per job on real GPUs: every GPU of the machine a rank (NCCL), all sharing one fresh cache
directory; the ranks split the configs, all take the same best, and every rank's results match float64.
Skipped on a machine with one GPU."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

dist = pytest.importorskip("torch.distributed")
if not (dist.is_available() and dist.is_nccl_available()):
    pytest.skip("this torch has no NCCL", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ["TILEJIT_CACHE_DIR"] = str(Path(out_dir) / "cache")
    os.environ.pop("TILEJIT_REMOTE_CACHE", None)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    try:
        from test_autotune_gpu import grid, tuned_matmul  # tests/gpu is on the path

        report = {"choices": [], "errors": [], "timed_here": []}
        for m, n, k in ((1000, 777, 1531), (2048, 2048, 512)):
            gen = torch.Generator(device="cuda").manual_seed(100 * rank + m)
            a = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=gen)
            b = torch.randn(k, n, device="cuda", dtype=torch.float16, generator=gen)
            c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
            tuned_matmul[grid](a, b, c)
            torch.cuda.synchronize()
            ref = a.double() @ b.double()
            report["errors"].append(((c.double() - ref).norm() / ref.norm()).item())
            report["choices"].append(str(tuned_matmul.best_config))
            gathered = [None] * world
            dist.all_gather_object(gathered, str(tuned_matmul.best_config))
            report.setdefault("gathered", []).append(gathered)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def test_every_gpu_a_rank_one_choice_and_correct_results(tmp_path):
    world = min(torch.cuda.device_count(), 4)
    if world < 2:
        pytest.skip(f"needs 2 or more GPUs; this machine has {torch.cuda.device_count()}")
    import torch.multiprocessing as mp

    mp.spawn(_rank_main, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=True)
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(world)]
    for problem in range(2):
        choices = {r["choices"][problem] for r in reports}
        assert len(choices) == 1, f"ranks chose {choices}"
        assert all(set(r["gathered"][problem]) == choices for r in reports)
    assert max(e for r in reports for e in r["errors"]) < 2e-3
    # No compile lock left behind in the shared directory.
    from tilejit.cache.layout import _LOCK_SUFFIX

    assert not list((tmp_path / "cache").rglob("*" + _LOCK_SUFFIX))
