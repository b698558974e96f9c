"""Server strategy: Flower's FedAvg (eq. 2), made deterministic, checkpointed and metered.

* Flower's ``FedAvg`` sums replies in arrival order; the float sum then differs in the last bits
  between identical runs.  We sort replies by the client's partition id before aggregating, so a
  rerun with the same seed gives byte-identical parameters.
* A reply with an error, or fewer replies than sampled clients, stops the run with the clients'
  error messages instead of silently averaging the survivors.
* After every round the aggregated tensors and the round's metrics (client losses, KD fractions,
  bytes down/up) are written atomically to ``<cell>/checkpoints/``; a killed run resumes from the
  last finished round (:func:`latest_round`).
* Partial participation is deterministic: before the first round the strategy asks every node
  for its ``partition-id`` (one ``query`` message each), then samples *partition ids* with a
  generator seeded by (cell seed, round) -- Flower's own sampling draws node ids with the global
  ``random`` module, and node ids are random in the simulation engine.
* Subclasses (other papers' server procedures) can add per-client records to a round's message
  (:meth:`SortedCheckpointFedAvg.client_records`) and read extra reply records in
  :meth:`aggregate_train`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fedrepro.fl.checkpoint import checkpoint_paths, save_state, timing_path
from fedrepro.io import InputError, write_json_atomic
from fedrepro.logs import RoundProgress

log = logging.getLogger(__name__)

MEASUREMENT_PREFIXES = ("seconds", "peak")
"""Client statistics that are measurements (times, memory), not results: kept out of the round
log (same seed, same bits) and written to the round's timing file instead."""


def is_measurement(key: str) -> bool:
    return key.replace("-", "_").startswith(MEASUREMENT_PREFIXES)


def payload_bytes(arrays: ArrayRecord) -> int:
    """Bytes of tensor data in an ArrayRecord (the tensors themselves, without serialisation framing;
    ``ArrayRecord.count_bytes()`` — recorded beside it — includes Flower's framing)."""
    return int(sum(a.numpy().nbytes for a in arrays.values()))


class SortedCheckpointFedAvg(FedAvg):
    """FedAvg weighted by ``num-examples`` (|D_i|), deterministic, with round checkpoints."""

    def __init__(self, out_dir: str | Path, round_offset: int, expected_clients: int, seed: int = 0,
                 timeout: float = 3600.0, wave_size: int | None = None, **kwargs):
        super().__init__(**kwargs)
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
        self._round_t0 = time.perf_counter()
        self._node_of: dict[int, int] | None = None  # partition id -> node id
        self._progress: RoundProgress | None = None  # set by start()

    # -- which node is which client --------------------------------------------------------
    def partitions(self, grid) -> dict[int, int]:
        """``{partition id: node id}``, asked once from every node (a ``query`` message)."""
        if self._node_of is None:
            deadline = time.monotonic() + self.timeout
            while len(list(grid.get_node_ids())) < self.min_available_nodes:  # as Flower's sample_nodes
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {len(list(grid.get_node_ids()))} of {self.min_available_nodes} "
                                       f"nodes connected within {self.timeout:.0f} s")
                time.sleep(0.2)
            queries = [
                Message(content=RecordDict({"config": ConfigRecord({"ask": "partition-id"})}),
                        message_type=MessageType.QUERY, dst_node_id=node)
                for node in sorted(grid.get_node_ids())
            ]
            replies = list(grid.send_and_receive(queries, timeout=self.timeout))
            errors = [m.error.reason for m in replies if m.has_error()]
            if errors or len(replies) < len(queries):
                raise RuntimeError(f"partition query failed: {'; '.join(errors) or 'missing replies'}")
            self._node_of = {
                int(m.content["metrics"]["partition-id"]): m.metadata.src_node_id for m in replies
            }
        return self._node_of

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
        messages = []
        for pid in chosen:
            # in waves, a client's own records are made when its wave is sent (WaveGrid)
            extra = {} if self.wave_size else self.client_records(absolute, pid)
            content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config, **extra})
            msg = Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node_of[pid])
            if self.wave_size:
                self._pending[id(msg)] = (absolute, pid)
            messages.append(msg)
        self._n_sampled = len(messages)
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
        if not self.wave_size:
            return super().start(grid=grid, **kwargs)
        self._clear_spool()  # replies a killed run left behind
        return super().start(grid=WaveGrid(grid, self), **kwargs)

    def _spool_root(self) -> Path:
        return self.out_dir / "checkpoints" / "replies"

    def attach_client_records(self, msg: Message) -> None:
        """Before a train message's wave is sent: add the client's own records to it."""
        key = self._pending.pop(id(msg), None)
        if key is not None:
            for name, record in self.client_records(*key).items():
                msg.content[name] = record

    def release_client_records(self, msg: Message) -> None:
        """After the wave: drop the client's own records (keep the shared ones)."""
        for name in [k for k in msg.content.keys() if k not in (self.arrayrecord_key, self.configrecord_key)]:
            del msg.content[name]

    def spool_reply(self, reply: Message) -> None:
        """Move a train reply's tensors to ``checkpoints/replies/<partition>.safetensors`` (exact
        bytes) and leave an empty ``arrays`` record: the round's replies then cost disk, not
        memory; :meth:`spooled_arrays` reads them back tensor by tensor."""
        if reply.has_error() or self.arrayrecord_key not in reply.content:
            return
        from safetensors.numpy import save_file

        from fedrepro.io import atomic_path

        arrays = reply.content[self.arrayrecord_key]
        pid = int(reply.content["metrics"]["partition-id"])
        path = self._spool_root() / f"partition_{pid:05d}.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, suffix=".safetensors") as tmp:
            save_file({k: arrays[k].numpy() for k in arrays}, str(tmp))
        self._spooled[pid] = {"path": path, "shapes": {k: list(a.shape) for k, a in arrays.items()},
                              "bytes": payload_bytes(arrays), "record_bytes": arrays.count_bytes()}
        reply.content[self.arrayrecord_key] = ArrayRecord()

    def spooled_arrays(self, partition_id: int):
        """``{name: tensor}`` of a spooled reply, each tensor read from disk when asked for."""
        from safetensors import safe_open

        entry = self._spooled[partition_id]

        def read(name: str):
            with safe_open(str(entry["path"]), framework="pt") as fh:
                return fh.get_tensor(name)

        return entry["shapes"], read

    def _clear_spool(self) -> None:
        if not self._spool_root().is_dir():
            return
        for path in self._spool_root().glob("partition_*.safetensors"):
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

    def save_server_state(self, absolute_round: int) -> None:
        """Persist server-side state beyond the global tensors (control variates, memories...)
        for a resume; called before the round's JSON (the completeness marker) is written."""

    # -- one round --------------------------------------------------------------------------
    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        replies = list(replies)
        absolute = server_round + self.round_offset
        errors = [m.error.reason for m in replies if m.has_error()]
        if errors or not replies or len(replies) < self._n_sampled:
            reason = "; ".join(errors) or f"{len(replies)} of {self._n_sampled} clients replied"
            (self.out_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.out_dir / "checkpoints" / "failure.json", {"round": absolute, "reason": reason})
            raise RuntimeError(f"round {absolute} failed: {reason}")
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
        entry = {
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
            **self.round_extras(absolute, replies),
        }

        tensors_path, meta_path = checkpoint_paths(self.out_dir, absolute)
        save_state(tensors_path, arrays.to_torch_state_dict())
        self.save_server_state(absolute)
        self._clear_spool()
        write_json_atomic(
            timing_path(self.out_dir, absolute),
            {"round": absolute, "seconds": time.perf_counter() - self._round_t0,
             "server_peak_rss_mb": peak_rss_mb(), "clients": measured},
        )
        write_json_atomic(meta_path, entry)
        if self._progress is not None:
            self._progress.log(absolute, len(replies))
        return arrays, metrics


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (MB; Linux reports ``ru_maxrss`` in KB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def metric_record(stats: dict, partition_id: int) -> MetricRecord:
    """A client's round statistics as a Flower MetricRecord (keys ``a_b`` -> ``a-b``).

    Every int/float entry of ``stats`` is sent; ``num_examples`` is required (FedAvg's weight)."""
    if "num_examples" not in stats:
        raise ValueError("client statistics must include num_examples (FedAvg weights)")
    out = {"partition-id": int(partition_id)}
    for key, value in stats.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out[key.replace("_", "-")] = value if isinstance(value, int) else float(value)
    return MetricRecord(out)


class WaveGrid(Grid):
    """A Flower ``Grid`` that sends a list of messages in waves of ``strategy.wave_size``.

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
        messages = list(messages)
        k = self._strategy.wave_size or len(messages) or 1
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
        return replies
