"""The frozen backbone, loaded once per process (issue 16, "resident model at paper scale").

Every paper's task reads its backbone folder through :func:`resident`: the first call in a process
runs the loader (``from_pretrained``), later calls get the same object back, whichever engine
drives the clients -- the in-process grid (one process for the server and every client), Flower's
Ray simulation (each actor process loads once and keeps it for every client and round it runs),
a deployed SuperNode (one process per client), or a row job training several methods.  The key is
the loader's name, the folder's resolved path and its *identity* -- size and modification time of
``config.json`` and of the weight files -- plus the caller's extra key (e.g. a seed that draws a
freshly initialised head), so a folder rebuilt in place is loaded again, never served stale.

The returned object is shared: a task must copy what it trains (FedMCP, FedSum, FedSUMM deep-copy
their per-client models, as before) and may share only frozen tensors
(:func:`share_frozen`, AdaFedSelecKD).

Loads are counted per process (:data:`LOADS`); with ``FEDREPRO_LOAD_LOG=<file>`` set in the
environment every load also appends ``pid<TAB>name<TAB>path`` to that file, so loads in Ray actor
processes (which inherit the environment) can be counted from outside (tests/test_resident.py).
"""

from __future__ import annotations

import collections
import copy
import logging
import os
import threading
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LOAD_LOG_ENV = "FEDREPRO_LOAD_LOG"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")

LOADS: collections.Counter[tuple[str, str]] = collections.Counter()
"""``(loader name, resolved folder) -> number of loads`` in this process."""

MAX_RESIDENT = 4
"""At most this many resident objects per process (least recently used dropped first): a process
uses one backbone at a time; tests and report jobs may walk through several."""

_CACHE: dict[tuple, Any] = {}  # insertion order = least recently used first
_LOCK = threading.Lock()


def folder_identity(path: str | os.PathLike) -> tuple:
    """``(file, size, mtime_ns)`` of the folder's config and weight files: what changes when the
    backbone rule (or a user) rewrites the folder."""
    folder = Path(path)
    out = []
    for name in ("config.json", *WEIGHT_FILES):
        f = folder / name
        if f.is_file():
            st = f.stat()
            out.append((name, st.st_size, st.st_mtime_ns))
    return tuple(out)


def resident(name: str, path: str | os.PathLike, loader: Callable[[], Any], extra: Hashable = ()) -> Any:
    """``loader()``'s result for backbone folder ``path``, loaded once per process.

    ``name`` says which loader (a folder may be read as an encoder by one paper and as a seq2seq
    model by another); ``extra`` is any further key the result depends on.  An entry for the same
    ``name``/``path``/``extra`` whose folder identity changed is dropped before the new load."""
    folder = str(Path(path).resolve())
    key = (name, folder, extra)
    ident = folder_identity(folder)
    with _LOCK:
        hit = _CACHE.pop(key, None)
        if hit is not None and hit[0] == ident:
            _CACHE[key] = hit  # most recently used
            return hit[1]
        if hit is not None:
            log.info("backbone folder %s changed since it was loaded; loading it again", folder)
        value = loader()
        _CACHE[key] = (ident, value)
        while len(_CACHE) > MAX_RESIDENT:
            del _CACHE[next(iter(_CACHE))]
        LOADS[(name, folder)] += 1
        record = os.environ.get(LOAD_LOG_ENV)
        if record:
            with open(record, "a", encoding="utf-8") as f:  # one short line, O_APPEND: no interleaving
                f.write(f"{os.getpid()}\t{name}\t{folder}\n")
        return value


def clear() -> None:
    """Forget every resident object (and the counts); tests and long-lived tools."""
    with _LOCK:
        _CACHE.clear()
        LOADS.clear()


def share_frozen(module):
    """A deep copy of ``module`` whose parameters and buffers are the *same* tensors as the
    original's: its own module tree (which a wrapper may rewire: adapters inserted, layers
    replaced) over one copy of the weights.  Only for weights nobody trains."""
    memo = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return copy.deepcopy(module, memo)
