"""Server strategy: Flower's FedAvg (eq. 2), made deterministic, checkpointed and metered.

* Flower's ``FedAvg`` sums replies in arrival order; the float sum then differs in the last bits
  between identical runs.  We sort replies by the client's partition id before aggregating, so a
  rerun with the same seed gives byte-identical parameters.
* A reply with an error, or fewer replies than sampled clients, stops the run with the clients'
  error messages instead of silently averaging the survivors.
* After every round the aggregated tensors and the round's metrics (client losses, KD fractions,
  bytes down/up) are written atomically to ``<cell>/checkpoints/``; a killed run resumes from the
  last finished round (:func:`latest_round`).  The clients' own checkpoint writes of the round
  (in the background on the in-process engine) are joined first, so a round checkpoint never
  exists before its clients' files.  Inside a run the round's files (and its server-step check)
  are written by a background thread while the next round trains (issue 25, item 3;
  :attr:`SortedCheckpointFedAvg.background_round_writes`): the log entry, the completeness
  marker, is still written last, and the writes are joined before the next round writes anything.
  So during round t+1 the last complete round on disk can be t-1: whatever prunes older state
  keeps what a resume from t-1 needs (:func:`fedrepro.fl.checkpoint.client_files_needed_from`,
  FedSUMM's server states).
* Partial participation is deterministic: before the first round the strategy asks every node
  for its ``partition-id`` (one ``query`` message each), then samples *partition ids* with a
  generator seeded by (cell seed, round) -- Flower's own sampling draws node ids with the global
  ``random`` module, and node ids are random in the simulation engine.
* Subclasses (other papers' server procedures) can add per-client records to a round's message
  (:meth:`SortedCheckpointFedAvg.client_records`) and read extra reply records in
  :meth:`aggregate_train`.
* Every round's log entry holds ``server_step`` (:func:`server_step`): the server's step
  ``‖w_{t+1} − w_t‖`` against the clients' mean update ``‖(1/|S|) Σ_c (w^c − w_t)‖`` (and the
  ``num-examples``-weighted mean, FedAvg's own), over the tensors both broadcast and returned
  with the same shape, in float64, streamed tensor by tensor -- the rehearsal report judges it
  (:mod:`fedrepro.rehearsal.report`).
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fedrepro.fl.checkpoint import BackgroundWriter, ClientWriteError, checkpoint_paths, join_client_writes, save_state, timing_path
from fedrepro.host_memory import release_free_memory
from fedrepro.io import InputError, write_json_atomic
from fedrepro.logs import RoundProgress
from fedrepro.fl import npy_threads

npy_threads.install()  # np.load in the round writer's thread on CPython 3.11.7 (gh-106905)

log = logging.getLogger(__name__)

MEASUREMENT_PREFIXES = ("seconds", "peak", "flops")
"""Client statistics that are measurements (times, memory), not results: kept out of the round
log (same seed, same bits) and written to the round's timing file instead."""


def is_measurement(key: str) -> bool:
    return key.replace("-", "_").startswith(MEASUREMENT_PREFIXES)


SERVER_STEP_CHUNK = 1 << 20
"""Entries per float64 chunk of :func:`server_step` (its memory: two float64 sums of the largest
tensor, one client's tensor and 1 Mi-entry chunks; no copy of a whole model)."""


def _flat(x) -> np.ndarray:
    """A tensor (numpy array or torch tensor) as a flat numpy array in its own dtype (bfloat16,
    which numpy lacks, as float32)."""
    if not isinstance(x, np.ndarray):
        import torch

        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            x = x.float()
        x = x.numpy()
    return np.ascontiguousarray(x).reshape(-1)


def _sq(x: np.ndarray) -> float:
    return float(np.sum(x * x))


def _fsum(parts) -> float:
    """The exact sum of float partials (math.fsum: independent of their order); a plain sum
    where they hold ±inf of both signs or overflow (the result is then not finite anyway)."""
    parts = list(parts)
    try:
        return math.fsum(parts)
    except (ValueError, OverflowError):
        return float(sum(parts))


def _quotient(a: float, b: float) -> float | None:
    """a / b; None when b is 0 (no mean update to compare with), NaN stays NaN."""
    return None if b == 0 else a / b


def _device_tensor(x, device):
    """A read tensor (numpy array or torch tensor) flat on ``device`` in its own dtype."""
    import torch

    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    return x.detach().reshape(-1).to(device)


class _StepSums:
    """:func:`server_step`'s partial sums (per chunk or per tensor), added exactly at the end
    (:func:`_fsum`: independent of their order), and the largest |step| entry."""

    def __init__(self, m: int) -> None:
        self.s2: list[float] = []
        self.u2: list[float] = []
        self.w2: list[float] = []
        self.su_dot: list[float] = []
        self.sw_dot: list[float] = []
        self.client_sq: list[list[float]] = [[] for _ in range(m)]
        self.max_abs = 0.0


def _add_tensor_numpy(sums: _StepSums, w_t: np.ndarray, reads, read_new, p, device) -> None:
    """One tensor's partial sums in float64 NumPy, chunk by chunk (:data:`SERVER_STEP_CHUNK`),
    each client's tensor read once (its memory: two float64 sums of the tensor, one client's
    tensor and the chunks)."""
    n, m = w_t.size, len(reads)
    su = np.zeros(n, dtype=np.float64)
    sw = np.zeros(n, dtype=np.float64)
    for c, (read, weight) in enumerate(zip(reads, p)):
        x = _flat(read())
        for a in range(0, n, SERVER_STEP_CHUNK):
            d = x[a:a + SERVER_STEP_CHUNK].astype(np.float64)
            d -= w_t[a:a + SERVER_STEP_CHUNK]
            sums.client_sq[c].append(_sq(d))
            su[a:a + SERVER_STEP_CHUNK] += d
            d *= weight
            sw[a:a + SERVER_STEP_CHUNK] += d
        del x
    x = _flat(read_new())
    for a in range(0, n, SERVER_STEP_CHUNK):
        step = x[a:a + SERVER_STEP_CHUNK].astype(np.float64)
        step -= w_t[a:a + SERVER_STEP_CHUNK]
        mean_u = su[a:a + SERVER_STEP_CHUNK] / m
        mean_w = sw[a:a + SERVER_STEP_CHUNK]
        sums.s2.append(_sq(step))
        sums.u2.append(_sq(mean_u))
        sums.w2.append(_sq(mean_w))
        sums.su_dot.append(float(np.sum(step * mean_u)))
        sums.sw_dot.append(float(np.sum(step * mean_w)))
        if step.size:
            sums.max_abs = max(sums.max_abs, float(np.max(np.abs(step))))


def _add_tensor_torch(sums: _StepSums, w_t, reads, read_new, p, device) -> None:
    """One tensor's partial sums in torch float64 on ``device`` (a GPU): one partial per tensor
    (the device's reductions are deterministic: the same replies give the same bits), each
    client's tensor moved there once; agrees with :func:`_add_tensor_numpy` to float64 rounding
    (tests/test_rehearsal_checks.py)."""
    import torch

    w_t = w_t.double()
    su = torch.zeros_like(w_t)
    sw = torch.zeros_like(w_t)
    for c, (read, weight) in enumerate(zip(reads, p)):
        d = _device_tensor(read(), device).double().sub_(w_t)
        sums.client_sq[c].append(float(d.square().sum()))
        su += d
        sw.add_(d, alpha=weight)
        del d
    step = _device_tensor(read_new(), device).double().sub_(w_t)
    mean_u = su.div_(len(reads))
    sums.s2.append(float(step.square().sum()))
    sums.u2.append(float(mean_u.square().sum()))
    sums.w2.append(float(sw.square().sum()))
    sums.su_dot.append(float((step * mean_u).sum()))
    sums.sw_dot.append(float((step * sw).sum()))
    if step.numel():
        sums.max_abs = max(sums.max_abs, float(step.abs().max()))


def server_step(reference, new, clients, weights, device=None) -> dict:
    """How far the server moved the model against the clients' mean update, in float64.

    ``reference``: ``{name: (shape, read)}`` of the broadcast w_t; ``new``: the same of w_{t+1};
    ``clients``: one ``{name: (shape, read)}`` per reply (sorted by partition id); ``weights``:
    the replies' ``num-examples``.  ``read()`` returns the tensor (numpy or torch); each tensor is
    read once per client, compared in chunks of :data:`SERVER_STEP_CHUNK` entries.  Compared are the
    floating tensors that are broadcast, returned by every client and by the server with the same
    shape; the rest are counted in ``skipped_tensors``.  With Δ_c = w^c − w_t:

    * ``server_norm`` = ‖w_{t+1} − w_t‖, ``max_abs_server_step`` = max_i |(w_{t+1} − w_t)_i|;
    * ``mean_update_norm`` = ‖(1/|S|) Σ_c Δ_c‖ and ``weighted_mean_update_norm`` = ‖Σ_c p_c Δ_c‖
      (p_c = n_c / Σ n), FedAvg's own mean;
    * ``ratio`` / ``weighted_ratio`` = ``server_norm`` over them (None when the mean is 0), and
      the cosines between the server step and each mean (None when either is 0);
    * ``client_update_norm_mean`` = (1/|S|) Σ_c ‖Δ_c‖ and ``client_update_norm_weighted`` =
      Σ_c p_c ‖Δ_c‖ (their ratio to the mean's norm is the clients' dispersion: a server that
      scales each client's update by at most s moves at most s times them, triangle inequality).

    ``device``: a torch device (the cell's GPU) to compute on (:func:`_add_tensor_torch`);
    None or a CPU device: numpy on the CPU.  Deterministic (no timing): the same replies give the
    same bits.
    """
    m = len(clients)
    total = float(sum(weights))
    p = [w / total for w in weights] if total > 0 else [1.0 / max(m, 1)] * m
    keys, skipped = [], 0
    # sorted: a resumed run's broadcast comes back from disk in another key order
    for name, (shape, _) in sorted(reference.items()):
        shape = tuple(shape)
        same = (
            m > 0
            and name in new
            and tuple(new[name][0]) == shape
            and all(name in c and tuple(c[name][0]) == shape for c in clients)
        )
        if same:
            keys.append(name)
        else:
            skipped += 1
    on_device = device is not None and str(device) != "cpu"
    add = _add_tensor_torch if on_device else _add_tensor_numpy
    sums = _StepSums(m)
    entries = non_float = 0
    for name in keys:
        read = reference[name][1]
        w_t = _device_tensor(read(), device) if on_device else _flat(read())
        if not (w_t.is_floating_point() if on_device else w_t.dtype.kind == "f"):
            non_float += 1
            continue
        entries += w_t.shape[0]
        add(sums, w_t, [c[name][1] for c in clients], new[name][1], p, device)
        del w_t
    out: dict = {"tensors": len(keys) - non_float, "skipped_tensors": skipped + non_float,
                 "entries": entries}
    if not entries:
        return out
    s, u, w = (math.sqrt(_fsum(x)) for x in (sums.s2, sums.u2, sums.w2))
    su_dot, sw_dot = _fsum(sums.su_dot), _fsum(sums.sw_dot)
    norms = [math.sqrt(_fsum(x)) for x in sums.client_sq]
    out.update({
        "server_norm": s,
        "max_abs_server_step": sums.max_abs,
        "mean_update_norm": u,
        "weighted_mean_update_norm": w,
        "ratio": _quotient(s, u),
        "weighted_ratio": _quotient(s, w),
        "cosine": _quotient(su_dot, s * u),
        "weighted_cosine": _quotient(sw_dot, s * w),
        "client_update_norm_mean": _fsum(norms) / m,
        "client_update_norm_weighted": _fsum(pc * x for pc, x in zip(p, norms)),
    })
    return out


def payload_bytes(arrays: ArrayRecord) -> int:
    """Bytes of tensor data in an ArrayRecord (the tensors themselves, without serialisation framing;
    ``ArrayRecord.count_bytes()`` — recorded beside it — includes Flower's framing)."""
    # from each array's shape and dtype: no deserialisation (a.numpy() copied every tensor, 100 MB
    # per client and round for BART-large's adapters; bench/round_overhead.py)
    return int(sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in arrays.values()))


class SortedCheckpointFedAvg(FedAvg):
    """FedAvg weighted by ``num-examples`` (|D_i|), deterministic, with round checkpoints."""

    background_round_writes = True
    """Inside :meth:`start` (the run's round loop), a round's server-step check and files are
    written by a background thread while the next round trains (issue 25, item 3): joined before
    the next round writes anything, before a spooled reply reuses a file, and when the run ends.
    ``aggregate_train`` called on its own (outside a run) writes synchronously."""

    def __init__(self, out_dir: str | Path, round_offset: int, expected_clients: int, seed: int = 0,
                 timeout: float = 3600.0, wave_size: int | None = None,
                 check_device: str | None = None, **kwargs):
        super().__init__(**kwargs)
        # where the server-step check computes (:func:`server_step`): the cell's GPU when it has
        # one (float64 over every shared tensor of every reply: ~1.7 s per 116 M-parameter reply
        # in numpy on the CPU, which the next round's first spooled reply waited for)
        self.check_device = check_device
        if wave_size is not None and int(wave_size) < 1:
            raise InputError(f"wave_size must be a positive number of clients, got {wave_size!r}")
        self.wave_size = int(wave_size) if wave_size else None
        self._pending: dict[int, tuple[int, int]] = {}  # id(message) -> (absolute round, partition id)
        self._spooled: dict[int, dict] = {}  # partition id -> spooled reply (path, shapes, bytes)
        self.out_dir = Path(out_dir)
        self.round_offset = round_offset
        self.expected_clients = expected_clients
        self.seed = int(seed)
        self.timeout = float(timeout)
        self._down_bytes = 0
        self._down_record_bytes = 0
        self._n_sampled = 0
        self._round_nodes: dict[int, int] = {}  # node id -> partition id of the round's train messages
        self._round_t0 = time.perf_counter()
        self._node_of: dict[int, int] | None = None  # partition id -> node id
        self._progress: RoundProgress | None = None  # set by start()
        self._broadcast: ArrayRecord | None = None  # w_t of the round (a reference, not a copy)
        self._own_start = False  # a client's message replaced the broadcast (FedDC's daisy chain)
        # the round's files (server-step check, tensors, timing, log entry) are written by a
        # background thread while the next round trains (issue 25, item 3); joined before the next
        # round writes anything, before a spooled reply reuses a file, and when the run ends
        self._running = False
        self._round_writer = BackgroundWriter(max_pending=1, what="round checkpoint",
                                              name="fedrepro-round-writer")
        self._writing_round: int | None = None

    # -- which node is which client --------------------------------------------------------
    def partitions(self, grid) -> dict[int, int]:
        """``{partition id: node id}``, asked once from every node (a ``query`` message)."""
        if self._node_of is None:
            deadline = time.monotonic() + self.timeout
            while len(list(grid.get_node_ids())) < self.min_available_nodes:  # as Flower's sample_nodes
                if time.monotonic() > deadline:
                    self.fail(self.round_offset + 1, f"only {len(list(grid.get_node_ids()))} of "
                              f"{self.min_available_nodes} nodes connected within {self.timeout:g} s "
                              "(config key <paper>.round_timeout_s)")
                time.sleep(0.2)
            queries = [
                Message(content=RecordDict({"config": ConfigRecord({"ask": "partition-id"})}),
                        message_type=MessageType.QUERY, dst_node_id=node)
                for node in sorted(grid.get_node_ids())
            ]
            replies = list(grid.send_and_receive(queries, timeout=self.timeout))
            errors = [m.error.reason for m in replies if m.has_error()]
            if errors or len(replies) < len(queries):
                self.fail(self.round_offset + 1, "partition query failed: " + ("; ".join(errors) or (
                    f"{len(replies)} of {len(queries)} nodes answered within the round's time limit "
                    f"of {self.timeout:g} s (config key <paper>.round_timeout_s)")))
            self._node_of = {
                int(m.content["metrics"]["partition-id"]): m.metadata.src_node_id for m in replies
            }
        return self._node_of

    def fail(self, absolute_round: int, reason: str) -> None:
        """Record why the run stops (``checkpoints/failure.json``, read back by the runner on every
        engine) and raise."""
        (self.out_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.out_dir / "checkpoints" / "failure.json", {"round": absolute_round, "reason": reason})
        raise RuntimeError(f"round {absolute_round} failed: {reason}")

    def missing_replies(self, sent: dict[int, int], replies: list[Message], total: int | None = None) -> str:
        """Why a round has fewer replies than messages (``total``, default ``len(sent)``): which
        partitions did not answer within the round's time limit (Flower's ``send_and_receive``
        returns what arrived by then)."""
        answered = {m.metadata.src_node_id for m in replies} if sent else set()
        missing = sorted(pid for node, pid in sent.items() if node not in answered)
        who = f"; no reply from partition(s) {missing}" if missing else ""
        return (f"{len(replies)} of {len(sent) if total is None else total} clients replied{who} within "
                f"the round's time limit of {self.timeout:g} s (config key <paper>.round_timeout_s)")

    def sample_partitions(self, absolute_round: int, partition_ids: list[int]) -> list[int]:
        """The round's participants: all, or ``fraction_train`` of them drawn with a generator
        seeded by (cell seed, round) -- the same draw on every engine and every rerun."""
        k = max(int(len(partition_ids) * self.fraction_train), self.min_train_nodes)
        if k >= len(partition_ids):
            return sorted(partition_ids)
        rng = random.Random(f"{self.seed}/sample/{absolute_round}")
        return sorted(rng.sample(sorted(partition_ids), k))

    def client_records(self, absolute_round: int, partition_id: int) -> dict:
        """Extra records for one client's train message (none for FedAvg)."""
        return {}

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid):
        node_of = self.partitions(grid)
        absolute = server_round + self.round_offset
        chosen = self.sample_partitions(absolute, list(node_of))
        config["server-round"] = server_round
        self._broadcast, self._own_start = arrays, False
        messages = []
        for pid in chosen:
            # in waves, a client's own records are made when its wave is sent (WaveGrid)
            extra = {} if self.wave_size else self.client_records(absolute, pid)
            if extra.get(self.arrayrecord_key, arrays) is not arrays:
                self._own_start = True
            content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config, **extra})
            msg = Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node_of[pid])
            if self.wave_size:
                self._pending[id(msg)] = (absolute, pid)
            messages.append(msg)
        self._n_sampled = len(messages)
        self._round_nodes = {msg.metadata.dst_node_id: pid for msg, pid in zip(messages, chosen)}
        self._round_t0 = time.perf_counter()
        self._down_bytes = payload_bytes(arrays) * len(messages)
        self._down_record_bytes = arrays.count_bytes() * len(messages)
        return messages

    # -- waves: at most ``wave_size`` clients' messages in memory at a time --------------------
    def start(self, *, grid, **kwargs):
        # one progress line per round (rounds round_offset+1 ... round_offset+num_rounds)
        self._progress = RoundProgress(self.round_offset + int(kwargs.get("num_rounds", 3)),
                                       self.expected_clients, start_round=self.round_offset,
                                       logger=log)
        self._running = True
        try:
            if self.wave_size:
                self._clear_spool()  # replies a killed run left behind
            return super().start(grid=WaveGrid(grid, self), **kwargs)
        except BaseException:
            try:  # the run's own error stays its error; a failed round write is logged with it
                self._round_writer.join()
            except ClientWriteError as exc:
                log.error("%s", exc)
            raise
        finally:
            self._running = False
            self.join_round_writes()

    def _spool_root(self) -> Path:
        return self.out_dir / "checkpoints" / "replies"

    def attach_client_records(self, msg: Message) -> None:
        """Before a train message's wave is sent: add the client's own records to it."""
        key = self._pending.pop(id(msg), None)
        if key is not None:
            for name, record in self.client_records(*key).items():
                replaced = name not in msg.content or record is not msg.content[name]
                if name == self.arrayrecord_key and replaced:
                    self._own_start = True
                msg.content[name] = record

    def release_client_records(self, msg: Message) -> None:
        """After the wave: drop the client's own records (keep the shared ones)."""
        for name in [k for k in msg.content.keys() if k not in (self.arrayrecord_key, self.configrecord_key)]:
            del msg.content[name]

    def spool_reply(self, reply: Message) -> None:
        """Move a train reply's tensors to ``checkpoints/replies/<partition>.npys`` (exact bytes)
        and leave an empty ``arrays`` record: the round's replies then cost disk, not memory;
        :meth:`spooled_arrays` reads them back tensor by tensor.

        The file is the reply's arrays as Flower holds them -- each ``Array``'s ``.npy`` bytes
        (NumPy's own format: header + raw data), one after the other, their offsets kept here --
        written as they are: one copy of the reply (to the page cache), where decoding them
        (``Array.numpy()``) and re-encoding them as safetensors made two more (~0.7 s per
        116 M-parameter reply on the GPU machine, bench/fedsumm_round_overhead.py)."""
        if reply.has_error() or self.arrayrecord_key not in reply.content:
            return
        from fedrepro.io import atomic_path

        self.join_round_writes()  # the previous round's writer removes its spooled files

        arrays = reply.content[self.arrayrecord_key]
        pid = int(reply.content["metrics"]["partition-id"])
        path = self._spool_root() / f"partition_{pid:05d}.npys"
        index, offset = {}, 0
        with atomic_path(path, suffix=".tmp") as tmp, open(tmp, "wb") as fh:
            for k, a in arrays.items():
                if a.stype != "numpy.ndarray":
                    raise InputError(f"reply of partition {pid}: array {k!r} is serialised as "
                                     f"{a.stype!r}; the wave spool reads numpy.ndarray arrays")
                fh.write(a.data)
                index[k] = (offset, len(a.data))
                offset += len(a.data)
        self._spooled[pid] = {"path": path, "index": index,
                              "shapes": {k: list(a.shape) for k, a in arrays.items()},
                              "bytes": payload_bytes(arrays), "record_bytes": arrays.count_bytes()}
        reply.content[self.arrayrecord_key] = ArrayRecord()

    def spooled_arrays(self, partition_id: int):
        """``{name: tensor}`` of a spooled reply, each tensor read from disk when asked for (the
        file mapped once per round; the tensor's ``.npy`` bytes read in place, then copied)."""
        import mmap

        import torch

        entry = self._spooled[partition_id]

        def read(name: str):
            view = entry.get("view")
            if view is None:  # mapped at the first read, dropped with the round
                with open(entry["path"], "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    view = entry["view"] = memoryview(
                        mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ)) if size else b""
            start, length = entry["index"][name]
            arr = _npy_view(view[start:start + length], f"{entry['path']}: {name}")
            return torch.from_numpy(arr.copy())  # the one copy, out of the mapped file

        return entry["shapes"], read

    def _clear_spool(self) -> None:
        if not self._spool_root().is_dir():
            return
        for pattern in ("partition_*.npys", "partition_*.safetensors"):  # (older runs: safetensors)
            for path in self._spool_root().glob(pattern):
                path.unlink()
        self._spooled.clear()

    # -- hooks for other papers' server procedures ------------------------------------------
    def aggregate_arrays(self, absolute_round: int, replies: list[Message]):
        """The new global tensors from the round's (sorted, error-free) replies: FedAvg weighted
        by ``num-examples`` here (eq. 2 of AdaFedSelecKD; FedMCP's weighted average)."""
        if self._spooled:
            raise NotImplementedError(
                "this strategy averages in-memory replies; wave_size (spooled replies) is supported "
                "by strategies that read spooled_arrays (FedSUMM's)"
            )
        return FedAvg.aggregate_train(self, absolute_round - self.round_offset, replies)

    def round_extras(self, absolute_round: int, replies: list[Message]) -> dict:
        """Extra JSON-able entries for the round log (none for FedAvg)."""
        return {}

    def server_step_note(self) -> str:
        if self._own_start:
            return ("clients start from their own models (a per-client downlink replaces the "
                    "broadcast): no common w_t to compare with")
        return "no broadcast recorded"

    def server_step_inputs(self, new: ArrayRecord, replies: list[Message]) -> tuple | None:
        """The arguments of :func:`server_step` for the round: w_{t+1} against the broadcast and
        the replies (spooled ones read back from their files), as lazy readers; None when there
        is no common w_t (:meth:`server_step_note` says why)."""
        if self._broadcast is None or self._own_start:
            return None

        def record(arrays: ArrayRecord) -> dict:
            return {k: (tuple(a.shape), lambda a=a: a.numpy()) for k, a in arrays.items()}

        clients = []
        for m in replies:
            pid = int(m.content["metrics"]["partition-id"])
            if pid in self._spooled:
                shapes, read = self.spooled_arrays(pid)
                clients.append({k: (tuple(v), lambda k=k, read=read: read(k))
                                for k, v in shapes.items()})
            else:
                clients.append(record(m.content[self.arrayrecord_key])
                               if self.arrayrecord_key in m.content else {})
        weights = [int(m.content["metrics"]["num-examples"]) for m in replies]
        return record(self._broadcast), record(new), clients, weights

    def server_step(self, new: ArrayRecord, replies: list[Message]) -> dict:
        """The round's ``server_step`` entry (:func:`server_step`), computed now."""
        inputs = self.server_step_inputs(new, replies)
        if not inputs:
            return {"tensors": 0, "note": self.server_step_note()}
        return server_step(*inputs, device=self.check_device)

    def join_round_writes(self) -> None:
        """Wait until the previous round's files are written (:attr:`background_round_writes`); a
        failed write stops the run (``failure.json`` names the file)."""
        try:
            self._round_writer.join()
        except ClientWriteError as exc:
            self.fail(self._writing_round or self.round_offset + 1, str(exc))

    def save_server_state(self, absolute_round: int) -> None:
        """Persist server-side state beyond the global tensors (control variates, memories...)
        for a resume; called before the round's JSON (the completeness marker) is written."""

    # -- one round --------------------------------------------------------------------------
    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        given, replies = replies, list(replies)
        if isinstance(given, RoundReplies):
            # Flower's round loop (``Strategy.start``) keeps the list it passed in a local
            # variable until the next round's replies replace it: emptied here (only the list our
            # own grid handed to that loop), the round's replies -- SCAFFOLD's y_i and Δc_i,
            # 0.87 GB per client at BERT-base size -- are freed when this round is done with them,
            # not after the next round has trained
            given.clear()
        absolute = server_round + self.round_offset
        self.join_round_writes()  # the previous round is on disk before this one writes anything
        errors = [m.error.reason for m in replies if m.has_error()]
        if errors or not replies or len(replies) < self._n_sampled:
            self.fail(absolute, "; ".join(errors) or self.missing_replies(self._round_nodes, replies, self._n_sampled))
        replies.sort(key=lambda m: int(m.content["metrics"]["partition-id"]))
        arrays, metrics = self.aggregate_arrays(absolute, replies)
        clients, measured = [], []
        for m in replies:
            rec = m.content["metrics"]
            sent = m.content["arrays"]
            spooled = self._spooled.get(int(rec["partition-id"]))
            entry = {"partition_id": int(rec["partition-id"]), "num_examples": int(rec["num-examples"])}
            times = {"partition_id": int(rec["partition-id"])}
            for key in sorted(rec.keys()):
                if key in ("partition-id", "num-examples"):
                    continue
                (times if is_measurement(key) else entry)[key.replace("-", "_")] = rec[key]
            measured.append(times)
            if spooled:
                entry["uplink_tensors"] = dict(spooled["shapes"])
                entry["uplink_bytes"] = spooled["bytes"]
            else:
                entry["uplink_tensors"] = {k: list(a.shape) for k, a in sent.items()}
                entry["uplink_bytes"] = payload_bytes(sent)
            clients.append(entry)
        head = {
            "round": absolute,
            "clients": clients,
            "bytes_down": self._down_bytes,
            "bytes_up": sum(c["uplink_bytes"] for c in clients),
            "record_bytes_down": self._down_record_bytes,
            "record_bytes_up": sum(
                self._spooled[int(m.content["metrics"]["partition-id"])]["record_bytes"]
                if int(m.content["metrics"]["partition-id"]) in self._spooled
                else m.content["arrays"].count_bytes()
                for m in replies
            ),
            "aggregated_metrics": {k: v for k, v in (metrics or {}).items() if not is_measurement(k)},
        }
        extras = self.round_extras(absolute, replies)
        # what the server-step check reads, captured for the background (the next round replaces
        # the broadcast and the spool's entries; Flower's Array data are immutable bytes)
        held = [self.server_step_inputs(arrays, replies)]
        note = self.server_step_note()
        spooled, self._spooled = self._spooled, {}
        self._broadcast = None

        # the clients' checkpoint files of this round are complete before the round checkpoint
        # exists (in-process engine: they are written in the background, fedrepro.fl.checkpoint)
        try:
            join_client_writes()
        except ClientWriteError as exc:
            self.fail(absolute, str(exc))
        self.save_server_state(absolute)
        seconds = time.perf_counter() - self._round_t0
        peak = peak_rss_mb()

        def finish() -> None:
            """The round's files, in order: tensors, timing, log entry (the completeness marker
            that :func:`~fedrepro.fl.checkpoint.latest_round` reads)."""
            t0 = time.perf_counter()
            inputs = held.pop()  # the replies are released as soon as the check has read them
            step = (server_step(*inputs, device=self.check_device) if inputs
                    else {"tensors": 0, "note": note})
            del inputs
            tensors_path, meta_path = checkpoint_paths(self.out_dir, absolute)
            _naming(tensors_path, lambda: save_state(tensors_path, arrays.to_torch_state_dict()))
            for entry_ in spooled.values():
                entry_.pop("view", None)  # its memory map
                Path(entry_["path"]).unlink(missing_ok=True)
            # the round's replies and buffers are garbage now: their pages back to the system
            # (fedrepro.host_memory).  glibc holds the arena's lock meanwhile, so a client
            # training beside this thread may wait on its next malloc: timed, in the timing file
            t_trim = time.perf_counter()
            release_free_memory()
            trim = time.perf_counter() - t_trim
            path = timing_path(self.out_dir, absolute)
            _naming(path, lambda: write_json_atomic(path, {
                "round": absolute, "seconds": seconds, "server_peak_rss_mb": peak,
                "seconds_background_finish": time.perf_counter() - t0, "seconds_trim": trim,
                "clients": measured}))
            _naming(meta_path, lambda: write_json_atomic(meta_path, {**head, "server_step": step, **extras}))

        self._writing_round = absolute
        if self.background_round_writes and self._running:
            self._round_writer.submit(f"round {absolute}", finish)
        else:
            finish()
        if self._progress is not None:
            self._progress.log(absolute, len(replies))
        return arrays, metrics


def _npy_view(blob: memoryview, what: str) -> np.ndarray:
    """The array of ``.npy`` bytes (NumPy's format: its header parsed by ``numpy.lib.format``)
    as a read-only view of ``blob``: no copy."""
    import io

    from numpy.lib import format as npy

    head = io.BytesIO(blob[:min(len(blob), 1 << 16)])  # the header (at most 64 KiB by the format)
    try:
        version = npy.read_magic(head)
        shape, fortran, dtype = (npy.read_array_header_1_0(head) if version == (1, 0)
                                 else npy.read_array_header_2_0(head))
    except ValueError as exc:
        raise InputError(f"{what}: not a .npy array ({exc}); the spooled reply is damaged") from exc
    count = math.prod(shape)
    arr = np.frombuffer(blob, dtype=dtype, count=count, offset=head.tell())
    return arr.reshape(shape, order="F" if fortran else "C")


def _naming(path: Path, write) -> None:
    """Run ``write``; an error names ``path`` (the round writer's error then says which file)."""
    try:
        write()
    except Exception as exc:
        raise OSError(f"{path}: {type(exc).__name__}: {exc}") from exc


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (MB; Linux reports ``ru_maxrss`` in KB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def metric_record(stats: dict, partition_id: int) -> MetricRecord:
    """A client's round statistics as a Flower MetricRecord (keys ``a_b`` -> ``a-b``).

    Every int/float entry of ``stats`` is sent, NumPy scalars as the Python numbers they hold (a
    ``np.float32`` loss was dropped without a word before); booleans, strings and sequences are not
    metrics.  ``num_examples`` is required (FedAvg's weight)."""
    if "num_examples" not in stats:
        raise ValueError("client statistics must include num_examples (FedAvg weights)")
    out = {"partition-id": int(partition_id)}
    for key, value in stats.items():
        if isinstance(value, (np.integer, np.floating)):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out[key.replace("_", "-")] = value if isinstance(value, int) else float(value)
    return MetricRecord(out)


class RoundReplies(list):
    """The replies :class:`WaveGrid` returns: a list that
    :meth:`SortedCheckpointFedAvg.aggregate_train` empties once it has taken the replies over
    (Flower's round loop would otherwise hold them through the next round)."""


class WaveGrid(Grid):
    """The Flower ``Grid`` our strategies' round loop talks to (:meth:`SortedCheckpointFedAvg.start`):
    it hands the replies over as :class:`RoundReplies` and, with ``strategy.wave_size``, sends a
    list of messages in waves of that many clients.

    Flower's strategies send a round's messages in one ``send_and_receive``, so a server holds
    every client's message and reply at once: N copies of a model.  With FedSUMM's 50-200 clients
    of a 116M-parameter BART that is tens of GB (2 x N x 0.47 GB with the guidance).  Here each
    wave's train messages get their client's own records just before they are sent
    (:meth:`SortedCheckpointFedAvg.attach_client_records`), lose them after, and every reply's
    tensors go to disk as soon as it arrives (:meth:`SortedCheckpointFedAvg.spool_reply`), so
    the server holds one wave.  Replies come back in the order of the waves; the strategy sorts
    them by partition id anyway, so the result is the same bits as one big send.  Flower has no
    such option (its strategies own the round loop), hence this hand-written wrapper;
    ``fedsumm.server_state.wave_size`` turns it on.
    """

    def __init__(self, grid: Grid, strategy: SortedCheckpointFedAvg) -> None:
        self._grid = grid
        self._strategy = strategy

    def set_run(self, run) -> None:
        self._grid.set_run(run)

    @property
    def run(self):
        return self._grid.run

    def create_message(self, *args, **kwargs) -> Message:
        return self._grid.create_message(*args, **kwargs)

    def get_node_ids(self):
        return self._grid.get_node_ids()

    def push_messages(self, messages):
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids):
        return self._grid.pull_messages(message_ids)

    def send_and_receive(self, messages, *, timeout: float | None = None):
        if not self._strategy.wave_size:
            return RoundReplies(self._grid.send_and_receive(messages, timeout=timeout))
        messages = list(messages)
        k = self._strategy.wave_size
        replies: list[Message] = []
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        for start in range(0, len(messages), k):
            wave = messages[start:start + k]
            for msg in wave:
                self._strategy.attach_client_records(msg)
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            got = list(self._grid.send_and_receive(wave, timeout=left))
            for msg in wave:
                if msg.metadata.message_type == MessageType.TRAIN:
                    self._strategy.release_client_records(msg)
            for reply in got:
                if reply.metadata.message_type == MessageType.TRAIN:
                    self._strategy.spool_reply(reply)
            replies.extend(got)
        return RoundReplies(replies)
