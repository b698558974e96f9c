"""FedSUMM's server on Flower: Algorithm 1 (memory gradients, ρ, gradient adapter, plain mean) and
eq. 9-10's DP inside the project's sorted, checkpointed FedAvg strategy.

:class:`FedSummStrategy` subclasses :class:`~fedrepro.fl.strategy.SortedCheckpointFedAvg` (replies
sorted by partition id, failures stop the run, per-round checkpoints and resume) and fills its
hooks with :class:`~fedrepro.papers.fedsumm.algorithm.FedSummServer` (regime ``FedSUMM``) or
:class:`FedAvgServer` (regime ``FedAvg``: the same allocation, ρ bookkeeping and aggregation, no
memory and no guidance) -- so the two regimes differ only by the server procedure:

* ``sample_partitions``: S_t is the server's seeded random allocation
  (:meth:`FedSummServer.sample_clients`, ``fedsumm.algorithm.clients_per_round``), the same for
  both regimes;
* ``client_records``: the guidance of Algorithm 1 for each client of S_t -- ``fedsumm-guidance``
  (``ArrayRecord``: the modulated gradient g̃) and ``fedsumm-guidance-config`` (``ConfigRecord``:
  ρ, the client's previous loss, ε) -- nothing in a client's first round, nothing for FedAvg;
* ``aggregate_arrays``: the client "gradient" is computed on the server from the returned
  parameters (``delta``: g^c = w_t − w^c; or read from the ``fedsumm-gradient`` reply record with
  ``client_gradient: mean_batch_gradient``), then :meth:`FedSummServer.server_round` (MG update,
  ρ, sort by loss, adapter, ``w^c − g̃^c``, mean);
* ``round_extras``: ρ per client and the mean, each client's distribution of ρ − 1
  (``rho_statistics``: per parameter entry, per tensor, per modulating group), FedSUMM's server
  update against FedAvg's on the same replies (``update_difference``), the memory order, which
  clients were modulated, the DP clipping norm and noise scale, every client's per-step losses, and the evaluation of the new
  global model on every client (Flower ``evaluate`` messages: validation perplexity, and ROUGE-L
  on the test split when ``rouge_every_round``), into the round's log;
* ``save_server_state`` / ``__init__``: the server state (MG, losses, guidance, ρ sums) is saved
  with every round's checkpoint and loaded when the run resumes.  With ``fedsumm.server_state.
  storage: disk`` the vectors are files in ``<cell>/checkpoints/server_state/`` (written once,
  never changed) and the round's state file names them; a state and the files only it names are
  deleted when the round after the next starts (unless ``keep_round_checkpoints``), and files a
  killed run wrote after its last finished round are deleted on resume.

Differential privacy (eq. 9-10)
-------------------------------
Flower's DP strategies (and :class:`~fedrepro.fl.dp.DifferentialPrivacyServerSideMedianClipping`)
*wrap* a strategy: they clip the replies, let the inner strategy aggregate, then add noise to what
it returns.  Around this strategy that composition is wrong twice: (1) the inner strategy writes
its round checkpoint inside ``aggregate_train``, so the checkpoint would hold the noise-free
aggregate and a resumed run would continue from a model the uninterrupted run never had; (2) with
the gradient adapter the update FedSUMM aggregates is the *modulated* ``w^c − g̃^c − w_t``, which
only exists inside the server procedure, not in the replies a wrapper sees.  So a pure function is
the aggregation step of ``server_round`` here, its noise from a ``torch.Generator`` seeded by (cell
seed, round), so a resumed run draws the same noise:

* ``fedsumm.dp.clipping: adaptive`` (default): :func:`~fedrepro.fl.dp.dp_adaptive_clip_mean`, the
  private median of Andrew et al. (clip at C_t, noisy count of the unclipped updates, geometric step
  to C_{t+1}).  C_{t+1} is in the round log (``dp.next_clip_norm``), which is where a resumed run
  reads it back; C_1 = ``initial_clip_norm``;
* ``round_median``: :func:`~fedrepro.fl.dp.dp_median_clip_mean` (eq. 9 literally; no guarantee).

ε after every round (:func:`fedrepro.fl.privacy.epsilon_per_round`: σ, δ, q = clients per round / N,
the round) goes into the round log (``dp.epsilon``) and metrics (``dp-epsilon``) beside C_t, σ, z_Δ,
the noise std and the number clipped; the task's ``before_cleanup`` puts the whole accounting in
the cell's provenance.  ``fedsumm.dp.enabled`` / ``regimes`` switch it on.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from fedrepro.papers.fedsumm.algorithm import (
    server_compute_device,
    ClientReply,
    FedSummConfig,
    FedSummServer,
    ServerStateConfig,
    client_update,
    plain_mean,
    plain_update_mean,
    state_names,
)
from fedrepro.data.seq2seq import derive_seed
from fedrepro.devices import cell_device
from fedrepro.fl.checkpoint import checkpoint_paths, latest_round
from fedrepro.fl.dp import ADAPTIVE_METRIC_KEYS, METRIC_KEYS, dp_adaptive_clip_mean, dp_median_clip_mean
from fedrepro.fl.privacy import DPSettings, epsilon_per_round
from fedrepro.papers.fedsumm.task import (
    GUIDANCE_ARRAYS,
    GUIDANCE_CONFIG,
    REPLY_GRADIENT,
    REPLY_STEPS,
    pool_evaluation,
)
from fedrepro.fl.strategy import SortedCheckpointFedAvg, payload_bytes
from fedrepro.fl.tensors import LazyTensors, RecordTensors
from fedrepro.io import InputError, atomic_path, read_json, write_json_atomic

Tensors = Mapping[str, torch.Tensor]


class FedAvgServer(FedSummServer):
    """FedAvg with FedSUMM's bookkeeping: the same allocation S_t and ρ (eq. 5-6, Fig. 6), the
    plain mean of the returned models (or the DP mean); no memory gradients, no guidance
    (``guidance`` stays empty, so :meth:`guidance_for` always answers None)."""

    def server_round(
        self,
        round_index: int,
        global_params: Tensors,
        replies: Mapping[str, ClientReply],
        aggregate: Callable[[Sequence[Tensors]], tuple[Tensors, dict]] = plain_mean,
    ) -> tuple[OrderedDict[str, torch.Tensor], dict]:
        clients, w_t = self._start_round(round_index, global_params, replies, check_gradient=False)
        for c in clients:
            self.losses[c] = float(replies[c].loss)
        results = self._rho(w_t, replies, clients)
        rho = {c: r.rho for c, r in results.items()}
        updates = [client_update(replies[c].params, w_t) for c in clients]
        mean = None
        if aggregate is plain_mean:  # the same mean, each reply read once (on the compute device)
            mean, _ = plain_update_mean(w_t, [replies[c].params for c in clients])
        w_next, info = self._finish_round(round_index, w_t, updates, aggregate, mean=mean)
        log = {
            "round": round_index,
            "clients": clients,
            "rho": rho,
            "rho_mean": sum(rho.values()) / len(rho),
            "rho_statistics": {c: r.statistics for c, r in results.items()},
            "losses": {c: self.losses[c] for c in clients},
            "aggregate": info,
        }
        return w_next, log


def server_state_path(out_dir: str | Path, round_index: int) -> Path:
    return Path(out_dir) / "checkpoints" / f"fedsumm_server_round_{round_index:03d}.pt"


def server_state_dir(out_dir: str | Path) -> Path:
    """The files of ``fedsumm.server_state.storage: disk``: inside the cell's checkpoints, so the
    runner's checkpoint policy (discard on a config change, delete after the cell unless
    ``keep_round_checkpoints``) covers them."""
    return Path(out_dir) / "checkpoints" / "server_state"


def _saved_rounds(out_dir: str | Path) -> list[int]:
    folder = Path(out_dir) / "checkpoints"
    if not folder.exists():
        return []
    return sorted(int(p.stem.rsplit("_", 1)[1]) for p in folder.glob("fedsumm_server_round_*.pt"))


def _jsonable(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


class FedSummStrategy(SortedCheckpointFedAvg):
    """The server of a FedSUMM or FedAvg cell (module docstring)."""

    def __init__(self, cell: dict, **kwargs):
        state = ServerStateConfig.from_config(cell.get("server_state"))
        kwargs.setdefault("wave_size", state.wave_size)
        super().__init__(**kwargs)
        self.cell = cell
        self.regime = cell["regime"]
        if self.regime not in ("FedAvg", "FedSUMM"):
            raise InputError(
                f"FedSummStrategy serves FedAvg and FedSUMM cells, not {self.regime!r}"
            )
        self.algorithm = FedSummConfig.from_config(cell["algorithm"])
        if (cell.get("clients_per_round") or None) != self.algorithm.clients_per_round:
            raise InputError(
                "cell clients_per_round must equal fedsumm.algorithm.clients_per_round"
            )
        self.clients = list(cell["clients"])
        self.pid_of = {c: i for i, c in enumerate(self.clients)}
        server_class = FedSummServer if self.regime == "FedSUMM" else FedAvgServer
        self.server_state = ServerStateConfig.from_config(cell.get("server_state"))
        self.server = server_class(
            self.algorithm,
            self.clients,
            self.seed,
            state=self.server_state,
            state_dir=server_state_dir(self.out_dir),
        )
        self.dp = DPSettings.from_config(cell.get("dp"), key="cell dp")
        self.dp_enabled = self.dp.enabled and self.regime in self.dp.regimes
        self._clip_norm = self.dp.initial_clip_norm  # C_t of adaptive clipping (round 1: C_1)
        self._epsilons: list[float | None] = []
        if self.dp_enabled:
            m = self.algorithm.clients_per_round or len(self.clients)
            self._epsilons = epsilon_per_round(
                self.dp, int(cell["train"]["rounds"]), m, len(self.clients)
            )
            if self.round_offset > 0 and self.dp.clipping == "adaptive":
                # C_{t+1} of the last finished round, as that round computed it (same bits)
                last = read_json(checkpoint_paths(self.out_dir, self.round_offset)[1])
                self._clip_norm = float(last["dp"]["next_clip_norm"])
        if self.round_offset > 0:
            path = server_state_path(self.out_dir, self.round_offset)
            if not path.exists():
                raise InputError(
                    f"{path}: the FedSUMM server state of round {self.round_offset} is missing; delete "
                    f"{self.out_dir / 'checkpoints'} to restart this cell"
                )
            self.server.load_state_dict(torch.load(path, weights_only=True))
        self._collect_garbage()  # files a killed run wrote after its last finished round
        self._global: OrderedDict[str, torch.Tensor] | None = None
        self._grid = None
        self._cell_json = None
        self._round_log: dict | None = None
        self._new_arrays: ArrayRecord | None = None
        self._guidance_bytes = 0

    # -- S_t and the guidance sent with w_t ----------------------------------------------------
    def sample_partitions(self, absolute_round: int, partition_ids: list[int]) -> list[int]:
        if sorted(partition_ids) != list(range(len(self.clients))):
            raise RuntimeError(
                f"expected partitions 0..{len(self.clients) - 1}, got {sorted(partition_ids)}"
            )
        return sorted(self.pid_of[c] for c in self.server.sample_clients(absolute_round))

    def client_records(self, absolute_round: int, partition_id: int) -> dict:
        guidance = self.server.guidance_for(self.clients[partition_id])
        if guidance is None:
            return {}
        has_gradient = guidance.modulated_gradient is not None
        records = {
            GUIDANCE_CONFIG: ConfigRecord(
                {
                    "rho": float(guidance.rho),
                    "previous-loss": float(guidance.previous_loss),
                    "epsilon": float(guidance.epsilon),
                    "has-gradient": has_gradient,
                    "round": absolute_round,
                }
            )
        }
        if has_gradient:
            arrays = ArrayRecord(
                OrderedDict(
                    sorted((k, v.detach().cpu()) for k, v in guidance.modulated_gradient.items())
                )
            )
            self._guidance_bytes += payload_bytes(arrays)
            records[GUIDANCE_ARRAYS] = arrays
        return records

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid):
        # a resume starts at the last round whose log entry (the completeness marker) is on disk:
        # t-1, or t-2 while round t-1's entry is still with the background round writer
        # (fedrepro.fl.strategy); the states of earlier rounds (and their disk files) can go
        done = latest_round(self.out_dir)
        self._prune_server_states(keep_from=min(server_round + self.round_offset - 1, done))
        self._grid = grid
        self._cell_json = str(config["cell"])
        self._global = OrderedDict(
            (k, v.detach().clone()) for k, v in arrays.to_torch_state_dict().items()
        )
        self._guidance_bytes = 0  # summed as the guidance is made (added in aggregate_arrays)
        return super().configure_train(server_round, arrays, config, grid)

    # -- Algorithm 1's server round -------------------------------------------------------------
    def _aggregate_fn(self, absolute_round: int):
        if not self.dp_enabled:
            return plain_mean
        generator = torch.Generator().manual_seed(
            derive_seed(self.seed, "fedsumm-dp", absolute_round)
        )
        if self.dp.clipping == "round_median":
            return functools.partial(
                dp_median_clip_mean, noise_multiplier=self.dp.noise_multiplier, generator=generator
            )
        m = self.algorithm.clients_per_round or len(self.clients)
        return functools.partial(
            dp_adaptive_clip_mean,
            clip_norm=self._clip_norm,
            noise_multiplier=self.dp.noise_multiplier,
            clipped_count_stddev=self.dp.count_stddev(m),
            target_quantile=self.dp.target_quantile,
            clip_norm_lr=self.dp.clip_norm_lr,
            generator=generator,
        )

    def aggregate_arrays(self, absolute_round: int, replies: list[Message]):
        if self._global is None:
            raise RuntimeError("aggregate_arrays before configure_train")
        self._down_bytes += self._guidance_bytes  # w_t and the guidance are both downlink
        client_replies: dict[str, ClientReply] = {}
        for m in replies:
            metrics = m.content["metrics"]
            pid = int(metrics["partition-id"])
            client = self.clients[pid]
            # converted (or read from the wave spool) tensor by tensor when the server reads them:
            # no second copy of every reply
            params = (LazyTensors(*self.spooled_arrays(pid)) if pid in self._spooled
                      else RecordTensors(m.content["arrays"]))
            if "train-loss" not in metrics:
                raise RuntimeError(f"round {absolute_round}: client {client} sent no train-loss")
            if self.algorithm.client_gradient == "delta":
                # g^c = w_t − w^c_{t+1}: computed here from the returned parameters (nothing extra sent)
                gradient = LazyTensors(
                    {k: params.shape_of(k) for k in params},
                    lambda k, params=params: self._global[k] - params[k],
                )
            else:
                if REPLY_GRADIENT not in m.content:
                    raise RuntimeError(
                        f"round {absolute_round}: client {client} sent no {REPLY_GRADIENT!r} record"
                    )
                gradient = RecordTensors(m.content[REPLY_GRADIENT])
            client_replies[client] = ClientReply(params, gradient, float(metrics["train-loss"]))
        # the parameter-sized arithmetic (rho, norms) on the cell's GPU when it has one
        with server_compute_device(cell_device(self.cell)):
            w_next, log = self.server.server_round(
                absolute_round,
                self._global,
                client_replies,
                aggregate=self._aggregate_fn(absolute_round),
            )
        self._round_log = log
        self._new_arrays = ArrayRecord(w_next)
        metrics = {
            "num-clients": len(client_replies),
            "rho-mean": float(log["rho_mean"]),
            "train-loss": sum(r.loss for r in client_replies.values()) / len(client_replies),
        }
        info = log.get("aggregate") or {}
        if self.dp_enabled:
            info["epsilon"] = self._epsilons[absolute_round - 1]  # after rounds 1..t
            info["delta"] = self.dp.delta
            info["sampling_rate"] = len(client_replies) / len(self.clients)
            if "next_clip_norm" in info:
                self._clip_norm = float(info["next_clip_norm"])
            metrics.update(
                {
                    metric: float(info[key])
                    for key, metric in {**METRIC_KEYS, **ADAPTIVE_METRIC_KEYS}.items()
                    if info.get(key) is not None
                }
            )
        return self._new_arrays, MetricRecord(metrics)

    # -- per-round log: ρ, DP, step losses, evaluation on every client ---------------------------
    def evaluate_global(self, absolute_round: int) -> dict:
        """Send w_{t+1} to every client in a Flower ``evaluate`` message and pool the answers."""
        node_of = self.partitions(self._grid)
        config = ConfigRecord(
            {
                "cell": self._cell_json,
                "round-offset": self.round_offset,
                "server-round": absolute_round - self.round_offset,
            }
        )
        messages = [
            Message(
                content=RecordDict({"arrays": self._new_arrays, "config": config}),
                message_type=MessageType.EVALUATE,
                dst_node_id=node_of[pid],
            )
            for pid in sorted(node_of)
        ]
        replies = list(self._grid.send_and_receive(messages, timeout=self.timeout))
        errors = [m.error.reason for m in replies if m.has_error()]
        if errors or len(replies) < len(messages):
            reason = "; ".join(errors) or "evaluation: " + self.missing_replies(
                {node_of[pid]: pid for pid in sorted(node_of)}, replies
            )
            write_json_atomic(
                self.out_dir / "checkpoints" / "failure.json",
                {"round": absolute_round, "reason": reason},
            )
            raise RuntimeError(f"round {absolute_round} evaluation failed: {reason}")
        per_client = {}
        for m in replies:
            rec = m.content["metrics"]
            entry = {
                "nll_sum": float(rec["nll-sum"]),
                "tokens": int(rec["tokens"]),
                "perplexity_split": "val" if int(rec["split-is-val"]) else "test",
            }
            entry["perplexity"] = (
                math.exp(entry["nll_sum"] / entry["tokens"]) if entry["tokens"] else None
            )
            if "rougeL-sum" in rec:
                entry["rougeL_sum"] = float(rec["rougeL-sum"])
                entry["test_examples"] = int(rec["test-examples"])
            per_client[self.clients[int(rec["partition-id"])]] = entry
        return pool_evaluation(per_client)

    def round_extras(self, absolute_round: int, replies: list[Message]) -> dict:
        log = self._round_log or {}
        extras = {
            "regime": self.regime,
            "participants": list(log.get("clients", [])),
            "rho": dict(log.get("rho", {})),
            "rho_mean": log.get("rho_mean"),
            "rho_statistics": dict(log.get("rho_statistics", {})),
            "step_losses": {
                self.clients[int(m.content["metrics"]["partition-id"])]: list(
                    m.content[REPLY_STEPS]["step-losses"]
                )
                for m in replies
                if REPLY_STEPS in m.content
            },
            "guidance_bytes_down": self._guidance_bytes,
        }
        if "update_difference" in log:  # FedSUMM's server update vs FedAvg's on the same replies
            extras["update_difference"] = dict(log["update_difference"])
        if self.regime == "FedSUMM":
            extras["fedsumm"] = {
                k: log[k]
                for k in ("memory_order", "losses", "gradient_norms", "modulated", "memory_source")
            }
        info = dict(log.get("aggregate") or {})
        if "clip_norm" in info:
            extras["dp"] = info
        extras["evaluation"] = self.evaluate_global(absolute_round)
        return _jsonable(extras)

    def save_server_state(self, absolute_round: int) -> None:
        """The server state of round t beside the runner's round checkpoint (atomic).

        With disk storage the file names the vector files (written once, never changed), so a
        killed run resumes from the last finished round's files; the files only an older state
        names are deleted once that state is (:meth:`_prune_server_states`)."""
        with atomic_path(server_state_path(self.out_dir, absolute_round), suffix=".pt") as tmp:
            torch.save(self.server.state_dict(), tmp)
        self._prune_server_states(keep_from=absolute_round - 1)

    def _prune_server_states(self, keep_from: int) -> None:
        """Delete the saved server states of rounds before ``keep_from`` (unless
        ``keep_round_checkpoints``; a resume needs only the last finished round's state), then the
        disk files that neither the live state nor a kept state refers to."""
        if not self.cell.get("keep_round_checkpoints", False):
            for r in _saved_rounds(self.out_dir):
                if r < keep_from:
                    server_state_path(self.out_dir, r).unlink()
        self._collect_garbage()

    def _collect_garbage(self) -> None:
        if self.server_state.storage != "disk":
            return
        keep: set[str] = set()
        for r in _saved_rounds(self.out_dir):
            keep |= state_names(torch.load(server_state_path(self.out_dir, r), weights_only=True))
        self.server.collect_garbage(keep)


def make_strategy(cell: dict, **kwargs) -> FedSummStrategy:
    """The server of a federated FedSUMM cell (the registry's strategy hook, :mod:`fedrepro.fl.tasks`)."""
    return FedSummStrategy(cell, **kwargs)
