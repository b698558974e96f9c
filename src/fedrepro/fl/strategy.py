"""Server strategy: Flower's FedAvg (eq. 2), made deterministic, checkpointed and metered.

* Flower's ``FedAvg`` sums replies in arrival order; the float sum then differs in the last bits
  between identical runs.  We sort replies by the client's partition id before aggregating, so a
  rerun with the same seed gives byte-identical parameters.
* A reply with an error, or fewer replies than sampled clients, stops the run with the clients'
  error messages instead of silently averaging the survivors.
* After every round the aggregated tensors and the round's metrics (client losses, KD fractions,
  bytes down/up) are written atomically to ``<cell>/checkpoints/``; a killed run resumes from the
  last finished round (:func:`latest_round`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedAvg

from fedrepro.io import read_json, write_json_atomic


def checkpoint_paths(out_dir: str | Path, round_index: int) -> tuple[Path, Path]:
    ckpt = Path(out_dir) / "checkpoints"
    return ckpt / f"server_round_{round_index:03d}.safetensors", ckpt / f"server_round_{round_index:03d}.json"


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


def payload_bytes(arrays: ArrayRecord) -> int:
    """Bytes of tensor data in an ArrayRecord (the tensors themselves, without serialisation framing;
    ``ArrayRecord.count_bytes()`` — recorded beside it — includes Flower's framing)."""
    return int(sum(a.numpy().nbytes for a in arrays.values()))


class SortedCheckpointFedAvg(FedAvg):
    """FedAvg weighted by ``num-examples`` (|D_i|), deterministic, with round checkpoints."""

    def __init__(self, out_dir: str | Path, round_offset: int, expected_clients: int, **kwargs):
        super().__init__(**kwargs)
        self.out_dir = Path(out_dir)
        self.round_offset = round_offset
        self.expected_clients = expected_clients
        self._down_bytes = 0
        self._down_record_bytes = 0
        self._n_sampled = 0

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid):
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self._n_sampled = len(messages)
        self._down_bytes = payload_bytes(arrays) * len(messages)
        self._down_record_bytes = arrays.count_bytes() * len(messages)
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        replies = list(replies)
        errors = [m.error.reason for m in replies if m.has_error()]
        if errors or len(replies) < self._n_sampled:
            reason = "; ".join(errors) or f"{len(replies)} of {self._n_sampled} clients replied"
            (self.out_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.out_dir / "checkpoints" / "failure.json", {"round": server_round + self.round_offset, "reason": reason})
            raise RuntimeError(f"round {server_round + self.round_offset} failed: {reason}")
        replies.sort(key=lambda m: int(m.content["metrics"]["partition-id"]))
        arrays, metrics = super().aggregate_train(server_round, replies)
        absolute = server_round + self.round_offset
        clients = []
        for m in replies:
            rec = m.content["metrics"]
            sent = m.content["arrays"]
            clients.append(
                {
                    "partition_id": int(rec["partition-id"]),
                    "num_examples": int(rec["num-examples"]),
                    "train_loss": float(rec["train-loss"]),
                    "kd_fraction": float(rec["kd-fraction"]),
                    "n_tokens": int(rec["n-tokens"]),
                    "uplink_tensors": {k: list(a.shape) for k, a in sent.items()},
                    "uplink_bytes": payload_bytes(sent),
                }
            )
        entry = {
            "round": absolute,
            "clients": clients,
            "bytes_down": self._down_bytes,
            "bytes_up": sum(c["uplink_bytes"] for c in clients),
            "record_bytes_down": self._down_record_bytes,
            "record_bytes_up": sum(m.content["arrays"].count_bytes() for m in replies),
            "aggregated_metrics": dict(metrics) if metrics is not None else {},
        }
        from fedrepro.fl.task import save_state

        tensors_path, meta_path = checkpoint_paths(self.out_dir, absolute)
        save_state(tensors_path, arrays.to_torch_state_dict())
        write_json_atomic(meta_path, entry)
        return arrays, metrics


def read_failure(out_dir: str | Path) -> str | None:
    path = Path(out_dir) / "checkpoints" / "failure.json"
    if path.exists():
        return json.dumps(read_json(path))
    return None


def metric_record(stats: dict, partition_id: int) -> MetricRecord:
    return MetricRecord(
        {
            "num-examples": int(stats["num_examples"]),
            "partition-id": int(partition_id),
            "train-loss": float(stats["train_loss"]),
            "kd-fraction": float(stats["kd_fraction"]),
            "n-tokens": int(stats["n_tokens"]),
        }
    )
