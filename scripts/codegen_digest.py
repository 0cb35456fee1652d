"""sha256 of the CUDA source tilejit generates for every kernel case the repository compiles.

A refactor of the compiler that should not change the generated code is checked with it:

    python scripts/codegen_digest.py --write scripts/codegen_digests.json   # before
    python scripts/codegen_digest.py --check scripts/codegen_digests.json   # after: exits 1 on any difference

The cases are the compile-everything cases of the test suite (tests/backend/test_compile_all.py: the GPU test
kernels, the example and benchmark matmuls, the interpreter kernels) plus every config of the default matmul
autotune space, for sm_80, sm_90a and sm_100a. Only the pass pipeline and the CUDA emitter run (no NVRTC).

The digest is of the translation unit NVRTC compiles: the generated source with tilejit's own
``#include "tilejit/<name>.cuh"`` lines expanded to the headers' text (``backend_cuda.headers.expand_includes``),
so moving a helper between the emitter and a header changes no digest, and editing a header's code does.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHS = ("sm_80", "sm_90a", "sm_100a")


def _cases() -> dict:
    for sub in ("tests", "tests/frontend", "tests/backend"):
        sys.path.insert(0, str(ROOT / sub))
    sys.path.insert(0, str(ROOT))
    import torch

    from benchmarks import kernels as bench
    from tilejit.configs import matmul_configs
    import test_compile_all as tca

    cases = dict(tca.ALL)
    for c in (c for c in matmul_configs(stream_k=True) if c.split_k == 1):  # split-K needs sm_90+: not in the all-arch set
        # the launch options a config turns on tell apart configs of the same tile
        options = "".join(f"-{o}" for o in ("warp_specialize", "persistent", "pingpong", "stream_k")
                          if getattr(c, o))
        for dtype in (torch.float16, torch.bfloat16):
            a = torch.empty(4096, 4096, dtype=dtype, device="meta")
            name = "bench-space/{BM}x{BN}x{BK}".format(**c.kwargs) + f"-w{c.num_warps}-s{c.num_stages}{options}-{dtype}"
            cases[name] = (bench.matmul.kernel, (a, a, a), dict(c.all_kwargs()), {})
        ragged = (torch.empty(1000, 777, dtype=dtype, device="meta"), torch.empty(777, 3000, dtype=dtype, device="meta"),
                  torch.empty(1000, 3000, dtype=dtype, device="meta"))
        name = "bench-space-ragged/{BM}x{BN}x{BK}".format(**c.kwargs) + f"-w{c.num_warps}-s{c.num_stages}{options}"
        cases[name] = (bench.matmul.kernel, ragged, dict(c.all_kwargs()), {})
    # clusters with TMA multicast (not in the default space) in each warp-specialized mode, B shared at run time
    square = tuple(torch.empty(4096, 4096, dtype=torch.float16, device="meta") for _ in range(3))
    for mode in ("warp_specialize", "persistent", "pingpong"):
        kw = dict(BM=128, BN=128, BK=64, num_warps=4, num_stages=4, cluster=2, **{mode: True})
        cases[f"bench-cluster/128x128x64-w4-s4-{mode}-cluster2"] = (bench.matmul.kernel, square, kw, {})
    return cases


def cuda_source(kernel, args, kwargs, arch: str) -> str:
    """The translation unit NVRTC compiles for this case: its generated source, tilejit's headers expanded."""
    from tilejit.backend_cuda.headers import expand_includes

    return expand_includes(kernel.compile(*args, arch=arch, stop_after="cuda", **kwargs).cuda)


def digests() -> dict[str, str]:
    out = {}
    for name, (kernel, args, kwargs, _) in sorted(_cases().items()):
        for arch in ARCHS:
            src = cuda_source(kernel, args, kwargs, arch)
            out[f"{name}@{arch}"] = hashlib.sha256(src.encode()).hexdigest()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", metavar="JSON")
    group.add_argument("--check", metavar="JSON")
    ns = parser.parse_args()
    now = digests()
    if ns.write:
        Path(ns.write).write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"{len(now)} CUDA sources digested into {ns.write}")
        return 0
    before = json.loads(Path(ns.check).read_text())
    changed = sorted(k for k in before if k in now and before[k] != now[k])
    missing = sorted(set(before) - set(now))
    added = sorted(set(now) - set(before))
    for k in changed:
        print(f"CHANGED {k}")
    for k in missing:
        print(f"MISSING {k}")
    print(f"{len(now)} sources: {len(changed)} changed, {len(missing)} missing, {len(added)} new")
    return 1 if changed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
