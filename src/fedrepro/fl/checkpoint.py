"""Checkpoint I/O of the shared runner: tensor-state files and per-round server checkpoints.

Every paper's task, strategy and the cell runner write and read states through here, so a rerun
with the same seed gives the same bytes and a killed run resumes from its last finished round:

* :func:`save_state` / :func:`load_state`: one safetensors file of named tensors (no metadata);
* ``<cell>/checkpoints/server_round_NNN.{safetensors,json}``: the server's tensors and the round's
  metrics after every round (:func:`checkpoint_paths`, :func:`latest_round`, :func:`round_log`);
* ``<cell>/clients/<client>/<prefix>NNN.safetensors``: a client's own state after each round it
  took part in (written by the paper's task; :func:`latest_client_round` finds the one to continue
  from, :func:`last_participation` reads from the round log which round that is at the end);
* ``cell_config.json``: the config hash the checkpoints were made under (:func:`prepare_checkpoints`
  discards checkpoints of another config); ``failure.json``: why a run stopped (:func:`read_failure`).

Client checkpoints off the critical path (issue 25, item 3): on the in-process engine the clients
of a round train one after another in the server's process, and each client's state file (tens to
hundreds of MB) used to be written before the next client could start.  Inside
:func:`deferred_client_writes` (the runner's in-process engine) a :func:`save_state` called by a
client's training (a thread inside :func:`client_checkpoint_writes`, entered by the ClientApp)
takes a *snapshot* of the tensors (detached CPU copies: the next client's training cannot change
what is written) and hands it to one background writer thread per process (:class:`BackgroundWriter`,
bounded queue), which writes it atomically as before.  The writes are joined
(:func:`join_client_writes`) before the server writes its round checkpoint -- so a resume never
sees a round checkpoint whose client files are missing or half-written -- and when the engine
stops, normally or on an error; a failed background write surfaces there as a
:class:`ClientWriteError` naming the file.  On every other engine (Ray actors, deployed
SuperNodes: other processes, whose writes the server cannot join) client writes stay synchronous.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import contextlib
import queue
import re
import shutil
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file

from fedrepro import cancellation
from fedrepro.io import InputError, read_json, safetensors_save_atomic, write_json_atomic

log = logging.getLogger(__name__)


def snapshot(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU copies of ``state``'s tensors (same order, same bits): nothing done
    to the originals afterwards (in-place training steps, a new state loaded) changes them."""
    out = {}
    for k, v in state.items():
        t = v.detach()
        if t.device.type == "cpu":
            t = t.clone(memory_format=torch.contiguous_format)
        else:  # the device-to-host copy is already a new tensor
            t = t.to("cpu").contiguous()
        out[k] = t
    return out


def save_state(path: str | os.PathLike, state: dict[str, torch.Tensor]) -> None:
    """Atomic safetensors write: the same tensors give the same bytes.

    No ``metadata`` is written: safetensors serialises a metadata dict in hash-map order, which
    differs between processes and would break byte-identical reruns.

    Called from a client's training inside :func:`client_checkpoint_writes` while the runner joins
    client writes (:func:`deferred_client_writes`), the write happens in the background: the
    tensors are snapshotted now and written by the process's :class:`BackgroundWriter`.
    """
    cancellation.check()  # a client given up on writes nothing more (fedrepro.cancellation)
    tensors = snapshot(state)
    if _defers_client_writes():
        WRITER.submit(path, lambda: safetensors_save_atomic(tensors, path))
    else:
        safetensors_save_atomic(tensors, path)


# -- client checkpoint writes in the background (issue 25, item 3) ---------------------------
class ClientWriteError(RuntimeError):
    """A background client-checkpoint write failed; the message names the file."""


class BackgroundWriter:
    """One daemon thread that runs submitted writes in order; at most ``max_pending`` wait in its
    queue (a client that submits more blocks until one is written: bounded memory).

    An exception of a write is kept with the file's path and raised by :meth:`join` as a
    :class:`ClientWriteError` naming the file (the first failure; later ones are logged)."""

    def __init__(self, max_pending: int = 2, what: str = "client checkpoint",
                 name: str = "fedrepro-checkpoint-writer") -> None:
        self.what, self.name = what, name
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._errors: list[tuple[str, BaseException]] = []

    def submit(self, path: str | os.PathLike, write: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        self._queue.put((str(path), write))

    def _run(self) -> None:
        while True:
            path, write = self._queue.get()
            try:
                write()
            except BaseException as exc:  # noqa: BLE001 - reported by join()
                with self._lock:
                    self._errors.append((path, exc))
            finally:
                self._queue.task_done()

    def pending(self) -> int:
        """Writes submitted and not finished yet (queued or running)."""
        return self._queue.unfinished_tasks

    def join(self) -> None:
        """Wait until every submitted write has finished; raise the first failure, naming its file."""
        self._queue.join()
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            for path, exc in errors[1:]:
                log.error("background write of %s failed too: %s: %s", path, type(exc).__name__, exc)
            path, exc = errors[0]
            raise ClientWriteError(
                f"{path}: the background write of this {self.what} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc


WRITER = BackgroundWriter()
"""The process's client-checkpoint writer (one thread)."""

_deferring = 0  # > 0 while a runner in this process joins client writes (deferred_client_writes)
_client_thread = threading.local()


def _defers_client_writes() -> bool:
    return _deferring > 0 and getattr(_client_thread, "active", False)


@contextlib.contextmanager
def client_checkpoint_writes() -> Iterator[None]:
    """Mark the calling thread as a client's training: its :func:`save_state` calls are client
    checkpoint writes (deferred while :func:`deferred_client_writes` is active in this process,
    synchronous otherwise).  Entered by the ClientApp around the task's client round."""
    saved = getattr(_client_thread, "active", False)
    _client_thread.active = True
    try:
        yield
    finally:
        _client_thread.active = saved


def join_client_writes() -> None:
    """Wait for this process's pending client-checkpoint writes (a no-op if there are none); a
    failed one raises :class:`ClientWriteError` naming its file.  The strategy calls this before
    it writes a round checkpoint."""
    WRITER.join()


@contextlib.contextmanager
def deferred_client_writes() -> Iterator[None]:
    """While inside, client checkpoint writes of this process go to the background writer (the
    in-process engine: the server that joins them before each round checkpoint is in this
    process).  On the way out every pending write is joined: a failed write raises (naming the
    file); if the block raised already, that error stays the run's error and a failed write is
    logged with it."""
    global _deferring
    _deferring += 1
    try:
        yield
    except BaseException:
        try:
            WRITER.join()
        except ClientWriteError as exc:
            log.error("%s", exc)
        raise
    else:
        WRITER.join()
    finally:
        _deferring -= 1


def load_state(path: str | os.PathLike) -> OrderedDict[str, torch.Tensor]:
    if not Path(path).exists():
        raise InputError(f"{path}: adapter state not found")
    return OrderedDict(sorted(load_file(str(path)).items()))


# keys that do not change what a cell computes (excluded from the config hash)
_NON_SEMANTIC = ("out_dir", "round_timeout_s", "engine")


def config_hash(cell: dict) -> str:
    semantic = {k: v for k, v in cell.items() if k not in _NON_SEMANTIC}
    return hashlib.sha256(json.dumps(semantic, sort_keys=True).encode()).hexdigest()[:16]


def prepare_checkpoints(cell: dict) -> int:
    """Return the last finished round, discarding checkpoints made under another config.

    Without a checkpoint stamp the cell starts afresh: client states left by an earlier run
    (one killed while :func:`discard_checkpoints` ran) are removed with it."""
    out = Path(cell["out_dir"])
    stamp = out / "checkpoints" / "cell_config.json"
    h = config_hash(cell)
    for stale in out.glob(f"{_DISCARDED}*"):
        shutil.rmtree(stale, ignore_errors=True)
    if stamp.exists() and read_json(stamp).get("config_hash") != h:
        log.warning("discarding checkpoints of a different cell config in %s", out)
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
        shutil.rmtree(out / "clients", ignore_errors=True)
    elif not stamp.exists():
        shutil.rmtree(out / "clients", ignore_errors=True)
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    failure = out / "checkpoints" / "failure.json"
    if failure.exists():
        failure.unlink()
    write_json_atomic(stamp, {"config_hash": h, "cell": cell})
    return latest_round(out)


_DISCARDED = ".discarded-"


def discard_checkpoints(out_dir: str | Path) -> None:
    """Delete a finished cell's ``checkpoints`` and ``clients`` folders.

    Each is renamed away (``.discarded-<name>``) before it is deleted, ``checkpoints`` first: a
    run killed meanwhile leaves either complete checkpoints (a rerun resumes from them) or none (a
    rerun starts afresh), never a round log with holes; :func:`prepare_checkpoints` removes what
    it left."""
    out = Path(out_dir)
    for name in ("checkpoints", "clients"):
        if (out / name).exists():
            trash = out / f"{_DISCARDED}{name}"
            shutil.rmtree(trash, ignore_errors=True)
            os.replace(out / name, trash)
            shutil.rmtree(trash, ignore_errors=True)


def checkpoint_paths(out_dir: str | Path, round_index: int) -> tuple[Path, Path]:
    ckpt = Path(out_dir) / "checkpoints"
    return (
        ckpt / f"server_round_{round_index:03d}.safetensors",
        ckpt / f"server_round_{round_index:03d}.json",
    )


def latest_round(out_dir: str | Path) -> int:
    """The last round whose checkpoint is complete (its JSON is written after its tensors)."""
    done = 0
    ckpt = Path(out_dir) / "checkpoints"
    if ckpt.exists():
        for meta in ckpt.glob("server_round_*.json"):
            r = int(meta.stem.rsplit("_", 1)[1])
            if checkpoint_paths(out_dir, r)[0].exists():
                done = max(done, r)
    return done


def round_log(out_dir: str | Path, upto: int) -> list[dict]:
    return [read_json(checkpoint_paths(out_dir, r)[1]) for r in range(1, upto + 1)]


def timing_path(out_dir: str | Path, round_index: int) -> Path:
    """Measured times of a round (provenance, not a result): ``checkpoints/timing_round_XXX.json``."""
    return Path(out_dir) / "checkpoints" / f"timing_round_{round_index:03d}.json"


def timing_log(out_dir: str | Path, upto: int) -> list[dict]:
    """The rounds' timing files that exist (a round resumed from a checkpoint has none)."""
    return [read_json(p) for r in range(1, upto + 1) if (p := timing_path(out_dir, r)).exists()]


def read_failure(out_dir: str | Path) -> str | None:
    path = Path(out_dir) / "checkpoints" / "failure.json"
    if path.exists():
        return json.dumps(read_json(path))
    return None


def latest_client_round(folder: str | Path, prefix: str, upto: int) -> int:
    """The highest round ``r <= upto`` with a file ``<folder>/<prefix>{r:03d}.safetensors``; 0 if none.

    With partial participation a client's last state can be older than the previous round (it
    was not sampled since); files of later rounds (left by a run killed inside a round) are
    ignored, so a resumed round starts from the same state as an uninterrupted one."""
    best = 0
    folder = Path(folder)
    if folder.is_dir():
        pattern = re.compile(re.escape(prefix) + r"(\d+)\.safetensors")
        for path in folder.glob(f"{prefix}*.safetensors"):
            m = pattern.fullmatch(path.name)
            if m and best < int(m[1]) <= upto:
                best = int(m[1])
    return best


def client_files_needed_from(out_dir: str | Path, folder: str | Path, prefix: str, started_from: int) -> int:
    """The oldest round whose client file ``<folder>/<prefix>NNN.safetensors`` must stay: the one
    this round started from (``started_from``), or the older one a resume would start from.

    A resume starts at the last round whose checkpoint is complete on disk (:func:`latest_round`)
    and gives each client its newest file at or before it (:func:`latest_client_round`).  The
    server writes a round's log entry in the background while the next round trains
    (:mod:`fedrepro.fl.strategy`), so during round t+1 the last complete round can still be t-1:
    a client pruning its files then keeps the one a resume from t-1 needs.  0: keep every file
    (no round complete yet, or the server's checkpoints are not visible here)."""
    done = latest_round(out_dir)
    return min(int(started_from), latest_client_round(folder, prefix, done))


def last_participation(out_dir: str | Path, clients: list[str], upto: int) -> dict[str, int]:
    """``{client: the last round <= upto whose round log lists it}`` (0: never sampled), from the
    server's checkpoints; ``clients`` in partition-id order (``cell['clients']``)."""
    last = dict.fromkeys(clients, 0)
    for entry in round_log(out_dir, upto):
        for c in entry["clients"]:
            last[clients[int(c["partition_id"])]] = int(entry["round"])
    return last
