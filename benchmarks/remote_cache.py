"""What a remote-cache hit costs: kernels fetched from a Redis on loopback, against a disk hit and a compile.

    python -m benchmarks.remote_cache [--url redis://127.0.0.1:PORT/0] [--kernels 6] [--out DIR]

Without ``--url`` a ``redis-server`` is started on a free loopback port (no persistence) and stopped after. No GPU
is needed: the kernels (the DESIGN matmul, fp16, in distinct tile configs) are compiled for sm_90a on meta
tensors. A first process compiles them into an empty directory and pushes them to the remote; a second, with
another empty directory, looks each up (``origin == "remote"``): the time of each lookup, which includes
fetching, checking the signature and the digests, and writing the entry to the local disk, is the remote hit.
A third process looks them up on that disk (``disk``). Every lookup is timed in a fresh process, so nothing is
answered from memory.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import DEFAULT_OUT, append_results, machine_stamp, markdown_table, write_json

REPO_ROOT = Path(__file__).resolve().parent.parent

_LOOKUPS = """
import json, sys, time, torch, tilejit
from benchmarks.kernels import matmul
tiles = json.loads(sys.argv[1])
a = torch.empty(1024, 1024, dtype=torch.float16, device="meta")
rows = []
for bm, bn, bk in tiles:
    start = time.perf_counter()
    compiled = matmul.kernel.compile(a, a, a, BM=bm, BN=bn, BK=bk, num_warps=8 if bm * bn > 128 * 128 else 4,
                                     arch="sm_90a")
    rows.append({"tiles": [bm, bn, bk], "seconds": time.perf_counter() - start, "origin": compiled.origin})
print(json.dumps(rows))
"""

TILES = [(128, 128, 32), (128, 128, 64), (128, 256, 64), (64, 128, 64), (128, 64, 64), (64, 256, 64),
         (256, 128, 64), (64, 64, 64)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_redis() -> tuple[subprocess.Popen, str]:
    if shutil.which("redis-server") is None:
        raise SystemExit("benchmarks.remote_cache needs redis-server (Debian: apt-get install redis-server) or --url")
    port = _free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            return server, f"redis://127.0.0.1:{port}/0"
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)
    server.kill()
    raise SystemExit("redis-server did not answer within 10 s")


def _lookups(cache: Path, url: str | None, key_file: Path, tiles) -> list[dict]:
    env = {**os.environ, "TILEJIT_CACHE_DIR": str(cache), "TILEJIT_REMOTE_CACHE_KEY": str(key_file),
           "PYTHONPATH": str(REPO_ROOT)}
    env.pop("TILEJIT_REMOTE_CACHE", None)
    if url:
        env["TILEJIT_REMOTE_CACHE"] = url
    done = subprocess.run([sys.executable, "-c", _LOOKUPS, json.dumps(tiles)], env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a Redis to use instead of starting one")
    parser.add_argument("--kernels", type=int, default=6, choices=range(1, len(TILES) + 1))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    server, url = (None, args.url) if args.url else _start_redis()
    work = Path(tempfile.mkdtemp(prefix="tilejit-remote-bench-"))
    try:
        key_file = work / "key"
        key_file.write_bytes(os.urandom(32).hex().encode())
        key_file.chmod(0o600)
        tiles = TILES[:args.kernels]
        compiled = _lookups(work / "host-a", url, key_file, tiles)
        remote = _lookups(work / "host-b", url, key_file, tiles)
        disk = _lookups(work / "host-b", None, key_file, tiles)
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for phase, found in (("compile (and push)", compiled), ("remote hit", remote), ("disk hit", disk)):
        ms = [r["seconds"] * 1e3 for r in found]
        rest = ms[1:] or ms
        rows.append([phase, "/".join(sorted({r["origin"] for r in found})), len(found), round(ms[0], 1),
                     round(statistics.median(rest), 1), round(max(rest), 1)])
    meta = machine_stamp()
    table = markdown_table(["lookup", "origin", "kernels", "first kernel ms", "others: median ms", "others: max ms"], rows)
    notes = [f"Redis on loopback; a process's first lookup includes importing the redis client and connecting; "
             f"CPU: {meta['cpu']}"]
    print(table)
    write_json(args.out / "remote_cache.json", {"meta": meta, "rows": rows})
    append_results("Remote cache: a hit against a disk hit and a compile", table, meta, notes=notes)
    return 0 if {r["origin"] for r in remote} == {"remote"} else 1


if __name__ == "__main__":
    raise SystemExit(main())
