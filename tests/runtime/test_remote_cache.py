"""The remote cache (``TILEJIT_REMOTE_CACHE``) with a real Redis and real NVRTC compiles: a second cache directory
compiles nothing, values that fail their signature or checks are refused, faults cost a bounded time.

A Redis server comes from ``TILEJIT_TEST_REDIS_URL`` (``.ci/run`` starts one), else the tests start their own
``redis-server`` on a free loopback port; without either, the tests that need one are skipped, saying why. Every
test compiles a kernel of its own (a fresh constant in its source, so a fresh key), so tests sharing one server
never see each other's entries.
"""
from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

import tilejit
from tilejit import cli
from tilejit.autotuner import Autotuner
from tilejit.backend_cuda import nvrtc
from tilejit.cache import kernel_cache, remote

from test_autotune import FakeBench, FakeKernel, configs_for, launch  # noqa: E402  (tests/runtime is on the path)

_KERNEL_SOURCE = """
import tilejit
import tilejit.language as T


@tilejit.kernel
def shift(X, Y, n, BLOCK: T.constexpr):
    i = T.program_id(0) * BLOCK
    Y[i:i + BLOCK] = X[i:i + BLOCK] + n + {salt}
"""
_salts = itertools.count(int(time.time() * 1000) % 10**6 * 1000 + os.getpid() % 1000)


# ---- a Redis server ---------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(*extra: str) -> tuple[subprocess.Popen, str]:
    """A fresh redis-server on a free loopback port (no persistence); (process, URL)."""
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return server, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise RuntimeError("redis-server did not answer within 20 s")


def need_redis_server() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("needs the redis-server program (Debian: apt-get install redis-server)")


@pytest.fixture(scope="session")
def redis_url():
    pytest.importorskip("redis", reason="needs the redis client (pip install -e '.[test]')")
    url = os.environ.get("TILEJIT_TEST_REDIS_URL")
    if url:
        yield url
        return
    need_redis_server()
    server, url = start_redis()
    yield url
    server.terminate()
    server.wait(timeout=10)


def redis_client(url: str):
    import redis

    return redis.Redis.from_url(url, socket_timeout=5)


# ---- the process state of a cache user --------------------------------------------------------------------------

@pytest.fixture
def key_file(tmp_path) -> Path:
    path = tmp_path / "remote-key"
    path.write_bytes(os.urandom(32).hex().encode())
    path.chmod(0o600)
    return path


@pytest.fixture
def use_remote(monkeypatch, key_file):
    """Point the remote cache at a URL, signed with ``key_file``; returns the setter."""
    def configure(url: str) -> None:
        monkeypatch.setenv("TILEJIT_REMOTE_CACHE", url)
        monkeypatch.setenv("TILEJIT_REMOTE_CACHE_KEY", str(key_file))
        new_process(monkeypatch)
    for name in ("TILEJIT_ALWAYS_COMPILE", "TILEJIT_ARCH"):
        monkeypatch.delenv(name, raising=False)
    return configure


def new_process(monkeypatch, cache_dir: Path | None = None) -> None:
    """Forget what a process remembers: the in-memory cache, the remote cache and its fault state."""
    if cache_dir is not None:
        monkeypatch.setenv("TILEJIT_CACHE_DIR", str(cache_dir))
    monkeypatch.setattr(kernel_cache, "_default_cache", None)
    monkeypatch.setattr(remote, "_configured", {})


@pytest.fixture
def nvrtc_calls(monkeypatch):
    calls = []
    real = nvrtc._run_nvrtc

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(nvrtc, "_run_nvrtc", counted)
    return lambda: len(calls)


@pytest.fixture
def fresh_kernel(tmp_path):
    """A kernel no other test has compiled (its own constant in its source): its key is new to any server."""
    salt = next(_salts)
    path = tmp_path / f"remote_kernel_{salt}.py"
    path.write_text(_KERNEL_SOURCE.format(salt=salt))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.shift


def compile_with(kernel, arch: str = "sm_80"):
    """Compile through a fresh Kernel object, so nothing of an earlier compile is remembered by it."""
    x = torch.empty(4096, device="meta")
    return tilejit.kernel(kernel.fn).compile(x, x, 3, BLOCK=256, arch=arch)


def runtime_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


# ---- sharing ----------------------------------------------------------------------------------------------------

def test_a_second_cache_directory_compiles_nothing(tmp_path, monkeypatch, redis_url, use_remote, nvrtc_calls,
                                                   fresh_kernel):
    use_remote(redis_url)
    new_process(monkeypatch, tmp_path / "host-a")
    monkeypatch.setattr(kernel_cache, "_origin_counts", kernel_cache.collections.Counter())
    first = compile_with(fresh_kernel)
    assert first.origin == "compiled" and nvrtc_calls() == 1

    new_process(monkeypatch, tmp_path / "host-b")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a good value is taken without a word
        second = compile_with(fresh_kernel)
    assert second.origin == "remote" and nvrtc_calls() == 1
    assert second.key == first.key and second.asm["cubin"] == first.asm["cubin"]
    assert second.asm["cuda"] == first.asm["cuda"] and second.entry.path.is_relative_to(tmp_path / "host-b")

    new_process(monkeypatch, tmp_path / "host-b")  # the remote hit was written into host b's cache
    third = compile_with(fresh_kernel)
    assert third.origin == "disk" and nvrtc_calls() == 1
    assert compile_with(fresh_kernel).origin == "memory"
    assert kernel_cache.origin_counts() == {"memory": 1, "disk": 1, "remote": 1, "compiled": 1}


def test_cache_stats_prints_the_counts_and_the_remote(tmp_path, monkeypatch, redis_url, use_remote, capsys,
                                                     fresh_kernel):
    use_remote(redis_url)
    new_process(monkeypatch, tmp_path / "cache")
    monkeypatch.setattr(kernel_cache, "_origin_counts", kernel_cache.collections.Counter())
    compile_with(fresh_kernel)
    compile_with(fresh_kernel)
    assert cli.main(["cache", "stats"]) == 0
    out = capsys.readouterr().out
    assert "memory 1" in out and "compiled 1" in out and "disk 0" in out and "remote 0" in out
    assert "reachable" in out and redis_url.split("/")[2] in out


def test_cache_stats_without_a_remote(monkeypatch, capsys):
    monkeypatch.delenv("TILEJIT_REMOTE_CACHE", raising=False)
    assert cli.main(["cache", "stats"]) == 0
    assert "not configured" in capsys.readouterr().out


# ---- values that are refused ------------------------------------------------------------------------------------

def _tampered(value: bytes, secret: bytes, name: str) -> bytes:
    at = len(value) * 3 // 4
    return value[:at] + bytes([value[at] ^ 0x01]) + value[at + 1:]


def _truncated(value: bytes, secret: bytes, name: str) -> bytes:
    return value[:len(value) // 2]


def _unsigned(value: bytes, secret: bytes, name: str) -> bytes:
    return remote.verify(secret, name, value)  # the payload alone, as a writer without the key would store it


def _signed_with_another_key(value: bytes, secret: bytes, name: str) -> bytes:
    return remote.sign(b"not the key of this user" * 2, name, remote.verify(secret, name, value))


def _oversize(value: bytes, secret: bytes, name: str) -> bytes:
    # Correctly signed and well-formed (JSON allows trailing blanks): refused for its size alone.
    payload = remote.verify(secret, name, value)
    return remote.sign(secret, name, payload + b" " * remote.MAX_VALUE_BYTES)


def _signed_but_invalid_meta(value: bytes, secret: bytes, name: str) -> bytes:
    # Signed with the right key, yet a meta the compiler's checks reject (a writer with the key made a mistake).
    data = json.loads(remote.verify(secret, name, value))
    data["meta"]["threads"] = 0
    return remote.sign(secret, name, json.dumps(data).encode())


def _under_another_name(value: bytes, secret: bytes, name: str) -> bytes:
    # A value signed for another entry, replayed under this one's name.
    payload = remote.verify(secret, name, value)
    return remote.sign(secret, remote.entry_name("0" * 64), payload)


@pytest.mark.parametrize("damage", [_tampered, _truncated, _unsigned, _signed_with_another_key, _oversize,
                                    _signed_but_invalid_meta, _under_another_name])
def test_a_bad_remote_value_is_refused_with_one_warning_and_compiled_locally(tmp_path, monkeypatch, redis_url,
                                                                           use_remote, key_file, nvrtc_calls,
                                                                           fresh_kernel, damage):
    if damage is _oversize:
        monkeypatch.setattr(remote, "MAX_VALUE_BYTES", 1 << 20)
    use_remote(redis_url)
    new_process(monkeypatch, tmp_path / "host-a")
    first = compile_with(fresh_kernel)
    name = remote.entry_name(first.key)
    client = redis_client(redis_url)
    secret = key_file.read_bytes().strip()
    client.set(name, damage(client.get(name), secret, name))

    new_process(monkeypatch, tmp_path / "host-b")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second = compile_with(fresh_kernel)
    messages = runtime_warnings(caught)
    assert len(messages) == 1 and "refusing" in messages[0] and name in messages[0], messages
    assert second.origin == "compiled" and nvrtc_calls() == 2
    assert second.asm["cubin"] == first.asm["cubin"]
    # The local compile put a good value back: the next machine takes it.
    new_process(monkeypatch, tmp_path / "host-c")
    assert compile_with(fresh_kernel).origin == "remote" and nvrtc_calls() == 2


# ---- no key, no server ------------------------------------------------------------------------------------------

def test_without_a_key_the_remote_is_not_used_and_a_warning_says_why(tmp_path, monkeypatch, nvrtc_calls,
                                                                   fresh_kernel):
    monkeypatch.setenv("TILEJIT_REMOTE_CACHE", "redis://127.0.0.1:1/0")
    monkeypatch.delenv("TILEJIT_REMOTE_CACHE_KEY", raising=False)
    new_process(monkeypatch, tmp_path / "cache")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = compile_with(fresh_kernel)
        compile_with(fresh_kernel, arch="sm_90a")
    messages = runtime_warnings(caught)
    assert len(messages) == 1 and "TILEJIT_REMOTE_CACHE_KEY is not set" in messages[0], messages
    assert first.origin == "compiled" and nvrtc_calls() == 2


@pytest.mark.parametrize("mode, why", [(0o644, "readable by others"), (0o620, "writable by group")])
def test_a_key_file_others_can_read_or_write_is_refused(tmp_path, monkeypatch, key_file, nvrtc_calls,
                                                        fresh_kernel, mode, why):
    key_file.chmod(mode)
    monkeypatch.setenv("TILEJIT_REMOTE_CACHE", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("TILEJIT_REMOTE_CACHE_KEY", str(key_file))
    new_process(monkeypatch, tmp_path / "cache")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert compile_with(fresh_kernel).origin == "compiled"
    messages = runtime_warnings(caught)
    assert len(messages) == 1 and why in messages[0] and str(key_file) in messages[0], messages


def test_an_unreachable_server_costs_one_warning_and_is_skipped_after(tmp_path, monkeypatch, use_remote,
                                                                    nvrtc_calls, fresh_kernel):
    pytest.importorskip("redis", reason="needs the redis client (pip install -e '.[test]')")
    use_remote(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    new_process(monkeypatch, tmp_path / "cache")
    began = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = compile_with(fresh_kernel)
        second = compile_with(fresh_kernel, arch="sm_90a")
    messages = runtime_warnings(caught)
    assert len(messages) == 1 and "not answering" in messages[0], messages
    assert (first.origin, second.origin) == ("compiled", "compiled") and nvrtc_calls() == 2
    assert time.monotonic() - began < 60  # two NVRTC compiles; the refused connection itself is immediate


def test_a_server_that_never_answers_costs_one_timeout(tmp_path, monkeypatch, use_remote, nvrtc_calls,
                                                        fresh_kernel):
    pytest.importorskip("redis", reason="needs the redis client (pip install -e '.[test]')")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # accepts connections (the kernel does) and never says a word
    try:
        use_remote(f"redis://127.0.0.1:{listener.getsockname()[1]}/0")
        new_process(monkeypatch, tmp_path / "cache")
        began = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = compile_with(fresh_kernel)
            lookup_done = time.monotonic()
            second = compile_with(fresh_kernel, arch="sm_90a")
        messages = runtime_warnings(caught)
        assert len(messages) == 1 and "not answering" in messages[0], messages
        assert (first.origin, second.origin) == ("compiled", "compiled") and nvrtc_calls() == 2
        assert lookup_done - began < remote.TIMEOUT_S * 2 + 30  # one timeout (the second compile tries no more)
        assert remote.remote_cache() is None
    finally:
        listener.close()


def test_redis_killed_mid_run(tmp_path, monkeypatch, use_remote, nvrtc_calls, fresh_kernel):
    pytest.importorskip("redis", reason="needs the redis client (pip install -e '.[test]')")
    need_redis_server()
    server, url = start_redis()
    try:
        use_remote(url)
        new_process(monkeypatch, tmp_path / "cache")
        first = compile_with(fresh_kernel)
        assert redis_client(url).get(remote.entry_name(first.key)) is not None
        server.kill()
        server.wait(timeout=10)
        began = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            second = compile_with(fresh_kernel, arch="sm_90a")
            third = compile_with(fresh_kernel, arch="sm_86")
        messages = runtime_warnings(caught)
        assert len(messages) == 1 and "not answering" in messages[0], messages
        assert (second.origin, third.origin) == ("compiled", "compiled") and nvrtc_calls() == 3
        assert time.monotonic() - began < 60
    finally:
        server.kill()
        server.wait(timeout=10)


def test_a_full_server_turns_the_remote_off_and_compiles_go_on(tmp_path, monkeypatch, use_remote, nvrtc_calls,
                                                               fresh_kernel):
    pytest.importorskip("redis", reason="needs the redis client (pip install -e '.[test]')")
    need_redis_server()
    server, url = start_redis("--maxmemory-policy", "noeviction")
    try:
        client = redis_client(url)
        client.set("ballast", b"x" * (2 << 20))
        client.config_set("maxmemory", "1mb")  # now over it: reads still answer, every write is refused
        use_remote(url)
        new_process(monkeypatch, tmp_path / "cache")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = compile_with(fresh_kernel)
            second = compile_with(fresh_kernel, arch="sm_90a")
        messages = runtime_warnings(caught)
        assert len(messages) == 1 and "not answering" in messages[0] and "maxmemory" in messages[0], messages
        assert (first.origin, second.origin) == ("compiled", "compiled") and nvrtc_calls() == 2
    finally:
        server.kill()
        server.wait(timeout=10)


# ---- autotune records -------------------------------------------------------------------------------------------

def test_an_autotune_choice_is_shared_through_the_remote(tmp_path, monkeypatch, redis_url, use_remote):
    use_remote(redis_url)
    source = f"shared-tuning-{next(_salts)}"
    times = {32: 3.0, 64: 1.0, 128: 2.0}
    new_process(monkeypatch, tmp_path / "host-a")
    kernel = FakeKernel(source)
    bench = FakeBench(kernel, times)
    tuner = Autotuner(kernel, configs_for(32, 64, 128), key=["M"], bench_fn=bench)
    launch(tuner)
    assert tuner.best_config.kwargs["BM"] == 64 and sorted(bench.timed) == [32, 64, 128]

    new_process(monkeypatch, tmp_path / "host-b")
    kernel_b = FakeKernel(source)
    bench_b = FakeBench(kernel_b, {32: 0.1, 64: 9.0, 128: 9.0})  # would choose otherwise if it timed anything
    tuner_b = Autotuner(kernel_b, configs_for(32, 64, 128), key=["M"], bench_fn=bench_b)
    launch(tuner_b)
    assert tuner_b.best_config.kwargs["BM"] == 64 and bench_b.timed == [] and kernel_b.compiles == []
    assert tuner_b.stats.from_disk
    stored = json.loads(next((tmp_path / "host-b" / "autotune").glob("*.json")).read_text())
    assert [record["config"]["kwargs"]["BM"] for record in stored.values()] == [64]


def test_a_tampered_autotune_record_is_refused_and_tuned_again(tmp_path, monkeypatch, redis_url, use_remote):
    use_remote(redis_url)
    source = f"tampered-tuning-{next(_salts)}"
    new_process(monkeypatch, tmp_path / "host-a")
    kernel = FakeKernel(source)
    tuner = Autotuner(kernel, configs_for(32, 64), key=["M"], bench_fn=FakeBench(kernel, {32: 3.0, 64: 1.0}))
    launch(tuner)
    (tuning_key,) = tuner._chosen
    name = remote.record_name(kernel.__name__, kernel.source_hash(), tuning_key)
    client = redis_client(redis_url)
    value = client.get(name)
    client.set(name, value.replace(b'"BM": 64', b'"BM": 32'))

    new_process(monkeypatch, tmp_path / "host-b")
    kernel_b = FakeKernel(source)
    bench_b = FakeBench(kernel_b, {32: 3.0, 64: 1.0})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tuner_b = Autotuner(kernel_b, configs_for(32, 64), key=["M"], bench_fn=bench_b)
        launch(tuner_b)
    messages = runtime_warnings(caught)
    assert len(messages) == 1 and "refusing" in messages[0], messages
    assert tuner_b.best_config.kwargs["BM"] == 64 and sorted(bench_b.timed) == [32, 64]


# ---- the backend interface --------------------------------------------------------------------------------------

class DictBackend:
    """A RemoteBackend in a dict: any store with get and put plugs in."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def get(self, name, limit):
        value = self.values.get(name)
        return None if value is None else value[:limit + 1]

    def put(self, name, value):
        self.values[name] = value

    def ping(self):
        return 0.0


def test_any_backend_with_get_and_put_plugs_in():
    backend = DictBackend()
    shared = remote.RemoteCache(backend, b"k" * 32, "a dict")
    shared.put_record("tilejit:v1:autotune:x", {"kernel": "k", "key": "M=1"})
    (stored,) = backend.values.values()
    assert stored.startswith(b"tilejit-signed-v1\n") and b'"M=1"' in stored
    assert shared.get_record("tilejit:v1:autotune:x") == {"kernel": "k", "key": "M=1"}
    assert shared.get_record("tilejit:v1:autotune:missing") is None
    with pytest.warns(RuntimeWarning, match="refusing"):
        assert remote.RemoteCache(backend, b"another key 0123456789", "a dict").get_record(
            "tilejit:v1:autotune:x") is None


def test_the_url_password_is_not_shown():
    assert remote.redacted("redis://user:secret@host:6379/0") == "redis://user:***@host:6379/0"
    assert remote.redacted("redis://:secret@host:6379/0") == "redis://***@host:6379/0"
    assert remote.redacted("redis://host:6379/0") == "redis://host:6379/0"


def test_no_remote_configured_costs_nothing(tmp_path, monkeypatch, nvrtc_calls, fresh_kernel):
    monkeypatch.delenv("TILEJIT_REMOTE_CACHE", raising=False)
    new_process(monkeypatch, tmp_path / "cache")
    opened = []
    monkeypatch.setattr(remote, "_open", lambda *a: opened.append(a))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compile_with(fresh_kernel).origin == "compiled"
    assert opened == [] and remote.status().startswith("not configured")


def test_threads_share_one_fault(monkeypatch):
    """Many threads hitting a dead remote at once still warn once."""
    class Dead(DictBackend):
        def get(self, name, limit):
            raise remote.RemoteUnavailable("ConnectionError: refused")

    shared = remote.RemoteCache(Dead(), b"k" * 32, "a dead store")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=shared.get_entry, args=("ab" * 32,)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(runtime_warnings(caught)) == 1 and shared.unavailable == "ConnectionError: refused"


def test_a_server_that_answers_slowly_is_turned_off_after_a_few_slow_requests(monkeypatch):
    """Slow but within the timeout: each request would cost its wait for the whole run; a few slow ones turn the
    remote off, once, and later lookups cost nothing."""
    clock = [0.0]
    monkeypatch.setattr(remote.time, "perf_counter", lambda: clock[0])

    class Slow(DictBackend):
        requests = 0

        def get(self, name, limit):
            Slow.requests += 1
            clock[0] += remote.SLOW_REQUEST_S + 1.0  # answers, within TIMEOUT_S, but slowly
            return super().get(name, limit)

    shared = remote.RemoteCache(Slow(), b"k" * 32, "a slow store")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(remote.SLOW_REQUESTS + 5):
            assert shared.get_entry("ab" * 32) is None
    assert Slow.requests == remote.SLOW_REQUESTS
    (warning,) = runtime_warnings(caught)
    assert "answering slowly" in warning
    assert shared.unavailable.startswith("answering slowly")


def test_fast_requests_never_count_as_slow(monkeypatch):
    shared = remote.RemoteCache(DictBackend(), b"k" * 32, "a dict")
    for _ in range(50):
        shared.put_record("tilejit:v1:autotune:x", {"kernel": "k"})
        assert shared.get_record("tilejit:v1:autotune:x") == {"kernel": "k"}
    assert shared.slow_requests == 0 and shared.unavailable is None


# ---- a URL that cannot name a store -----------------------------------------------------------------------------

@pytest.mark.parametrize("url, why", [
    ("redis://user:secret@[::1", "Invalid IPv6 URL"),
    ("redis://user:secret@host:abc/0", "Port could not be cast"),
    ("redis://host:99999/0", "Port out of range"),
    ("ftp://user:secret@host/0", "unknown scheme 'ftp'"),
    ("user:secret@host:6379", "unknown scheme 'user'"),  # redis:// forgotten
    ("redis://", "no host"),
    ("redis://:secret@:6379/0", "no host"),
    ("unix://", "no socket path"),
    ("redis://host/zero", "the database 'zero' is not a number"),
])
def test_a_malformed_remote_url_is_a_usage_error_naming_the_variable(monkeypatch, key_file, url, why):
    monkeypatch.setenv("TILEJIT_REMOTE_CACHE", url)
    monkeypatch.setenv("TILEJIT_REMOTE_CACHE_KEY", str(key_file))
    new_process(monkeypatch)
    with pytest.raises(tilejit.errors.UsageValueError) as caught:
        remote.configured()
    message = str(caught.value)
    assert message.startswith("TILEJIT_REMOTE_CACHE=") and why in message and "redis://" in message, message
    assert "secret" not in message, message


def test_a_malformed_remote_url_fails_a_compile_before_anything_compiles(tmp_path, monkeypatch, use_remote,
                                                                         nvrtc_calls, fresh_kernel):
    use_remote("redis://user:secret@[::1")
    new_process(monkeypatch, tmp_path / "cache")
    with pytest.raises(tilejit.errors.UsageValueError, match=r"TILEJIT_REMOTE_CACHE=redis://user:\*\*\*@\[::1 "):
        compile_with(fresh_kernel)
    assert nvrtc_calls() == 0


def test_cache_stats_with_a_malformed_remote_url_says_so_in_one_line(monkeypatch, use_remote, capsys):
    use_remote("redis://user:secret@[::1")
    assert cli.main(["cache", "stats"]) == 1
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("tilejit: TILEJIT_REMOTE_CACHE=redis://user:***@[::1 is not a remote cache URL: "
                           "Invalid IPv6 URL"), line
    assert "secret" not in captured.err + captured.out and "Traceback" not in captured.err


def test_the_password_of_a_url_that_cannot_be_parsed_is_not_shown():
    assert remote.redacted("redis://user:secret@[::1") == "redis://user:***@[::1"
    assert remote.redacted("redis://:se@cret@[::1") == "redis://***@[::1"
    assert remote.redacted("user:secret@host:6379") == "user:***@host:6379"
    assert remote.redacted("redis://user@[::1") == "redis://user@[::1"
