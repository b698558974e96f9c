"""The process's host memory: glibc's allocator kept from hoarding freed memory.

A cell trains every client of a round in one process (the in-process engine), each client in a
thread of its own, and the server keeps a round's replies -- hundreds of MB per client at
BERT-base size -- while the next ones train.  With glibc's defaults such a process's resident
memory only grows: each new thread gets a malloc *arena* of its own (up to 8 per core), and after
the first large block is freed glibc raises its mmap threshold (up to 32 MB), so tensors of a few
MB come from those arenas and their freed pages stay with the process.

Measured on FedSum's SCAFFOLD rehearsal cell (bert-base, 4 clients x 2 rounds, this 2-core VM,
2026-11-27; ``bench/results/rehearsal_cpu/host_memory_2026-11-27.md``), peak RSS / wall:
17.3 GB / 231 s with the defaults; 14.9 GB / 233 s with ``MALLOC_ARENA_MAX=1``; 11.5 GB / 210 s
with that, the round's replies freed before the next round (``fl.strategy.RoundReplies``) and
:func:`release_free_memory` once per round.  Not chosen: a fixed 1 MB mmap threshold (13.4 GB
but 356 s: every activation buffer mapped and faulted anew), and ``mallopt(M_ARENA_MAX, 1)``
from inside the running process (17.5 GB: glibc then hands new threads the arenas that already
exist in turn, which was no better than the defaults) -- the limit works only from the
environment a process *starts* with.

So :func:`one_arena_environment` puts ``MALLOC_ARENA_MAX=1`` into the environment of the
processes we start: every Snakemake job (``rules/common.smk`` sets it in Snakemake's own
environment, which local and SLURM jobs inherit), the Flower SuperLink and SuperNodes
(``fl.deploy``) and, through them, Ray's workers.  A user's own ``MALLOC_ARENA_MAX`` wins.  A
cell run from Python directly (a notebook, the tests) keeps the interpreter's setting; start it
with ``MALLOC_ARENA_MAX=1`` for the same memory.  ``provenance.json`` records what the cell's
process had (``machine.malloc_arena_max``).

:func:`release_free_memory` runs once per round in the round writer's thread, after the round's
tensors (``fl.strategy``); glibc holds the arena's lock while it trims, so a client training
beside it may wait that long on a malloc: the round's timing file records ``seconds_trim``
(0.12-0.73 s on the SCAFFOLD cell above, which frees GBs per round; unmeasured on a GPU, where
a round frees far less host memory).

Hand-written with :mod:`ctypes`: no maintained library wraps ``malloc_trim`` (jemalloc/tcmalloc
would need ``LD_PRELOAD`` before Python starts).  On a C library other than glibc (musl, macOS,
Windows) the variable is ignored and :func:`release_free_memory` does nothing.  Neither changes a
computed value: same bits.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import MutableMapping

ARENA_ENV = "MALLOC_ARENA_MAX"
"""The environment variable glibc reads at start-up; set, it replaces our setting."""

ARENAS = "1"
"""The arena limit we start processes with (see the module docstring for the measurement)."""


@functools.cache
def glibc() -> ctypes.CDLL | None:
    """This process's C library if it is glibc, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the symbols the process already has
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def one_arena_environment(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """``env`` with ``MALLOC_ARENA_MAX=1`` unless it already names a limit (a user's own value
    wins); for the environment of a process about to start.  Returns ``env``."""
    env.setdefault(ARENA_ENV, ARENAS)
    return env


def release_free_memory() -> bool:
    """Give the free pages of every malloc arena back to the system (``malloc_trim(0)``); False
    where the C library is not glibc."""
    libc = glibc()
    if libc is None:
        return False
    libc.malloc_trim(ctypes.c_size_t(0))
    return True
