"""glibc's allocator: one arena in the processes we start, trimmed once per round
(fedrepro.host_memory).

Each check runs in a fresh interpreter: glibc reads ``MALLOC_ARENA_MAX`` when a process starts.
The arenas are counted in glibc's own report (``malloc_info``: one ``<heap nr=...>`` per arena)
after threads that each allocate -- a new thread gets an arena of its own under glibc's defaults.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fedrepro import host_memory

pytestmark = pytest.mark.skipif(host_memory.glibc() is None, reason="glibc's allocator only")

SCRIPT = textwrap.dedent("""
    import ctypes, json, os, re, sys, tempfile, threading
    from concurrent.futures import ThreadPoolExecutor
    from fedrepro import host_memory
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.fopen.restype = ctypes.c_void_p
    barrier = threading.Barrier(4)

    def work():
        blocks = [libc.malloc(4096) for _ in range(64)]
        barrier.wait()  # all four threads hold memory at once
        for b in blocks:
            libc.free(b)

    with ThreadPoolExecutor(4) as pool:  # four threads, each blocked on the barrier until all run
        for _ in range(4):
            pool.submit(work)
    path = tempfile.mktemp()
    fh = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, ctypes.c_void_p(fh))
    libc.fclose(ctypes.c_void_p(fh))
    heaps = len(re.findall(r"<heap nr=", open(path).read()))
    os.unlink(path)
    print(json.dumps({"arenas": heaps, "env": os.environ.get("MALLOC_ARENA_MAX")}))
""")


def _base_env() -> dict:
    return {k: v for k, v in os.environ.items() if k != host_memory.ARENA_ENV}


def _arenas(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_without_the_limit_threads_get_arenas_of_their_own():
    """The control: what the limit prevents (else the test below could not fail)."""
    assert _arenas(_base_env())["arenas"] > 1


def test_a_process_started_with_our_environment_has_one_arena():
    env = host_memory.one_arena_environment(_base_env())
    assert env[host_memory.ARENA_ENV] == "1"
    assert _arenas(env) == {"arenas": 1, "env": "1"}


def test_a_users_malloc_arena_max_wins():
    env = host_memory.one_arena_environment({**_base_env(), host_memory.ARENA_ENV: "3"})
    assert env[host_memory.ARENA_ENV] == "3"
    assert _arenas(env)["arenas"] == 3  # the user's limit, not replaced by ours


def test_the_flower_deployment_processes_start_with_it(tmp_path, monkeypatch):
    """The SuperLink's and SuperNodes' environment (and so their apps'); a user's value wins.
    (Snakemake's jobs: the end-to-end Table III test reads it back from a cell's provenance.)"""
    from fedrepro.fl.deploy import LocalFederation

    monkeypatch.delenv(host_memory.ARENA_ENV, raising=False)
    assert LocalFederation(tmp_path / "a").env[host_memory.ARENA_ENV] == "1"
    monkeypatch.setenv(host_memory.ARENA_ENV, "4")
    assert LocalFederation(tmp_path / "b").env[host_memory.ARENA_ENV] == "4"


TRIM = textwrap.dedent("""
    import ctypes, json, os
    from fedrepro import host_memory
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    page = os.sysconf("SC_PAGE_SIZE")

    def rss_mb():
        return int(open("/proc/self/statm").read().split()[1]) * page / 2**20

    # 256 MB in 64 KB blocks (below the mmap threshold: from the heap), then one block above
    # them, so freeing them leaves a hole glibc does not give back by itself
    blocks = [libc.malloc(65536) for _ in range(4096)]
    for b in blocks:
        libc.memset(b, 1, 65536)
    keep = libc.malloc(65536)
    libc.memset(keep, 1, 65536)
    for b in blocks:
        libc.free(b)
    before = rss_mb()
    released = host_memory.release_free_memory()
    print(json.dumps({"released": released, "before": before, "after": rss_mb()}))
""")


def test_release_free_memory_gives_freed_heap_pages_back():
    out = subprocess.run([sys.executable, "-c", TRIM], env=_base_env(), capture_output=True, text=True,
                         check=True, timeout=120)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["released"] is True
    assert got["before"] - got["after"] > 200, got  # of the 256 MB freed
