"""``np.load`` from several threads at once on CPython 3.11.0-3.11.7 / 3.12.0-3.12.1.

The in-process engine runs each client in a worker thread while the server's round writer
(:mod:`fedrepro.fl.strategy`) works in another, and both read ``.npy`` bytes: Flower's
``Array.numpy()`` and our spooled replies go through ``np.load``, whose header parser is
``ast.literal_eval``.  On the CPython versions above, building AST objects in two threads at
once can raise ``SystemError: AST constructor recursion depth mismatch`` (CPython gh-106905: the
depth counter was per interpreter, not per thread; fixed in 3.11.8 and 3.12.2).  This machine's
Python is 3.11.7, and the suite failed on it once in a worker thread's ``np.load``.

No library offers a fix for an interpreter bug, so :func:`install` (called on import of the
engine and the strategy) puts NumPy's ``.npy`` header reader (``_read_array_header``, which
imports ``ast`` in its body and calls ``ast.literal_eval`` on the header's dict literal) under a
process-wide lock: the header, a few hundred bytes, is read and parsed under the lock and the
array bytes outside it, so the lock costs microseconds per array.  On an interpreter with the fix
nothing is changed.  Other callers of ``ast.parse`` in threads are not covered (none in the
project's threaded code).
"""

from __future__ import annotations

import functools
import importlib
import sys
import threading
import types

_LOCK = threading.Lock()


def affected(version: tuple = tuple(sys.version_info[:3])) -> bool:
    """Whether this interpreter has gh-106905 (AST construction not thread-safe)."""
    return (3, 11, 0) <= version < (3, 11, 8) or (3, 12, 0) <= version < (3, 12, 2)


def _format_modules() -> list[types.ModuleType]:
    """NumPy's ``.npy`` format module(s) with a ``_read_array_header`` (numpy 2: ``_format_impl``,
    numpy 1: ``format``)."""
    mods = []
    for name in ("numpy.lib._format_impl", "numpy.lib.format"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if callable(getattr(mod, "_read_array_header", None)) and mod not in mods:
            mods.append(mod)
    return mods


def _locked(read_header):
    @functools.wraps(read_header)
    def read_array_header(*args, **kwargs):
        with _LOCK:
            return read_header(*args, **kwargs)

    read_array_header.__fedrepro_locked__ = True
    return read_array_header


def install(force: bool = False) -> bool:
    """Put NumPy's header reader under the lock where the interpreter needs it (or ``force``);
    idempotent.  Returns whether the lock is in place."""
    if not (force or affected()):
        return False
    mods = _format_modules()
    for mod in mods:
        if not _is_locked(mod):
            mod._read_array_header = _locked(mod._read_array_header)
    return bool(mods)


def _is_locked(mod: types.ModuleType) -> bool:
    return getattr(mod._read_array_header, "__fedrepro_locked__", False)


def installed() -> bool:
    """Whether every NumPy format module reads its headers under the lock."""
    mods = _format_modules()
    return bool(mods) and all(_is_locked(m) for m in mods)
