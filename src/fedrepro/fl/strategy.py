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
from flwr.serverapp.strategy import FedAvg

from fedrepro.fl.checkpoint import checkpoint_paths, save_state, timing_path
from fedrepro.io import write_json_atomic

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
                 timeout: float = 3600.0, **kwargs):
        super().__init__(**kwargs)
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
            content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config,
                                  **self.client_records(absolute, pid)})
            messages.append(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node_of[pid]))
        self._n_sampled = len(messages)
        self._round_t0 = time.perf_counter()
        self._down_bytes = payload_bytes(arrays) * len(messages)
        self._down_record_bytes = arrays.count_bytes() * len(messages)
        return messages

    # -- hooks for other papers' server procedures ------------------------------------------
    def aggregate_arrays(self, absolute_round: int, replies: list[Message]):
        """The new global tensors from the round's (sorted, error-free) replies: FedAvg weighted
        by ``num-examples`` here (eq. 2 of AdaFedSelecKD; FedMCP's weighted average)."""
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
            entry = {"partition_id": int(rec["partition-id"]), "num_examples": int(rec["num-examples"])}
            times = {"partition_id": int(rec["partition-id"])}
            for key in sorted(rec.keys()):
                if key in ("partition-id", "num-examples"):
                    continue
                (times if is_measurement(key) else entry)[key.replace("-", "_")] = rec[key]
            measured.append(times)
            entry["uplink_tensors"] = {k: list(a.shape) for k, a in sent.items()}
            entry["uplink_bytes"] = payload_bytes(sent)
            clients.append(entry)
        entry = {
            "round": absolute,
            "clients": clients,
            "bytes_down": self._down_bytes,
            "bytes_up": sum(c["uplink_bytes"] for c in clients),
            "record_bytes_down": self._down_record_bytes,
            "record_bytes_up": sum(m.content["arrays"].count_bytes() for m in replies),
            "aggregated_metrics": {k: v for k, v in (metrics or {}).items() if not is_measurement(k)},
            **self.round_extras(absolute, replies),
        }

        tensors_path, meta_path = checkpoint_paths(self.out_dir, absolute)
        save_state(tensors_path, arrays.to_torch_state_dict())
        self.save_server_state(absolute)
        write_json_atomic(
            timing_path(self.out_dir, absolute),
            {"round": absolute, "seconds": time.perf_counter() - self._round_t0,
             "server_peak_rss_mb": peak_rss_mb(), "clients": measured},
        )
        write_json_atomic(meta_path, entry)
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
